"""Phase 4, advantages: group-relative, exactly as TRL 1.16 computes them.

advantage = (reward - mean of its group) / (std + 1e-4), with the std Bessel-corrected and taken over
the group (`scale_rewards="group"`), over the whole batch (`"batch"`, the mean is still the group's),
or not divided by at all (`"none"`). NaN rewards follow TRL: ignored by the group mean and std, and
their advantage is 0. A group whose rewards are all equal has advantage 0 everywhere: no signal.
A group whose std is tiny but not zero divides noise by almost nothing ("phantom advantages");
`std_floor` clamps the std from below to stop that (not in TRL).

A group needs at least two samples (`num_generations >= 2`, as TRL requires): a group of one has
advantage 0 by construction, which would read as "no signal" rather than as a wrong set-up. To
normalise a set of rewards as one group (a validation set, say), use `normalize_over_set`.
Infinite rewards are refused: they turn the group's std into NaN and every advantage into 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRL_EPS = 1e-4
PHANTOM_STD = 0.05  # a group std below this, yet above 0, amplifies reward noise by > 1 / 0.05


def _nanstd(x: torch.Tensor, dim=None) -> torch.Tensor:
    """Bessel-corrected std ignoring NaN, like `trl.trainer.utils.nanstd`."""
    mean = torch.nanmean(x, dim=dim, keepdim=dim is not None)
    var = torch.nanmean((x - mean) ** 2, dim=dim)
    count = (~torch.isnan(x)).sum(dim=dim)
    return torch.sqrt(var * count / (count - 1))


def group_std(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    return _nanstd(rewards.view(-1, num_generations), dim=1)


def check_rewards(rewards: torch.Tensor, num_generations: int) -> None:
    """ValueError unless the rewards form groups of G >= 2 and none is infinite (NaN is allowed, as in TRL)."""
    if num_generations < 2:
        raise ValueError(
            f"num_generations must be >= 2, got {num_generations}: GRPO normalises each reward "
            f"within its group, and a group of one has advantage 0 whatever its reward. To "
            f"normalise a set of rewards as one group, use normalize_over_set(rewards)"
        )
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(
            f"rewards must be 1-D with a multiple of num_generations={num_generations} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    infinite = torch.isinf(rewards).nonzero().flatten().tolist()
    if infinite:
        i = infinite[0]
        raise ValueError(
            f"reward {rewards[i].item()} for sample {i} (group {i // num_generations}) and "
            f"{len(infinite) - 1} more: rewards must be finite (NaN means 'no reward' and is ignored)"
        )


def compute_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group", std_floor: float = 0.0
) -> torch.Tensor:
    check_rewards(rewards, num_generations)
    rewards = rewards.float()
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std = group_std(rewards, num_generations).repeat_interleave(num_generations)
    elif scale_rewards == "batch":
        std = _nanstd(rewards).expand_as(rewards)
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std.clamp(min=std_floor) + TRL_EPS)
    return torch.nan_to_num(advantages, nan=0.0)


def normalised_sum(per_function: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(N,) the weighted sum over functions of each function's reward normalised within its group,
    (r_k - mean_k) / (std_k + 1e-4), from per_function (N, F) rewards (NaN: None) and weights (F,); NaN where no
    function scored the completion."""
    per_function = per_function.float()
    grouped = per_function.view(-1, num_generations, per_function.shape[1])  # (B, G, F)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = _nanstd(grouped, dim=1).unsqueeze(1)
    normalised = ((grouped - mean) / (std + TRL_EPS)).view_as(per_function)
    summed = (normalised * weights.float()).nansum(1)
    summed[torch.isnan(per_function).all(1)] = float("nan")
    return summed


def normalize_then_sum(per_function: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL 1.16's `multi_objective_aggregation="normalize_then_sum"`: each function normalised within its group,
    the weighted sum over functions (`normalised_sum`), that sum normalised over the batch. Each function carries
    the same within-group scale whatever its units; `scale_rewards` does not act. Unscorable: advantage 0."""
    check_rewards(per_function.nansum(1), num_generations)
    return over_the_batch(normalised_sum(per_function, weights, num_generations))


def over_the_batch(summed: torch.Tensor) -> torch.Tensor:
    """(N,) `normalised_sum` normalised over the batch: normalize_then_sum's advantages (NaN: 0)."""
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (_nanstd(summed) + TRL_EPS), nan=0.0)


def normalize_over_set(rewards: torch.Tensor, scale_rewards: str = "group", std_floor: float = 0.0) -> torch.Tensor:
    """Advantages of a set of rewards taken as one group (at least two of them): the set's mean and std."""
    return compute_advantages(rewards.flatten(), rewards.numel(), scale_rewards, std_floor)


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # (N,)
    group_mean: torch.Tensor  # (B,)
    group_std: torch.Tensor  # (B,)
    reward: float  # TRL metric names from here on
    reward_std: float
    frac_reward_zero_std: float  # TRL's: groups whose divisor std is 0 (under "batch": all or none)
    zero_std_groups: list[int]  # groups whose std is 0 (TRL's isclose): advantage 0 under every scale_rewards
    rounding_std_groups: list[int]  # identical rewards, yet float rounding of the mean leaves a std of ~1e-8,
    # which TRL's isclose(std, 0) (atol 1e-8) counts as varied: their advantages are rounding noise
    phantom_groups: list[int]  # groups with a reward std divided by 0 < divisor < PHANTOM_STD: amplified noise
    max_abs_advantage: float


def summarize_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    std_floor: float = 0.0,
    per_function: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Advantages:
    """The advantages of the summed `rewards` (N,), and what shapes them. `per_function` ((N, F) rewards, (F,)
    weights): TRL's normalize_then_sum from them instead (its groups and their stds are still the sum's)."""
    if per_function is not None:
        check_rewards(per_function[0].nansum(1), num_generations)
        summed = normalised_sum(*per_function, num_generations)
        values = over_the_batch(summed)
    else:
        values = compute_advantages(rewards, num_generations, scale_rewards, std_floor)
    std = group_std(rewards, num_generations)
    zero = torch.isclose(std, torch.zeros_like(std))  # TRL's test of a zero std: advantage 0 under every scaling
    grouped = rewards.view(-1, num_generations)
    rounding = (grouped == grouped[:, :1]).all(1) & ~zero  # e.g. eight float32 copies of 0.7314: std 6.4e-8
    trl_zero = zero  # TRL's frac_reward_zero_std reads the std it divides by: the batch's under "batch"
    divisor = std
    if per_function is not None:  # each function's group std divides its own rewards; the sum's batch std, the sum
        per_std = _nanstd(per_function[0].float().view(-1, num_generations, per_function[0].shape[1]), dim=1)
        batch_std = _nanstd(summed)
        trl_zero = torch.isclose(batch_std, torch.zeros_like(batch_std)).expand_as(std)
        per_zero = torch.isclose(per_std, torch.zeros_like(per_std))
        phantom = (~per_zero & (per_std < PHANTOM_STD)).any(1)
    else:
        if scale_rewards == "batch":
            batch_std = _nanstd(rewards.float())
            trl_zero = torch.isclose(batch_std, torch.zeros_like(batch_std)).expand_as(std)
            divisor = batch_std.expand_as(std)
        divisor = divisor.clamp(min=std_floor)
        amplifies = scale_rewards != "none"
        phantom = ~zero & (divisor > 0) & (divisor < PHANTOM_STD) & amplifies
    return Advantages(
        values=values,
        group_mean=torch.nanmean(rewards.view(-1, num_generations).float(), dim=1),
        group_std=std,
        reward=torch.nanmean(rewards.float()).item(),
        reward_std=_nanstd(rewards.float()).item(),
        frac_reward_zero_std=trl_zero.float().mean().item(),
        zero_std_groups=zero.nonzero().flatten().tolist(),
        rounding_std_groups=rounding.nonzero().flatten().tolist(),
        phantom_groups=phantom.nonzero().flatten().tolist(),
        max_abs_advantage=values.abs().max().item(),
    )


def groups_without_signal(adv: Advantages) -> torch.Tensor:
    """(B,) bool: the groups whose advantages are all 0, TRL's zero std or equal rewards whose float32 mean rounds."""
    out = torch.zeros(len(adv.group_std), dtype=torch.bool)
    out[adv.zero_std_groups + adv.rounding_std_groups] = True
    return out


def advantages_of(cfg, rewards, weights: tuple[float, ...]) -> Advantages:
    """The advantages a `StepConfig` computes from the rewards phase's `Rewards` and the task's reward weights."""
    per_function = None
    if cfg.multi_objective_aggregation == "normalize_then_sum":
        per_function = (
            torch.stack(list(rewards.per_function.values()), dim=1),
            torch.tensor(weights, device=rewards.total.device),
        )
    return summarize_advantages(rewards.total, cfg.num_generations, cfg.scale_rewards, cfg.std_floor, per_function)
