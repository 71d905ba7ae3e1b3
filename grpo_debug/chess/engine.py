"""Stockfish analysis of every legal move of a position: the ground truth of the P: task.

Every engine call has a wall-clock limit, and every analysis starts from a cleared engine (a new game:
`ucinewgame` clears Stockfish's hash and history tables), so a result depends on the position and the
depth only, never on what the engine analysed before or on a restart. Positions that are not legal
chess (`board.is_valid()` fails) or have no legal move never reach the engine: they raise
`PositionError`. An engine that crashes, freezes or answers nonsense is killed and restarted once;
if the retry fails too, `analyse` raises `EngineFailed`. A path that is not a UCI engine raises
`EngineNotFound` naming the path and what is wrong with it.

The engines' I/O runs on one daemon thread (python-chess's `SimpleEngine` runs a non-daemon thread
per engine, which kept the interpreter alive until `close()`); engines still open at exit are closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import stat
import threading
import weakref
from dataclasses import dataclass, field

import chess
import chess.engine

MATE_SCORE_CP = 10_000  # a forced mate is worth 100 pawns, minus the plies to it
ANALYSE_TIMEOUT = 30.0  # seconds per attempt; depth 10 over every legal move takes ~0.6 s (max 1.4 s)
STARTUP_TIMEOUT = 10.0  # seconds for the UCI handshake, python-chess's default
QUIT_TIMEOUT = 1.0
DEFAULT_PATH = "/usr/games/stockfish"
INSTALL_HINT = (
    "Install Stockfish (Debian/Ubuntu: `sudo apt-get install stockfish`; conda: "
    "`conda install -c conda-forge stockfish`) or set STOCKFISH_PATH to the binary."
)


class EngineNotFound(RuntimeError):
    """No usable engine: the path is missing, not an executable file, or not a UCI engine."""


class EngineFailed(RuntimeError):
    """The engine crashed, froze or answered nonsense, and so did its restarted successor."""


class PositionError(ValueError):
    """A position the engine must not see: not legal chess, or no legal move (the game is over)."""


def path_problem(path: str) -> str:
    """What makes `path` unusable as an engine binary, or "" if it is an executable file."""
    if not os.path.exists(path):
        return "no such file"
    if os.path.isdir(path):
        return "is a directory"
    if not os.access(path, os.X_OK):
        return f"is not executable (mode {stat.filemode(os.stat(path).st_mode)})"
    return ""


def check_engine_path(path: str, source: str = "engine path") -> str:
    """`path` (a bare name is looked up on PATH), or EngineNotFound saying what is wrong with it."""
    if os.sep not in path:
        path = shutil.which(path) or path
    problem = path_problem(path)
    if problem:
        raise EngineNotFound(f"{source} {path!r} {problem}. {INSTALL_HINT}")
    return path


def find_stockfish() -> str:
    """STOCKFISH_PATH if set (it must be usable: no silent fallback), else stockfish on PATH or Debian's."""
    configured = os.environ.get("STOCKFISH_PATH")
    if configured:
        return check_engine_path(configured, "STOCKFISH_PATH")
    for path in (shutil.which("stockfish"), DEFAULT_PATH):
        if path and not path_problem(path):
            return path
    raise EngineNotFound(f"Stockfish not found on PATH nor at {DEFAULT_PATH}. {INSTALL_HINT}")


def position_problem(board: chess.Board) -> str:
    """Why the engine must not analyse `board`, or "" if it may."""
    if not board.is_valid():
        flags = [status.name.lower().replace("_", " ") for status in chess.Status if status & board.status()]
        return f"invalid position ({', '.join(flags)})"
    if not any(board.legal_moves):
        return "game over: " + ("checkmate" if board.is_check() else "stalemate")
    return ""


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
    def from_json(cls, record: dict) -> PositionAnalysis:
        return cls(fen=record["fen"], depth=record["depth"], evals=dict(record["evals"]))


# ---------------------------------------------------------------- the I/O thread

_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def _event_loop() -> asyncio.AbstractEventLoop:
    """The daemon thread's loop, one per process (a forked child gets its own: threads do not fork)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            loop.set_exception_handler(_report_unless_engine_death)
            threading.Thread(target=loop.run_forever, name="stockfish-io", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def _report_unless_engine_death(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """asyncio's default report, except for what a killed engine leaves behind and `Stockfish` already
    recovered from: python-chess's futures of the dead command (never awaited once we cancel) and
    its callbacks setting a result on a future that the death already settled."""
    error = context.get("exception")
    if isinstance(error, (chess.engine.EngineTerminatedError, asyncio.InvalidStateError)):
        return
    loop.default_exception_handler(context)


def _call(coro, timeout: float):
    """Run `coro` on the I/O thread; TimeoutError after `timeout` seconds whatever the engine does."""
    future = asyncio.run_coroutine_threadsafe(coro, _event_loop())
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no answer within {timeout:g} s") from None


@dataclass
class _Process:
    transport: asyncio.SubprocessTransport
    protocol: chess.engine.UciProtocol
    owner: int = field(default_factory=os.getpid)  # a forked child must neither use nor kill its parent's engine

    @property
    def ours(self) -> bool:
        return self.owner == os.getpid()

    def call(self, coro, timeout: float):
        return _call(self._unless_exited(coro), timeout)

    async def _unless_exited(self, coro):
        """`coro`, or EngineTerminatedError as soon as the process exits: python-chess leaves an analysis
        whose engine dies before answering `isready` waiting forever."""
        task = asyncio.ensure_future(coro)
        try:
            await asyncio.wait([task, self.protocol.returncode], return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise chess.engine.EngineTerminatedError(
                f"engine process died (exit code {self.protocol.returncode.result()})"
            )
        finally:
            task.cancel()


class _Slot:
    """The current process, shared with the finalizer (which must not hold the Stockfish object)."""

    process: _Process | None = None


def _kill(process: _Process) -> None:
    if process.ours:
        _event_loop().call_soon_threadsafe(process.transport.close)  # closing a running process's transport kills it


def _shut_down(slot: _Slot) -> None:
    """Ask the engine to quit, then kill it whatever it said; never raises."""
    process, slot.process = slot.process, None
    if process is None or not process.ours:
        return
    try:
        process.call(process.protocol.quit(), QUIT_TIMEOUT)
    except Exception:
        pass
    _kill(process)


ENGINE_FAILURES = (chess.engine.EngineError, OSError, TimeoutError)  # EngineTerminatedError is an EngineError


class Stockfish:
    """One engine process; killed and restarted (and the request retried once) if it dies, freezes or errs.

    `timeout` bounds each analysis attempt, `startup_timeout` the UCI handshake. Use as a context
    manager or call `close()`; engines left open are closed when garbage-collected or at exit.
    """

    def __init__(
        self,
        depth: int = 10,
        path: str | None = None,
        hash_mb: int = 16,
        timeout: float = ANALYSE_TIMEOUT,
        startup_timeout: float = STARTUP_TIMEOUT,
    ):
        self.depth = depth
        self.path = check_engine_path(path) if path else find_stockfish()
        self.hash_mb = hash_mb
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.restarts = 0
        self._started_once = False
        self._slot = _Slot()
        weakref.finalize(self, _shut_down, self._slot)  # also runs at interpreter exit

    def _spawn(self) -> _Process:
        process = None
        try:
            process = _Process(*_call(chess.engine.UciProtocol.popen(self.path), self.startup_timeout))
            process.call(process.protocol.initialize(), self.startup_timeout)
            process.call(process.protocol.configure({"Threads": 1, "Hash": self.hash_mb}), self.startup_timeout)
        except ENGINE_FAILURES as e:
            if process is not None:
                _kill(process)
            if not self._started_once:
                raise EngineNotFound(
                    f"{self.path!r} is not a working UCI engine: the handshake failed "
                    f"({type(e).__name__}: {e or 'no reply'}). {INSTALL_HINT}"
                ) from None
            raise
        self._started_once = True
        return process

    def _process(self) -> _Process:
        if self._slot.process is None or not self._slot.process.ours:
            self._slot.process = self._spawn()
        return self._slot.process

    @property
    def pid(self) -> int | None:
        """The running engine's process id (None before the first call and after close())."""
        process = self._slot.process
        return process.transport.get_pid() if process else None

    @property
    def version(self) -> str:
        return self._process().protocol.id.get("name", "Stockfish")

    def analyse(self, board: chess.Board) -> PositionAnalysis:
        problem = position_problem(board)
        if problem:
            raise PositionError(f"{board.fen()}: {problem}")
        failures = []
        for _ in range(2):
            try:
                return self._analyse_once(board)
            except ENGINE_FAILURES as e:
                failures.append(f"{type(e).__name__}: {e}")
                self.restart()
        raise EngineFailed(
            f"analysis of {board.fen()} failed, then failed again after a restart: " + "; ".join(failures)
        )

    def _analyse_once(self, board: chess.Board) -> PositionAnalysis:
        process = self._process()
        # game=object(): a new game every call, so python-chess sends ucinewgame and the hash starts empty
        search = process.protocol.analyse(
            board.copy(), chess.engine.Limit(depth=self.depth), multipv=board.legal_moves.count(), game=object()
        )
        return PositionAnalysis(
            fen=board.fen(), depth=self.depth, evals=_evals(board, process.call(search, self.timeout))
        )

    def restart(self) -> None:
        """Kill the engine; the next call starts a fresh one."""
        process, self._slot.process = self._slot.process, None
        if process is not None:
            _kill(process)
        self.restarts += 1

    def close(self) -> None:
        _shut_down(self._slot)

    def __enter__(self) -> Stockfish:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _evals(board: chess.Board, infos: list[dict]) -> dict[str, float]:
    """Pawns per move, best first; EngineError unless every legal move got a move and a score."""
    evals = {}
    for info in infos:
        if not info.get("pv") or "score" not in info:
            raise chess.engine.EngineError(f"a multipv line without a move or a score: {info}")
        score = info["score"].pov(board.turn).score(mate_score=MATE_SCORE_CP)
        evals[info["pv"][0].uci()] = round(score / 100, 2)
    missing = {move.uci() for move in board.legal_moves} - set(evals)
    if missing:
        raise chess.engine.EngineError(f"no evaluation of {len(missing)} legal moves ({', '.join(sorted(missing))})")
    return dict(sorted(evals.items(), key=lambda kv: -kv[1]))  # stable: engine order breaks ties
