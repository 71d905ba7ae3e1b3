import chess
import pytest

from grpo_debug.chess.format import (
    canonical_fen,
    env_completion,
    env_prompt,
    env_step,
    format_eval,
    parse_env_completion,
    parse_env_prompt,
    parse_policy_completion,
    policy_completion,
    policy_prompt,
    same_position,
)

START = chess.STARTING_FEN


def test_prompts_are_exactly_rookworld():
    assert policy_prompt(START) == f"P: {START} "
    assert env_prompt(START, "e2e4", []) == f"A: {START}+e2e4++"
    history = [f"m{i}" for i in range(14)]
    assert env_prompt(START, "e2e4", history).endswith("+e2e4+" + ",".join(history[-10:]) + "+")
    assert parse_env_prompt(env_prompt(START, "e2e4", ["d2d4", "d7d5"])).history == ["d2d4", "d7d5"]


def test_design_example_line():
    board = chess.Board("8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31")
    outcome = env_step(board, "a6a5")
    assert env_completion(outcome) == "8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0"


def test_illegal_move_truncates_and_keeps_position():
    board = chess.Board()
    for move in ["e2e5", "e7e5", "zz", "", "a1a1"]:
        outcome = env_step(board, move)
        assert (outcome.next_fen, outcome.reward, outcome.terminated, outcome.truncated) == (START, -1.0, False, True)
    assert board.fen() == START  # env_step leaves the board as it was


def test_mate_stalemate_and_draw_by_rule():
    mate = env_step(chess.Board("rnbqkbnr/ppppp2p/5p2/6p1/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 3"), "d1h5")
    assert (mate.reward, mate.terminated, mate.truncated) == (1.0, True, False)
    stalemate = env_step(chess.Board("7k/8/6Q1/8/8/8/8/K7 w - - 0 1"), "g6f7")
    assert (stalemate.reward, stalemate.terminated) == (0.5, True)
    bare_kings = env_step(chess.Board("8/8/8/3k4/3r4/8/3K4/8 w - - 0 1"), "d2d3").terminated is False
    assert bare_kings
    insufficient = env_step(chess.Board("7k/8/8/8/3r4/3K4/8/8 w - - 0 1"), "d3d4")
    assert (insufficient.reward, insufficient.terminated) == (0.5, True)


def test_en_passant_conventions_are_the_same_position():
    board = chess.Board()
    board.push_uci("e2e4")
    legal, strict = board.fen(), board.fen(en_passant="fen")
    assert legal != strict and " e3 " in strict
    assert same_position(legal, strict)
    assert env_step(chess.Board(), "e2e4", fen_convention="fen").next_fen == strict
    assert not same_position(legal, START)
    assert canonical_fen("not a fen") is None and not same_position("garbage", "garbage")


def test_policy_roundtrip_and_eval_format():
    text = policy_completion(["e2e4", "d2d4"], [0.3, -1.2], "e2e4")
    assert text == "M: e2e4 d2d4 E: 0.3 -1.2 B: e2e4"
    parsed = parse_policy_completion("    " + text.replace(" E:", "      E:"))
    assert parsed.ok and parsed.moves == ["e2e4", "d2d4"] and parsed.evals == [0.3, -1.2] and parsed.best == "e2e4"
    assert [format_eval(x) for x in (1.0, -0.0, 0.25, -2.41, 100.0)] == ["1", "0", "0.25", "-2.41", "100"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "M: E: B:",
        "B: e2e4",
        "M: e2e4 E: nan B: e2e4",
        "M: e2e4 E: 1 2 B: e2e4",
        "M: e2e4 E: 1 B: e2e4 junk",
        "\x00\u2603",
        "M: e2e4 E: inf B: e2e4",
    ],
)
def test_malformed_policy_completions_are_reported(text):
    parsed = parse_policy_completion(text)
    assert not parsed.ok and parsed.error


@pytest.mark.parametrize(
    "text", ["", "+++", "x+0.001+0+0", f"{START}+abc+0+0", f"{START}+0.001+2+0", f"{START}+0.001+0"]
)
def test_malformed_env_completions_are_reported(text):
    parsed = parse_env_completion(text)
    assert not parsed.ok and parsed.error


def test_env_completion_parses_and_tolerates_trailing_plus():
    parsed = parse_env_completion(f"{START}+0.001+0+0+")
    assert parsed.ok and parsed.reward == 0.001 and parsed.terminated is False


def test_the_policy_parser_is_linear_in_its_input():
    """'M:' + ' E:' * n with no B: made the old regex backtrack quadratically (27 s at 48 kB)."""
    import time

    from grpo_debug.chess.format import parse_policy_completion

    text = "M:" + " E:" * 350_000  # about 1 MB
    start = time.perf_counter()
    parsed = parse_policy_completion(text)
    assert not parsed.ok and "missing one of the sections" in parsed.error
    assert time.perf_counter() - start < 1.0
    ok = parse_policy_completion("  M: e2e4 d2d4 E: 0.3 0.2 B: e2e4")
    assert ok.ok and ok.moves == ["e2e4", "d2d4"] and ok.evals == [0.3, 0.2] and ok.best == "e2e4"
