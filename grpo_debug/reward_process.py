"""The user's reward functions in a process of their own, which the command can stop.

    funcs = reward_process.functions("rewards.py", "REWARD_FUNCS", "--task rewards.py:REWARD_FUNCS")
    funcs[0](prompts=p, completions=c, answer=a)   # called in the worker, within the reward time limit

A `--task FILE.py:NAME` file is imported once per command, in one worker process (spawned: nothing of the command's
torch state is shared); each function is a `RemoteReward` standing in for it here, called with the same keywords
(the prompts, the completions, the dataset's columns, `trainer_state`; `log_extra` and `log_metric` log nothing
there either). A call waits at most the reward time limit (`time_limit.reward_timeout`): past it the worker is
killed and the next call starts a new one, so the limit holds whatever the function does: swallow every signal, sit
in C code holding the GIL, leave a thread running. What the user's code raises (KeyboardInterrupt and sys.exit
included) comes back as an exception of the same name and message; a worker that ends on its own (os._exit, a
crash) is a one-line error naming the function and the rows. Workers are killed when the command exits.

Reward functions passed as Python objects (a notebook's, a Task's) run in the caller's process (`time_limit`).
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import multiprocessing
import sys
import time
from pathlib import Path

from .time_limit import RewardTimeout, reward_timeout

START_SECONDS = 300.0  # the worker's import of the user's file (its own imports: torch, a tokenizer) at most
LOGGERS = ("log_extra", "log_metric")  # TRL's logging keywords: callables, given as no-ops in the worker


class UserError(Exception):
    """What the user's function raised in the worker: `type_name` its exception's class, the message its own."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


def _error_class(type_name: str) -> type:
    """An Exception subclass named as the user's (the one-line reports print `type(e).__name__`)."""
    return type(type_name, (UserError,), {})


# ---------------------------------------------------------------- the worker


def _worker(connection, file: str, name: str, said: str) -> None:
    """Imports `file`, answers with the functions' descriptions, then serves calls until the pipe closes."""
    from .task import callable_name, import_user_file

    try:
        module = import_user_file(file, said)
        if not hasattr(module, name):
            raise ValueError(f"{said}: {file} defines no {name!r}")
        value = getattr(module, name)
        funcs = list(value) if isinstance(value, (list, tuple)) else [value]
        connection.send(("ok", [_described(f, callable_name) for f in funcs], _kinds(value)))
    except BaseException as e:  # the import, whatever it raises: one line back
        connection.send(("error", type(e).__name__, str(e)))
        return
    while True:
        try:
            index, method, kwargs, loggers = connection.recv()
        except (EOFError, OSError):
            return
        kwargs = {**kwargs, **{k: _log_nothing for k in loggers}}
        try:
            func = funcs[index]
            result = func.details(**kwargs) if method == "details" else func(**kwargs)
            connection.send(("ok", _plain(result)))
        except SystemExit as e:
            connection.send(("exit", e.code))
        except BaseException as e:  # KeyboardInterrupt too: the user's, reported as theirs
            connection.send(("raised", type(e).__name__, str(e)))


def _log_nothing(*args, **kwargs) -> None:
    return None


class LazyTrainerState:
    """TRL's `trainer_state` keyword as the worker receives it: its fields, and a real `transformers.TrainerState`
    built from them at the first attribute read (importing transformers takes seconds: a function that never reads
    it, or a worker that never gets it, does not pay them)."""

    def __init__(self, fields: dict):
        self._fields, self._state = fields, None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._state is None:
            from transformers import TrainerState

            self._state = TrainerState(**self._fields)
        return getattr(self._state, name)

    def __reduce__(self):
        return (LazyTrainerState, (self._fields,))


def _portable(value):
    """A keyword as it is sent to the worker: a TrainerState as its fields (`LazyTrainerState`)."""
    if type(value).__name__ == "TrainerState" and dataclasses.is_dataclass(value):
        return LazyTrainerState(dataclasses.asdict(value))
    return value


def _plain(result):
    """A function's result as the parent can read it: tensors and arrays as lists (the parent checks the values)."""
    if hasattr(result, "tolist") and not isinstance(result, (list, tuple)):
        return result.tolist()
    if isinstance(result, (list, tuple)):
        return [v.tolist() if hasattr(v, "tolist") else v for v in result]
    return result


def _described(func, callable_name) -> dict:
    """What the parent needs of a function without it: its name, whether it has `details`, its signature."""
    try:
        signature = inspect.signature(func)
        params = [(p.name, p.kind.value, p.default is p.empty) for p in signature.parameters.values()]
    except (TypeError, ValueError):
        params = None
    return {"name": callable_name(func) if callable(func) else "", "details": callable(getattr(func, "details", None)),
            "params": params, "callable": callable(func), "kind": kind_of(func)}  # fmt: skip


def _kinds(value) -> str:
    return type(value).__name__ if isinstance(value, (list, tuple)) else kind_of(value)


def kind_of(value) -> str:
    """What a value is, in words, for a refusal: its value where short, and its type."""
    shown = repr(value)
    return f"{shown} (type {type(value).__name__})" if len(shown) <= 40 else f"of type {type(value).__name__}"


# ---------------------------------------------------------------- the parent's side


class RewardProcess:
    """One worker for one `file:name`: started at the first use, again after a kill."""

    def __init__(self, file: str, name: str, said: str):
        self.file, self.name, self.said = str(Path(file).resolve()), name, said
        self.process = self.connection = None
        self.described: list[dict] | None = None
        self.container = "list"

    def start(self) -> None:
        """The worker running and its file imported (launched here unless `launch` did it), its functions described."""
        if self.process is None:
            self.launch()
        self._described()

    def launch(self) -> None:
        """The worker spawned; its import of the file goes on while the caller does other work (`start` waits)."""
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        self.process = context.Process(target=_worker, args=(theirs, self.file, self.name, self.said), daemon=True)
        main = sys.modules.get("__main__")
        bare = main is not None and not hasattr(main, "__spec__")  # a Jupyter kernel's __main__: spawn reads it
        if bare:
            main.__spec__ = None
        try:
            self.process.start()
        finally:
            if bare:
                del main.__spec__
        theirs.close()
        self.connection = mine
        _LIVE.add(self)

    def replied(self, seconds: float) -> bool:
        """Whether the worker has answered its start (imported the file, or failed to) within `seconds`."""
        return self.described is not None or (self.connection is not None and self.connection.poll(seconds))

    def _described(self) -> None:
        mine = self.connection
        if not mine.poll(START_SECONDS):
            self.kill()
            raise ValueError(f"{self.said}: importing {self.file} did not end within {START_SECONDS:g} s")
        try:
            reply = mine.recv()
        except (EOFError, OSError):
            code = self.kill()
            raise ValueError(f"{self.said}: importing {self.file} ended its process (exit code {code})") from None
        if reply[0] == "error":
            self.kill()
            raise ValueError(reply[2] if reply[2].startswith(self.said) else f"{self.said}: {reply[2]}")
        self.described, self.container = reply[1], reply[2]

    def kill(self) -> int | None:
        """The worker stopped (SIGKILL: nothing it does can keep it), its exit code."""
        process, self.process = self.process, None
        _LIVE.discard(self)
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        if process is None:
            return None
        if process.is_alive():
            process.kill()
        process.join(5)
        return process.exitcode

    def call(self, index: int, method: str, kwargs: dict):
        """The function `index` (or its `details`) called in the worker with `kwargs`, within the time limit."""
        if self.process is None:
            self.start()
        loggers = [k for k in LOGGERS if k in kwargs]
        sent = {k: _portable(v) for k, v in kwargs.items() if k not in LOGGERS}
        name = self.described[index]["name"]
        rows = len(kwargs.get("completions") or [])
        limit = reward_timeout()
        start = time.monotonic()
        try:
            self.connection.send((index, method, sent, loggers))
            if not self.connection.poll(limit):  # None: wait as long as it takes
                self.kill()
                raise RewardTimeout(f"reward function {name!r}: it did not return within {limit:g} s on {rows} rows "
                                    "(--reward-timeout); its process was stopped")  # fmt: skip
            reply = self.connection.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            code = self.kill()
            raise ProcessEnded(name, f"ended its process (exit code {code}) after {time.monotonic() - start:.1f} s "
                               f"on {rows} row{'' if rows == 1 else 's'}: no rewards came back") from None  # fmt: skip
        except BaseException:  # an alarm of the caller's, a KeyboardInterrupt here: the call is abandoned
            self.kill()
            raise
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "exit":
            raise SystemExit(reply[1])
        raise _error_class(reply[1])(reply[1], reply[2])


class ProcessEnded(ValueError):
    """The worker ended on its own during a call (os._exit, a crash): one line naming the function and the rows;
    `what` the line without the function's name (the caller names it as it knows it)."""

    def __init__(self, name: str, what: str):
        super().__init__(f"reward function {name!r} {what}")
        self.what = what


class RemoteReward:
    """A reward function that runs in a `RewardProcess`: called with the keywords TRL uses; `details` where the
    function has one; its signature the function's own (what the checks read)."""

    bounds_itself = True  # `time_limit.bounded` leaves the limit to the process

    def __init__(self, process: RewardProcess, index: int):
        described = process.described[index]
        self.process, self.index, self.__name__ = process, index, described["name"]
        params = described["params"]
        if params is not None:
            self.__signature__ = inspect.Signature(
                [
                    inspect.Parameter(n, inspect._ParameterKind(k), **({} if empty else {"default": None}))
                    for n, k, empty in params
                ]  # fmt: skip
            )
        if described["details"]:
            self.details = self._details

    def __call__(self, *args, **kwargs):
        kwargs = {**dict(zip(("prompts", "completions"), args)), **kwargs}
        return self.process.call(self.index, "call", kwargs)

    def _details(self, prompts, completions):
        return self.process.call(self.index, "details", {"prompts": prompts, "completions": completions})

    def __repr__(self) -> str:
        return f"<reward function {self.__name__} of {self.process.file}, run in a process of its own>"


_PROCESSES: dict[tuple[str, str], RewardProcess] = {}
_LIVE: set[RewardProcess] = set()


def _registered(file: str, name: str, said: str) -> RewardProcess:
    """The command's one worker for `file:name`, made on first ask, not yet spawned."""
    return _PROCESSES.setdefault((str(Path(file).resolve()), name), RewardProcess(file, name, said))


def process_of(file: str, name: str, said: str) -> RewardProcess:
    """The command's one worker for `file:name`, started (its file imported there once)."""
    process = _registered(file, name, said)
    if process.described is None:
        process.start()
    return process


def launch(file: str, name: str, said: str) -> RewardProcess:
    """The command's worker for `file:name` spawned now, its import of the file overlapping the command's own
    imports; `functions` then waits for it."""
    process = _registered(file, name, said)
    if process.process is None and process.described is None:
        process.launch()
    return process


def functions(file: str, name: str, said: str) -> list:
    """`file`'s `name` as RemoteRewards, one per function; ValueError in one line where the file cannot be
    imported, names no such value, or it is not a reward function nor a non-empty list of them."""
    process = process_of(file, name, said)
    problem = not_functions(name, process.container, process.described)
    if problem:
        raise ValueError(f"{said}: {problem} (def f(prompts, completions, **kwargs) -> one number per completion)")
    return [RemoteReward(process, i) for i in range(len(process.described))]


def not_functions(name: str, container: str, described: list[dict]) -> str | None:
    """Why `name` (a list or tuple of the `described` values, else one value) is not a reward function nor a
    non-empty list of them, or None."""
    if container in ("list", "tuple"):
        if not described:
            return f"{name} is an empty {container}: name a reward function or a list of them"
        bad = next((i for i, f in enumerate(described) if not f["callable"]), None)
        return None if bad is None else f"{name}[{bad}] is {described[bad]['kind']}, not a reward function"
    return (
        None
        if described[0]["callable"]
        else f"{name} is {described[0]['kind']}, not a reward function or a list of them"
    )


@atexit.register  # after multiprocessing's own: its join of a worker that ignores SIGTERM would never end
def stop_all() -> None:
    """Every worker killed and forgotten: at exit, and when a command ends (the next one imports its file anew)."""
    for process in list(_LIVE):
        process.kill()
    _PROCESSES.clear()
