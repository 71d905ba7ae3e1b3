"""Phase 3, rewards: the task's reward functions on every (prompt, completion), summed as TRL sums them.

Sample i belongs to prompt i // G. Each reward function gets the prompts repeated once per completion, as
in TRL's `_calculate_rewards`; a None reward becomes NaN. The total is TRL 1.16's default
`multi_objective_aggregation="sum_then_normalize"` before its normalisation: the NaN-skipping sum over
functions of weight * reward. A completion for which every function returned None is unscorable: its total is
NaN, as TRL 1.16 marks it (left out of its group's mean and std; advantage 0). An infinite reward, which TRL only
warns about (it turns its group's advantages into 0, or into -3.4e38 under `scale_rewards="none"`), is refused
here, naming the sample and its prompt.

Components, for the tables: what each function's `details` reports, else the function's own reward under
its name; a component name two functions report is prefixed with the function's name (`name/component`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .reward_process import ProcessEnded
from .task import Task, as_task
from .time_limit import RewardTimeout, bounded


@dataclass(frozen=True)
class Rewards:
    total: torch.Tensor  # (N,) float32, what the advantages see; NaN: unscorable (no function scored it)
    components: dict[str, torch.Tensor]  # name -> (N,), NaN where a component does not apply to a sample
    errors: list[str]  # why a completion was malformed ("" when it parsed)
    seconds: float
    per_function: dict[str, torch.Tensor] = field(default_factory=dict)  # reward function -> (N,), NaN: None
    infinite: dict[str, list[int]] = field(default_factory=dict)  # function -> rows read as None (`infinite_as_none`)

    def to(self, device: torch.device | str) -> Rewards:
        """The same rewards on `device` (the policy's, where the step's other tensors live)."""
        move = lambda named: {name: v.to(device) for name, v in named.items()}
        return dataclasses.replace(
            self, total=self.total.to(device), components=move(self.components), per_function=move(self.per_function)
        )


def _as_floats(values, what: str, n: int) -> torch.Tensor:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{what} returned {type(values).__name__}, not a list of one number per completion")
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{what} returned {len(values)} values, but {n} were expected (one per completion)")
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, numbers.Real) and not (isinstance(v, torch.Tensor) and v.numel() == 1):
            raise ValueError(f"{what} returned {v!r} for row {i}: not a number or None")
    return torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)


def _called(func, name: str, prompts: list, completions: list):
    """`func` called as TRL calls it, within the time limit (`time_limit.bounded`: RewardTimeout naming the function
    and the rows, and it is not called again); an exception (or a sys.exit) of the user's becomes one line naming
    the function and the first row it fails on (found by calling it row by row, only once it failed, each row
    within the limit: a row that times out ends the search with that timeout)."""
    try:
        return _bounded_call(func, name, prompts, completions, batch_of(len(completions)))
    except RewardTimeout:
        raise
    except ProcessEnded as e:  # a row alone would not say more, and would start the process again
        raise ValueError(f"reward function {name!r} {e.what}") from None
    except (Exception, SystemExit) as e:
        row = next(
            (i for i in range(len(completions)) if _fails(func, name, prompts, completions, i, e)),
            None,
        )
        where = f" on row {row} ({str(completions[row])[:60]!r})" if row is not None else ""
        what = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else f"raised {type(e).__name__}: {e}"
        defined = "" if ".py:" in name else _defined_in(func)  # a --task FILE.py:NAME names its file already
        raise ValueError(f"reward function {name!r}{defined} {what}{where}") from None


def _defined_in(func) -> str:
    """' (file.py:line)' where the function's source file is known, else ''."""
    try:
        file, line = inspect.getsourcefile(func), inspect.getsourcelines(func)[1]
    except (TypeError, OSError):  # a builtin, a class instance, a function typed in: no file to name
        return ""
    return f" ({Path(file).name}:{line})" if file else ""


def batch_of(n: int) -> str:
    return f"a batch of {n} row{'' if n == 1 else 's'}"


def _bounded_call(func, name: str, prompts: list, completions: list, where: str):
    return bounded(func, name, where, lambda: func(prompts=prompts, completions=completions))


def _fails(func, name: str, prompts: list, completions: list, i: int, error: BaseException) -> bool:
    """Whether `func` fails on row i alone; a timeout there ends the search (RewardTimeout names the row)."""
    said = f"{type(error).__name__}" if not isinstance(error, SystemExit) else "sys.exit"
    where = f"row {i} ({str(completions[i])[:60]!r}) alone, called to find the row its {said} came from"
    try:
        _bounded_call(func, name, prompts[i : i + 1], completions[i : i + 1], where)
    except RewardTimeout:
        raise
    except (Exception, SystemExit):
        return True
    return False


def call_reward(func, name: str, prompts: list[str], completions: list[str], completion_ids=None):
    """(rewards (N,), components {name: (N,)}, errors [N]) of one reward function: its `details` when it has
    one, else the function itself (its reward is then its one component). A function with `takes_completion_ids`
    (the doctor's probe) also gets `completion_ids`, each completion's token ids as TRL passes them."""
    n = len(completions)
    if getattr(func, "takes_completion_ids", False):
        if completion_ids is None:
            raise ValueError(f"reward function {name!r} reads completion_ids, which this scoring does not have")
        func = functools.partial(func, completion_ids=completion_ids)
    details = getattr(func, "details", None)
    if callable(details):
        where = f"{batch_of(n)} (its details method)"
        rewards, components, errors = bounded(func, name, where, lambda: details(prompts, completions))
        if len(errors) != n:
            raise ValueError(f"reward function {name!r} gave {len(errors)} errors for {n} completions")
        components = {k: _as_floats(v, f"component {k!r} of {name!r}", n) for k, v in components.items()}
        return _as_floats(rewards, f"reward function {name!r}", n), components, list(errors)
    rewards = _as_floats(_called(func, name, prompts, completions), f"reward function {name!r}", n)
    return rewards, {name: rewards}, [""] * n


def _merge_components(reported: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    counts: dict[str, int] = {}
    for components in reported.values():
        for k in components:
            counts[k] = counts.get(k, 0) + 1
    return {
        (k if counts[k] == 1 else f"{func}/{k}"): v
        for func, components in reported.items()
        for k, v in components.items()
    }


def _merge_errors(per_function: dict[str, list[str]]) -> list[str]:
    if len(per_function) == 1:
        return next(iter(per_function.values()))
    return [
        "; ".join(f"{name}: {e}" for name, errors in per_function.items() if (e := errors[i]))
        for i in range(len(next(iter(per_function.values()))))
    ]


def _refuse_infinite(values: torch.Tensor, names: tuple[str, ...], prompts: list[str], G: int) -> None:
    """values (N, F): an infinite reward is the task's bug: name it."""
    infinite = torch.isinf(values).any(1).nonzero().flatten().tolist()
    if infinite:
        i = infinite[0]
        row = ", ".join(f"{name}={v:g}" for name, v in zip(names, values[i].tolist()))
        raise ValueError(
            f"an infinite reward (or one past float32's range, 3.4e38) for sample {i} (prompt {i // G}: "
            f"{prompts[i // G][:80]!r}): {row}; and "
            f"{len(infinite) - 1} more samples: a reward must be a finite number, or None where it does not apply"
        )


def compute_rewards(
    prompts: list[str], completions: list[str], num_generations: int, task: Task | str, completion_ids=None
) -> Rewards:
    """Score sample i against prompt i // num_generations with every reward function of `task`; `completion_ids`
    (each completion's token ids, up to its EOS) for a function that reads them (`call_reward`)."""
    start = time.perf_counter()
    task, G = as_task(task), num_generations
    if len(completions) != len(prompts) * G:
        raise ValueError(f"{len(completions)} completions for {len(prompts)} prompts x {G} generations")
    repeated = [prompts[i // G] for i in range(len(completions))]
    per_function, reported, errors = {}, {}, {}
    for name, func in zip(task.reward_names, task.reward_funcs):
        per_function[name], reported[name], errors[name] = call_reward(
            func, name, repeated, completions, completion_ids
        )
    values = torch.stack(list(per_function.values()), dim=1)  # (N, F)
    infinite = {
        name: torch.isinf(values[:, k]).nonzero().flatten().tolist() for k, name in enumerate(task.reward_names)
    }
    if not task.infinite_as_none:
        _refuse_infinite(values, task.reward_names, prompts, G)
    values = torch.where(torch.isinf(values), float("nan"), values)
    per_function = {name: values[:, k] for k, name in enumerate(task.reward_names)}
    total = (values * torch.tensor(task.weights, dtype=torch.float32)).nansum(dim=1)
    total[torch.isnan(values).all(1)] = float("nan")  # unscorable, as TRL 1.16 marks it
    return Rewards(
        total=total,
        components=_merge_components(reported),
        errors=_merge_errors(errors),
        seconds=time.perf_counter() - start,
        per_function=per_function,
        infinite={name: rows for name, rows in infinite.items() if rows},
    )


class StoredReward:
    """A reward function that returns stored values of known completions, by text (a captured step's
    rewards, where the run's own functions were not given)."""

    def __init__(self, name: str, table: dict[tuple[str, str], float | None]):
        self.__name__, self.table = name, table

    def __call__(self, prompts, completions, **kwargs):
        missing = [(p, c) for p, c in zip(prompts, completions) if (p, c) not in self.table]
        if missing:
            raise ValueError(
                f"reward {self.__name__!r} is known only for the captured completions; {len(missing)} "
                "are new: open the capture with your reward functions (task=[...]) to score them"
            )
        return [self.table[(p, c)] for p, c in zip(prompts, completions)]
