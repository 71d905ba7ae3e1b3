"""TracIn influence of each training sample on a validation loss, and what it means.

influence_i = <g_train_i, grad L_val>, g_train_i = the gradient of sample i's share of the GRPO loss.
An SGD step of size lr on sample i alone changes L_val by about -lr * influence_i (first order), so
influence > 0 means "an SGD step on i lowers L_val", whatever the sign convention inside L_val, as long as
L_val is a loss to minimise. The step's real optimizer is AdamW, whose step is not -lr * g: see
`tracin/optimizer.py` and the measurements in `tracin/first_order.py` and `tracin/selection.py`.

Validation losses (per sequence, averaged over the N_val sequences):
  seqloss-lastadv   -seq_logprob * advantage     (advantages: `VAL_ADVANTAGES`)
  seqloss-reward    -seq_logprob * reward        (the same-batch TracIn report: no contrast when every reward is high)

The same-batch self-term (validation = the training batch, PPO's step_part_I). At step 0 (ratio 1, no
clipping) with beta = 0, both of sample i's gradients lie along G_i = grad seq_logprob_i:
  g_train_i = c_train_i G_i,  c_train_i = -A_i k_i, k_i = the weight of seq_logprob_i in i's loss share (grpo: 1 / (N T_i),
              T_i = i's completion tokens; reinforce_sum: 1 / N)                   (`train_coefficients`)
  g_val_i   = c_val_i G_i,    c_val_i = -a_i / N (lastadv) or -r_i / N (reward)   (`validation_coefficients`)
so self_i = <g_train_i, g_val_i> = (c_val_i / c_train_i) ||g_train_i||^2. For seqloss-lastadv (a_i = A_i)
the ratio is 1 / (N k_i) > 0 (grpo: exactly T_i): self_i = T_i ||g_train_i||^2 >= 0, not <g_i, g_i> / N.
For seqloss-reward the ratio is r_i / (A_i N k_i): self_i has the sign of A_i * r_i, negative for a
below-average sample with a positive reward or an above-average one with a negative reward.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..advantages import normalize_over_set
from ..choices import VAL_LOSSES, VAL_SOURCES
from ..fast.backward import conv1d_weights, no_autograd_for
from ..fast.per_sample import PerSampleGradients, SampleGradients
from ..logprobs import TokenLogProbs
from ..loss import Batch, Normalisation, loss_weights
from ..rollout import ROWS_PER_PASS, Rollout, row_chunks
from ..step import StepRun
from ..update import DROPOUT_SEED, scored_rows_loss
from .specs import StepSpecs

PARAMETER_SETS = ("all", "blocks", "lora")
VAL_ADVANTAGES = ("per_group", "whole_set")
ZERO_TOLERANCE = 1e-6  # |score| <= this x max |score| counts as 0: zero-advantage samples score ~1e-11, not 0


def lora_model(model, rank: int = 8, alpha: int = 16):
    """A copy of `model` with peft LoRA adapters on every attention and MLP projection (as the seeds'
    code trained). peft starts B at zero, so the copy scores exactly like `model` and, at this point,
    only the B matrices have a gradient."""
    from peft import LoraConfig, get_peft_model
    from transformers.pytorch_utils import Conv1D

    conv1d = any(isinstance(m, Conv1D) for m in model.modules())  # GPT-2 stores its projections transposed
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, fan_in_fan_out=conv1d, target_modules="all-linear"
    )  # every projection of every block, found by type
    with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(copy.deepcopy(model), config)


def block_parameter_names(model) -> set[str]:
    """The parameters of the model's stack of transformer blocks, found by module type: the ModuleList holding
    the most parameters (GPT-2's transformer.h, Llama's and Qwen's model.layers)."""
    stacks = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not stacks:
        raise ValueError("parameter set 'blocks' needs a stack of blocks (a ModuleList) in the model; use 'all'")
    name, blocks = max(stacks, key=lambda item: sum(p.numel() for p in item[1].parameters()))
    return {f"{name}.{n}" for n, _ in blocks.named_parameters()}


def _in_set(name: str, param_set: str, blocks: set[str]) -> bool:
    if param_set == "all":
        return "lora_" not in name
    if param_set == "blocks":
        return name in blocks and "lora_" not in name
    return "lora_" in name


@contextmanager
def parameter_set(model, param_set: str = "all"):
    """Only `param_set` requires grad inside the block: 'all' parameters, the transformer 'blocks'
    (no embeddings, no final LayerNorm), or the 'lora' adapters of a `lora_model`."""
    if param_set not in PARAMETER_SETS:
        raise ValueError(f"parameter set must be one of {PARAMETER_SETS}, got {param_set!r}")
    if param_set == "lora" and not any("lora_" in n for n, _ in model.named_parameters()):
        raise ValueError("parameter set 'lora' needs a model with LoRA adapters: use influence.lora_model(model)")
    before = {p: p.requires_grad for p in model.parameters()}
    blocks = block_parameter_names(model) if param_set == "blocks" else set()
    for name, p in model.named_parameters():
        p.requires_grad_(_in_set(name, param_set, blocks))
    try:
        yield
    finally:
        for p, flag in before.items():
            p.requires_grad_(flag)


def validation_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    kind: str = "seqloss-lastadv",
    flip_sign: bool = False,
) -> torch.Tensor:
    """Per-sequence validation losses (N,) from (N, T) log-probs and mask; their mean is L_val.
    `flip_sign` is the TracIn-sign report's "fix"."""
    seq_logp = (logps * mask).sum(-1)
    if kind == "seqloss-lastadv":
        per_seq = -seq_logp * advantages
    elif kind == "seqloss-reward":
        per_seq = -seq_logp * rewards
    else:
        raise ValueError(f"validation loss must be one of {VAL_LOSSES}, got {kind!r}")
    return -per_seq if flip_sign else per_seq


def whole_set_advantages(rewards: torch.Tensor, scale_rewards: str = "group") -> torch.Tensor:
    """(N,) the set's rewards normalised over the whole set as ONE group of N. The TracIn-sign report does this to its
    validation set (`compute_group_advantages(val_scores, 1)`, normalised across the batch by its own account)."""

    return normalize_over_set(rewards, scale_rewards)


@dataclass(frozen=True)
class ValidationSet:
    rollout: Rollout
    logprobs: TokenLogProbs
    advantages: torch.Tensor  # (N_val,)
    rewards: torch.Tensor  # (N_val,)
    name: str = "same_batch"  # e.g. "random 64"
    prompt_set: str = "train"  # the task's named prompt set its prompts come from
    val_advantages: str = "per_group"


def validation_pool(run: StepRun) -> ValidationSet:
    """The pool random and top-k validation sets are cut from: `run`, the step's phases rollout..advantages
    on the 'validation' prompts (`GRPOStep.validation_run(size)`), advantages within their groups."""
    if run.prompt_set != "validation" or run.advantages is None:
        raise ValueError(
            f"a validation pool is a run up to the advantages on the 'validation' prompts "
            f"(step.validation_run(size)); got one on {run.prompt_set!r} prompts"
            + ("" if run.advantages is not None else " without advantages")
        )
    size = run.rollout.num_samples
    return ValidationSet(
        run.rollout, run.logprobs, run.advantages.values, run.rewards.total, f"pool {size}", "validation", "per_group"
    )


def same_batch_set(run) -> ValidationSet:
    """The training batch itself as validation set (PPO's step_part_I), with the step's own advantages."""
    return ValidationSet(run.rollout, run.logprobs, run.advantages.values, run.rewards.total)


def pool_rows(pool: ValidationSet, source: str, size: int, num_generations: int) -> torch.Tensor:
    """The pool's rows a set keeps. random: the first `size` (whole groups); topk: the `size` best by
    reward of the pool's first 2 x size (the two TracIn reports: all good samples, no contrast)."""
    needed = size * (2 if source == "topk" else 1)
    if source not in VAL_SOURCES or needed % num_generations:
        raise ValueError(f"source must be one of {VAL_SOURCES} and size a multiple of G={num_generations}")
    if needed > pool.rollout.num_samples:
        raise ValueError(f"a {source} set of {size} needs a pool of {needed}, got {pool.rollout.num_samples}")
    if source == "random":
        return torch.arange(size)
    return pool.rewards[:needed].argsort(descending=True)[:size].sort().values


def validation_set(
    run,
    source: str = "same_batch",
    size: int = 64,
    pool: ValidationSet | None = None,
    val_advantages: str = "per_group",
) -> ValidationSet:
    """A validation set for the step's `run` (a StepRun). same_batch: the training batch itself. random
    and topk: cut from `pool` (a `validation_pool` on 'validation' prompts; see `pool_rows`).
    `val_advantages`: 'per_group' keeps each sample's advantage within its own generation group (for
    same_batch: the step's advantages); 'whole_set' normalises the set's rewards over the set as one
    group, as the TracIn-sign report did."""
    if val_advantages not in VAL_ADVANTAGES:
        raise ValueError(f"val_advantages must be one of {VAL_ADVANTAGES}, got {val_advantages!r}")
    if source not in VAL_SOURCES:
        raise ValueError(f"source must be one of {VAL_SOURCES}, got {source!r}")
    if source == "same_batch":
        full, keep = same_batch_set(run), torch.arange(run.rollout.num_samples)
    elif pool is None:
        raise ValueError(f"a {source} set is cut from a pool: pass pool=validation_pool(step.validation_run(size))")
    else:
        full, keep = pool, pool_rows(pool, source, size, run.rollout.num_generations)
    rewards = full.rewards[keep]
    advantages = (
        full.advantages[keep]
        if val_advantages == "per_group"
        else whole_set_advantages(rewards, run.config.scale_rewards)
    )
    name = "same_batch" if source == "same_batch" else f"{source} {size}"
    return ValidationSet(
        full.rollout.rows(keep), full.logprobs.rows(keep), advantages, rewards, name, full.prompt_set, val_advantages
    )


def _val_share(model, val: ValidationSet, spec: StepSpecs, kind: str, rows: list[int], flip_sign: bool = False):
    """These rows' share of L_val (the mean over all N_val sequences)."""
    logps = spec.kernels.score_logps(model, val.rollout.rows(rows), spec.scoring)
    per_seq = validation_loss(logps, val.logprobs.mask[rows], val.advantages[rows], val.rewards[rows], kind, flip_sign)
    return per_seq.sum() / val.rollout.num_samples


def validation_gradient(model, val: ValidationSet, spec: StepSpecs, kind: str, flip_sign: bool = False):
    """(L_val, {param: dL_val/dparam}) with the model scored as `spec.scoring` says, 8 rows at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    total, grads = 0.0, [torch.zeros_like(p) for p in params]
    torch.manual_seed(DROPOUT_SEED)
    for rows in row_chunks(val.rollout.num_samples):
        share = _val_share(model, val, spec, kind, rows, flip_sign)
        total += share.item()
        for g, d in zip(grads, torch.autograd.grad(share, params)):
            g += d
    return total, dict(zip(params, grads))


def same_prompt_chunks(rollout: Rollout, size: int = ROWS_PER_PASS) -> list[list[int]]:
    """Runs of at most `size` consecutive rows with one prompt: no-grad scoring computes each run's prompt once."""
    chunks: list[list[int]] = []
    for i in range(rollout.num_samples):
        same = (
            chunks
            and len(chunks[-1]) < size
            and rollout.prompts[rollout.group_of(i)] == rollout.prompts[rollout.group_of(chunks[-1][0])]
        )
        chunks[-1].append(i) if same else chunks.append([i])
    return chunks


def validation_loss_value(model, val: ValidationSet, spec: StepSpecs, kind: str = "seqloss-lastadv") -> float:
    """L_val (unflipped: the quantity a helpful step lowers), no grad."""
    with torch.no_grad():
        torch.manual_seed(DROPOUT_SEED)
        return sum(_val_share(model, val, spec, kind, rows).item() for rows in same_prompt_chunks(val.rollout))


def self_terms(model, train: SampleGradients, val: ValidationSet, spec: StepSpecs, kind: str) -> torch.Tensor:
    """Same-batch only: (N,) each sample's inner product with its OWN share of L_val's gradient,
    <g_train_i, g_val_i>: the part of influence_i that says "a step on i helps i". Measured with hooks."""
    chunks = []
    torch.manual_seed(DROPOUT_SEED)
    for rows in row_chunks(val.rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture():
            _val_share(model, val, spec, kind, rows).backward()
        chunks.append(hooks.factors())
    model.zero_grad(set_to_none=True)
    return train.inner(SampleGradients(chunks)).float()


def train_coefficients(advantages: torch.Tensor, mask: torch.Tensor, spec: StepSpecs) -> torch.Tensor:
    """(N,) c_i with g_train_i = c_i * grad(seq_logprob_i): step 0 (ratio 1, clipping inactive), beta = 0."""
    if spec.loss.beta != 0:
        raise ValueError("with beta != 0 the KL term's gradient is not along grad seq_logprob: no such coefficient")
    weight_sum = loss_weights(mask, spec.loss.loss_type, spec.loss.max_completion_length).sum(
        -1
    )  # (N,) = T_i x per-token weight
    tokens = mask.sum(-1).clamp(min=1)
    per_token = weight_sum if spec.loss.loss_type == "reinforce_sum" else weight_sum / tokens
    return -advantages.double() * per_token.double()


def validation_coefficients(val: ValidationSet, kind: str) -> torch.Tensor:
    """(N_val,) c_i with g_val_i (sample i's share of grad L_val) = c_i * grad(seq_logprob_i)."""
    if kind not in VAL_LOSSES:
        raise ValueError(f"validation loss must be one of {VAL_LOSSES}, got {kind!r}")
    weight = val.advantages if kind == "seqloss-lastadv" else val.rewards
    return -weight.double() / val.rollout.num_samples


def self_terms_from_norms(
    train_squared_norms: torch.Tensor, c_train: torch.Tensor, c_val: torch.Tensor
) -> torch.Tensor:
    """(N,) <g_train_i, g_val_i> = (c_val_i / c_train_i) ||g_train_i||^2; 0 where g_train_i = 0 (A_i = 0)."""
    ratio = torch.where(c_train == 0, torch.zeros_like(c_val), c_val / torch.where(c_train == 0, 1.0, c_train))
    return ratio * train_squared_norms.double()


def _train_chunks(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, spec: StepSpecs):
    """The hooks of one backward per 8 rows of the GRPO loss (the batch's normalisation kept). No summed
    gradient is needed, so autograd skips the Conv1D weights' (a third of the backward's work)."""
    weights = loss_weights(logprobs.mask, spec.loss.loss_type, spec.loss.max_completion_length)
    batch, norm = Batch(rollout, logprobs, advantages), Normalisation(weights)
    torch.manual_seed(DROPOUT_SEED)
    skipped = conv1d_weights(model)
    for rows in row_chunks(rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture(), no_autograd_for(skipped):
            scored_rows_loss(model, batch, spec.scoring, spec.loss, norm, rows, spec.kernels.score)[0].backward()
        yield hooks
    model.zero_grad(set_to_none=True)


def per_sample_train_gradients(
    model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, spec: StepSpecs
) -> SampleGradients:
    """Each sample's gradient of its share of the GRPO loss, factored."""
    return SampleGradients([hooks.factors() for hooks in _train_chunks(model, rollout, logprobs, advantages, spec)])


def batch_influence(
    model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, spec: StepSpecs, val_grad: dict
) -> torch.Tensor:
    """(N,) influence of every sample: each chunk's factors are dotted with the validation gradient
    and dropped, so memory stays that of one chunk's backward."""
    chunks = _train_chunks(model, rollout, logprobs, advantages, spec)
    return torch.cat([SampleGradients.of(hooks).dot(val_grad) for hooks in chunks]).float()


def influence_scores(train: SampleGradients, val_grad: dict) -> torch.Tensor:
    """(N,) <g_train_i, g_val> over the parameters both cover, without building any g_train_i."""
    return train.dot(val_grad).float()


def signs(scores: torch.Tensor, rel_tol: float = ZERO_TOLERANCE) -> torch.Tensor:
    """(N,) -1, 0 or +1, with |score| <= rel_tol x max |score| counted as 0 (float noise, not a sign)."""
    tol = rel_tol * scores.abs().max().item() if len(scores) else 0.0
    return torch.where(scores.abs() <= tol, torch.zeros_like(scores), torch.sign(scores)).long()


def sign_fractions(scores: torch.Tensor, rel_tol: float = ZERO_TOLERANCE) -> dict[str, float]:
    """Fractions of scores > 0, = 0 and < 0 under `signs`' tolerance."""
    s = signs(scores, rel_tol)
    return {
        "> 0": (s > 0).float().mean().item(),
        "= 0": (s == 0).float().mean().item(),
        "< 0": (s < 0).float().mean().item(),
    }
