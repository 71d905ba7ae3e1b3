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
from .arms import Arm, Plan, Selection, step_config
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


def run_arm(arm: Arm, seed: int, plan: Plan, progress: Progress, bar) -> None:
    base = plan.base
    step = GRPOStep(arm.config(base))
    done = progress.resume_point(arm.name, seed)
    if done:
        progress.load(step, base, arm.name, seed)
    else:
        progress.add(
            {"arm": arm.name, "seed": seed, "step": 0, "eval": held_out(step, base, plan.eval_prompts, plan.eval_set)}
        )
    bar.update(done)
    for t in range(done, plan.steps):
        record = train_step(step, step_config(base, arm, seed, t, plan.train_prompts), arm.selection)
        progress.add({"arm": arm.name, "seed": seed, "step": t + 1, **record})
        if (t + 1) % plan.eval_every == 0 or t + 1 == plan.steps:
            evaluation = held_out(step, base, plan.eval_prompts, plan.eval_set)
            progress.add({"arm": arm.name, "seed": seed, "step": t + 1, "eval": evaluation})
            progress.save(step, arm.name, seed, t + 1)
        bar.update(1)


def train(
    plan: Plan,
    progress_path: str | Path = "train.progress.jsonl",
    show_progress: bool = True,
    keep_progress: bool = False,
) -> dict:
    """Every arm of `plan` for its steps and seeds (resuming from `progress_path`); the results. Once every arm is
    done the progress file and its checkpoints are removed, unless `keep_progress`. A confirmatory run takes seeds
    no exploratory run used (`first_seed`); a run that chooses a setting (a learning rate) evaluates on the
    validation prompts (`eval_set`), never the test's."""
    header = plan.header()
    lock = _lock(Path(f"{progress_path}.lock"))
    progress = Progress(progress_path, header)
    for arm in plan.arms:
        for seed in plan.seed_range:
            with tqdm(total=plan.steps, desc=f"{arm.name} seed {seed}", disable=not show_progress, leave=False) as bar:
                run_arm(arm, seed, plan, progress, bar)
    order = {a.name: i for i, a in enumerate(plan.arms)}  # a resumed run appended its records out of order
    records = sorted(
        (r for r in progress.records if r["step"] <= plan.steps),
        key=lambda r: (order[r["arm"]], r["seed"], r["step"], "eval" in r),
    )
    results = {
        **header,
        "steps": plan.steps,
        "seeds": plan.seeds,
        "records": records,
        "summary": summarize(records, [a.name for a in plan.arms], plan.seeds, plan.steps),
    }
    if not keep_progress:
        progress.remove()
    lock.close()
    return results
