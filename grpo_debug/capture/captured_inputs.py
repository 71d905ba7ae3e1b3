"""A capture as the step's inputs: its batch as the step's rollout (`captured_rollout`) and its models, the policy
before the step and TRL's frozen reference, loaded as TRL loaded them (`captured_models`)."""

from __future__ import annotations

from pathlib import Path

from ..model import LoadedModel, ModelUnavailable, load_model
from ..rollout import Rollout
from .captured import Capture, CaptureError
from .captured_task import captured_texts
from .lora import load_adapter_capture
from .model_folder import check_model_folder


def captured_rollout(capture: Capture, tokenizer):
    """The captured batch as a Rollout. The sampler's log-probs are the engine's (`sampling_per_token_logps`)
    where one generated, else the trainer's own scoring (NaN rows, not trained on at this step, as 0)."""

    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts, completions = captured_texts(capture, tokenizer)
    lengths = b["completion_mask"].sum(1).long()
    lengths = lengths.masked_fill(lengths == 0, b["completion_ids"].shape[1])  # mask_truncated_completions: no EOS
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


def _check_tokenizer(capture: Capture, tokenizer) -> None:
    if len(tokenizer) <= int(capture.batch["completion_ids"].max()):
        raise CaptureError(
            f"{capture.path / 'policy'}: its tokenizer has {len(tokenizer)} tokens, fewer than the "
            "batch's token ids need"
        )


def trained_names(capture: Capture) -> set[str] | None:
    """The parameters the run trained, by name: the capture's `policy.trainable` (None: all of them), else, for a
    capture written before it was recorded, the names the trainer's optimizer groups held (Trainer builds its
    groups from the parameters that require a gradient), else None."""
    policy = capture.meta["policy"]
    if "trainable" in policy:
        return None if policy["trainable"] is None else set(policy["trainable"])
    optimizer = capture.meta.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("groups"), list):
        return {n for g in optimizer["groups"] for n in g["params"]}
    return None


def freeze_as_captured(capture: Capture, policy) -> None:
    """Freeze what the run froze: every parameter the run did not train stops requiring a gradient, so the replay's
    gradients, update and optimizer cover the run's own trained set. A trained name the model lacks is refused."""
    trained = trained_names(capture)
    if trained is None:
        return
    params = dict(policy.named_parameters())
    unknown = sorted(trained - set(params))
    if unknown:
        raise CaptureError(
            f"{capture.path / 'capture.json'}: the run trained {unknown[0]!r}, which the captured policy does not "
            f"have ({len(unknown)} such name(s))"
        )
    for name, param in params.items():
        param.requires_grad_(name in trained)


def captured_models(capture: Capture) -> tuple[LoadedModel, bool]:
    """The captured policy (its weights before the step) and TRL's frozen reference, loaded as TRL loaded it
    (beta != 0), else the policy's own copy; and whether that copy is it (beta = 0: TRL has no reference).
    A LoRA capture: the base with the adapter, and the base as the reference (`lora.load_adapter_capture`)."""
    if capture.meta["policy"].get("adapter"):
        loaded, at_reference = load_adapter_capture(
            capture.path, capture.meta["policy"], capture.meta["reference"]["beta"]
        )
        _check_tokenizer(capture, loaded.tokenizer)
        return loaded, at_reference
    reference_name = capture.meta["reference"]["name_or_path"]
    policy_folder = str(capture.path.resolve() / capture.meta["policy"]["folder"])
    loaded = load_model(policy_folder, reference=reference_name is None)  # beta = 0: its start is the reference
    _check_tokenizer(capture, loaded.tokenizer)
    freeze_as_captured(capture, loaded.policy)
    if reference_name is None:
        return loaded, True
    if Path(str(reference_name)).is_dir():  # a local folder from outside the capture: checked like the policy's
        check_model_folder(reference_name, CaptureError)
    try:
        reference = load_model(reference_name, hub=False, reference=False).policy  # from a file: never downloaded
    except ModelUnavailable as e:
        reason = str(e).splitlines()[0]
        raise CaptureError(
            f"{capture.path / 'capture.json'}: the run's reference model {reference_name!r} is not here "
            f"({reason}); copy it to that path, or point the capture at the folder holding it: set "
            f"reference.name_or_path in capture.json, then reseal the capture (python -m grpo_debug reseal "
            f"{capture.path}: its checksums then trust the capture as you edited it)"
        ) from None
    reference.requires_grad_(False)
    return LoadedModel(loaded.policy, reference, loaded.tokenizer, loaded.name), False
