"""The task a GRPO step trains on, as a plug-in: named prompt sets and TRL-style reward functions.

The engine (rollout, rewards, evaluation, the CLI, the notebooks) knows a task only through `Task`:
  prompts(prompt_set, n)  the first n prompts of one of PROMPT_SETS, disjoint by construction:
                          'train' the step's prompts, 'validation' the pool TracIn's separate validation
                          sets come from, 'test' held-out prompts for every reward measured after an
                          update. A bad set name or an n out of range raises ValueError naming it.
  reward_funcs            TRL's `reward_funcs`: f(prompts, completions, **kwargs) -> list[float | None],
                          one reward per completion, the prompts repeated once per completion; None means
                          the function does not apply to that completion (TRL: NaN, skipped in the sum).
  reward_weights          TRL's `reward_weights`, one per function (None: all 1).
  held_out                whether the 'test' prompts are held out (a capture opened with your reward
                          functions only repeats its train prompts there).
A reward function may also have a method `details(prompts, completions) -> (rewards, components, errors)`:
the same rewards, named components for the tables ({name: one float per completion, NaN where the
component does not apply}) and one error string per completion ("" when fine). The rewards phase calls it
instead of the function when present, so one scoring pass gives both.

Tasks are registered by name (`register_task`); a factory may be an import string "module:function",
resolved at the first `load_task` of that name, so the engine imports no task's code (the bundled chess
task's included) until that task is used.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROMPT_SETS = ("train", "validation", "test")


@dataclass(frozen=True)
class Task:
    name: str
    prompts: Callable[[str, int], list[str]]  # (prompt_set, n) -> the first n prompts of that set
    reward_funcs: tuple[Callable, ...]  # TRL-style f(prompts, completions, **kwargs) -> list[float | None]
    reward_weights: tuple[float, ...] | None = None  # TRL's reward_weights; None: all 1
    held_out: bool = True  # prompts("test", n) are prompts no step trains on (a capture's repeats are not)
    infinite_as_none: bool = False  # an infinite reward is refused; True: read as None, and its rows recorded

    def __post_init__(self):
        object.__setattr__(self, "reward_funcs", tuple(self.reward_funcs))
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise ValueError(f"task {self.name!r} needs at least one callable reward function")
        if self.reward_weights is not None:
            object.__setattr__(self, "reward_weights", tuple(float(w) for w in self.reward_weights))
            if len(self.reward_weights) != len(self.reward_funcs):
                raise ValueError(
                    f"task {self.name!r}: number of reward weights ({len(self.reward_weights)}) must "
                    f"match number of reward functions ({len(self.reward_funcs)})"
                )
            if not all(math.isfinite(w) for w in self.reward_weights):
                raise ValueError(f"task {self.name!r}: reward weights must be finite, got {self.reward_weights}")

    @property
    def weights(self) -> tuple[float, ...]:
        return self.reward_weights if self.reward_weights is not None else (1.0,) * len(self.reward_funcs)

    def without_infinite(self) -> Task:
        """The task with an infinite reward read as None (the function does not apply there): what the doctor
        scores a step with once it has named the infinite reward, so that every other detector still runs."""
        return dataclasses.replace(self, infinite_as_none=True)

    @property
    def reward_names(self) -> tuple[str, ...]:
        """Each function's name as TRL logs it (`rewards/<name>/mean`); a repeated name gets a suffix _2, _3..."""
        names, seen = [], {}
        for func in self.reward_funcs:
            base = callable_name(func)
            seen[base] = seen.get(base, 0) + 1
            names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
        return tuple(names)


def import_user_file(file: str, said: str):
    """A user's .py file run as a module (their reward functions' file); what importing it raises (a syntax error,
    sys.exit, any exception of theirs) becomes one line, `said` (the argument that named the file) first."""
    from importlib import util
    from pathlib import Path

    spec = util.spec_from_file_location(Path(file).stem, file)
    module = util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ValueError(f"{said}: {file}, line {e.lineno}: {e.msg}") from None
    except SystemExit as e:
        raise ValueError(f"{said}: {file} called sys.exit({e.code!r}) when imported") from None
    except Exception as e:  # the user's module, whatever it raises
        raise ValueError(f"{said}: importing {file} raised {type(e).__name__}: {e}") from None
    return module


def callable_name(func: Callable) -> str:
    """TRL's `get_callable_name`: a partial's wrapped function, else `__name__`, else the class name."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


# ---------------------------------------------------------------- registry

_FACTORIES: dict[str, Callable[[], Task] | str] = {
    "policy": "grpo_debug.chess.task:rookworld_task_policy",
    "env": "grpo_debug.chess.task:rookworld_task_env",
    "mixed": "grpo_debug.chess.task:rookworld_task_mixed",
}
_LOADED: dict[str, Task] = {}


def check_prompt_counts(name: str, needs) -> None:
    """Each (prompt_set, n, what) of `needs` the task `name` must hold, refused naming `what` and n before any
    model loads (the bundled tasks load without torch)."""
    task = load_task(name)
    for prompt_set, n, what in needs:
        try:
            task.prompts(prompt_set, n)
        except ValueError as e:
            raise ValueError(f"{what} {n}: {e}") from None


def register_task(name: str, factory: Callable[[], Task] | str) -> None:
    """Make `name` a task: `factory()` (or the function an import string "module:function" names) builds it.
    Registering a name again replaces it."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a task name must be a non-empty string, got {name!r}")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise ValueError(f"task {name!r}: the factory must be callable or 'module:function', got {factory!r}")
    _FACTORIES[name] = factory
    _LOADED.pop(name, None)


def task_names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def _resolve(factory: Callable[[], Task] | str) -> Callable[[], Task]:
    if callable(factory):
        return factory
    module, _, attribute = factory.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_task(name: str) -> Task:
    """The registered task `name`, built once and then cached."""
    if name not in _LOADED:
        if name not in _FACTORIES:
            raise ValueError(f"task must be one of {', '.join(task_names())}, got {name!r}")
        task = _resolve(_FACTORIES[name])()
        if not isinstance(task, Task):
            raise TypeError(f"the factory of task {name!r} returned {type(task).__name__}, not a Task")
        _LOADED[name] = task
    return _LOADED[name]


def as_task(task: Task | str) -> Task:
    """A Task, or the registered task of that name."""
    return task if isinstance(task, Task) else load_task(task)


class _RegisteredTasks(Sequence):
    """The registered task names, read at each use: `StepConfig.task`'s choices."""

    def __getitem__(self, index):
        return task_names()[index]

    def __len__(self) -> int:
        return len(task_names())

    def __repr__(self) -> str:
        return repr(task_names())


REGISTERED_TASKS = _RegisteredTasks()
