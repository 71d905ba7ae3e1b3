"""`doctor --no-model`: the detectors that read only what a capture holds (its batch, rewards, advantages, the
trainer's own log-probs and logged numbers, its configs), run without building the model: seconds at any size.
The others (the model's own scoring, its update, its flips) are named as not run.

    report = diagnose_without_model("captures/step-2")           # or with your reward functions: task=...

Dropout is read from what the capture's configs state (`stated_dropouts`): the model's config.json (a LoRA
capture: its base's) and the adapter's `lora_dropout`. The doctor's `dropout` finding comes with the same
verdict as with the model, the gap between two scorings not measured (`stated_dropout`); a model whose configs
state none is judged as it runs, its train-mode forwards dropping nothing (`as_it_runs`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from ..advantages import advantages_of
from ..capture.captured_config import config_from_capture
from ..capture.captured_inputs import captured_rollout
from ..capture.captured_task import captured_task
from ..capture.lora import ADAPTER_CONFIG
from ..capture.reading import load_capture
from ..detectors.detectors import DETECTORS
from ..detectors.findings import Finding, StepFacts
from ..detectors.logprob_detectors import dropout
from ..logprobs import TokenLogProbs
from ..model import UNUSED_DROPOUT_FIELDS, load_tokenizer
from ..rewards import compute_rewards
from ..sampler import mismatch_metrics
from ..step import StepRun
from ..update import StepResult
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
    "dropout",  # from the configs, its gap not measured (`stated_dropout`)
)
NEEDS_THE_MODEL = "needs the model (run without --no-model)"


def _tokenizer_folder(capture):
    policy = capture.meta["policy"]
    return capture.path / policy["folder"]


def config_dropouts(config: dict) -> list[str]:
    """The drop probabilities a model's config states above 0 (GPT-2's attn_pdrop, resid_pdrop, embd_pdrop;
    Qwen2's and Llama's attention_dropout; a hidden_dropout), named as `model.dropout_sources` names a config
    field; the heads a causal LM does not run (GPT-2's summary_first_dropout) left out, as there."""
    return [
        f"config.{k}={v:g}"
        for k, v in config.items()
        if ("dropout" in k or k.endswith("_pdrop"))
        and not k.startswith(UNUSED_DROPOUT_FIELDS)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v > 0
    ]


def adapter_dropouts(adapter: dict | None) -> list[str]:
    """The LoRA adapter's own dropout (peft's `lora_dropout`: on the adapter's input, in train mode), above 0."""
    p = (adapter or {}).get("lora_dropout")
    ok = isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0
    return [f"adapter lora_dropout={p:g}"] if ok else []


def model_config(folder: Path) -> dict:
    """A model folder's config as the model reads it: transformers' config class fills what config.json leaves to
    its defaults (a GPT-2 config.json without attn_pdrop drops at 0.1); the file's own fields where transformers
    does not know its model_type."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder).to_dict()
    except (ValueError, KeyError, OSError):
        return json.loads((folder / "config.json").read_text())


def stated_dropouts(capture) -> tuple[str, ...]:
    """Every dropout the capture's configs state: its model's config (a LoRA capture: the base's, whose files
    reading the capture hashed) and, for a LoRA capture, its adapter's config."""
    policy = capture.meta["policy"]
    folder = _tokenizer_folder(capture)
    if not policy.get("adapter"):
        return tuple(config_dropouts(model_config(folder)))
    adapter = json.loads((folder / ADAPTER_CONFIG).read_text())
    return tuple(config_dropouts(model_config(Path(policy["base"]["folder"]))) + adapter_dropouts(adapter))


def stated_dropout(f: StepFacts) -> Finding:
    """The doctor's `dropout` on the dropouts the configs state: its verdict as with the model (the verdict reads
    the sources and whether the trainer scored in train mode, not the gap's size); where it warns, its summary
    says the gap between two scorings is not measured here."""
    if not f.dropout_sources or not f.run.config.dropout:
        return dropout(f)
    found = dropout(dataclasses.replace(f, dropout_gap=math.nan))
    said = (
        f"dropout on while scoring ({', '.join(f.dropout_sources)}), as the capture's configs state: two scorings "
        "of the same tokens differ (the gap is measured with the model: run without --no-model)"
    )
    evidence = {**found.evidence, "max_logp_gap": None, "sources_from": "the capture's configs"}
    return dataclasses.replace(found, summary=said, evidence=evidence)


def as_it_runs(f: StepFacts) -> StepFacts:
    """The facts with the run's config saying dropout off where no config states any: the train-mode forwards of
    such a model drop nothing, so that no detector reads TRL's disable_dropout=False as noise in them (kl_blowup's
    logged k3). The report keeps the captured config."""
    cfg = f.run.config
    if f.dropout_sources or not cfg.dropout:
        return f
    return dataclasses.replace(f, run=dataclasses.replace(f.run, config=cfg.replace(dropout=False)))


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
        dropout_sources=stated_dropouts(capture),
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
    judged = as_it_runs(facts)  # `dropout` reads the run's own config: it says what drops and what the trainer set
    findings = [stated_dropout(facts) if d.__name__ == "dropout" else d(judged) for d in DETECTORS
                if d.__name__ in WITHOUT_MODEL]  # fmt: skip
    not_run = tuple(d.__name__ for d in DETECTORS if d.__name__ not in WITHOUT_MODEL)
    return Report(
        rank(findings),
        facts.run.config.settings(),
        time.perf_counter() - start,
        facts.uses_vllm,
        {"steps": 0, "why": f"not followed: --no-model ({NEEDS_THE_MODEL})"},
        not_run=not_run,
    )
