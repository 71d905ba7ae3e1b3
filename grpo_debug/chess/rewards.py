"""Chess rewards for RookWorld completions, every component returned, never an exception, never a hang.

P: (policy) components, each in [-1, 1]:
  best_move   -1 if B: is missing, unparsable or illegal; else 1 - rank / n_legal, where rank is the
              number of legal moves Stockfish rates strictly better (its best move scores 1).
  candidates  (moves of M: in Stockfish's top 5 - illegal moves of M:) / min(5, n_legal); a move
              listed twice counts once.
  evals       mean over the min(5, n_legal) slots of 1 - min(|E - Stockfish's eval of that move|, 2)
              (pawns); an empty slot, an illegal move or a missing eval scores -1.
  format      1 if M:, E:, B: parse with as many evals as moves and min(5, n_legal) moves, else 0.
  total       clamp(0.5 best_move + 0.3 candidates + 0.2 evals, -1, 1): the public RookWorld
              trainer's weights. An unparsable completion scores -1 on every graded component.
A: (environment) components:
  fen         1 if the next FEN is the right position (en-passant convention ignored), else
              min(0.9, 2 * similarity - 1) with the normalized Levenshtein similarity of the strings.
  reward, terminated, truncated   1 if equal to the truth, else -1.
  format      1 if the four `+`-separated fields parse, else 0.
  total       clamp(0.6 fen + 0.2 reward + 0.1 terminated + 0.1 truncated, -1, 1); unparsable: -1.
The ground-truth completion scores exactly 1.0 on both tasks.

Ground truth comes from the bundled analyses (no engine, deterministic); a position that is not
bundled is analysed by a live Stockfish (one process per scorer; every analysis starts from a cleared
hash, so it does not depend on what the engine did before; a call that crashes or freezes the engine
is cut off after `Stockfish.timeout` seconds, the engine restarted and the call retried once). An A:
prompt is replayed with python-chess; repetition draws need the game's move stack, which a FEN does
not carry, so they are only known for bundled records.

Unscorable P: prompts. A position that python-chess parses but that is not legal chess
(`board.is_valid()` fails: two kings of a colour, a pawn on the first rank, the side not to move in
check, ...), a game-over position (checkmate or stalemate: no legal move, so no answer can be right)
and a position whose live analysis failed on a fresh engine too (crash, no answer within the timeout,
moves missing from the answer) all score like an unparsable completion: best_move, candidates and
evals -1, format 0, total -1, with `Score.error` giving the reason. The score does not depend on the
completion, so the whole group gets it and its advantages are 0: no training signal, as none is
deserved. Invalid and game-over positions never reach the engine.

Unreadable prompts: one bad row of a dataset must not stop a training run, so `score` and `score_group`
never raise for a prompt either. A P: prompt whose FEN python-chess cannot parse scores as above; an A:
prompt that is not `A: <FEN>+<move>+<recent moves>+` or whose FEN python-chess cannot parse scores like an
unparsable A: completion (fen, reward, terminated, truncated -1, format 0, total -1); a prompt of neither
task (another prefix, or not text) scores total -1 with no components (none applies). `Score.error` names
the problem. What raises is the caller's error: an engine path that is not a UCI engine (`EngineNotFound`),
and `analysis_for` or `env_truth_for` called directly on an unreadable FEN or prompt (`UnreadablePrompt`,
a ValueError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import chess
from rapidfuzz.distance import Levenshtein

from .data import env_example, fen_key, load_split
from .engine import EngineFailed, PositionAnalysis, PositionError, Stockfish, position_problem
from .format import (
    ENV_PREFIX,
    POLICY_PREFIX,
    EnvOutcome,
    canonical_fen,
    env_step,
    parse_env_completion,
    parse_env_prompt,
    parse_policy_completion,
    task_of,
)

POLICY_WEIGHTS = {"best_move": 0.5, "candidates": 0.3, "evals": 0.2}
ENV_WEIGHTS = {"fen": 0.6, "reward": 0.2, "terminated": 0.1, "truncated": 0.1}
EVAL_ERROR_CAP = 2.0  # pawns


class UnreadablePrompt(ValueError):
    """A P: or A: prompt the scorer cannot read: a FEN python-chess cannot parse, or a malformed A: prompt."""


@dataclass
class Score:
    task: str
    total: float
    components: dict[str, float]
    error: str = ""


def _clamp(x: float) -> float:
    return max(-1.0, min(1.0, x))


def _weighted(components: dict[str, float], weights: dict[str, float]) -> float:
    return _clamp(sum(w * components[k] for k, w in weights.items()))


def unscorable_policy(reason: str) -> Score:
    """The documented score of a P: prompt without ground truth (see the module docstring)."""
    components = {"best_move": -1.0, "candidates": -1.0, "evals": -1.0, "format": 0.0}
    return Score("P", _weighted(components, POLICY_WEIGHTS), components, reason)


def unscorable_env(reason: str) -> Score:
    """The documented score of an unparsable A: completion, and of every completion of an unreadable A: prompt."""
    components = {"fen": -1.0, "reward": -1.0, "terminated": -1.0, "truncated": -1.0, "format": 0.0}
    return Score("A", -1.0, components, reason)


def unscorable_prompt(reason: str) -> Score:
    """The documented score of a prompt of neither task: total -1, no component applies."""
    return Score("", -1.0, {}, reason)


def _not_a_task_prompt(prompt) -> str:
    """Why `prompt` is neither a P: nor an A: prompt, or "" if it is one."""
    if not isinstance(prompt, str):
        return f"prompt is {type(prompt).__name__}, not str"
    if prompt.startswith((POLICY_PREFIX, ENV_PREFIX)):
        return ""
    return f"prompt starts with neither {POLICY_PREFIX!r} nor {ENV_PREFIX!r}: {prompt[:40]!r}"


def score_policy(analysis: PositionAnalysis, completion: str) -> Score:
    parsed = parse_policy_completion(completion)
    slots = min(5, len(analysis.evals))
    if parsed.best is None and not parsed.moves:
        return unscorable_policy(parsed.error)

    # legal = one of the position's legal moves in standard UCI; python-chess's is_legal would also accept
    # the Chess960 spelling of castling (king takes own rook, e8a8), which no analysis lists
    legal = analysis.evals.__contains__
    if parsed.best is not None and legal(parsed.best):
        best_eval = analysis.evals[parsed.best]
        rank = sum(1 for e in analysis.evals.values() if e > best_eval)
        best_move = 1.0 - rank / len(analysis.evals)
    else:
        best_move = -1.0

    top5 = set(analysis.top5)
    listed = list(dict.fromkeys(parsed.moves))  # first occurrence of each move, in order
    hits = sum(1 for m in listed if m in top5)
    illegal = sum(1 for m in listed if not legal(m))
    candidates = _clamp((hits - illegal) / slots)

    slot_scores = []
    for i in range(slots):
        move = parsed.moves[i] if i < len(parsed.moves) else None
        value = parsed.evals[i] if i < len(parsed.evals) else None
        if move is None or value is None or not legal(move):
            slot_scores.append(-1.0)
        else:
            slot_scores.append(1.0 - min(abs(value - analysis.evals[move]), EVAL_ERROR_CAP))
    evals = sum(slot_scores) / slots

    well_formed = parsed.ok and len(parsed.moves) == slots
    components = {"best_move": best_move, "candidates": candidates, "evals": evals, "format": float(well_formed)}
    error = parsed.error or ("" if well_formed else f"{len(parsed.moves)} moves listed, {slots} expected")
    return Score("P", _weighted(components, POLICY_WEIGHTS), components, error)


def fen_similarity(predicted: str, truth: str) -> float:
    return Levenshtein.normalized_similarity(predicted, truth)


def score_env(truth: EnvOutcome, completion: str) -> Score:
    parsed = parse_env_completion(completion)
    if parsed.reward is None and parsed.terminated is None and not parsed.next_fen:
        return unscorable_env(parsed.error)
    predicted, true = canonical_fen(parsed.next_fen), canonical_fen(truth.next_fen)
    # the same position (either en-passant convention), or, where the position is not valid chess and has no
    # canonical form, the same text: the ground truth of an A: prompt on an invalid position scores 1 too
    exact = (predicted is not None and predicted == true) or parsed.next_fen.strip() == truth.next_fen.strip()
    fen = 1.0 if exact else min(0.9, 2 * fen_similarity(parsed.next_fen, truth.next_fen) - 1)
    reward_ok = parsed.reward is not None and math.isclose(parsed.reward, truth.reward, abs_tol=1e-9)
    components = {
        "fen": fen,
        "reward": 1.0 if reward_ok else -1.0,
        "terminated": 1.0 if parsed.terminated == truth.terminated else -1.0,
        "truncated": 1.0 if parsed.truncated == truth.truncated else -1.0,
        "format": float(parsed.ok),
    }
    return Score("A", _weighted(components, ENV_WEIGHTS), components, parsed.error)


@dataclass
class RewardScorer:
    """Scores (prompt, completion) pairs of either task against bundled or live ground truth."""

    analyses: dict[str, PositionAnalysis] = field(default_factory=dict)  # bundled, by position (no clocks)
    live: dict[str, PositionAnalysis] = field(default_factory=dict)  # analysed here, by full FEN: the halfmove
    # clock changes Stockfish's evaluation (a draw by the 50-move rule nears), so a position seen with another clock
    # is analysed again instead of reusing an answer that depends on what was scored before
    env_truths: dict[str, EnvOutcome] = field(default_factory=dict)
    engine: Stockfish | None = None
    engine_depth: int = 10

    @classmethod
    def bundled(cls, splits: tuple[str, ...] = ("policy_eval", "policy_prompts", "env_eval"), **kwargs) -> RewardScorer:
        scorer = cls(**kwargs)
        for split in splits:
            for record in load_split(split):
                if split.startswith("policy"):
                    scorer.add_analysis(PositionAnalysis.from_json(record))
                else:
                    prompt, _ = env_example(record)
                    scorer.env_truths[prompt] = EnvOutcome(
                        record["next_fen"], record["reward"], record["terminated"], record["truncated"]
                    )
        return scorer

    def add_analysis(self, analysis: PositionAnalysis) -> None:
        self.analyses[fen_key(analysis.fen)] = analysis

    def analysis_for(self, fen: str) -> PositionAnalysis:
        """Bundled, else live. PositionError: not legal chess or game over; EngineFailed: the engine failed twice."""
        try:
            board = chess.Board(fen)
        except ValueError as e:
            raise UnreadablePrompt(f"invalid FEN in P: prompt {fen!r}: {e}") from None
        key = fen_key(fen)
        if key in self.analyses:
            return self.analyses[key]
        full = board.fen()
        if full not in self.live:
            problem = position_problem(board)
            if problem:
                raise PositionError(f"{fen!r}: {problem}")
            if self.engine is None:
                self.engine = Stockfish(depth=self.engine_depth)
            self.live[full] = self.engine.analyse(board)
        return self.live[full]

    def env_truth_for(self, prompt: str) -> EnvOutcome:
        if prompt in self.env_truths:
            return self.env_truths[prompt]
        try:
            parsed = parse_env_prompt(prompt)
        except ValueError as e:
            raise UnreadablePrompt(str(e)) from None
        try:
            board = chess.Board(parsed.fen)
        except ValueError as e:
            raise UnreadablePrompt(f"invalid FEN in A: prompt {parsed.fen!r}: {e}") from None
        return env_step(board, parsed.move)

    def score(self, prompt: str, completion: str) -> Score:
        """The score of one completion; never raises for the prompt or the completion (see the module docstring:
        an unreadable prompt scores -1 like an unparsable completion)."""
        return self.score_group(prompt, [completion])[0]

    def score_group(self, prompt: str, completions: list[str]) -> list[Score]:
        """Completions of one prompt, against one lookup of its ground truth: a group never mixes a
        failed analysis with a later successful retry. An unreadable prompt gives every completion its
        documented score (the module docstring) instead of raising: one bad row does not stop a run."""
        if problem := _not_a_task_prompt(prompt):
            return [unscorable_prompt(f"unscorable prompt: {problem}") for _ in completions]
        if task_of(prompt) == "A":
            try:
                truth = self.env_truth_for(prompt)
            except UnreadablePrompt as e:
                return [unscorable_env(f"unscorable prompt: {e}") for _ in completions]
            return [score_env(truth, c) for c in completions]
        try:
            analysis = self.analysis_for(prompt[len(POLICY_PREFIX) :].strip())
        except PositionError as e:
            return [unscorable_policy(f"unscorable position: {e}") for _ in completions]
        except EngineFailed as e:
            return [unscorable_policy(f"engine analysis failed: {e}") for _ in completions]
        except UnreadablePrompt as e:
            return [unscorable_policy(f"unscorable prompt: {e}") for _ in completions]
        return [score_policy(analysis, c) for c in completions]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
