"""RookWorld text formats: prompts, completions and their parsers.

Policy (P:)       prompt  `P: <FEN> `
                  target  `M: <up to 5 moves> E: <their evals, pawns> B: <best move>`
Environment (A:)  prompt  `A: <FEN>+<move>+<recent moves>+`
                  target  `<next FEN>+<reward>+<terminated>+<truncated>`

Parsers never raise: a malformed completion comes back with `ok=False` and the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import chess

POLICY_PREFIX = "P: "
ENV_PREFIX = "A: "

# RookWorld's environment rewards (the public ArbiterSim generator).
REWARD_LEGAL = 0.001
REWARD_WIN = 1.0
REWARD_DRAW = 0.5
REWARD_ILLEGAL = -1.0

# `legal`: python-chess's default `board.fen()`, the en-passant square only when a capture is legal
# (what RookWorld writes). `fen`: the square after every double push (X-FEN / strict FEN convention).
FEN_CONVENTIONS = ("legal", "fen")
HISTORY_LENGTH = 10
HISTORY_SEPARATOR = ","


def format_eval(pawns: float) -> str:
    """Evaluation in pawns as RookWorld writes it: at most 2 decimals, no trailing zeros."""
    text = f"{pawns:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_reward(reward: float) -> str:
    return f"{reward:g}"


def write_fen(board: chess.Board, convention: str = "legal") -> str:
    if convention not in FEN_CONVENTIONS:
        raise ValueError(f"unknown FEN convention {convention!r}; use one of {FEN_CONVENTIONS}")
    return board.fen(en_passant=convention)


def canonical_fen(fen: str) -> str | None:
    """The FEN in RookWorld's convention, or None if it is not a valid position.

    Two FENs that differ only in the en-passant convention describe the same position and
    get the same canonical form, so comparing canonical FENs compares positions.
    """
    if not isinstance(fen, str) or not fen.strip():
        return None
    try:
        board = chess.Board(fen.strip())
    except ValueError:
        return None
    if board.status() & ~chess.STATUS_VALID & ~chess.STATUS_TOO_MANY_CHECKERS & ~chess.STATUS_IMPOSSIBLE_CHECK:
        return None
    return board.fen()


def same_position(fen_a: str, fen_b: str) -> bool:
    a, b = canonical_fen(fen_a), canonical_fen(fen_b)
    return a is not None and a == b


# ---------------------------------------------------------------- policy task


def policy_prompt(fen: str) -> str:
    return f"{POLICY_PREFIX}{fen} "


def policy_completion(moves: list[str], evals: list[float], best: str) -> str:
    return f"M: {' '.join(moves)} E: {' '.join(format_eval(e) for e in evals)} B: {best}"


@dataclass
class PolicyCompletion:
    ok: bool
    moves: list[str] = field(default_factory=list)
    evals: list[float | None] = field(default_factory=list)
    best: str | None = None
    error: str = ""


_POLICY_RE = re.compile(r"^\s*M:(?P<moves>.*?)E:(?P<evals>.*?)B:(?P<best>.*)$", re.DOTALL)


def _policy_sections(text: str) -> tuple[str, str, str] | None:
    """The texts after M:, the first E: after it, and the first B: after that (what `_POLICY_RE` matches), found
    in one left-to-right pass: the regex backtracks quadratically on 'M:' + ' E:' * n with no B:."""
    start = len(text) - len(text.lstrip())
    if not text.startswith("M:", start):
        return None
    e = text.find("E:", start + 2)
    b = text.find("B:", e + 2) if e >= 0 else -1
    if b < 0:
        return None
    return text[start + 2 : e], text[e + 2 : b], text[b + 2 :]


def _parse_float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_policy_completion(text: str) -> PolicyCompletion:
    """Split `M: ... E: ... B: ...` into moves, evals and the best move (UCI strings, unchecked)."""
    if not isinstance(text, str):
        return PolicyCompletion(ok=False, error=f"completion is {type(text).__name__}, not str")
    sections = _policy_sections(text)
    if sections is None:
        return PolicyCompletion(ok=False, error="missing one of the sections M:, E:, B:")
    moves = sections[0].split()
    evals = [_parse_float(t) for t in sections[1].split()]
    best_tokens = sections[2].split()
    best = best_tokens[0] if best_tokens else None
    errors = []
    if not moves:
        errors.append("no moves after M:")
    if len(evals) != len(moves):
        errors.append(f"{len(moves)} moves but {len(evals)} evals")
    if any(e is None for e in evals):
        errors.append("an eval is not a finite number")
    if best is None:
        errors.append("no move after B:")
    if len(best_tokens) > 1:
        errors.append("trailing text after the best move")
    return PolicyCompletion(ok=not errors, moves=moves, evals=evals, best=best, error="; ".join(errors))


# ---------------------------------------------------------------- environment task


def env_prompt(fen: str, move: str, history: list[str], separator: str = HISTORY_SEPARATOR) -> str:
    return f"{ENV_PREFIX}{fen}+{move}+{separator.join(history[-HISTORY_LENGTH:])}+"


@dataclass
class EnvPrompt:
    fen: str
    move: str
    history: list[str]


def parse_env_prompt(prompt: str, separator: str = HISTORY_SEPARATOR) -> EnvPrompt:
    if not prompt.startswith(ENV_PREFIX) or not prompt.endswith("+") or prompt.count("+") != 3:
        raise ValueError(f"not an A: prompt `A: <FEN>+<move>+<recent moves>+`: {prompt!r}")
    fen, move, history, _ = prompt[len(ENV_PREFIX) :].split("+")
    return EnvPrompt(fen=fen, move=move, history=[m for m in history.split(separator) if m])


@dataclass
class EnvOutcome:
    """The environment's answer to a move: what `env_step` returns and what an A: completion is scored against."""

    next_fen: str
    reward: float
    terminated: bool
    truncated: bool


def env_completion(outcome: EnvOutcome) -> str:
    return f"{outcome.next_fen}+{format_reward(outcome.reward)}+{int(outcome.terminated)}+{int(outcome.truncated)}"


def env_step(board: chess.Board, move_text: str, fen_convention: str = "legal") -> EnvOutcome:
    """Apply `move_text` (UCI) as RookWorld's environment does.

    Illegal or unparsable move: the position stays, reward -1, truncated. Checkmate by the mover:
    reward 1, terminated. A draw by rule (stalemate, insufficient material, 75-move and fivefold
    rules, and the claimable 50-move and threefold rules, which need `board`'s move stack): 0.5,
    terminated. Any other legal move: 0.001.
    """
    fen = write_fen(board, fen_convention)
    try:
        move = chess.Move.from_uci(move_text)
    except (ValueError, TypeError):
        move = None
    if move is None or not board.is_legal(move):
        return EnvOutcome(fen, REWARD_ILLEGAL, terminated=False, truncated=True)
    board.push(move)
    try:
        outcome = board.outcome(claim_draw=True)
        next_fen = write_fen(board, fen_convention)
    finally:
        board.pop()
    if outcome is None:
        reward = REWARD_LEGAL
    elif outcome.winner is None:
        reward = REWARD_DRAW
    else:
        reward = REWARD_WIN
    return EnvOutcome(next_fen, reward, terminated=outcome is not None, truncated=False)


@dataclass
class EnvCompletion:
    ok: bool
    next_fen: str = ""
    reward: float | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    error: str = ""


def _parse_flag(token: str) -> bool | None:
    return {"0": False, "1": True}.get(token.strip())


def parse_env_completion(text: str) -> EnvCompletion:
    if not isinstance(text, str):
        return EnvCompletion(ok=False, error=f"completion is {type(text).__name__}, not str")
    fields = text.strip().split("+")
    if fields and fields[-1] == "" and len(fields) == 5:
        fields = fields[:4]  # tolerate a trailing `+`
    if len(fields) != 4:
        return EnvCompletion(
            ok=False, next_fen=fields[0] if fields else "", error=f"expected 4 `+`-separated fields, got {len(fields)}"
        )
    next_fen, reward, terminated, truncated = fields
    parsed = EnvCompletion(
        ok=True,
        next_fen=next_fen.strip(),
        reward=_parse_float(reward.strip()),
        terminated=_parse_flag(terminated),
        truncated=_parse_flag(truncated),
    )
    errors = []
    if parsed.reward is None:
        errors.append("reward is not a finite number")
    if parsed.terminated is None or parsed.truncated is None:
        errors.append("terminated/truncated must be 0 or 1")
    if canonical_fen(parsed.next_fen) is None:
        errors.append("next FEN is not a valid position")
    parsed.ok = not errors
    parsed.error = "; ".join(errors)
    return parsed


def task_of(prompt: str) -> str:
    if prompt.startswith(POLICY_PREFIX):
        return "P"
    if prompt.startswith(ENV_PREFIX):
        return "A"
    raise ValueError(f"prompt must start with {POLICY_PREFIX!r} or {ENV_PREFIX!r}: {prompt[:40]!r}")
