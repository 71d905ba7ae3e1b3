"""Open a captured TRL step (`grpo_debug.capture`) as a `GRPOStep`, and say whether we reproduce it.

The capture's batch becomes the step's cached rollout. Every phase after it recomputes from it: scoring,
rewards, advantages, loss, update. The config is the `trl` preset with the capture's own `GRPOConfig`
settings, None values resolved as the trainer resolved them (`config_from_capture`). The rewards are the
stored values (`captured_task`), or your own reward functions (`task=[f, g]`, `task="my_rewards.py:funcs"`,
or a registered task name), which can also score new completions. A change of a rollout field would sample new
completions, so it is refused.

`reproduction(step, run)` replays the captured optimizer step as TRL took it (`trl_step`: its micro-batches,
its pass, its dropout masks) and compares every number with the step's own metrics from the trainer.

A capture is a file from outside: `load_capture` reads tensors with `weights_only=True` and checks every piece
(files, JSON, tensor names, shapes, masks, NaN, the schedule, the random states, and the policy's config
against the shapes of its stored weights, before any model is built); a problem names the file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import StepConfig
from .task import Task, callable_name, load_task, register_task, task_names
from .trl_bridge import SAME_NAME as TRL_SAME_NAME

COMPARED = (
    "loss",
    "grad_norm",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "cispo_clip_ratio",
    "vespo/phi_seq_mean",
)  # TRL's names
# GRPOConfig fields read back under the same StepConfig name: the bridge's own list, plus sampling,
# batch layout and optimiser fields it sets explicitly
SAME_NAME = TRL_SAME_NAME + (
    "steps_per_generation",
    "temperature",
    "top_p",
    "num_generations",
    "learning_rate",
    "max_grad_norm",
    "weight_decay",
    "seed",
)
REQUIRED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "trainer_per_token_logps")


class CaptureError(ValueError):
    """A capture folder that cannot be opened: the message names the file and the problem."""


@dataclass(frozen=True)
class Capture:
    path: Path
    meta: dict  # capture.json
    batch: dict[str, torch.Tensor]  # batch.pt

    @property
    def num_samples(self) -> int:
        return len(self.batch["completion_ids"])

    @property
    def schedule(self) -> dict | None:
        """The captured optimizer step's micro-batches (rows of the generation batch) and pass; None for a
        multi-process capture or one written before format 2."""
        return self.meta.get("schedule")

    @property
    def step_metrics(self) -> dict:
        """The step's own numbers from the trainer (format 2), else what TRL logged at the step."""
        return self.meta.get("step_metrics") or self.meta.get("logged") or {}

    @property
    def conversational(self) -> bool:
        return bool(self.meta["prompts"]) and isinstance(self.meta["prompts"][0], list)


# ---- reading and checking a capture


def load_capture(path: str | Path) -> Capture:
    path = Path(path)
    if not path.is_dir():
        raise CaptureError(f"{path} is not a capture: no such folder (CaptureCallback writes step-<k>/ folders)")
    for name in ("capture.json", "batch.pt"):
        if not (path / name).is_file():
            raise CaptureError(f"{path} is not a capture: no {name} (CaptureCallback writes step-<k>/ folders)")
    try:
        meta = json.loads((path / "capture.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaptureError(f"{path / 'capture.json'} is not valid JSON: {e}") from None
    try:
        with zipfile.ZipFile(path / "batch.pt") as archive:  # torch.save's format: the CRCs catch a corrupted byte
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise CaptureError(f"{path / 'batch.pt'} is not a torch.save archive ({e})") from None
    if bad is not None:
        raise CaptureError(f"{path / 'batch.pt'} is corrupted: {bad} fails its checksum")
    try:
        batch = torch.load(path / "batch.pt", weights_only=True, map_location="cpu")
    except Exception as e:  # a truncated or edited file fails in many ways inside torch
        raise CaptureError(f"{path / 'batch.pt'} cannot be read as tensors ({type(e).__name__}: {e})") from None
    capture = Capture(path, meta, batch)
    check_capture(capture)
    return capture


def _need(ok: bool, where: Path, problem: str) -> None:
    if not ok:
        raise CaptureError(f"{where}: {problem}")


def check_capture(capture: Capture) -> None:
    """Refuse a damaged or edited capture before anything is built, naming the file and the problem."""
    meta, b, path = capture.meta, capture.batch, capture.path
    js, pt = path / "capture.json", path / "batch.pt"
    _need(isinstance(meta, dict), js, "not a JSON object")
    for key in ("step", "grpo_config", "prompts", "completions", "rewards", "reward_weights", "policy", "reference"):
        _need(key in meta, js, f"no {key!r} entry")
    g = meta["grpo_config"]
    _need(isinstance(g, dict), js, "'grpo_config' is not an object")
    for key in ("num_generations", "max_completion_length", "epsilon", "disable_dropout", "loss_type", "beta"):
        _need(key in g, js, f"grpo_config has no {key!r}")
    G = g["num_generations"]
    _need(isinstance(G, int) and G >= 1, js, f"num_generations = {G!r} is not a positive integer")
    _need(isinstance(b, dict), pt, "not a dict of tensors")
    for name in REQUIRED:
        _need(isinstance(b.get(name), torch.Tensor), pt, f"no tensor {name!r}")
    N, C = b["completion_ids"].shape if b["completion_ids"].dim() == 2 else (-1, -1)
    _need(N > 0, pt, f"completion_ids has shape {tuple(b['completion_ids'].shape)}, not (N, C)")
    P = b["prompt_ids"].shape[1] if b["prompt_ids"].dim() == 2 else -1
    shapes = {
        "prompt_ids": (N, P),
        "prompt_mask": (N, P),
        "completion_mask": (N, C),
        "advantages": (N,),
        "trainer_per_token_logps": (N, C),
        "old_per_token_logps": (N, C),
        "ref_per_token_logps": (N, C),
        "sampling_per_token_logps": (N, C),
    }
    for name, shape in shapes.items():
        if name in b:
            _need(tuple(b[name].shape) == shape, pt, f"{name} has shape {tuple(b[name].shape)}, expected {shape}")
    _need(N % G == 0, pt, f"{N} rows are not groups of num_generations = {G}")
    _need(
        len(meta["completions"]) == N and len(meta["prompts"]) == N,
        js,
        f"{len(meta['prompts'])} prompts and {len(meta['completions'])} completions for {N} rows in batch.pt",
    )
    for name in ("prompt_mask", "completion_mask"):
        _need(bool(((b[name] == 0) | (b[name] == 1)).all()), pt, f"{name} holds values other than 0 and 1")
    mask = b["completion_mask"].bool()
    _need(bool(b["advantages"].isfinite().all()), pt, "advantages hold NaN or inf")
    for name in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        if name in b:
            _need(bool(b[name][mask].isfinite().all()), pt, f"{name} holds NaN or inf on completion tokens")
    trainer = b["trainer_per_token_logps"]
    scored_rows = trainer.isfinite().any(1)
    _need(
        bool(trainer[scored_rows][mask[scored_rows]].isfinite().all()),
        pt,
        "trainer_per_token_logps holds NaN or inf on completion tokens of a row the trainer scored",
    )
    for name, values in meta["rewards"].items():
        _need(isinstance(values, list) and len(values) == N, js, f"rewards of {name!r} are not one per row")
    _need(set(meta["reward_weights"]) == set(meta["rewards"]), js, "reward_weights do not name the reward functions")
    schedule = meta.get("schedule")
    if schedule is not None:
        rows = [r for mb in schedule["micro_batches"] for r in mb["rows"]]
        _need(
            bool(rows) and all(isinstance(r, int) and 0 <= r < N for r in rows) and len(set(rows)) == len(rows),
            js,
            "schedule rows are not distinct rows of the batch",
        )
        if "rng_states" in b:
            states = b["rng_states"]
            _need(
                states.dtype == torch.uint8 and states.dim() == 2 and states.shape[1] == torch.get_rng_state().numel(),
                pt,
                "rng_states are not CPU random states",
            )
    check_policy_folder(capture)


def check_policy_folder(capture: Capture) -> None:
    """The policy's config must describe its stored weights: every weight of the architecture it names is in the
    safetensors files with the same shape (read from their headers; the model is built on the meta device,
    allocating nothing), so an edited config cannot build a model bigger than its weights."""
    folder_name = capture.meta["policy"].get("folder")
    if folder_name is None:
        raise CaptureError(
            f"{capture.path} holds no weights ({capture.meta['policy']}): reload that checkpoint and "
            f"save it to {capture.path / 'policy'} with save_pretrained"
        )
    folder = capture.path / folder_name
    config_file = folder / "config.json"
    _need(config_file.is_file(), folder, "no config.json")
    files = sorted(folder.glob("*.safetensors"))
    _need(bool(files), folder, "no .safetensors weights")
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    stored = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                stored.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
        except Exception as e:
            raise CaptureError(f"{file} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    try:
        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:
        raise CaptureError(f"{config_file} does not describe a causal LM ({type(e).__name__}: {e})") from None
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in expected if k not in stored and k not in tied and not k.endswith("lm_head.weight")]
    wrong = [f"{k} {stored[k]} vs {expected[k]}" for k in expected if k in stored and stored[k] != expected[k]]
    _need(
        not missing and not wrong,
        config_file,
        f"the architecture it names does not match the stored weights: {len(missing)} missing "
        f"({', '.join(missing[:3])}), {len(wrong)} of another shape ({', '.join(wrong[:3])})",
    )
    vocab = getattr(config, "vocab_size", None)
    b = capture.batch
    if vocab:
        for name in ("prompt_ids", "completion_ids"):
            _need(
                bool(((b[name] >= 0) & (b[name] < vocab)).all()),
                capture.path / "batch.pt",
                f"{name} holds token ids outside the model's vocabulary of {vocab}",
            )


# ---- the config


def resolved_grpo_config(capture: Capture) -> dict:
    """The GRPOConfig as the trainer ran it: None values resolved as TRL resolves them at run time
    (epsilon_high -> epsilon, steps_per_generation -> gradient_accumulation_steps), or read from the values
    the trainer itself recorded (`resolved`, format 2)."""
    g = dict(capture.meta["grpo_config"])
    resolved = capture.meta.get("resolved") or {}
    if g.get("epsilon_high") is None:
        g["epsilon_high"] = resolved.get("epsilon_high", g["epsilon"])
    if g.get("steps_per_generation") is None:
        g["steps_per_generation"] = resolved.get("steps_per_generation", g.get("gradient_accumulation_steps", 1))
    if g.get("bf16") is None:
        g["bf16"] = resolved.get("mixed_precision") == "bf16" if resolved else not g.get("fp16", False)
    return g


def config_from_capture(capture: Capture, **changes) -> StepConfig:
    """The `trl` preset with the capture's GRPOConfig: sampling, loss, batch layout and optimiser settings,
    dropout (`disable_dropout`), precision (`bf16`), the KL estimator (`use_bias_correction_kl`), and
    position_ids where the trainer passed them (`PositionIdsGRPOTrainer`). `changes` apply after."""
    g, meta = resolved_grpo_config(capture), capture.meta
    if task_name(capture) not in task_names():  # a StepConfig.task choice from here on; `open_capture` fills it

        def not_opened():
            raise RuntimeError(f"{task_name(capture)}: open the capture (GRPOStep.from_capture) for its task")

        register_task(task_name(capture), not_opened)
    fields = {k: g[k] for k in SAME_NAME if k in g and g[k] is not None}
    dropout = not g["disable_dropout"]
    fields.update(
        model=str(capture.path.resolve() / capture.meta["policy"]["folder"]),
        task=task_name(capture),
        num_prompts=capture.num_samples // g["num_generations"],
        max_new_tokens=g["max_completion_length"],
        epsilon_low=g["epsilon"],
        kl_estimator="k3_corrected" if g.get("use_bias_correction_kl") else "k3",
        dropout=dropout,
        sample_dropout=dropout,
        position_ids=meta["position_ids"],
        dtype="bfloat16" if g.get("bf16") else "float32",
        vllm_importance_sampling_correction=bool(g.get("use_vllm") and g.get("vllm_importance_sampling_correction")),
        per_sample_grad_norms=False,
        fast=_model_type(capture) == "gpt2" and not dropout,
    )
    try:
        return StepConfig.preset("trl", **{**fields, **changes})
    except ValueError as e:
        raise CaptureError(f"{capture.path / 'capture.json'}: its GRPOConfig has no StepConfig here: {e}") from None


def _model_type(capture: Capture) -> str:
    return json.loads((capture.path / capture.meta["policy"]["folder"] / "config.json").read_text()).get(
        "model_type", ""
    )


def task_name(capture: Capture) -> str:
    return f"capture:{capture.path.resolve()}"


# ---- the rewards: stored, or your own functions


class StoredReward:
    """A reward function that returns the captured values of the captured completions, by text."""

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


def captured_texts(capture: Capture, tokenizer) -> tuple[list[str], list[str]]:
    """The B prompts and B*G completions as our rollout decodes them (special tokens removed)."""
    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts = [
        tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
        for ids, m in zip(b["prompt_ids"][::G], b["prompt_mask"][::G])
    ]
    completions = [
        tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
        for ids, m in zip(b["completion_ids"], b["completion_mask"])
    ]
    return prompts, completions


def reward_functions(spec) -> list:
    """Your reward functions: a list of callables, or "file.py:name" naming one function or a list of them."""
    if callable(spec):
        return [spec]
    if isinstance(spec, (list, tuple)) and spec and all(callable(f) for f in spec):
        return list(spec)
    if isinstance(spec, str) and ".py:" in spec:
        file, _, name = spec.rpartition(":")
        if not Path(file).is_file():
            raise ValueError(f"task {spec!r}: no file {file}")
        module_spec = importlib.util.spec_from_file_location(Path(file).stem, file)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        if not hasattr(module, name):
            raise ValueError(f"task {spec!r}: {file} defines no {name!r}")
        return reward_functions(getattr(module, name))
    raise ValueError(f"task must be a registered task name, a Task, reward functions or 'file.py:name', got {spec!r}")


def _as_messages(func, prompt_messages: dict[str, list]):
    """`func` called as TRL calls it in a conversational run: message lists, not strings."""

    def reward(prompts, completions, **kwargs):
        return func(
            prompts=[prompt_messages.get(p, [{"role": "user", "content": p}]) for p in prompts],
            completions=[[{"role": "assistant", "content": c}] for c in completions],
            **kwargs,
        )

    reward.__name__ = callable_name(func)
    return reward


def captured_task(capture: Capture, tokenizer, rewards_from=None) -> Task:
    """The capture as a task: its train prompts are the captured prompts. Without `rewards_from` its reward
    functions replay the stored values (the captured completions only). With your task or reward functions, new
    completions (evaluation, validation sets) are rewarded too; a Task also brings its validation and test
    prompts. In a conversational capture, your functions get message lists, as TRL gave them."""
    prompts, completions = captured_texts(capture, tokenizer)
    G = capture.meta["grpo_config"]["num_generations"]
    names = list(capture.meta["rewards"])
    weights = [capture.meta["reward_weights"][name] for name in names]
    yours = None
    has_sets = isinstance(rewards_from, Task) or (isinstance(rewards_from, str) and ".py:" not in rewards_from)
    if isinstance(rewards_from, str) and ".py:" not in rewards_from:
        try:
            yours = load_task(rewards_from)
        except ValueError:
            names = ", ".join(n for n in task_names() if not n.startswith("capture:"))
            raise ValueError(
                f"task {rewards_from!r} is neither a registered task ({names}) nor "
                "'file.py:NAME' naming your reward functions; pass the functions themselves "
                "(task=[f, g]) or register a Task (grpo_debug.task.register_task)"
            ) from None
    elif isinstance(rewards_from, Task):
        yours = rewards_from
    elif rewards_from is not None:
        funcs = reward_functions(rewards_from)
        if capture.conversational:
            messages = {p: capture.meta["prompts"][i * G] for i, p in enumerate(prompts)}
            funcs = [_as_messages(f, messages) for f in funcs]
        yours = Task(
            name="your reward functions",
            prompts=lambda s, n: prompts[:n],
            reward_funcs=tuple(funcs),
            reward_weights=tuple(weights),
        )

    told = []

    def prompt_set(name: str, n: int) -> list[str]:
        if name == "train" and n <= len(prompts):
            return prompts[:n]
        if has_sets and name != "train":
            return yours.prompts(name, n)
        if yours is not None and name != "train":  # your reward functions, no prompt sets of yours
            if not told:
                told.append(name)
                warnings.warn(
                    f"the capture has no {name} prompts of its own: new completions are sampled on its "
                    f"{len(prompts)} train prompts, repeated (open it with a Task for separate sets)",
                    stacklevel=2,
                )
            return [prompts[i % len(prompts)] for i in range(n)]
        raise ValueError(
            f"a capture holds its own {len(prompts)} train prompts only, not {n} {name!r} prompts: to "
            "sample new completions on other prompts, open it with a task that has them, "
            "GRPOStep.from_capture(path, task=NAME)"
        )

    if yours is not None:
        theirs = list(yours.reward_weights or [1.0] * len(yours.reward_funcs))
        if list(yours.reward_names) != names or theirs != weights:
            raise ValueError(
                f"{yours.name!r} has the reward functions {list(yours.reward_names)} weighted {theirs}; "
                f"the captured run had {names} weighted {weights}: not the run's reward functions"
            )
        return Task(
            name=task_name(capture), prompts=prompt_set, reward_funcs=yours.reward_funcs, reward_weights=tuple(weights)
        )
    funcs = []
    for name, values in capture.meta["rewards"].items():
        table = {
            (prompts[i // G], c): (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
            for i, (c, v) in enumerate(zip(completions, values))
        }
        funcs.append(StoredReward(name, table))
    return Task(name=task_name(capture), prompts=prompt_set, reward_funcs=tuple(funcs), reward_weights=tuple(weights))


def captured_rollout(capture: Capture, tokenizer):
    """The captured batch as a Rollout. The sampler's log-probs are the engine's (`sampling_per_token_logps`)
    where one generated, else the trainer's own scoring (NaN rows, not trained on at this step, as 0)."""
    from .rollout import Rollout

    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts, completions = captured_texts(capture, tokenizer)
    lengths = b["completion_mask"].sum(1).long()
    last = b["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    sampler = b.get("sampling_per_token_logps", b.get("old_per_token_logps", b["trainer_per_token_logps"]))
    sampler = sampler.float().nan_to_num(0.0)
    groups = [g for g in range(len(prompts)) if len(set(completions[g * G : (g + 1) * G])) == 1]
    return Rollout(
        prompts=prompts,
        completions=completions,
        prompt_ids=b["prompt_ids"],
        prompt_mask=b["prompt_mask"],
        completion_ids=b["completion_ids"],
        completion_lengths=lengths,
        finished=(last == tokenizer.eos_token_id) & (lengths > 0),
        sampler_logps=sampler * b["completion_mask"],
        sampler_logps_temperature_only=sampler * b["completion_mask"],
        num_generations=G,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        identical_groups=groups,
        seconds=0.0,
    )


def open_capture(path: str | Path, task=None, **changes):
    """A GRPOStep whose cached rollout is the captured batch, under `config_from_capture` (+ `changes`).
    `task`: the run's reward functions (a list, "file.py:name") or a task plug-in (a registered name or a Task),
    for the phases that sample new completions; without it the stored rewards are replayed."""
    from .model import LoadedModel, ModelUnavailable, load_model
    from .step import GRPOStep, PhaseTiming, StepRun

    capture = load_capture(path)
    base = config_from_capture(capture)
    cfg = config_from_capture(capture, **changes)
    rollout_fields = [
        f.name
        for f in dataclasses.fields(StepConfig)
        if StepConfig.phase_of(f.name) == "rollout" and getattr(cfg, f.name) != getattr(base, f.name)
    ]
    if rollout_fields:
        raise ValueError(f"{rollout_fields} are rollout fields: a capture's rollout is the trainer's, fixed")
    loaded = load_model(str(capture.path.resolve() / capture.meta["policy"]["folder"]))
    reference_name = capture.meta["reference"]["name_or_path"]
    if reference_name is not None:  # beta != 0: TRL's frozen reference, loaded as TRL loaded it
        try:
            reference = load_model(reference_name).policy.eval()
        except ModelUnavailable as e:
            raise CaptureError(
                f"{capture.path / 'capture.json'}: the run's reference model {reference_name!r} "
                f"cannot be loaded here ({e}); copy it to that path, or edit reference.name_or_path "
                "to a folder holding it"
            ) from None
        reference.requires_grad_(False)
        loaded = LoadedModel(loaded.policy, reference, loaded.tokenizer, loaded.name)
    task = captured_task(capture, loaded.tokenizer, task)
    register_task(task.name, lambda: task)
    step = GRPOStep(cfg, task=task, loaded=loaded)
    step.at_reference = reference_name is None  # beta = 0: no reference in TRL; here the policy's own copy
    step.capture, step.stored_rewards = capture, not any(not isinstance(f, StoredReward) for f in task.reward_funcs)
    step.result = StepRun(
        cfg, rollout=captured_rollout(capture, loaded.tokenizer), timings={"rollout": PhaseTiming(0.0, 0.0)}
    )
    return step


# ---- does the replay reproduce the trainer's step?


def absolute_positions(model) -> bool:
    """Whether the model adds learned absolute position embeddings (GPT-2's wpe), which left padding shifts."""
    return any(
        isinstance(m, torch.nn.Embedding) and (name.endswith("wpe") or "position_embedding" in name)
        for name, m in model.named_modules()
    )


def has_dropout(model) -> bool:
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def replay_trl_step(step, run):
    """The captured optimizer step, replayed as TRL took it (`trl_step.trl_step`) under the step's config:
    its micro-batches and pass, pi_old and the reference's log-probs from generation time (recomputed when a
    scoring toggle changed them and the step is its generation's first), the trainer's dropout masks."""
    from .specs import loss_spec_of, scoring_of
    from .trl_step import trl_step

    capture, cfg, b = step.capture, run.config, step.capture.batch
    step.restore_policy()  # the weights before the step, whatever the engine's update phase did to them
    schedule = capture.schedule
    as_captured = scoring_of(cfg) == scoring_of(config_from_capture(capture))
    first_of_generation = schedule["generation_first_step"] == capture.meta["step"]
    old = b.get("old_per_token_logps")
    if old is not None and not as_captured and first_of_generation:
        old = run.logprobs.policy
    ref = b.get("ref_per_token_logps") if as_captured else run.logprobs.reference
    states = b.get("rng_states")
    scoring = scoring_of(cfg)
    fused = scoring.temperature == cfg.temperature and scoring.gather == "per_position"
    if fused:
        add_trl_head(step.policy, cfg.temperature, bool(capture.meta["grpo_config"].get("cast_lm_head_to_fp32")))
    return trl_step(
        step.policy,
        run.rollout,
        run.logprobs.mask,
        run.advantages.values,
        scoring_of(cfg),
        loss_spec_of(cfg),
        [mb["rows"] for mb in schedule["micro_batches"]],
        old_logps=None if old is None else old.float(),
        ref_logps=None if ref is None else ref.float(),
        rng_states=None if states is None else list(states),
        max_grad_norm=cfg.max_grad_norm,
        fused=fused,
    )


def add_trl_head(model, temperature: float, cast_lm_head_to_fp32: bool) -> None:
    """TRL's fused LM head on `model` (once): `model(..., fused_lm_head=True)` then scores as the trainer did;
    every other call is the model's own forward."""
    from trl.trainer.utils import add_fused_lm_head

    if getattr(model, "_trl_fused_head", None) != (temperature, cast_lm_head_to_fp32):
        if getattr(model, "_trl_fused_head", None) is not None:
            del model.forward  # back to the class's forward before patching again
        add_fused_lm_head(
            model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=("log_probs", "entropy")
        )
        model._trl_fused_head = (temperature, cast_lm_head_to_fp32)


def pitfalls(capture: Capture, model) -> dict[str, str]:
    """What the captured run did that the suite calls a pitfall, whether or not it explains a difference."""
    left_padded = bool((capture.batch["prompt_mask"][:, 0] == 0).any())
    out = {}
    if absolute_positions(model) and not capture.meta["position_ids"] and left_padded:
        out["positions"] = (
            "absolute positions scored without position_ids: left-padded rows were scored at "
            "positions shifted from those they were sampled at"
        )
    if has_dropout(model) and not capture.meta["grpo_config"]["disable_dropout"]:
        out["dropout"] = "dropout was on in the trainer's forward passes (disable_dropout=False)"
    return out


def causes(capture: Capture, model, replayed_dropout: bool) -> dict[str, str]:
    """Each cause of a difference between the replay and the trainer this module can detect: 'present: ...'
    or 'absent: ...'."""
    g, b = capture.meta["grpo_config"], capture.batch
    out = {}
    dropout_on = has_dropout(model) and not g["disable_dropout"]
    if not dropout_on:
        out["dropout"] = "absent: dropout off" + ("" if has_dropout(model) else " (the model has none)")
    elif replayed_dropout:
        out["dropout"] = "absent: the trainer's dropout masks are replayed from its captured random states"
    else:
        out["dropout"] = (
            "present: dropout was on and its masks are not replayed (a multi-process or older "
            "capture); loss, kl and grad_norm differ by dropout noise"
        )
    if "sampling_per_token_logps" in b:
        mask = b["completion_mask"].bool()
        gap = (b["sampling_per_token_logps"] - b["trainer_per_token_logps"]).abs()[mask].nan_to_num(0).max().item()
        out["sampler_gap"] = f"present: max |sampler - trainer| log-prob {gap:.3g}"
    else:
        out["sampler_gap"] = "absent: the trainer generated with its own model (no sampler log-probs)"
    if capture.schedule is None:
        out["micro_batches"] = (
            "present: no schedule recorded (a multi-process or older capture): the whole "
            "batch is replayed as one micro-batch"
        )
    return out


def reproduction(run, capture: Capture, model, step=None) -> dict:
    """{"logged": the trainer's numbers for the step, "replayed": ours, "difference": ours - the trainer's,
    "logps": our per-token log-probs against the trainer's, "rewards": per reward function, the largest
    |ours - captured|, "pitfalls": `pitfalls`, "causes": `causes`}. With `step` (the GRPOStep) and a
    captured schedule, the optimizer step is replayed micro-batch by micro-batch (`replay_trl_step`); without,
    from the whole batch as one (`step.metrics`)."""
    from .step import metrics

    trainer_logps = capture.batch["trainer_per_token_logps"].float()
    ours = metrics(run)
    replayed_dropout = False
    if (
        step is not None
        and capture.schedule is not None
        and run.config.num_prompts * run.config.num_generations == capture.num_samples
    ):
        replay = replay_trl_step(step, run)
        ours = {**ours, **replay.metrics, "loss": replay.loss, "grad_norm": replay.grad_norm}
        policy_logps = replay.logps
        replayed_dropout = "rng_states" in capture.batch and run.config.dropout
    else:
        policy_logps = run.logprobs.policy
    logged = capture.step_metrics
    keys = [k for k in COMPARED if logged.get(k) is not None and k in ours]
    mask = capture.batch["completion_mask"].bool() & trainer_logps.isfinite() & policy_logps.isfinite()
    gap = (policy_logps - trainer_logps).abs()[mask]
    return {
        "step": capture.meta["step"],
        "config": {k: v for k, v in dataclasses.asdict(run.config).items() if k not in ("model", "task")},
        "logged": {k: logged[k] for k in keys},
        "replayed": {k: ours[k] for k in keys},
        "difference": {k: ours[k] - logged[k] for k in keys},
        "logps": {
            "max_abs_difference": gap.max().item() if len(gap) else None,
            "mean_abs_difference": gap.mean().item() if len(gap) else None,
            "rows_compared": int(mask.any(1).sum()),
        },
        "rewards": reward_drift(run.rewards, capture),
        "pitfalls": pitfalls(capture, model),
        "causes": causes(capture, model, replayed_dropout),
    }


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
