"""`doctor --no-model`: the detectors that read only what a capture holds (its batch, rewards, advantages, the
trainer's own log-probs and logged numbers, its config), run without building the model: seconds at any size.
The others (the model's own scoring, its update, its flips) are named as not run.

    report = diagnose_without_model("captures/step-2")           # or with your reward functions: task=...
"""

from __future__ import annotations

import math
import time

import torch

from ..advantages import advantages_of
from ..capture.reading import captured_rollout, captured_task, config_from_capture, load_capture
from ..logprobs import TokenLogProbs
from ..model import load_tokenizer
from ..rewards import compute_rewards
from ..sampler import mismatch_metrics
from ..step import StepRun
from ..update import StepResult
from .detectors import DETECTORS
from .findings import StepFacts
from .report import Report, rank

# the detectors whose facts a capture holds without its model; the others need it (`NEEDS_THE_MODEL`)
WITHOUT_MODEL = (
    "zero_std_groups",
    "constant_reward",
    "dominant_reward",
    "length_reward",
    "bad_reward",
    "truncation",
    "sampler_mismatch",
    "kl_off",
    "large_advantages",
    "advantage_scale",
    "grad_clipped",
    "kl_blowup",
    "loss_normaliser",
)
NEEDS_THE_MODEL = "needs the model (run without --no-model)"


def _tokenizer_folder(capture):
    policy = capture.meta["policy"]
    return capture.path / policy["folder"]


def trainer_logprobs(capture) -> TokenLogProbs:
    """The trainer's own per-token log-probs of the captured step as the log-prob phase's result: its mask, its
    policy log-probs (a row the step did not train on: 0), the reference's where captured. What only the model
    can give (entropies, the sampler gap over the scoring's support) is NaN: no detector here reads it."""
    b = capture.batch
    policy = b["trainer_per_token_logps"].float().nan_to_num(0.0)
    reference = b["ref_per_token_logps"].float() if "ref_per_token_logps" in b else policy
    unknown = torch.full_like(policy, math.nan)
    return TokenLogProbs(
        policy=policy,
        reference=reference,
        mask=b["completion_mask"].float(),
        entropies=unknown,
        sampler_gap=unknown,
        max_sampler_gap=math.nan,
        top_p_gap=math.nan,
        eos_kept=math.nan,
        seconds=0.0,
    )


def logged_update(capture) -> StepResult:
    """The trainer's own numbers of the update (its logged loss and grad_norm); what the model would measure
    (the update's norm) is NaN: no detector here reads it."""
    m = capture.step_metrics
    grad_norm = float(m.get("grad_norm", math.nan))
    return StepResult(
        loss=float(m.get("loss", math.nan)),
        grad_norm=grad_norm,
        clipped=False,
        per_sample_grad_norms=torch.tensor([]),
        update_norm=math.nan,
        seconds=0.0,
        optimizer="the trainer's, as logged (not replayed: --no-model)",
    )


def facts_without_model(path, task=None) -> StepFacts:
    """The facts the WITHOUT_MODEL detectors read, from the capture at `path` (checked as `load_capture` checks
    it; the model's weights are hashed, never loaded), scored by `task` where given, else its stored rewards."""
    capture = load_capture(path)
    cfg = config_from_capture(capture)
    tokenizer = load_tokenizer(_tokenizer_folder(capture))
    rollout = captured_rollout(capture, tokenizer)
    task = captured_task(capture, tokenizer, task)
    rewards = compute_rewards(rollout.prompts, rollout.completions, rollout.num_generations, task)
    logprobs = trainer_logprobs(capture)
    run = StepRun(
        cfg,
        rollout=rollout,
        logprobs=logprobs,
        rewards=rewards,
        advantages=advantages_of(cfg, rewards, task.weights),
        update=logged_update(capture),
    )
    b = capture.batch
    sampled = "sampling_per_token_logps" in b
    return StepFacts(
        run=run,
        reward_weights=task.weights,
        absolute_positions=False,
        left_padded=bool((rollout.prompt_mask[:, 0] == 0).any()),
        dropout_sources=(),
        dropout_gap=None,
        sampler_metrics=mismatch_metrics(logprobs.policy, b["sampling_per_token_logps"].float(), logprobs.mask)
        if sampled
        else None,
        kept_mass=None,
        kl_against_exact=None,
        weight_norm=math.nan,
        uses_vllm=bool(capture.meta["grpo_config"].get("use_vllm")),
        logged_kl=capture.step_metrics.get("kl"),
        kl_history=tuple(capture.logged_kl),
    )


def diagnose_without_model(path, task=None) -> Report:
    """Every WITHOUT_MODEL detector on the capture at `path`, ranked; the rest listed in `not_run`."""
    start = time.perf_counter()
    facts = facts_without_model(path, task)
    findings = [d(facts) for d in DETECTORS if d.__name__ in WITHOUT_MODEL]
    not_run = tuple(d.__name__ for d in DETECTORS if d.__name__ not in WITHOUT_MODEL)
    return Report(
        rank(findings),
        facts.run.config.settings(),
        time.perf_counter() - start,
        facts.uses_vllm,
        {"steps": 0, "why": f"not followed: --no-model ({NEEDS_THE_MODEL})"},
        not_run=not_run,
    )
