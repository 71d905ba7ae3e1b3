"""Build and load the bundled RookWorld data: `python -m grpo_debug.chess.data build`.

Positions come from two kinds of games, each seeded by its index so a rebuild gives the same files:
- `selfplay`: Stockfish analyses every position (every legal move, fixed depth) and the game
  follows a softmax over those evaluations, with a random move now and then;
- `random`: uniformly random legal moves, which reach odd endgames, draws by rule and mates.
Every analysed position becomes a P: record holding the evaluation of every legal move, so any
completion on it can be scored without an engine. Every move played becomes an A: record, plus a
random legal alternative, an illegal move, and any mating or stalemating move available.
Games are split train / eval / prompts by index; eval and prompt positions never occur in train,
and are re-analysed at a deeper depth.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import chess
from tqdm import tqdm

from ..files import DATA_DIR
from .engine import PositionAnalysis, Stockfish
from .format import (
    HISTORY_LENGTH,
    EnvOutcome,
    env_completion,
    env_prompt,
    env_step,
    policy_completion,
    policy_prompt,
    write_fen,
)


@dataclass
class BuildConfig:
    seed: int = 1234
    selfplay_games: int = 300
    random_games: int = 500
    eval_games: int = 40  # games reserved for the eval split and the notebook prompts
    train_depth: int = 5
    eval_depth: int = 10
    max_plies: int = 160
    max_plies_random: int = 300
    random_move_prob: float = 0.12
    softmax_temperature: float = 0.6  # pawns
    random_analyse_every: int = 10  # plies of a random game between two analysed positions
    illegal_prob: float = 0.12
    alternative_prob: float = 0.5
    eval_positions: int = 600
    eval_env_records: int = 600
    prompt_positions: int = 64
    fen_convention: str = "legal"
    history_separator: str = ","
    workers: int = 2


@dataclass
class GameRecords:
    index: int
    kind: str
    positions: list[dict] = field(default_factory=list)  # analysed P: positions
    env: list[dict] = field(default_factory=list)  # A: transitions


def position_key(board: chess.Board) -> str:
    """Board, side, castling and legal en-passant: the identity of a position, without clocks."""
    return board.epd()


def random_illegal_move(board: chess.Board, rng: random.Random) -> str:
    """A plausible-looking move string that is not legal here."""
    while True:
        kind = rng.random()
        if kind < 0.4:  # a piece of the side not to move
            pieces = [sq for sq, p in board.piece_map().items() if p.color != board.turn]
            move = chess.Move(rng.choice(pieces), rng.randrange(64))
        elif kind < 0.8:  # a piece of the side to move, to a square it cannot reach
            pieces = [sq for sq, p in board.piece_map().items() if p.color == board.turn]
            move = chess.Move(rng.choice(pieces), rng.randrange(64))
        else:  # any two squares
            move = chess.Move(rng.randrange(64), rng.randrange(64))
        if move.from_square != move.to_square and not board.is_legal(move):
            return move.uci()


def env_record(board: chess.Board, move: str, history: list[str], cfg: BuildConfig, kind: str) -> dict:
    outcome = env_step(board, move, cfg.fen_convention)
    return {
        "fen": write_fen(board, cfg.fen_convention),
        "move": move,
        "history": history[-HISTORY_LENGTH:],
        "next_fen": outcome.next_fen,
        "reward": outcome.reward,
        "terminated": outcome.terminated,
        "truncated": outcome.truncated,
        "kind": kind,
    }


def special_moves(board: chess.Board) -> list[tuple[str, str]]:
    """Legal moves that end the game at once by mate, stalemate or insufficient material.

    (Draws by the move-count and repetition rules arise along the played line and are recorded there;
    testing them for every legal move replays the move stack and costs more than the engine.)
    """
    found = []
    for move in board.legal_moves:
        board.push(move)
        if board.is_checkmate():
            found.append((move.uci(), "checkmate"))
        elif board.is_stalemate():
            found.append((move.uci(), "stalemate"))
        elif board.is_insufficient_material():
            found.append((move.uci(), "insufficient_material"))
        board.pop()
    return found


def choose_move(analysis: PositionAnalysis, cfg: BuildConfig, rng: random.Random) -> str:
    moves = list(analysis.evals)
    if rng.random() < cfg.random_move_prob:
        return rng.choice(moves)
    best = max(analysis.evals.values())
    weights = [math.exp((analysis.evals[m] - best) / cfg.softmax_temperature) for m in moves]
    return rng.choices(moves, weights=weights)[0]


def play_game(index: int, kind: str, cfg: BuildConfig, engine: Stockfish | None) -> GameRecords:
    rng = random.Random(cfg.seed * 100_003 + index)
    board = chess.Board()
    history: list[str] = []
    records = GameRecords(index=index, kind=kind)
    for ply in range(cfg.max_plies if kind == "selfplay" else cfg.max_plies_random):
        if board.is_game_over(claim_draw=True):
            break
        analysed = kind == "selfplay" or ply % cfg.random_analyse_every == cfg.random_analyse_every - 1
        if analysed and engine is not None:
            analysis = engine.analyse(board)
            records.positions.append({**analysis.to_json(), "source": kind, "ply": ply})
            move = choose_move(analysis, cfg, rng) if kind == "selfplay" else None
        else:
            move = None
        if move is None:
            move = rng.choice(list(board.legal_moves)).uci()
        records.env.append(env_record(board, move, history, cfg, "played"))
        if rng.random() < cfg.alternative_prob:
            records.env.append(
                env_record(board, rng.choice(list(board.legal_moves)).uci(), history, cfg, "alternative")
            )
        if rng.random() < cfg.illegal_prob:
            records.env.append(env_record(board, random_illegal_move(board, rng), history, cfg, "illegal"))
        for special, termination in special_moves(board):
            if special != move:
                records.env.append(env_record(board, special, history, cfg, termination))
        board.push_uci(move)
        history.append(move)
    return records


def _worker(args: tuple[list[tuple[int, str]], BuildConfig, int]) -> list[GameRecords]:
    games, cfg, depth = args
    with Stockfish(depth=depth) as engine:
        return [play_game(index, kind, cfg, engine) for index, kind in games]


def _game_plan(cfg: BuildConfig) -> list[tuple[int, str]]:
    plan = [(i, "selfplay") for i in range(cfg.selfplay_games)]
    plan += [(cfg.selfplay_games + i, "random") for i in range(cfg.random_games)]
    return plan


def play_all(plan: list[tuple[int, str]], cfg: BuildConfig, depth: int, desc: str) -> list[GameRecords]:
    chunks = [plan[i :: cfg.workers * 8] for i in range(cfg.workers * 8)]
    results: list[GameRecords] = []
    with mp.Pool(cfg.workers) as pool:
        for chunk_result in tqdm(
            pool.imap_unordered(_worker, [(c, cfg, depth) for c in chunks]), total=len(chunks), desc=desc
        ):
            results.extend(chunk_result)
    return sorted(results, key=lambda g: g.index)


def reanalyse(positions: list[dict], depth: int) -> list[dict]:
    with Stockfish(depth=depth) as engine:
        out = []
        for p in tqdm(positions, desc=f"re-analyse at depth {depth}"):
            out.append({**p, **engine.analyse(chess.Board(p["fen"])).to_json()})
        return out


def write_jsonl(path: Path, records: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def dedupe(records: list[dict], key, exclude: set) -> list[dict]:
    seen = set(exclude)
    out = []
    for record in records:
        k = key(record)
        if k not in seen:
            seen.add(k)
            out.append(record)
    return out


def fen_key(fen: str) -> str:
    return position_key(chess.Board(fen))


def env_key(record: dict) -> tuple[str, str]:
    return fen_key(record["fen"]), record["move"]


def build(cfg: BuildConfig, out_dir: Path = DATA_DIR) -> dict:
    start = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = _game_plan(cfg)
    rng = random.Random(cfg.seed)
    eval_indices = set(
        rng.sample([i for i, kind in plan if kind == "selfplay"], cfg.eval_games // 2)
        + rng.sample([i for i, kind in plan if kind == "random"], cfg.eval_games // 2)
    )
    games = play_all(plan, cfg, cfg.train_depth, "games")
    train_games = [g for g in games if g.index not in eval_indices]
    heldout_games = [g for g in games if g.index in eval_indices]

    train_positions = dedupe([p for g in train_games for p in g.positions], lambda p: fen_key(p["fen"]), set())
    train_keys = {fen_key(p["fen"]) for p in train_positions}
    heldout = dedupe([p for g in heldout_games for p in g.positions], lambda p: fen_key(p["fen"]), train_keys)
    random.Random(cfg.seed + 1).shuffle(heldout)
    needed = cfg.eval_positions + cfg.prompt_positions
    if len(heldout) < needed:
        raise RuntimeError(f"only {len(heldout)} held-out positions, need {needed}: raise eval_games")
    heldout = reanalyse(heldout[:needed], cfg.eval_depth)
    prompt_positions, eval_positions = heldout[: cfg.prompt_positions], heldout[cfg.prompt_positions :]

    train_env = dedupe([r for g in train_games for r in g.env], env_key, set())
    train_env_keys = {env_key(r) for r in train_env}
    eval_env = dedupe([r for g in heldout_games for r in g.env], env_key, train_env_keys)
    random.Random(cfg.seed + 2).shuffle(eval_env)
    eval_env = eval_env[: cfg.eval_env_records]

    files = {
        "policy_train": train_positions,
        "policy_eval": eval_positions,
        "policy_prompts": prompt_positions,
        "env_train": train_env,
        "env_eval": eval_env,
    }
    for name, records in files.items():
        write_jsonl(out_dir / f"{name}.jsonl.gz", records)
    with Stockfish(depth=cfg.eval_depth) as engine:
        version = engine.version
    manifest = {
        "config": vars(cfg),
        "stockfish": version,
        "counts": {k: len(v) for k, v in files.items()},
        "env_kinds": _count(r["kind"] for r in train_env + eval_env),
        "position_sources": _count(p["source"] for p in train_positions),
        "build_seconds": round(time.time() - start, 1),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out_dir / "README.md").write_text(data_readme(manifest))
    return manifest


def data_readme(manifest: dict) -> str:
    cfg, counts = manifest["config"], manifest["counts"]
    rows = "\n".join(f"| `{name}.jsonl.gz` | {count} |" for name, count in counts.items())
    return f"""# Bundled RookWorld data

Built by `python -m grpo_debug.chess.data build` (seed {cfg["seed"]}, {manifest["build_seconds"]:.0f} s on 2 cores) with
{manifest["stockfish"]}; `manifest.json` holds every setting. Rebuilding with the same settings gives the same files.

| file | records |
|---|---|
{rows}

## Positions (P: task)
- {cfg["selfplay_games"]} Stockfish self-play games (softmax over the evaluations at temperature
  {cfg["softmax_temperature"]} pawns, a uniformly random move with probability {cfg["random_move_prob"]}) and
  {cfg["random_games"]} random playouts (every {cfg["random_analyse_every"]}th position analysed). Sources of the
  training positions: {manifest["position_sources"]}.
- Every record: `fen`, `depth`, and `evals`: Stockfish's evaluation of **every legal move** (pawns, side to move,
  MultiPV = number of legal moves), best first. The top 5 are the M: list, the first is B:. A forced mate counts
  100 pawns minus the plies to it.
- Depth {cfg["train_depth"]} for `policy_train`; depth {cfg["eval_depth"]} for `policy_eval` and `policy_prompts`
  (the notebook prompt set). Train, eval and prompts come from different games, and no eval or prompt position
  (board, side, castling, en passant) occurs in train.

## Transitions (A: task)
- Fields: `fen`, `move`, `history` (the last {cfg.get("history_length", 10)} moves before `move`), `next_fen`, `reward`,
  `terminated`, `truncated`, `kind`. Prompt `A: <fen>+<move>+<history joined by "{cfg["history_separator"]}">+`,
  completion `<next_fen>+<reward>+<terminated>+<truncated>`.
- FEN convention `{cfg["fen_convention"]}` (python-chess's default `board.fen()`: the en-passant square only when a
  capture is legal); rewards 0.001 legal, 1 mate by the mover, 0.5 draw (stalemate, insufficient material, 50/75-move,
  threefold/fivefold), -1 illegal (position unchanged, truncated = 1).
- Kinds: {manifest["env_kinds"]}.
"""


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


# ---------------------------------------------------------------- loading and text


def load_split(name: str, data_dir: Path = DATA_DIR) -> list[dict]:
    path = data_dir / f"{name}.jsonl.gz"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m grpo_debug.chess.data build`")
    return read_jsonl(path)


def policy_example(record: dict) -> tuple[str, str]:
    """(prompt, ground-truth completion) of a P: record: Stockfish's top 5 and its best move."""
    analysis = PositionAnalysis.from_json(record)
    top = analysis.top5
    return policy_prompt(record["fen"]), policy_completion(top, [analysis.evals[m] for m in top], top[0])


def env_example(record: dict, separator: str = ",") -> tuple[str, str]:
    outcome = EnvOutcome(record["next_fen"], record["reward"], record["terminated"], record["truncated"])
    return env_prompt(record["fen"], record["move"], record["history"], separator), env_completion(outcome)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_debug.chess.data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["build", "stats"])
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    for name, default in vars(BuildConfig()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args(argv)
    if args.command == "build":
        cfg = BuildConfig(**{k: getattr(args, k) for k in vars(BuildConfig())})
        print(json.dumps(build(cfg, args.out), indent=2))
    else:
        print((args.out / "manifest.json").read_text())


if __name__ == "__main__":
    from ..kernels import pin

    pin()  # before torch runs an op: the numbers this script writes are the same on every machine
    main()
