"""Stockfish analysis of every legal move of a position: the ground truth of the P: task."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import chess
import chess.engine

MATE_SCORE_CP = 10_000  # a forced mate is worth 100 pawns, minus the plies to it
INSTALL_HINT = ("Install Stockfish (Debian/Ubuntu: `sudo apt-get install stockfish`; conda: "
                "`conda install -c conda-forge stockfish`) or set STOCKFISH_PATH to the binary.")


class EngineNotFound(RuntimeError):
    pass


def find_stockfish() -> str:
    candidates = [os.environ.get("STOCKFISH_PATH"), shutil.which("stockfish"), "/usr/games/stockfish"]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise EngineNotFound(f"Stockfish not found. {INSTALL_HINT}")


@dataclass
class PositionAnalysis:
    """Evaluations (pawns, side to move) of every legal move, best first."""
    fen: str
    depth: int
    evals: dict[str, float]

    @property
    def ranked_moves(self) -> list[str]:
        return list(self.evals)

    @property
    def top5(self) -> list[str]:
        return self.ranked_moves[:5]

    def to_json(self) -> dict:
        return {"fen": self.fen, "depth": self.depth, "evals": self.evals}

    @classmethod
    def from_json(cls, record: dict) -> "PositionAnalysis":
        return cls(fen=record["fen"], depth=record["depth"], evals=dict(record["evals"]))


class Stockfish:
    """One engine process; restarted (and the request retried) if it dies."""

    def __init__(self, depth: int = 10, path: str | None = None, hash_mb: int = 16):
        self.depth = depth
        self.path = path or find_stockfish()
        self.hash_mb = hash_mb
        self._engine: chess.engine.SimpleEngine | None = None
        self.restarts = 0

    def _start(self) -> chess.engine.SimpleEngine:
        engine = chess.engine.SimpleEngine.popen_uci(self.path)
        engine.configure({"Threads": 1, "Hash": self.hash_mb})
        return engine

    @property
    def version(self) -> str:
        return self.engine.id.get("name", "Stockfish")

    @property
    def engine(self) -> chess.engine.SimpleEngine:
        if self._engine is None:
            self._engine = self._start()
        return self._engine

    def analyse(self, board: chess.Board) -> PositionAnalysis:
        legal = board.legal_moves.count()
        if legal == 0:
            raise ValueError(f"no legal moves in {board.fen()}: the game is over")
        for attempt in range(2):
            try:
                infos = self.engine.analyse(board, chess.engine.Limit(depth=self.depth), multipv=legal)
                break
            except (chess.engine.EngineTerminatedError, chess.engine.EngineError, BrokenPipeError):
                if attempt:
                    raise
                self.restart()
        evals = {}
        for info in infos:
            move = info["pv"][0].uci()
            evals[move] = round(info["score"].pov(board.turn).score(mate_score=MATE_SCORE_CP) / 100, 2)
        evals = dict(sorted(evals.items(), key=lambda kv: -kv[1]))  # stable: engine order breaks ties
        return PositionAnalysis(fen=board.fen(), depth=self.depth, evals=evals)

    def restart(self) -> None:
        self.close()
        self.restarts += 1

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.quit()
            except (chess.engine.EngineTerminatedError, chess.engine.EngineError, OSError):
                pass
            self._engine = None

    def __enter__(self) -> "Stockfish":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
