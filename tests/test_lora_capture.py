"""A LoRA run (`GRPOTrainer(..., peft_config=LoraConfig(...))`) captured as its adapter plus its base's identity,
and replayed: the user's own script (a plain GRPOConfig, a tiny Llama in a relative folder, their reward function),
run from its own directory. The replay must reproduce what TRL logged, the reference (TRL's adapter-disabled
model) included; a capture whose base model changed must be refused before anything is built."""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from arithmetic_task import build_tiny_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")

EXACT = ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "grad_norm")  # test_capture's


def digits(completions, **kwargs):
    """The user's reward: the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-7


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> dict:
    """3 steps of a user's LoRA run in its own folder, steps 2 and 3 captured; TRL's defaults but for the batch shape,
    beta = 0.04 (a reference) and a learning rate that moves the adapter off its zero start at step 1 (TRL's
    1e-6 leaves kl at 0.0 at step 2). The LoRA has dropout, so the trainer's dropout masks are replayed too."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from grpo_debug.capture import CaptureCallback

    user = tmp_path_factory.mktemp("lora-user")
    build_tiny_llama(user / "my-llama")
    prompts = [f"What is {a}+{b}? " for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]
    here = os.getcwd()
    os.chdir(user)
    try:
        args = GRPOConfig(
            output_dir="out",
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            max_steps=3,
            report_to="none",
            use_cpu=True,
            logging_steps=1,
            beta=0.04,
            learning_rate=1e-2,
            seed=1,  # completions of different lengths at step 2: a loss away from 0 (seed 0's are all 8 tokens)
        )
        trainer = GRPOTrainer(
            model="my-llama",
            reward_funcs=[digits],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            peft_config=LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]),
        )
        trainer.add_callback(CaptureCallback("captures", steps=[2, 3]))
        trainer.train()
    finally:
        os.chdir(here)
    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    return {"user": user, "capture": user / "captures" / "step-2", "logged": logged[2], "base": user / "my-llama"}


def test_a_lora_capture_holds_the_adapter_and_names_the_base_by_path_and_hash(lora_run):
    from grpo_debug.capture.reading import load_capture
    from grpo_debug.checksums import sha256

    capture, base = lora_run["capture"], lora_run["base"]
    policy = sorted(p.name for p in (capture / "policy").iterdir())
    assert "adapter_model.safetensors" in policy and "adapter_config.json" in policy, f"no adapter saved: {policy}"
    assert "model.safetensors" not in policy and "config.json" not in policy, f"whole weights were saved: {policy}"
    adapter_bytes = (capture / "policy" / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < (base / "model.safetensors").stat().st_size / 4, (
        "the adapter is not much smaller than the base"
    )
    meta = load_capture(capture).meta
    entry = meta["policy"]["base"]
    assert meta["policy"]["adapter"] == "lora" and entry["name_or_path"] == str(base.resolve()), meta["policy"]
    lines = "".join(f"{n} {sha256(base / n)}\n" for n in ("config.json", "model.safetensors"))
    assert entry["files"] == ["config.json", "model.safetensors"], f"hashed other files: {entry['files']}"
    assert entry["sha256"] == hashlib.sha256(lines.encode()).hexdigest(), "the base's digest is not its files'"
    assert meta["reference"]["name_or_path"] == str(base.resolve()), "TRL's reference (the base) is not named"


def test_the_replay_reproduces_trls_logged_step_and_its_adapter_disabled_reference(lora_run):
    from grpo_debug.capture import open_capture
    from grpo_debug.capture.replay import reproduction

    step = open_capture(lora_run["capture"], task=[digits])
    trainable = [n for n, p in step.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable), f"not only the adapter is trainable: {trainable[:3]}"
    run = step.run(until="update")
    out = reproduction(run, step.capture, step.policy, step)
    logged = lora_run["logged"]
    for name in EXACT:
        assert close(out["replayed"][name], logged[name]), (
            f"{name}: replayed {out['replayed'][name]}, TRL {logged[name]}"
        )
    assert logged["kl"] > 1e-6, f"kl {logged['kl']}: the adapter did not move, so the reference is not tested"
    assert abs(logged["loss"]) > 1e-2, f"loss {logged['loss']}: about 0, a wrong loss would pass too"
    assert out["logps"]["max_abs_difference"] < 1e-4, out["logps"]
    assert out["causes"]["dropout"].startswith("absent: the trainer's dropout masks are replayed"), out["causes"]
    mask = step.capture.batch["completion_mask"].bool()
    trl_reference = step.capture.batch["ref_per_token_logps"]
    gap = (run.logprobs.reference - trl_reference).abs()[mask].max().item()
    assert gap < 1e-5, f"our reference (the base) scores {gap} away from TRL's adapter-disabled reference"
    policy_gap = (run.logprobs.policy - trl_reference).abs()[mask].max().item()
    assert policy_gap > 10 * gap, "the policy scores like the reference: the test cannot tell them apart"


def _with_changed_base_weight(base: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(base / "model.safetensors")
    name = next(k for k in weights if k.endswith("q_proj.weight"))
    weights[name] = weights[name] + 1e-3
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})


def test_a_capture_whose_base_changed_is_refused_before_anything_is_built(lora_run, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    from grpo_debug.capture.reading import CaptureError, load_capture
    from grpo_debug.checksums import write_checksums

    capture, base = lora_run["capture"], lora_run["base"]
    built = []  # the base is checked as a model folder (its config read, built on the meta device) after its hash
    monkeypatch.setattr("grpo_debug.capture.model_folder.check_model_folder", lambda *a, **k: built.append(a))
    kept = tmp_path / "model.safetensors"
    shutil.copy(base / "model.safetensors", kept)
    try:
        _with_changed_base_weight(base)
        with pytest.raises(CaptureError, match="is not the run's: the SHA-256 of its files") as refused:
            load_capture(capture)
    finally:
        shutil.copy(kept, base / "model.safetensors")
        monkeypatch.undo()
    assert built == [], "the base was read as a model before its hash was checked"
    assert "\n" not in str(refused.value) and str(base.resolve()) in str(refused.value), str(refused.value)
    assert load_capture(capture).meta["policy"]["adapter"] == "lora", "the restored base is refused"
    moved = tmp_path / "moved"
    shutil.copytree(capture, moved)
    meta = json.loads((moved / "capture.json").read_text())
    meta["policy"]["base"]["folder"] = str(tmp_path / "nowhere")
    (moved / "capture.json").write_text(json.dumps(meta))
    write_checksums(moved)
    with pytest.raises(CaptureError, match="base model folder .* does not exist here"):
        load_capture(moved)
    meta["policy"]["base"]["folder"] = str(base.resolve())
    (moved / "capture.json").write_text(json.dumps(meta))
    config = json.loads((moved / "policy" / "adapter_config.json").read_text())
    (moved / "policy" / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    write_checksums(moved)  # resealed: the checksums pass, the adapter's shapes do not
    with pytest.raises(CaptureError, match="not those its config gives on the base"):
        load_capture(moved)
    (moved / "policy" / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["no_such_proj"]}))
    write_checksums(moved)  # resealed: peft refuses the config, in one line (its message can hold the model)
    with pytest.raises(CaptureError, match="is not a LoRA config for this base") as refused:
        load_capture(moved)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 600, str(refused.value)
    (moved / "policy" / "adapter_config.json").write_text(json.dumps(config))
    weights = load_file(moved / "policy" / "adapter_model.safetensors")
    first = sorted(weights)[0]
    weights[first] = weights[first].clone().fill_(float("nan"))
    save_file(weights, moved / "policy" / "adapter_model.safetensors")
    write_checksums(moved)  # resealed: a NaN adapter weight is refused by the weights' own check
    with pytest.raises(CaptureError, match=f"weight {first} holds NaN or inf"):
        load_capture(moved)


def test_a_lora_capture_short_of_an_adapter_state_tensor_is_refused_naming_it(lora_run, tmp_path):
    """The optimizer's state of an adapter weight, one tensor removed and resealed: refused when read, naming the
    file and the tensor (the replay once ended in KeyError: 'exp_avg'); a moment of another shape than its adapter
    weight (checked against the adapter file's headers) is refused too."""
    from safetensors.torch import load_file, save_file

    from grpo_debug.capture.reading import CaptureError, load_capture
    from grpo_debug.checksums import write_checksums

    folder = tmp_path / "step-2"
    shutil.copytree(lora_run["capture"], folder)
    file = folder / "optimizer.safetensors"
    state = load_file(file)
    key = sorted(k for k in state if k.endswith("/exp_avg"))[0]
    removed = {k: v for k, v in state.items() if k != key}
    save_file(removed, file)
    write_checksums(folder)
    with pytest.raises(CaptureError, match=f"{file}: {key} is missing: a parameter with AdamW state holds") as refused:
        load_capture(folder)
    assert "\n" not in str(refused.value), str(refused.value)
    save_file({**state, key: state[key].flatten()}, file)
    write_checksums(folder)
    with pytest.raises(CaptureError, match=rf"{key} has shape \({state[key].numel()},\), its parameter"):
        load_capture(folder)


def test_the_doctor_report_builds_on_a_lora_capture(lora_run):
    from grpo_debug.capture import open_capture
    from grpo_debug.detectors.detectors import DETECTORS
    from grpo_debug.doctor import diagnose

    report = diagnose(open_capture(lora_run["capture"], task=[digits]), held_out=0)
    assert len(report.findings) == len(DETECTORS), f"{len(report.findings)} findings for {len(DETECTORS)} detectors"
    assert all(f.severity in ("problem", "warning", "info", "absent") for f in report.findings)


def test_influence_takes_gradients_over_the_adapter_only(lora_run):
    from test_per_sample import naive_per_sample_gradients

    from grpo_debug.capture import open_capture
    from grpo_debug.tracin.influence import (
        influence_scores,
        parameter_set,
        per_sample_train_gradients,
        same_batch_set,
        validation_gradient,
    )
    from grpo_debug.tracin.specs import specs_of

    step = open_capture(lora_run["capture"], task=[digits], dropout=False, dtype="float32")
    run = step.run(until="loss")
    model, spec = step.policy, specs_of(run.config)
    with parameter_set(model, "lora"):
        names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        train = per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, spec)
        _, val_grad = validation_gradient(model, same_batch_set(run), spec, "seqloss-lastadv")
        scores = influence_scores(train, val_grad)
        params = [p for p in model.parameters() if p.requires_grad]
        naive = naive_per_sample_gradients(model, run, run.config).double()
    covered = [names[id(p)] for p in train.params]
    assert covered and all("lora_" in n for n in covered), f"gradients over non-adapter parameters: {covered[:3]}"
    assert len(covered) == len(names), f"{len(covered)} of the {len(names)} adapter parameters have gradients"
    expected = naive @ torch.cat([val_grad[p].flatten() for p in params]).double()
    assert scores.abs().max() > 0, "every influence is 0"
    assert torch.allclose(scores.double(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item()), (
        f"influence {scores.tolist()} is not the naive inner products {expected.tolist()}"
    )


def test_the_replayed_update_of_a_lora_step_lands_on_the_next_steps_adapter(lora_run):
    """The adapter's optimizer state (the base is frozen, so the trainer's AdamW holds the adapter alone) restored:
    step 2 replayed with it lands on the adapter the trainer captured at step 3."""
    from grpo_debug.capture import open_capture
    from grpo_debug.capture.landing import landing
    from grpo_debug.capture.reading import load_capture

    capture = load_capture(lora_run["capture"])
    names = [n for g in capture.meta["optimizer"]["groups"] for n in g["params"]]
    assert names and all("lora_" in n for n in names), f"the optimizer holds more than the adapter: {names[:4]}"
    out = landing(open_capture(lora_run["capture"], [digits]), lora_run["user"] / "captures" / "step-3")
    assert out["exact"], out["optimizer"]
    assert out["trainer_norm"] > 0 and out["cosine"] >= 0.99 and abs(out["norm_ratio"] - 1) <= 0.02, out
    assert out["bit_equal"], f"the replayed LoRA update is not the trainer's: {out}"
