"""The live-engine path keeps the scorer's promise: a defined score, in bounded time, whatever the position
or the engine does; and a score that does not depend on the engine's history."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import chess
import chess.engine
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_debug.advantages import compute_advantages, normalize_over_set, summarize_advantages
from grpo_debug.chess.engine import EngineNotFound, PositionError, Stockfish, _evals, find_stockfish
from grpo_debug.chess.format import policy_completion
from grpo_debug.chess.rewards import RewardScorer, Score
from grpo_debug.chess.task import rookworld_task
from grpo_debug.rewards import compute_rewards

DEPTH = 6
UNSCORABLE = {"best_move": -1.0, "candidates": -1.0, "evals": -1.0, "format": 0.0}
LIVE = [
    "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",  # none of them bundled
    "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
    "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
    "r2q1rk1/ppp2ppp/2npbn2/2b1p3/2B1P3/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 8",
]
MATE = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"
STALEMATE = "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"


def within(seconds: float, fn, *args):
    """fn(*args), failing the test (not hanging it) if it takes longer than `seconds`."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def live_scorer(**engine_kwargs) -> RewardScorer:
    return RewardScorer(engine=Stockfish(depth=DEPTH, **engine_kwargs))  # nothing bundled: every P: is live


@pytest.fixture(scope="module")
def reference():
    """Unfaulted analyses of LIVE, each by a fresh engine, and a batch of two completions per position."""
    analyses = {}
    for fen in LIVE:
        with Stockfish(depth=DEPTH) as engine:
            analyses[fen] = engine.analyse(chess.Board(fen))
    prompts = [f"P: {fen} " for fen in LIVE]
    completions = []
    for fen in LIVE:
        top = analyses[fen].top5
        evals = [analyses[fen].evals[m] for m in top]
        completions += [
            policy_completion(top, evals, top[0]),
            policy_completion(top[::-1], [e + 0.3 for e in evals], top[-1]),
        ]
    return analyses, prompts, completions


def faulty(engine: Stockfish, fault, at: set[int]) -> None:
    """Apply `fault` to the engine process just before the analysis attempts numbered in `at` (from 1)."""
    attempt = 0
    analyse_once = engine._analyse_once

    def wrapped(board):
        nonlocal attempt
        attempt += 1
        if attempt in at:
            _ = engine.version  # make sure a process is running
            fault(engine.pid)
        return analyse_once(board)

    engine._analyse_once = wrapped


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def assert_same_rewards(got, want) -> None:
    assert torch.equal(got.total, want.total)
    assert got.components.keys() == want.components.keys()
    assert all(torch.equal(got.components[k], want.components[k]) for k in want.components)


# ---------------------------------------------------------------- positions


@st.composite
def parseable_fens(draw) -> str:
    """Two kings plus up to 10 random pieces (kings and back-rank pawns included), random castling and
    en passant: mostly positions python-chess parses but that are not legal chess, some legal ones."""
    board = chess.Board.empty()
    squares = draw(st.lists(st.integers(0, 63), min_size=2, max_size=12, unique=True))
    board.set_piece_at(squares[0], chess.Piece.from_symbol("K"))
    board.set_piece_at(squares[1], chess.Piece.from_symbol("k"))
    for square in squares[2:]:
        board.set_piece_at(square, chess.Piece.from_symbol(draw(st.sampled_from("KQRBNPkqrbnp"))))
    turn = draw(st.sampled_from("wb"))
    castling = draw(st.sampled_from(["-", "-", "KQkq", "Kq"]))
    ep = draw(st.sampled_from(["-", "-", "-", "e3", "d6"]))
    return f"{board.board_fen()} {turn} {castling} {ep} 0 1"


@pytest.fixture(scope="module")
def fuzz_scorer():
    with RewardScorer(engine=Stockfish(depth=4, timeout=10)) as scorer:
        yield scorer


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(fen=parseable_fens())
@example(fen="4k3/8/8/8/8/8/8/K3K3 w - - 0 1")  # two white kings: analysed 3 of 8 legal moves
@example(fen="4k3/8/8/8/8/8/8/P3K3 w - - 0 1")  # pawn on the first rank
@example(fen="8/8/8/8/8/8/8/4K3 w - - 0 1")  # no black king: Stockfish died with -11
@example(fen="4k3/4Q3/8/8/8/8/8/4K3 w - - 0 1")  # the side not to move is in check
def test_any_parseable_position_gets_a_defined_score_in_bounded_time(fuzz_scorer, fen):
    board = chess.Board(fen)
    score = within(2 * 10 + 15, fuzz_scorer.score, f"P: {fen} ", "M: e1e2 E: 0.1 B: e1e2")
    assert -1.0 <= score.total <= 1.0
    if not board.is_valid() or not any(board.legal_moves):
        assert score.components == UNSCORABLE and score.total == -1.0
        assert score.error.startswith("unscorable position") and fen.split()[0] in score.error
    else:
        analysis = fuzz_scorer.analysis_for(fen)
        assert set(analysis.evals) == {m.uci() for m in board.legal_moves}


def test_invalid_positions_never_reach_the_engine():
    scorer = live_scorer()
    for fen in ["4k3/8/8/8/8/8/8/K3K3 w - - 0 1", "4k3/8/8/8/8/8/8/P3K3 w - - 0 1", MATE, STALEMATE]:
        assert scorer.score(f"P: {fen} ", "M: e1e2 E: 0 B: e1e2").components == UNSCORABLE
    assert scorer.engine.pid is None  # never started
    with pytest.raises(PositionError, match="too many kings"):
        scorer.engine.analyse(chess.Board("4k3/8/8/8/8/8/8/K3K3 w - - 0 1"))


@pytest.mark.parametrize("fen, reason", [(MATE, "checkmate"), (STALEMATE, "stalemate")])
def test_game_over_prompt_gets_the_documented_score(fen, reason):
    scorer = live_scorer()
    rewards = compute_rewards([f"P: {fen} "], ["M: e1e2 E: 0 B: e1e2", "garbage"], 2, rookworld_task("policy", scorer))
    assert rewards.total.tolist() == [-1.0, -1.0]
    assert all(f"game over: {reason}" in error for error in rewards.errors)
    assert summarize_advantages(rewards.total, 2).values.tolist() == [0.0, 0.0]


def test_engine_lines_without_a_move_or_missing_moves_are_engine_errors():
    board = chess.Board("4k3/8/8/8/8/8/8/4K3 w - - 0 1")
    score = chess.engine.PovScore(chess.engine.Cp(0), chess.WHITE)
    with pytest.raises(chess.engine.EngineError, match="without a move"):
        _evals(board, [{"score": score}])
    with pytest.raises(chess.engine.EngineError, match="no evaluation of 4 legal moves"):
        _evals(board, [{"pv": [chess.Move.from_uci("e1e2")], "score": score}])


# ---------------------------------------------------------------- engine faults


def test_two_engine_deaths_in_one_batch_change_no_score(reference):
    analyses, prompts, completions = reference
    want = compute_rewards(prompts, completions, 2, rookworld_task("policy", live_scorer()))
    scorer = live_scorer()
    faulty(scorer.engine, kill, at={2, 4})  # the 2nd and 3rd positions' first attempts
    got = within(60, compute_rewards, prompts, completions, 2, rookworld_task("policy", scorer))
    assert scorer.engine.restarts == 2
    assert_same_rewards(got, want)
    assert all(scorer.live[k].evals == a.evals for k, a in zip(scorer.live, analyses.values()))
    scorer.close()


def test_an_engine_that_dies_on_the_retry_too_costs_one_group_only(reference):
    _, prompts, completions = reference
    want = compute_rewards(prompts, completions, 2, rookworld_task("policy", live_scorer()))
    scorer = live_scorer()
    faulty(scorer.engine, kill, at={2, 3})  # the 2nd position: first attempt and retry
    got = within(60, compute_rewards, prompts, completions, 2, rookworld_task("policy", scorer))
    assert got.total[2:4].tolist() == [-1.0, -1.0]
    assert all(e.startswith("engine analysis failed") for e in got.errors[2:4])
    keep = [0, 1, 4, 5, 6, 7]
    assert torch.equal(got.total[keep], want.total[keep])
    scorer.close()


def test_frozen_engine_times_out_and_is_restarted(reference):
    analyses, prompts, completions = reference
    scorer = live_scorer(timeout=2.0)
    scorer.score(prompts[0], completions[0])
    frozen = scorer.engine.pid
    freeze(frozen)
    start = time.perf_counter()
    score = within(20, scorer.score, prompts[1], completions[2])
    seconds = time.perf_counter() - start
    assert 2.0 <= seconds < 10.0, seconds
    assert scorer.engine.restarts == 1 and scorer.engine.pid != frozen
    assert scorer.analysis_for(LIVE[1]).evals == analyses[LIVE[1]].evals and score.components["format"] == 1.0
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{frozen}") or open(f"/proc/{frozen}/stat").read().split()[2] == "Z"
    scorer.close()


def test_an_engine_frozen_on_every_attempt_gives_the_documented_score(reference):
    _, prompts, completions = reference
    scorer = live_scorer(timeout=1.0)
    faulty(scorer.engine, freeze, at={1, 2})
    score = within(20, scorer.score, prompts[0], completions[0])
    assert score.components == UNSCORABLE and "no answer within 1 s" in score.error
    assert scorer.score(prompts[0], completions[0]).components["format"] == 1.0  # the third engine works
    scorer.close()


def test_a_score_does_not_depend_on_engine_history():
    fen = chess.Board(LIVE[3])
    with Stockfish(depth=8) as engine:
        fresh = engine.analyse(fen).evals
    with Stockfish(depth=8) as engine:
        for other in LIVE[:3]:
            engine.analyse(chess.Board(other))
        after_others = engine.analyse(fen).evals
        again = engine.analyse(fen).evals
        engine.restart()
        engine.analyse(chess.Board(LIVE[0]))
        after_restart = engine.analyse(fen).evals
    assert fresh == after_others == again == after_restart


def test_scorer_is_a_context_manager():
    with live_scorer() as scorer:
        scorer.score(f"P: {LIVE[0]} ", "M: e2e4 E: 0 B: e2e4")
        pid = scorer.engine.pid
        assert pid is not None
    assert scorer.engine.pid is None
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_script_scoring_live_exits_without_close_and_prints_nothing_after_a_recovered_kill():
    script = textwrap.dedent(f"""
        import gc, os, signal, time
        from grpo_debug.chess.engine import Stockfish
        from grpo_debug.chess.rewards import RewardScorer
        scorer = RewardScorer(engine=Stockfish(depth=4))
        _ = scorer.engine.version
        os.kill(scorer.engine.pid, signal.SIGKILL)  # dies before the analysis: recovered by a restart
        print(scorer.score("P: {LIVE[0]} ", "M: f1b5 E: 0.3 B: f1b5").total)
        assert scorer.engine.restarts == 1
        gc.collect()  # asyncio reports a never-retrieved future when it is collected
        print(time.time(), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=180)  # importing torch takes most of it
    finally:
        proc.kill()
    exited = time.time()
    assert proc.returncode == 0, err
    total, scored = (float(line) for line in out.split())
    assert total > 0 and exited - scored < 5, (exited - scored, err)
    assert err == "", err  # asyncio printed "Future exception was never retrieved" before its handler was set


# ---------------------------------------------------------------- configuration errors


def _not_executable(tmp_path):
    path = tmp_path / "stockfish"
    path.write_text("not an engine")
    path.chmod(0o644)
    return str(path), "is not executable"


def _directory(tmp_path):
    return str(tmp_path), "is a directory"


def _missing(tmp_path):
    return str(tmp_path / "nowhere" / "stockfish"), "no such file"


@pytest.mark.parametrize("make", [_missing, _directory, _not_executable])
def test_bad_stockfish_path_is_named_with_its_problem(make, tmp_path, monkeypatch):
    path, problem = make(tmp_path)
    monkeypatch.setenv("STOCKFISH_PATH", path)
    with pytest.raises(EngineNotFound, match=problem) as error:
        find_stockfish()
    assert f"STOCKFISH_PATH {path!r}" in str(error.value)
    with pytest.raises(EngineNotFound, match=problem):
        RewardScorer().score(f"P: {LIVE[0]} ", "M: e2e4 E: 0 B: e2e4")


@pytest.mark.parametrize("path", ["/bin/true", "/bin/cat", "script"])
def test_a_binary_that_is_no_uci_engine_is_named(path, tmp_path, monkeypatch):
    if path == "script":  # executable, but no format the kernel can run
        path = tmp_path / "stockfish"
        path.write_text("uciok\n")
        path.chmod(0o755)
        path = str(path)
    monkeypatch.setenv("STOCKFISH_PATH", path)
    scorer = RewardScorer(engine=Stockfish(startup_timeout=1.0))
    with pytest.raises(EngineNotFound, match=f"{path!r} is not a working UCI engine"):
        within(10, scorer.score, f"P: {LIVE[0]} ", "M: e2e4 E: 0 B: e2e4")


# ---------------------------------------------------------------- rewards and advantages at the boundary


class ConstantScorer(RewardScorer):
    def __init__(self, totals):
        super().__init__()
        self.totals = iter(totals)

    def score_group(self, prompt, completions):
        return [Score("P", next(self.totals), {}) for _ in completions]


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_reward_is_refused_naming_the_sample(bad):
    with pytest.raises(ValueError, match=r"an infinite reward .*for sample 3 \(prompt 1: 'P: b'\)"):
        compute_rewards(["P: a", "P: b"], ["x"] * 4, 2, rookworld_task("policy", ConstantScorer([0.0, 1.0, 0.5, bad])))


def test_a_completion_no_function_scored_is_unscorable_as_in_trl():
    """Its total is NaN (TRL 1.16 marks it so), left out of its group's mean, and its advantage is 0."""
    task = rookworld_task("policy", ConstantScorer([0.0, 1.0, 0.5, float("nan")]))
    rewards = compute_rewards(["P: a", "P: b"], ["x"] * 4, 2, task)
    assert rewards.total[:3].tolist() == [0.0, 1.0, 0.5] and rewards.total[3].isnan(), rewards.total
    assert compute_advantages(rewards.total, 2)[3] == 0.0


def test_infinite_reward_is_refused_by_the_advantages_but_nan_is_ignored():
    for fn in (compute_advantages, summarize_advantages):
        with pytest.raises(ValueError, match="sample 2 .group 1."):
            fn(torch.tensor([0.0, 1.0, float("inf"), 0.5]), 2)
    advantages = compute_advantages(torch.tensor([0.0, 1.0, float("nan"), 0.5, 0.7, 0.7]), 3)
    assert torch.isfinite(advantages).all() and advantages[2] == 0.0


def test_a_group_of_one_is_refused():
    rewards = torch.tensor([0.0, 1.0, 0.5])
    for fn in (compute_advantages, summarize_advantages):
        with pytest.raises(ValueError, match="num_generations must be >= 2.*normalize_over_set"):
            fn(rewards, 1)
    assert torch.equal(normalize_over_set(rewards), compute_advantages(rewards, 3))
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        normalize_over_set(torch.tensor([1.0]))


def test_a_live_analysis_is_keyed_by_the_full_fen_clocks_included():
    """Stockfish's evaluation depends on the halfmove clock: the same position with another clock is analysed
    anew, so a score does not depend on what was scored before it."""
    scorer = live_scorer()
    board = chess.Board(LIVE[0])
    board.halfmove_clock = 99
    near_fifty = board.fen()
    first = scorer.analysis_for(LIVE[0])
    scorer.analysis_for(near_fifty)
    assert set(scorer.live) == {chess.Board(LIVE[0]).fen(), near_fifty}
    assert scorer.analysis_for(LIVE[0]) is first  # the same full FEN again: the cached analysis
    scorer.close()
