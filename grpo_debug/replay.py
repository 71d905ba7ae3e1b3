"""Open a captured TRL step (`grpo_debug.capture`) as a `GRPOStep`, and say whether we reproduce it.

The capture's batch becomes the step's cached rollout. Every phase after it recomputes from it: scoring,
rewards, advantages, loss, update. The config is the `trl` preset with the capture's own `GRPOConfig`
settings (`config_from_capture`). The capture's reward functions are replayed from their stored values:
`captured_task` is a task plug-in whose train prompts are the captured prompts. A change of a rollout
field would sample new completions, which have no rewards, so it is refused.

`reproduction(run, capture)` compares the recomputed numbers with what the trainer logged for that step.
It also names the causes of difference it can detect: a model with absolute position embeddings scored
left-padded rows without position_ids, dropout on in the trainer, and the gap between the sampler (vLLM)
and the trainer.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import StepConfig
from .task import Task, register_task
from .trl_bridge import SAME_NAME as TRL_SAME_NAME

COMPARED = ("loss", "grad_norm", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
            "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")  # TRL's names
# GRPOConfig fields read back under the same StepConfig name: the bridge's own list, plus sampling,
# batch layout and optimiser fields it sets explicitly
SAME_NAME = TRL_SAME_NAME + ("steps_per_generation", "temperature", "top_p", "num_generations", "learning_rate",
                             "max_grad_norm", "weight_decay", "seed")


@dataclass(frozen=True)
class Capture:
    path: Path
    meta: dict  # capture.json
    batch: dict[str, torch.Tensor]  # batch.pt

    @property
    def num_samples(self) -> int:
        return len(self.batch["completion_ids"])


def load_capture(path: str | Path) -> Capture:
    path = Path(path)
    for name in ("capture.json", "batch.pt"):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path} is not a capture: no {name} (CaptureCallback writes step-<k>/ folders)")
    meta = json.loads((path / "capture.json").read_text())
    if meta["policy"]["folder"] is None:
        raise ValueError(f"{path} holds no weights ({meta['policy']}): reload that checkpoint and save it to "
                         f"{path / 'policy'} with save_pretrained")
    return Capture(path, meta, torch.load(path / "batch.pt"))


def config_from_capture(capture: Capture, **changes) -> StepConfig:
    """The `trl` preset with the capture's GRPOConfig: sampling, loss, batch layout and optimiser settings,
    dropout (`disable_dropout`), precision (`bf16`), the KL estimator (`use_bias_correction_kl`), and
    position_ids where the trainer passed them (`PositionIdsGRPOTrainer`)."""
    g, meta = capture.meta["grpo_config"], capture.meta
    fields = {k: g[k] for k in SAME_NAME if k in g}
    fields.update(
        model=str(capture.path / "policy"), task=task_name(capture), num_prompts=capture.num_samples // g["num_generations"],
        max_new_tokens=g["max_completion_length"], epsilon_low=g["epsilon"],
        kl_estimator="k3_corrected" if g.get("use_bias_correction_kl") else "k3", dropout=not g["disable_dropout"],
        position_ids=meta["position_ids"], dtype="bfloat16" if g.get("bf16") else "float32",
        vllm_importance_sampling_correction=bool(g.get("use_vllm") and g.get("vllm_importance_sampling_correction")),
        per_sample_grad_norms=False, fast=_model_type(capture) == "gpt2")
    return StepConfig.preset("trl", **{**fields, **changes})


def _model_type(capture: Capture) -> str:
    return json.loads((capture.path / "policy" / "config.json").read_text()).get("model_type", "")


def task_name(capture: Capture) -> str:
    return f"capture:{capture.path.resolve()}"


class StoredReward:
    """A reward function that returns the captured values of the captured completions, by text."""

    def __init__(self, name: str, table: dict[tuple[str, str], float | None]):
        self.__name__, self.table = name, table

    def __call__(self, prompts, completions, **kwargs):
        missing = [(p, c) for p, c in zip(prompts, completions) if (p, c) not in self.table]
        if missing:
            raise ValueError(f"reward {self.__name__!r} is known only for the captured completions; {len(missing)} "
                             "are new (a rollout field was changed: the capture's rollout is fixed)")
        return [self.table[(p, c)] for p, c in zip(prompts, completions)]


def captured_texts(capture: Capture, tokenizer) -> tuple[list[str], list[str]]:
    """The B prompts and B*G completions as our rollout decodes them (special tokens removed)."""
    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts = [tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
               for ids, m in zip(b["prompt_ids"][::G], b["prompt_mask"][::G])]
    completions = [tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
                   for ids, m in zip(b["completion_ids"], b["completion_mask"])]
    return prompts, completions


def captured_task(capture: Capture, tokenizer, rewards_from: Task | None = None) -> Task:
    """The capture as a task: its train prompts are the captured prompts. Its reward functions replay the
    stored values, which exist for the captured completions only. With `rewards_from` (your own task plug-in:
    the run's reward functions and your prompt sets) the functions are yours: new completions (the
    evaluation, validation sets) can be rewarded too, on your validation and test prompts."""
    prompts, completions = captured_texts(capture, tokenizer)
    G = capture.meta["grpo_config"]["num_generations"]
    names = list(capture.meta["rewards"])

    def prompt_set(name: str, n: int) -> list[str]:
        if name == "train" and n <= len(prompts):
            return prompts[:n]
        if rewards_from is not None and name != "train":
            return rewards_from.prompts(name, n)
        raise ValueError(f"a capture holds its own {len(prompts)} train prompts only, not {n} {name!r} prompts"
                         + ("" if rewards_from else ": to sample new completions (evaluation, validation sets), "
                            "open it with your task, GRPOStep.from_capture(path, task=NAME)"))

    weights = [capture.meta["reward_weights"][name] for name in names]
    if rewards_from is not None:
        theirs = list(rewards_from.reward_weights or [1.0] * len(rewards_from.reward_funcs))
        if list(rewards_from.reward_names) != names or theirs != weights:
            raise ValueError(f"task {rewards_from.name!r} has the reward functions {list(rewards_from.reward_names)} "
                             f"weighted {theirs}; the captured run had {names} weighted {weights}: not the run's task")
        return Task(name=task_name(capture), prompts=prompt_set, reward_funcs=rewards_from.reward_funcs,
                    reward_weights=rewards_from.reward_weights)
    funcs = []
    for name, values in capture.meta["rewards"].items():
        table = {(prompts[i // G], c): (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
                 for i, (c, v) in enumerate(zip(completions, values))}
        funcs.append(StoredReward(name, table))
    return Task(name=task_name(capture), prompts=prompt_set, reward_funcs=tuple(funcs), reward_weights=tuple(weights))


def captured_rollout(capture: Capture, tokenizer):
    """The captured batch as a Rollout. The sampler's log-probs are the engine's (`sampling_per_token_logps`)
    where one generated, else the trainer's own scoring: the gap columns then read ours against the trainer's."""
    from .rollout import Rollout
    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts, completions = captured_texts(capture, tokenizer)
    lengths = b["completion_mask"].sum(1).long()
    last = b["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    sampler = b.get("sampling_per_token_logps", b["trainer_per_token_logps"]).float()
    groups = [g for g in range(len(prompts)) if len(set(completions[g * G:(g + 1) * G])) == 1]
    return Rollout(prompts=prompts, completions=completions, prompt_ids=b["prompt_ids"], prompt_mask=b["prompt_mask"],
                   completion_ids=b["completion_ids"], completion_lengths=lengths,
                   finished=(last == tokenizer.eos_token_id) & (lengths > 0), sampler_logps=sampler * b["completion_mask"],
                   sampler_logps_temperature_only=sampler * b["completion_mask"], num_generations=G,
                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                   identical_groups=groups, seconds=0.0)


def open_capture(path: str | Path, task: str | Task | None = None, **changes):
    """A GRPOStep whose cached rollout is the captured batch, under `config_from_capture` (+ `changes`).
    `task`: your task plug-in (a registered name or a Task) with the run's reward functions, for the phases
    that sample new completions; without it the stored rewards are replayed (`captured_task`)."""
    from .model import LoadedModel, load_model
    from .task import load_task
    from .step import GRPOStep, PhaseTiming, StepRun
    capture = load_capture(path)
    loaded = load_model(str(capture.path / "policy"))
    reference_name = capture.meta["reference"]["name_or_path"]
    if reference_name is not None:  # beta != 0: TRL's frozen reference, loaded as TRL loaded it
        reference = load_model(reference_name).policy.eval()
        reference.requires_grad_(False)
        loaded = LoadedModel(loaded.policy, reference, loaded.tokenizer, loaded.name)
    yours = load_task(task) if isinstance(task, str) else task
    task = captured_task(capture, loaded.tokenizer, yours)
    register_task(task.name, lambda: task)
    cfg = config_from_capture(capture, **changes)
    rollout_fields = [f.name for f in dataclasses.fields(StepConfig) if StepConfig.phase_of(f.name) == "rollout"
                      and getattr(cfg, f.name) != getattr(config_from_capture(capture), f.name)]
    if rollout_fields:
        raise ValueError(f"{rollout_fields} are rollout fields: a capture's rollout is the trainer's, fixed")
    step = GRPOStep(cfg, task=task, loaded=loaded)
    step.at_reference = reference_name is None  # beta = 0: no reference in TRL; here the policy's own copy
    step.capture, step.stored_rewards = capture, yours is None
    step.result = StepRun(cfg, rollout=captured_rollout(capture, loaded.tokenizer),
                          timings={"rollout": PhaseTiming(0.0, 0.0)})
    return step


# ---- does the replay reproduce the trainer's step?

def absolute_positions(model) -> bool:
    """Whether the model adds learned absolute position embeddings (GPT-2's wpe), which left padding shifts."""
    return any(isinstance(m, torch.nn.Embedding) and (name.endswith("wpe") or "position_embedding" in name)
               for name, m in model.named_modules())


def has_dropout(model) -> bool:
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def causes(capture: Capture, model) -> dict[str, str]:
    """Each cause of difference this module can detect: 'present: ...' or 'absent: ...'."""
    g, b = capture.meta["grpo_config"], capture.batch
    left_padded = bool((b["prompt_mask"][:, 0] == 0).any())
    out = {}
    if not absolute_positions(model):
        out["positions"] = "absent: the model has no absolute position embeddings (rotary or relative positions)"
    elif capture.meta["position_ids"]:
        out["positions"] = "absent: the trainer passed position_ids (PositionIdsGRPOTrainer)"
    elif not left_padded:
        out["positions"] = "absent: no prompt is left-padded, so positions start at 0 in every row"
    else:
        out["positions"] = ("present: absolute positions scored without position_ids; left-padded rows were "
                            "scored at positions shifted from those they were sampled at")
    dropout = has_dropout(model)
    out["dropout"] = ("present: dropout was on in the trainer's forward passes (disable_dropout=False); its "
                      "masks are random, so loss, kl and grad_norm differ by dropout noise" if dropout and
                      not g["disable_dropout"] else "absent: dropout off" + ("" if dropout else " (the model has none)"))
    if "sampling_per_token_logps" in b:
        mask = b["completion_mask"].bool()
        gap = (b["sampling_per_token_logps"] - b["trainer_per_token_logps"]).abs()[mask].nan_to_num(0).max().item()
        out["sampler_gap"] = f"present: max |sampler - trainer| log-prob {gap:.3g}"
    else:
        out["sampler_gap"] = "absent: the trainer generated with its own model (no sampler log-probs)"
    return out


def reproduction(run, capture: Capture, model) -> dict:
    """{"logged": TRL's numbers, "replayed": ours, "difference": ours - TRL's, "logps": our per-token
    log-probs against the trainer's, "rewards": per reward function, the largest |ours - captured| (0 when
    the stored values are replayed; your functions' own drift when opened with your task), "causes": `causes`}."""
    from .step import metrics
    ours, logged = metrics(run), capture.meta["logged"]
    keys = [k for k in COMPARED if k in logged and k in ours]
    trainer = capture.batch["trainer_per_token_logps"].float()
    mask = capture.batch["completion_mask"].bool() & trainer.isfinite()  # rows step k trained on
    gap = (run.logprobs.policy - trainer).abs()[mask]
    return {"step": capture.meta["step"], "config": {k: v for k, v in dataclasses.asdict(run.config).items()
                                                      if k not in ("model", "task")},
            "logged": {k: logged[k] for k in keys}, "replayed": {k: ours[k] for k in keys},
            "difference": {k: ours[k] - logged[k] for k in keys},
            "logps": {"max_abs_difference": gap.max().item() if len(gap) else math.nan,
                      "mean_abs_difference": gap.mean().item() if len(gap) else math.nan,
                      "rows_compared": int(mask.any(1).sum())},
            "rewards": reward_drift(run.rewards, capture), "causes": causes(capture, model)}


def reward_drift(rewards, capture: Capture) -> dict[str, float]:
    """Per reward function, the largest |recomputed - captured| reward over the captured completions (a
    function's None against None is 0, None against a number is inf)."""
    out = {}
    for name, values in capture.meta["rewards"].items():
        ours = rewards.per_function[name]
        stored = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
        gap = (ours - stored).abs().nan_to_num(math.inf)
        out[name] = torch.where(ours.isnan() & stored.isnan(), 0.0, gap).max().item()
    return out
