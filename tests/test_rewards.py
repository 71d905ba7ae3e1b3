import math
import os
import signal
import time

import chess
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_debug.chess.data import env_example, load_split, policy_example
from grpo_debug.chess.engine import PositionAnalysis, Stockfish
from grpo_debug.chess.format import EnvOutcome, env_completion, policy_completion
from grpo_debug.chess.rewards import RewardScorer, UnreadablePrompt, score_env, score_policy
from grpo_debug.chess.task import RookWorldReward, rookworld_task
from grpo_debug.rewards import compute_rewards

POLICY_EVAL = load_split("policy_eval")
ENV_EVAL = load_split("env_eval")


def test_ground_truth_of_every_eval_position_scores_the_maximum(scorer):
    for record in POLICY_EVAL + load_split("policy_prompts"):
        prompt, completion = policy_example(record)
        score = scorer.score(prompt, completion)
        assert score.total == 1.0, (prompt, completion, score)
        assert score.components == {"best_move": 1.0, "candidates": 1.0, "evals": 1.0, "format": 1.0}
    for record in ENV_EVAL:
        prompt, completion = env_example(record)
        assert scorer.score(prompt, completion).total == 1.0, (prompt, completion)


def _perturbations(analysis: PositionAnalysis):
    top = analysis.top5
    evals = [analysis.evals[m] for m in top]
    worst = analysis.ranked_moves[-1]
    worse = [m for m in top if analysis.evals[m] < evals[0]]
    yield "a worse top-5 move as B:", policy_completion(top, evals, worse[0]) if worse else None
    yield "worst legal move as B:", policy_completion(top, evals, worst) if analysis.evals[worst] < evals[0] else None
    yield "illegal B:", policy_completion(top, evals, "a1a1")
    yield "evals off by a pawn", policy_completion(top, [e + 1 for e in evals], top[0])
    yield "one candidate missing", policy_completion(top[:-1], evals[:-1], top[0])
    yield "garbage", "M: ??"


def test_perturbed_ground_truth_scores_lower():
    for record in POLICY_EVAL[:100]:
        analysis = PositionAnalysis.from_json(record)
        for name, completion in _perturbations(analysis):
            if completion is not None:
                assert score_policy(analysis, completion).total < 1.0, name
    for record in ENV_EVAL[:100]:
        truth = EnvOutcome(record["next_fen"], record["reward"], record["terminated"], record["truncated"])
        fen, reward, terminated, truncated = truth.next_fen, truth.reward, truth.terminated, truth.truncated
        wrongs = [
            EnvOutcome(fen, reward, not terminated, truncated),
            EnvOutcome(fen, reward, terminated, not truncated),
            EnvOutcome(fen, reward + 0.5, terminated, truncated),
            EnvOutcome(
                fen.replace(" w ", " b ") if " w " in fen else fen.replace(" b ", " w "), reward, terminated, truncated
            ),
        ]
        for wrong in [env_completion(w) for w in wrongs] + ["", fen]:
            assert score_env(truth, wrong).total < 1.0, wrong


def test_reward_graded_by_stockfish_ranking():
    analysis = PositionAnalysis.from_json(POLICY_EVAL[0])
    scores = [
        score_policy(
            analysis, policy_completion(analysis.top5, [analysis.evals[m] for m in analysis.top5], m)
        ).components["best_move"]
        for m in analysis.ranked_moves
    ]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0 and scores[-1] > -1.0


def test_chess960_castling_spelling_is_illegal_not_a_crash():
    board = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1")
    assert board.is_legal(chess.Move.from_uci("e8a8"))  # python-chess reads it as castling
    with Stockfish(depth=4) as engine:
        analysis = engine.analyse(board)
    assert "e8a8" not in analysis.evals and "e8c8" in analysis.evals
    score = score_policy(analysis, "M: e8a8 E: 0 B: e8a8")
    assert score.components["best_move"] == -1.0 and score.components["candidates"] < 0


def test_other_en_passant_convention_is_not_a_wrong_board():
    board = chess.Board()
    board.push_uci("e2e4")
    truth = EnvOutcome(board.fen(), 0.001, False, False)
    strict = env_completion(EnvOutcome(board.fen(en_passant="fen"), 0.001, False, False))
    assert score_env(truth, strict).total == 1.0


UNICODE = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
MOVES = st.one_of(st.sampled_from(["e2e4", "a1a1", "e7e8q", "0000", "g1f3", "zz", ""]), st.text(max_size=6))
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), st.sampled_from(["1", "-0.3", "x", ""]))
POLICY_TEXT = st.one_of(
    UNICODE,
    st.builds(
        lambda ms, es, b, pad: f"{pad}M: {' '.join(ms)} E: {' '.join(es)} B: {b}",
        st.lists(MOVES, max_size=7),
        st.lists(NUMBERS, max_size=7),
        MOVES,
        st.sampled_from(["", "   "]),
    ),
    st.builds(
        lambda s, n: s[:n], st.sampled_from([policy_example(r)[1] for r in POLICY_EVAL[:20]]), st.integers(0, 80)
    ),
)
FENS = st.one_of(
    UNICODE,
    st.sampled_from([r["next_fen"] for r in ENV_EVAL[:50]]),
    st.builds(lambda f, n: f[:n], st.sampled_from([r["next_fen"] for r in ENV_EVAL[:50]]), st.integers(0, 90)),
)
ENV_TEXT = st.one_of(
    UNICODE,
    st.builds(
        lambda f, r, t, u: f"{f}+{r}+{t}+{u}",
        FENS,
        NUMBERS,
        st.sampled_from(["0", "1", "2", ""]),
        st.sampled_from(["0", "1", "x"]),
    ),
)


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=st.sampled_from(POLICY_EVAL), text=POLICY_TEXT)
def test_any_policy_completion_gets_a_defined_score(record, text):
    score = score_policy(PositionAnalysis.from_json(record), text)
    assert -1.0 <= score.total <= 1.0 and all(math.isfinite(v) for v in score.components.values())
    if score.components["format"] == 0.0:
        assert score.error


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=st.sampled_from(ENV_EVAL), text=ENV_TEXT)
def test_any_env_completion_gets_a_defined_score(record, text):
    truth = EnvOutcome(record["next_fen"], record["reward"], record["terminated"], record["truncated"])
    score = score_env(truth, text)
    assert -1.0 <= score.total <= 1.0 and all(math.isfinite(v) for v in score.components.values())
    assert score.total < 1.0 or score.components["format"] == 1.0


START = chess.STARTING_FEN
UNREADABLE_P = [
    "P: not/a/fen w - - 0 1 ",
    "P: ",
    f"P: {START}x ",
    "P: \x00\x01 ",
]
UNREADABLE_A = ["A: not/a/fen+e2e4++", "A: garbage", "A: ", f"A: {START}+e2e4+", f"A: +e2e4+{START}+"]
NO_TASK = ["", "hello", "p: lowercase prefix ", "P:no space", "\u202eP: " + START, "\x00\xff\xfe", b"P: bytes"]
UNSCORABLE_PROMPT = (
    [(p, "P", {"best_move": -1.0, "candidates": -1.0, "evals": -1.0, "format": 0.0}) for p in UNREADABLE_P]
    + [
        (p, "A", {"fen": -1.0, "reward": -1.0, "terminated": -1.0, "truncated": -1.0, "format": 0.0})
        for p in UNREADABLE_A
    ]
    + [(p, "", {}) for p in NO_TASK]
)
SCORABLE_ODD_PROMPTS = [  # prompts that parse: scored against their ground truth, whatever it is
    "P: 8/8/8/8/8/8/8/8 w - - 0 1 ",  # no kings: an invalid position
    f"A: {START}+e2e5++",  # an illegal move
    f"A: {START}+zz+x,y+",  # a move that is not UCI
    "A: 8/8/8/8/8/8/8/8 w - - 0 1+a1a2++",  # no kings
    policy_example(POLICY_EVAL[0])[0],
    env_example(ENV_EVAL[0])[0],
]
BAD_COMPLETIONS = [
    "",
    " ",
    "M:",
    "M: E: B:",
    "M: e2e4 E: nan B: e2e4",
    "M: a1a1 E: 0 B: a1a1",  # an illegal move
    "M: e2e4 e2e4 e2e4 E: 1e308 -1e308 inf B: e2e4 junk",
    "M: " + "e2e4 " * 500 + "E: " + "0 " * 500 + "B: e2e4",
    "+++",
    "+1+0+0",
    f"{START}+x+2+y",
    "\x00\x01\x02\x1b[31m",
    bytes(range(256)).decode("latin-1"),
    "\u202e\u2066M: e2e4 E: 0 B: e2e4\u2069",
    policy_example(POLICY_EVAL[0])[1],
    env_example(ENV_EVAL[0])[1],
]


def bundled_reward_functions(scorer) -> list:
    return [f for mode in ("policy", "env", "mixed") for f in rookworld_task(mode, scorer).reward_funcs]


@pytest.mark.parametrize("prompt, task, components", UNSCORABLE_PROMPT)
def test_an_unreadable_prompt_scores_like_an_unparsable_completion(scorer, prompt, task, components):
    """One bad row of a dataset must not stop a run: every completion of it gets the documented score, -1."""
    for score in scorer.score_group(prompt, BAD_COMPLETIONS):
        assert (score.task, score.total, score.components) == (task, -1.0, components)
        assert score.error.startswith("unscorable prompt: ")


def test_the_scorers_own_lookups_still_name_an_unreadable_prompt(scorer):
    with pytest.raises(UnreadablePrompt, match="invalid FEN in P: prompt 'not/a/fen w - - 0 1'"):
        scorer.analysis_for("not/a/fen w - - 0 1")
    with pytest.raises(UnreadablePrompt, match="invalid FEN in A: prompt 'not/a/fen'"):
        scorer.env_truth_for("A: not/a/fen+e2e4++")
    with pytest.raises(UnreadablePrompt, match="not an A: prompt"):
        scorer.env_truth_for("A: garbage")


def test_every_bundled_reward_function_scores_bad_prompts_times_bad_completions(scorer):
    prompts = [p for p, _, _ in UNSCORABLE_PROMPT] + SCORABLE_ODD_PROMPTS
    rows = [(p, c) for p in prompts for c in BAD_COMPLETIONS]
    repeated, completions = [p for p, _ in rows], [c for _, c in rows]
    unscorable = {p for p, _, _ in UNSCORABLE_PROMPT}
    for reward in bundled_reward_functions(scorer):
        totals = reward(prompts=repeated, completions=completions, completion_ids=None)
        assert len(totals) == len(rows) and all(type(t) is float and -1.0 <= t <= 1.0 for t in totals)
        assert all(t == -1.0 for t, p in zip(totals, repeated) if p in unscorable)
        _, components, errors = reward.details(repeated, completions)
        assert all(len(v) == len(rows) for v in components.values()) and len(errors) == len(rows)
    text = [i for i, p in enumerate(repeated) if isinstance(p, str)]  # the project's own path, as a step scores
    out = compute_rewards(
        [repeated[i] for i in text], [completions[i] for i in text], 1, rookworld_task("mixed", scorer)
    )
    assert torch.isfinite(out.total).all() and ((out.total >= -1) & (out.total <= 1)).all()


PROMPT_TEXT = st.one_of(
    UNICODE,
    st.binary(max_size=60).map(lambda b: b.decode("utf-8", "replace")),
    st.builds(lambda t: f"P: {t}", UNICODE),
    st.builds(lambda t: f"A: {t}", UNICODE),
    st.builds(lambda f, m, h: f"A: {f}+{m}+{h}+", FENS, MOVES, st.text(max_size=12)),
)
COMPLETION_TEXT = st.one_of(POLICY_TEXT, ENV_TEXT, st.binary(max_size=60).map(lambda b: b.decode("latin-1")))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(PROMPT_TEXT, min_size=1, max_size=3), completions=st.lists(COMPLETION_TEXT, min_size=1, max_size=4)
)
def test_random_prompts_and_completions_get_a_defined_score(scorer, prompts, completions):
    repeated = [p for p in prompts for _ in completions]
    totals = RookWorldReward(scorer)(prompts=repeated, completions=completions * len(prompts))
    assert len(totals) == len(repeated) and all(type(t) is float and -1.0 <= t <= 1.0 for t in totals)


def test_live_engine_scores_unbundled_positions_and_survives_a_crash():
    scorer = RewardScorer(engine_depth=6)
    board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    first = scorer.score(f"P: {board.fen()} ", "M: f1b5 E: 0.3 B: f1b5")
    assert first.components["best_move"] > 0
    os.kill(scorer.engine.pid, signal.SIGKILL)
    time.sleep(0.2)
    other = chess.Board("rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2")
    second = scorer.score(f"P: {other.fen()} ", "M: g1f3 E: 0.3 B: g1f3")
    assert second.components["best_move"] > 0 and scorer.engine.restarts == 1
    scorer.close()


def test_live_and_bundled_ground_truth_agree_on_a_bundled_position():
    record = POLICY_EVAL[1]
    with Stockfish(depth=record["depth"]) as engine:
        live = engine.analyse(chess.Board(record["fen"]))
    assert set(live.evals) == set(record["evals"])
    assert live.top5[0] in record["evals"]


def test_an_a_prompt_on_an_invalid_position_scores_its_own_ground_truth_1():
    """A position python-chess plays but that is not valid chess (a pawn on the first rank) has no canonical
    FEN; the ground truth's next FEN is compared as text then, and scores 1.0 as the docstring promises."""
    from grpo_debug.chess.format import env_prompt
    from grpo_debug.chess.rewards import RewardScorer

    scorer = RewardScorer()
    prompt = env_prompt("4k3/8/8/8/8/8/8/K3P3 w - - 0 1", "a1a2", [])
    truth = scorer.env_truth_for(prompt)
    completion = f"{truth.next_fen}+{truth.reward}+{int(truth.terminated)}+{int(truth.truncated)}"
    assert scorer.score(prompt, completion).total == 1.0


def test_a_trl_run_with_unreadable_prompts_in_its_dataset_finishes(scorer, tmp_path):
    """TRL's GRPOTrainer on the bundled model, each batch holding every kind of bad row next to a real one."""
    from grpo_debug.capture.trl_bridge import trl_trainer
    from grpo_debug.config import StepConfig
    from grpo_debug.task import Task

    rows = ["P: not/a/fen w - - 0 1 ", "A: garbage", "hello", policy_example(POLICY_EVAL[0])[0]]
    task = Task("bad_rows", lambda prompt_set, n: rows[:n], (RookWorldReward(scorer),))
    cfg = StepConfig(num_prompts=len(rows), num_generations=2, max_new_tokens=8)
    trainer = trl_trainer(cfg, str(tmp_path), task, max_steps=2, logging_steps=1)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/rookworld/mean" in h]
    assert trainer.state.global_step == 2 and len(logged) == 2
    # 6 of the 8 samples score the documented -1, the other 2 at most 1
    assert all(-1.0 <= h["rewards/rookworld/mean"] <= -0.5 and math.isfinite(h["loss"]) for h in logged)
