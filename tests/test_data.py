import json

import chess

from grpo_debug.chess.data import DATA_DIR, env_example, fen_key, load_split, policy_example
from grpo_debug.chess.format import env_step, parse_env_completion, parse_policy_completion

MANIFEST = json.loads((DATA_DIR / "manifest.json").read_text())


def test_counts_match_the_manifest_and_the_issue():
    counts = MANIFEST["counts"]
    for name, count in counts.items():
        assert len(load_split(name)) == count
    assert counts["policy_train"] >= 20000 and counts["env_train"] >= 20000
    assert counts["policy_eval"] >= 500 and counts["env_eval"] >= 500 and counts["policy_prompts"] >= 16


def test_eval_and_prompt_positions_never_occur_in_training():
    """Positions compared by the FEN's first four fields (placement, side, castling, en passant): the bundled
    FENs are written by python-chess, so these are its position key; checked on a sample, then used for the
    ~300,000 records (parsing every one into a Board took most of this test's time)."""
    key = lambda fen: " ".join(fen.split()[:4])
    records = load_split("policy_train")
    env_train = load_split("env_train")
    for record in [*records[::100], *env_train[::500]]:
        assert key(record["fen"]) == fen_key(record["fen"])
    train = {key(r["fen"]) for r in records}
    held_out = [key(r["fen"]) for r in load_split("policy_eval") + load_split("policy_prompts")]
    assert not train & set(held_out) and len(set(held_out)) == len(held_out)
    train_env = {(key(r["fen"]), r["move"]) for r in env_train}
    assert not train_env & {(key(r["fen"]), r["move"]) for r in load_split("env_eval")}


def test_every_policy_record_evaluates_every_legal_move():
    for split, min_depth in [("policy_eval", 10), ("policy_prompts", 10), ("policy_train", 1)]:
        for record in load_split(split)[:2000]:
            board = chess.Board(record["fen"])
            assert set(record["evals"]) == {m.uci() for m in board.legal_moves}
            assert record["depth"] >= min_depth
            values = list(record["evals"].values())
            assert values == sorted(values, reverse=True)


def test_ground_truth_completions_parse():
    for record in load_split("policy_eval"):
        prompt, completion = policy_example(record)
        assert prompt == f"P: {record['fen']} "
        parsed = parse_policy_completion(completion)
        assert parsed.ok and parsed.best == parsed.moves[0] and len(parsed.moves) == min(5, len(record["evals"]))
    for record in load_split("env_eval"):
        assert parse_env_completion(env_example(record)[1]).ok


def test_transitions_replay_with_python_chess():
    repetition_draws = 0
    for record in load_split("env_train")[:20000] + load_split("env_eval"):
        outcome = env_step(chess.Board(record["fen"]), record["move"])
        if (outcome.reward, outcome.terminated) != (record["reward"], record["terminated"]):
            repetition_draws += 1  # threefold repetition needs the game's move stack, absent from a FEN
            assert record["reward"] == 0.5 and record["terminated"]
            continue
        assert outcome.next_fen == record["next_fen"] and outcome.truncated == record["truncated"]
        assert len(record["history"]) <= 10
    assert repetition_draws < 200


def test_transitions_cover_illegal_moves_mates_and_draws():
    records = load_split("env_train")
    assert sum(r["truncated"] for r in records) > 1000
    assert sum(r["reward"] == 1.0 for r in records) > 100
    assert sum(r["reward"] == 0.5 for r in records) > 100
    kinds = {r["kind"] for r in records}
    assert {"played", "alternative", "illegal", "checkmate", "stalemate"} <= kinds
