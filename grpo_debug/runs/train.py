"""Beyond one step: K GRPO steps per arm, the arms paired, the held-out reward every E steps.

An arm is a config (the `fixed` preset and its changes, or another preset) and, optionally, TracIn
selection. Step t of seed s samples the training prompts t*B.. (cycling through `train_prompts`) with
sampling seed `TRAIN_SEED_STRIDE * s + t` in every arm, so the arms differ only where their configs do.
Each step is the engine's own phases (`GRPOStep.run` up to the update), then `GRPOStep.advance`: the
updated weights become the next step's start, the reference stays the initial model, and one AdamW
carries on from step to step as TRL's does (at a constant learning rate: TRL's default schedule decays
it linearly to 0 over the run). Every `eval_every` steps, and before the first, the policy samples the
task's test prompts (never a training or validation prompt; the validation prompts instead where a run
chooses a setting, `eval_set`) with fixed seeds, the same in every arm.

TracIn-selected GRPO (the two TracIn reports): each step, every sample's influence on a validation loss
(same batch, or a random or top-k-by-reward set of fresh samples of the validation prompts), then the
update on the selected samples only, their loss normalised over themselves as the seeds' trainers did.

Arms: `arms.py`; the progress file and checkpoints: `progress.py`; the verdicts: `results.py`.
Results go to a JSON-lines progress file as they come, with the weights and AdamW state checkpointed at
every evaluation, so an interrupted comparison resumes where it stopped and gives the same numbers.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import StepConfig
from ..evaluation import eval_side
from ..show.diagnostics import triage_zero_loss
from ..show.metrics import metrics
from ..specs import eval_sampling_of
from ..speed import kernels
from ..step import GRPOStep, StepRun
from ..tracin.first_order import scores_for
from ..tracin.influence import (
    influence_scores,
    per_sample_train_gradients,
    validation_gradient,
    validation_pool,
    validation_set,
)
from ..tracin.selection import select
from ..tracin.specs import specs_of
from .arms import TRAIN_SEED_STRIDE, Arm, Selection, check_plan, step_config
from .progress import Progress, _lock
from .results import summarize

LOGGED = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/region_mean",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "grad_norm",
    "loss",
    "completions/mean_length",
    "completions/clipped_ratio",  # TRL's names, from `metrics.metrics`; then this suite's
    "logps/max_sampler_gap",
)


def influence(step: GRPOStep, run: StepRun, sel: Selection) -> tuple[torch.Tensor, float]:
    """(N,) each training sample's influence on the validation loss, and that loss."""
    spec = specs_of(run.config)
    if sel.source == "same_batch":
        val = validation_set(run, "same_batch")
    else:
        pool = validation_pool(step.validation_run(sel.size * (2 if sel.source == "topk" else 1), run.config))
        val = validation_set(run, sel.source, sel.size, pool)
    val_loss, val_grad = validation_gradient(step.policy, val, spec, sel.kind, sel.flip_sign)
    train = per_sample_train_gradients(step.policy, run.rollout, run.logprobs, run.advantages.values, spec)
    scores = (
        influence_scores(train, val_grad)
        if sel.score == "tracin"
        else scores_for(train.gradients(), val_grad, spec, sel.score)
    )
    return scores, val_loss


def train_step(step: GRPOStep, cfg: StepConfig, sel: Selection | None) -> dict:
    """One GRPO step of `step` under `cfg` (TracIn-selected when `sel`), then `advance`; its record."""
    start = time.perf_counter()
    if sel is None:
        run = step.run(cfg, until="update")
        extra = {}
    else:
        run = step.run(cfg, until="loss")
        scores, val_loss = influence(step, run, sel)
        keep = select(scores, sel.keep, cfg.seed)
        if len(keep):
            run = step.update_rows(keep)
        extra = {"selected_fraction": len(keep) / len(scores), "val_loss": val_loss}
    numbers = metrics(run)
    record = {k: numbers[k] for k in LOGGED if k in numbers}
    record.update(extra, triage=triage_zero_loss(run), seconds=time.perf_counter() - start)
    step.advance()
    return record


def held_out(step: GRPOStep, base: StepConfig, prompts: int, prompt_set: str = "test") -> dict:
    """The policy's mean reward on the first `prompts` test prompts (or validation prompts, to choose a setting
    without looking at the test set), sampled with the base config's seed."""
    tokenizer, generate = step.loaded.tokenizer, kernels(base.fast).generate
    chosen = step.task.prompts(prompt_set, prompts)
    side = eval_side(step.policy, tokenizer, chosen, eval_sampling_of(base), step.task, generate)
    return {"reward": side.reward, "per_prompt": side.per_prompt.tolist()}


def run_arm(
    arm: Arm,
    seed: int,
    base: StepConfig,
    steps: int,
    eval_every: int,
    eval_prompts_n: int,
    train_prompts: int,
    progress: Progress,
    bar,
    eval_set: str = "test",
) -> None:
    step = GRPOStep(arm.config(base))
    done = progress.resume_point(arm.name, seed)
    if done:
        progress.load(step, base, arm.name, seed)
    else:
        progress.add({"arm": arm.name, "seed": seed, "step": 0, "eval": held_out(step, base, eval_prompts_n, eval_set)})
    bar.update(done)
    for t in range(done, steps):
        record = train_step(step, step_config(base, arm, seed, t, train_prompts), arm.selection)
        progress.add({"arm": arm.name, "seed": seed, "step": t + 1, **record})
        if (t + 1) % eval_every == 0 or t + 1 == steps:
            progress.add(
                {"arm": arm.name, "seed": seed, "step": t + 1, "eval": held_out(step, base, eval_prompts_n, eval_set)}
            )
            progress.save(step, arm.name, seed, t + 1)
        bar.update(1)


def train(
    arms: list[Arm],
    steps: int,
    seeds: int,
    base: StepConfig | None = None,
    eval_every: int = 5,
    eval_prompts_n: int = 32,
    train_prompts: int = 128,
    progress_path: str | Path = "train.progress.jsonl",
    show_progress: bool = True,
    keep_progress: bool = False,
    first_seed: int = 0,
    eval_set: str = "test",
) -> dict:
    """Every arm for `steps` steps and `seeds` seeds, first_seed .. first_seed + seeds - 1 (resuming from
    `progress_path`); the results. Once every arm is done the progress file and its checkpoints are removed,
    unless `keep_progress`. A confirmatory run takes seeds no exploratory run used (`first_seed`); a run that
    chooses a setting (a learning rate) evaluates on the validation prompts (`eval_set`), never the test's."""
    base = base or StepConfig()
    check_plan(arms, steps, seeds, base, eval_every, eval_prompts_n, train_prompts, first_seed, eval_set)
    header = {
        "base": {k: v for k, v in dataclasses.asdict(base).items() if v != getattr(StepConfig(), k)},
        "arms": {a.name: a.describe() for a in arms},
        "eval_every": eval_every,
        "eval_prompts": eval_prompts_n,
        "train_prompts": train_prompts,
        "seed_stride": TRAIN_SEED_STRIDE,
        **({"first_seed": first_seed} if first_seed else {}),
        **({"eval_set": eval_set} if eval_set != "test" else {}),
    }
    lock = _lock(Path(f"{progress_path}.lock"))
    progress = Progress(progress_path, header)
    for arm in arms:
        for seed in range(first_seed, first_seed + seeds):
            with tqdm(total=steps, desc=f"{arm.name} seed {seed}", disable=not show_progress, leave=False) as bar:
                run_arm(arm, seed, base, steps, eval_every, eval_prompts_n, train_prompts, progress, bar, eval_set)
    order = {a.name: i for i, a in enumerate(arms)}  # a resumed run appended its records out of order
    records = sorted(
        (r for r in progress.records if r["step"] <= steps),
        key=lambda r: (order[r["arm"]], r["seed"], r["step"], "eval" in r),
    )
    results = {
        **header,
        "steps": steps,
        "seeds": seeds,
        "records": records,
        "summary": summarize(records, [a.name for a in arms], seeds, steps),
    }
    if not keep_progress:
        progress.remove()
    lock.close()
    return results
