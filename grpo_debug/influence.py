"""TracIn influence of each training sample on a validation loss, and the experiment that settles its sign.

influence_i = <grad L_train_i, grad L_val>. Gradient descent on sample i with step lr changes the
validation loss by about -lr * influence_i (first order), so influence > 0 means "a step on i lowers
L_val": it helps, whatever the sign convention inside L_val, as long as L_val is a loss to minimise.
Seed 000 flips the sign of `-seq_logprob * advantage` and calls it a fix; `sign_experiment` measures
the prediction against real single-sample SGD steps, so the claim is checked, not argued.

Validation losses (per sequence, averaged):
  seqloss-lastadv   -seq_logprob * advantage     (advantages of the validation samples' own groups)
  seqloss-reward    -seq_logprob * reward        (seed 001: no contrast when every reward is high)
With `val = train batch` (PPO's step_part_I) every score contains the sample's own term
<g_i, g_i> / N_val >= 0 (its own share of L_val), which biases scores upward, most at small batches.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .logprobs import TokenLogProbs, per_token_logps, scoring_kwargs
from .config import StepConfig
from .per_sample import PerSampleGradients, SampleGradients, conv1d_weights, no_autograd_for
from .rollout import Rollout, row_chunks
from .loss import loss_weights
from .update import chunk_loss

VAL_LOSSES = ("seqloss-lastadv", "seqloss-reward")
PARAMETER_SETS = ("all", "blocks", "lora")
SELECTIONS = ("all", "influence>0", "top_half", "bottom_half", "random_half")


def lora_model(model, rank: int = 8, alpha: int = 16):
    """A copy of `model` with peft LoRA adapters on every attention and MLP projection (as the seeds'
    code trained). peft starts B at zero, so the copy scores exactly like `model` and, at this point,
    only the B matrices have a gradient."""
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, fan_in_fan_out=True,
                        target_modules=["c_attn", "c_proj", "c_fc"])
    with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(copy.deepcopy(model), config)


def _in_set(name: str, param_set: str) -> bool:
    if param_set == "all":
        return "lora_" not in name
    if param_set == "blocks":
        return "transformer.h." in name and "lora_" not in name
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
    for name, p in model.named_parameters():
        p.requires_grad_(_in_set(name, param_set))
    try:
        yield
    finally:
        for p, flag in before.items():
            p.requires_grad_(flag)


def validation_loss(logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, rewards: torch.Tensor,
                    kind: str = "seqloss-lastadv", flip_sign: bool = False) -> torch.Tensor:
    """Per-sequence validation losses (N,); their mean is L_val. `flip_sign` is the seed-000 "fix"."""
    seq_logp = (logps * mask).sum(-1)
    if kind == "seqloss-lastadv":
        per_seq = -seq_logp * advantages
    elif kind == "seqloss-reward":
        per_seq = -seq_logp * rewards
    else:
        raise ValueError(f"validation loss must be one of {VAL_LOSSES}, got {kind!r}")
    return -per_seq if flip_sign else per_seq


@dataclass
class ValidationSet:
    rollout: Rollout
    logprobs: TokenLogProbs
    advantages: torch.Tensor
    rewards: torch.Tensor


VAL_SOURCES = ("same_batch", "random", "topk")


def validation_set(step, source: str = "same_batch", size: int = 64, pool: ValidationSet | None = None) -> ValidationSet:
    """same_batch: the training batch itself (PPO's step_part_I). random: `size` fresh samples on held-out
    prompts, advantages within their groups. topk: the `size` best of 2 x size fresh samples, advantages
    normalised over the selected set as one group (seed 000/001: all good samples, no contrast).
    `pool` (a random set) lets several sets share one generation: random takes its first `size`
    samples, topk its best `size`."""
    from .advantages import compute_advantages
    from .evaluation import eval_prompts
    from .logprobs import compute_logprobs
    from .rewards import compute_rewards
    from .rollout import rollout
    run, cfg = step.result, step.cfg
    if source == "same_batch":
        return ValidationSet(run.rollout, run.logprobs, run.advantages.values, run.rewards.total)
    needed = size * (2 if source == "topk" else 1)
    if source not in VAL_SOURCES or needed % cfg.num_generations:
        raise ValueError(f"source must be one of {VAL_SOURCES} and size a multiple of G={cfg.num_generations}")
    if pool is None:
        step.restore_policy()  # the step's own weights, not the updated ones
        val_cfg = cfg.replace(seed=cfg.seed + 1)
        r = rollout(step.policy, step.loaded.tokenizer, val_cfg, eval_prompts(cfg.task, needed // cfg.num_generations))
        rewards = compute_rewards(r.prompts, r.completions, r.num_generations, step.scorer).total
        logprobs = compute_logprobs(step.policy, step.loaded.reference, r, cfg, reference_is_policy=True)
        pool = ValidationSet(r, logprobs, compute_advantages(rewards, cfg.num_generations, cfg.scale_rewards), rewards)
    if needed > pool.rollout.num_samples:
        raise ValueError(f"a {source} set of {size} needs a pool of {needed}, got {pool.rollout.num_samples}")
    if source == "random":
        keep = torch.arange(size)
        advantages = pool.advantages[keep]  # whole groups: their advantages are unchanged
    else:  # the best half of the first 2 x size, as without a pool
        keep = pool.rewards[:needed].argsort(descending=True)[:size].sort().values
        advantages = compute_advantages(pool.rewards[keep], size, cfg.scale_rewards)
    return ValidationSet(pool.rollout.rows(keep), pool.logprobs.rows(keep), advantages, pool.rewards[keep])


def _val_share(model, val: ValidationSet, cfg: StepConfig, kind: str, rows: list[int], flip_sign: bool = False):
    """These rows' share of L_val (the mean over all N_val sequences)."""
    logps = per_token_logps(model, val.rollout.rows(rows), **scoring_kwargs(cfg))
    per_seq = validation_loss(logps, val.logprobs.mask[rows], val.advantages[rows], val.rewards[rows], kind, flip_sign)
    return per_seq.sum() / val.rollout.num_samples


def validation_gradient(model, val: ValidationSet, cfg: StepConfig, kind: str, flip_sign: bool = False):
    """(L_val, {param: dL_val/dparam}) with the model scored as `cfg` says, 8 rows at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    total, grads = 0.0, [torch.zeros_like(p) for p in params]
    torch.manual_seed(0)
    for rows in row_chunks(val.rollout.num_samples):
        share = _val_share(model, val, cfg, kind, rows, flip_sign)
        total += share.item()
        for g, d in zip(grads, torch.autograd.grad(share, params)):
            g += d
    return total, dict(zip(params, grads))


def self_terms(model, train: SampleGradients, val: ValidationSet, cfg: StepConfig, kind: str) -> torch.Tensor:
    """Same-batch only: (N,) each sample's inner product with its OWN share of L_val's gradient,
    <g_train_i, grad(val_loss_i) / N>: the part of influence_i that says "a step on i helps i"."""
    chunks = []
    torch.manual_seed(0)
    for rows in row_chunks(val.rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture():
            _val_share(model, val, cfg, kind, rows).backward()
        chunks.append(hooks.factors())
    model.zero_grad(set_to_none=True)
    return train.inner(SampleGradients(chunks)).float()


def _train_chunks(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig):
    """The hooks of one backward per 8 rows of the GRPO loss (the batch's normalisation kept). No summed
    gradient is needed, so autograd skips the Conv1D weights' (a third of the backward's work)."""
    weights = loss_weights(logprobs.mask, cfg.loss_type, cfg.max_new_tokens)
    torch.manual_seed(0)
    skipped = conv1d_weights(model)
    for rows in row_chunks(rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture(), no_autograd_for(skipped):
            chunk_loss(model, rollout, logprobs, advantages, cfg, rows, weights).backward()
        yield hooks
    model.zero_grad(set_to_none=True)


def per_sample_train_gradients(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor,
                               cfg: StepConfig) -> SampleGradients:
    """Each sample's gradient of its share of the GRPO loss, factored."""
    return SampleGradients([hooks.factors() for hooks in _train_chunks(model, rollout, logprobs, advantages, cfg)])


def batch_influence(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig,
                    val_grad: dict) -> torch.Tensor:
    """(N,) influence of every sample: each chunk's factors are dotted with the validation gradient
    and dropped, so memory stays that of one chunk's backward."""
    chunks = _train_chunks(model, rollout, logprobs, advantages, cfg)
    return torch.cat([SampleGradients.of(hooks).dot(val_grad) for hooks in chunks]).float()


def influence_scores(train: SampleGradients, val_grad: dict) -> torch.Tensor:
    """(N,) <g_train_i, g_val> over the parameters both cover, without building any g_train_i."""
    return train.dot(val_grad).float()


def validation_loss_value(model, val: ValidationSet, cfg: StepConfig, kind: str = "seqloss-lastadv") -> float:
    """L_val (unflipped: the quantity a helpful step lowers), no grad."""
    with torch.no_grad():
        torch.manual_seed(0)
        return sum(_val_share(model, val, cfg, kind, rows).item() for rows in row_chunks(val.rollout.num_samples))


@dataclass
class SignExperiment:
    predicted: torch.Tensor  # (N,) -lr * influence_i
    measured: torch.Tensor  # (N,) L_val after one SGD step on sample i alone, minus L_val before
    spearman: float
    sign_agreement: float  # fraction of moved samples where predicted and measured have the same sign
    lr: float
    moved: int  # samples with a non-zero gradient, over which the two statistics are taken

    def flipped(self) -> "SignExperiment":
        """The seed-000 flip on the same real steps: a negated L_val has a negated gradient, so its
        prediction is exactly minus this one (tested against recomputing it)."""
        return compare(-self.predicted, self.measured, self.lr)


def compare(predicted: torch.Tensor, measured: torch.Tensor, lr: float) -> SignExperiment:
    # a sample with a (near-)zero gradient (advantage ~0, no KL) takes no measurable step: a change below
    # 1e-4 of the largest predicted one is float32 noise in L_val, so it is left out of both statistics
    moved = predicted.abs() > 1e-4 * predicted.abs().max()
    agree = (torch.sign(predicted[moved]) == torch.sign(measured[moved])).float().mean().item()
    return SignExperiment(predicted, measured, _spearman(predicted[moved], measured[moved]), agree, lr,
                          int(moved.sum()))


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    return torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()


def sign_experiment(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig,
                    val: ValidationSet, kind: str = "seqloss-lastadv", flip_sign: bool = False,
                    lr: float = 1e-3) -> SignExperiment:
    """For each sample: predicted change of L_val (-lr * influence) against a real SGD step on it alone.

    The measured L_val always uses the unflipped loss (the quantity we want to go down); `flip_sign`
    only changes the influence used for the prediction, which is what the seed-000 "fix" changes.
    """
    train = per_sample_train_gradients(model, rollout, logprobs, advantages, cfg)
    _, val_grad = validation_gradient(model, val, cfg, kind, flip_sign)
    predicted = -lr * influence_scores(train, val_grad)
    train_grads = train.gradients()
    params = list(train_grads)

    def val_loss() -> float:
        return validation_loss_value(model, val, cfg, kind)

    base = val_loss()
    before = [p.detach().clone() for p in params]
    measured = []
    with torch.no_grad():
        for i in range(rollout.num_samples):
            for p in params:
                p.sub_(lr * train_grads[p][i])
            measured.append(val_loss() - base)
            for p, b in zip(params, before):
                p.copy_(b)
    return compare(predicted, torch.tensor(measured), lr)


def select(scores: torch.Tensor, strategy: str, seed: int = 0) -> torch.Tensor:
    """Indices (sorted) of the training samples a selection strategy keeps."""
    n, order = len(scores), scores.argsort(descending=True)
    if strategy == "all":
        keep = torch.arange(n)
    elif strategy == "influence>0":
        keep = (scores > 0).nonzero().flatten()
    elif strategy == "top_half":
        keep = order[:n // 2]
    elif strategy == "bottom_half":
        keep = order[n - n // 2:]
    elif strategy == "random_half":
        keep = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:n // 2]
    else:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {strategy!r}")
    return keep.sort().values


@dataclass
class SelectionResult:
    strategy: str
    selected: int
    val_loss_before: float
    val_loss_after: float
    reward_before: float  # mean reward on held-out prompts, same sampling seeds before and after
    reward_after: float
    reward_ci_low: float  # 95% bootstrap interval of the paired reward change
    reward_ci_high: float


def selection_experiment(step, val: ValidationSet, scores: torch.Tensor, kind: str = "seqloss-lastadv",
                         strategies=SELECTIONS, eval_prompts: int = 16) -> list[SelectionResult]:
    """For each strategy: one update (the step's optimizer, lr and loss) on the selected samples only,
    then L_val and the held-out reward, against the same model before. The policy is restored after."""
    from .evaluation import eval_prompts as held_out
    step.restore_policy()
    model, run = step.policy, step.result
    cfg = step.cfg.replace(per_sample_grad_norms=False, eval_prompts=eval_prompts)
    prompts = held_out(cfg.task, eval_prompts)
    saved = copy.deepcopy(model.state_dict())
    try:
        return _select_and_update(step, val, scores, kind, strategies, cfg, prompts, saved)
    finally:
        model.load_state_dict(saved)


def _select_and_update(step, val, scores, kind, strategies, cfg, prompts, saved) -> list[SelectionResult]:
    from .evaluation import bootstrap_ci, eval_side
    from .update import update
    model, run = step.policy, step.result
    loss_before = validation_loss_value(model, val, cfg, kind)
    before = eval_side(model, step.loaded.tokenizer, prompts, cfg, step.scorer)
    results = []
    for strategy in strategies:
        keep = select(scores, strategy, cfg.seed)
        after = before
        if len(keep):
            update(model, run.rollout.rows(keep), run.logprobs.rows(keep), run.advantages.values[keep], cfg)
            after = eval_side(model, step.loaded.tokenizer, prompts, cfg, step.scorer)
        low, high = bootstrap_ci(after.per_prompt - before.per_prompt, cfg.bootstrap, cfg.seed)
        results.append(SelectionResult(strategy, len(keep), loss_before, validation_loss_value(model, val, cfg, kind),
                                       before.reward, after.reward, low, high))
        model.load_state_dict(saved)
    return results


@dataclass(frozen=True)
class InfluenceChoice:
    """What the influence is measured against; every field is a toggle of notebook 07."""
    kind: str = "seqloss-lastadv"
    source: str = "random"
    size: int = 16
    param_set: str = "all"
    flip_sign: bool = False


class InfluenceExplorer:
    """Influence of the step's cached samples under any InfluenceChoice. Scores are cached per
    (step config, choice without the sign): flipping the sign negates L_val, hence its gradient, so it
    negates cached scores instead of recomputing. One random pool per config serves every set size."""

    def __init__(self, step, pool_size: int = 128):
        self.step, self.pool_size = step, pool_size
        self._scores: dict = {}
        self._train: dict = {}  # (config, parameter set) -> the batch's factored per-sample gradients
        self._pools: dict = {}
        self._lora = None

    def pool(self) -> ValidationSet:
        if self.step.cfg not in self._pools:
            self._pools = {self.step.cfg: validation_set(self.step, "random", self.pool_size)}  # one config kept
        return self._pools[self.step.cfg]

    def _model(self, param_set: str):
        self.step.restore_policy()
        if param_set != "lora":
            return self.step.policy
        if self._lora is None or self._lora[0] is not self.step.policy:  # rebuilt when the model is reloaded
            self._lora = (self.step.policy, lora_model(self.step.policy))
        return self._lora[1]

    def is_cached(self, choice: InfluenceChoice) -> bool:
        return (self.step.cfg, dataclasses.replace(choice, flip_sign=False)) in self._scores

    def scores(self, choice: InfluenceChoice) -> torch.Tensor:
        key = (self.step.cfg, dataclasses.replace(choice, flip_sign=False))
        if key not in self._scores:
            cfg, run = self.step.cfg, self.step.result
            if choice.source not in VAL_SOURCES or choice.size * (2 if choice.source == "topk" else 1) > self.pool_size:
                raise ValueError(f"{choice.source} {choice.size} needs more than the pool of {self.pool_size}")
            pool = None if choice.source == "same_batch" else self.pool()
            val = validation_set(self.step, choice.source, choice.size, pool)
            model = self._model(choice.param_set)
            with parameter_set(model, choice.param_set):
                train_key = (cfg, choice.param_set)
                if train_key not in self._train:  # one backward for the batch serves every validation set
                    self._train = {k: v for k, v in self._train.items() if k[0] == cfg}  # memory: one config
                    self._train[train_key] = per_sample_train_gradients(model, run.rollout, run.logprobs,
                                                                        run.advantages.values, cfg)
                _, val_grad = validation_gradient(model, val, cfg, choice.kind)
                self._scores[key] = influence_scores(self._train[train_key], val_grad)
        return -self._scores[key] if choice.flip_sign else self._scores[key]
