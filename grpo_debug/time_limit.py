"""A user's reward function called with a time limit: each call (a batch, or one row where the row-by-row search
looks for the row an error came from) stops at `seconds`, raising `RewardTimeout` (one line naming the function
and the rows), and a function that timed out is not called again in this process.

    set_reward_timeout(60.0, "--reward-timeout")   # the command line's default; None (the library's): no limit
    bounded(func, "mine.py:closeness", "a batch of 16 rows", lambda: func(prompts=p, completions=c))

How it stops: SIGALRM, armed with `signal.setitimer` around the call and raising an exception of its own (a
BaseException, so that a reward function's `except Exception` does not swallow it) inside the function, at the
next bytecode it runs. The function runs where it was called, in the caller's thread, with the caller's torch
state (no_grad, the CUDA stream): a thread or a process would change that, and a process cannot take a closure
or a model on the GPU. The alarm repeats every second past the limit, so a function that swallows the first
(a bare `except:`) meets the next. A call that returns after the limit (it swallowed every alarm, or sat in C
code) counts as timed out all the same: its rewards are not used.

Its limits, said plainly:
- Only in the main thread, on a system with SIGALRM (Linux, macOS): elsewhere (a thread, Windows) the function is
  called without a limit, and a warning says so once.
- C code that holds the GIL and never returns to Python (a C extension's loop) is not interrupted: the alarm is
  handled when it returns, and the call is then a timeout; one that waits with the GIL released (time.sleep, a
  socket, a subprocess) is interrupted at the limit.
- A function that sets its own SIGALRM handler during the call replaces ours. An ITIMER_REAL armed outside
  (pytest-timeout's signal method) is put back when the call ends, less the time it took; if it fell due during
  the call it fires right after.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
import warnings
from collections.abc import Callable

REPEAT_SECONDS = 1.0  # past the limit, the alarm comes again this often
MAX_SECONDS = 86400.0  # a day: a longer limit is no limit


class RewardTimeout(TimeoutError):
    """A reward function ran past its time limit, or is not called again because it did once (one line)."""


class _Expired(BaseException):
    """Raised by the alarm inside the user's function: not an Exception, so `except Exception` lets it pass."""


_limit: dict = {"seconds": None, "said": "the reward time limit"}
_timed_out: dict[int, tuple[Callable, str]] = {}  # id(func) -> (func, what happened): never called again
_warned: set[str] = set()


def set_reward_timeout(seconds: float | None, said: str = "the reward time limit") -> None:
    """Every later call of a reward function stops after `seconds` (None: no limit); `said` names the setting in
    the timeout's line (the command line's `--reward-timeout`)."""
    if seconds is not None and not (0 < seconds <= MAX_SECONDS):
        raise ValueError(f"{said} {seconds:g}: a number of seconds above 0 and at most {MAX_SECONDS:g}")
    _limit.update(seconds=seconds, said=said)


def reward_timeout() -> float | None:
    return _limit["seconds"]


def forget_timeouts() -> None:
    """Functions that timed out may be called again (a notebook that fixed one)."""
    _timed_out.clear()


def can_interrupt() -> bool:
    """Whether a call here can be stopped at its limit: the main thread, on a system with SIGALRM."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def bounded(func: Callable, name: str, where: str, call: Callable[[], object]):
    """`call()` (which calls `func`), stopped at the limit: RewardTimeout naming `name` and `where` (the rows it
    was called on). A function that timed out before is not called: RewardTimeout at once."""
    if id(func) in _timed_out and _timed_out[id(func)][0] is func:
        raise RewardTimeout(f"reward function {name!r} is not called again: {_timed_out[id(func)][1]}")
    seconds = _limit["seconds"]
    if seconds is None:
        return call()
    if bounds_itself(func):  # a process of its own, stopped at the limit by its caller (`reward_process`)
        try:
            return call()
        except RewardTimeout:
            what = f"it did not return within {seconds:g} s ({_limit['said']}) on {where}"
            _timed_out[id(func)] = (func, what)
            raise RewardTimeout(f"reward function {name!r}: {what}; its process was stopped, and it is not called "
                                "again") from None  # fmt: skip
    if not can_interrupt():
        _warn_once(
            f"reward functions run without a time limit here: {_limit['said']} needs SIGALRM in the main thread "
            f"(this is thread {threading.current_thread().name!r})"
        )
        return call()
    expired, start = False, time.monotonic()
    previous = signal.signal(signal.SIGALRM, _expire)
    outer = signal.setitimer(signal.ITIMER_REAL, 0)  # someone else's timer, put back below
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_SECONDS)
            result = call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # an alarm already due is handled here, inside the try
    except _Expired:
        expired = True
    finally:
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - start), 1e-6), outer[1])
    elapsed = time.monotonic() - start
    if expired or elapsed > seconds:
        what = f"it did not return within {seconds:g} s ({_limit['said']}) on {where}"
        _timed_out[id(func)] = (func, what)
        raise RewardTimeout(f"reward function {name!r}: {what}; stopped, and not called again")
    return result


def bounds_itself(func: Callable) -> bool:
    """Whether `func` (through partials and wrappers that name what they wrap, `__wrapped__`) runs in a process
    of its own that enforces the limit (`reward_process.RemoteReward`): no alarm here, whose window would count
    the worker's start."""
    for _ in range(16):
        if getattr(func, "bounds_itself", False):
            return True
        inner = (
            getattr(func, "func", None) if isinstance(func, functools.partial) else getattr(func, "__wrapped__", None)
        )
        if inner is None:
            return False
        func = inner
    return False


def _expire(signum, frame):
    raise _Expired()


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, stacklevel=3)
