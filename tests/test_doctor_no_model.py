"""`doctor --no-model`: the detectors a capture's own tensors answer, run without building the model. On a real
TRL capture they agree with the full doctor's, no model is loaded, the rest are named as not run; the command
prints what opening the capture would take before it loads anything."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.detectors.detectors import DETECTORS
from grpo_debug.doctor import WITHOUT_MODEL, diagnose, diagnose_without_model

pytestmark = pytest.mark.usefixtures("task_registry_restored")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A real 2-step TRL run of the bundled model (TRL's own pitfalls on: dropout, no position_ids; beta 0.04),
    its second step captured."""
    out = tmp_path_factory.mktemp("no-model")
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=24, beta=0.04)
    cfg = cfg.replace(position_ids=False, dropout=True, sample_dropout=True)
    trainer = trl_trainer(cfg, str(out), max_steps=2)
    trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
    trainer.train()
    return out / "captures" / "step-2"


def test_without_the_model_the_capture_answers_what_it_can_and_agrees_with_the_full_doctor(capture, monkeypatch):
    from grpo_debug.capture.opening import open_capture

    full = {f.id: f for f in diagnose(open_capture(capture), flip=False).findings}

    def no_model(*args, **kwargs):
        raise AssertionError("--no-model loaded a model")

    monkeypatch.setattr("grpo_debug.model.load_model", no_model)
    monkeypatch.setattr("grpo_debug.capture.captured_inputs.load_model", no_model)
    report = diagnose_without_model(capture)
    ran = {f.id: f for f in report.findings}
    assert set(ran) == set(WITHOUT_MODEL), f"ran {sorted(ran)}, not the detectors a capture answers"
    assert set(report.not_run) == {d.__name__ for d in DETECTORS} - set(WITHOUT_MODEL), report.not_run
    differ = {k: (f.severity, full[k].severity) for k, f in ran.items() if f.severity != full[k].severity}
    differ.pop("kl_blowup", None)  # below: the logged kl against the exact one
    assert not differ, f"without the model, these findings differ from the full doctor's (ours, full): {differ}"
    logged, exact = ran["kl_blowup"], full["kl_blowup"]
    assert logged.evidence["source"] == "TRL's logged kl" and exact.evidence["source"].startswith("exact"), logged
    assert "dropout's noise" in logged.summary, f"the logged kl's dropout noise is not said: {logged.summary}"


def test_the_command_prints_the_capture_size_and_runs_without_the_model_from_another_folder(capture, tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(capture), "--no-model", "--json", str(report)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("capture ") and "MB on disk" in first and "GB of memory" in first, first
    assert "not run without the model" in done.stdout, done.stdout
    written = json.loads(report.read_text())
    assert set(written["not_run"]) and {f["id"] for f in written["findings"]} == set(WITHOUT_MODEL)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [(["--no-model"], "give the capture's folder"), (["CAPTURE", "--no-model", "--horizon", "2"], "need the model")],
)
def test_no_model_refuses_what_needs_a_model_in_one_line(capture, arguments, problem):
    arguments = [str(capture) if a == "CAPTURE" else a for a in arguments]
    done = subprocess.run([sys.executable, "-m", "grpo_debug", "doctor", *arguments], capture_output=True, text=True)
    assert done.returncode == 2 and problem in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# ---- dropout, as the capture's configs state it: the model's and a LoRA adapter's


def digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def user_capture(folder: Path, lora_dropout: float | None) -> Path:
    """A user's one-step run of a tiny Llama (no dropout of its own) with beta 0.04, its step captured: with a LoRA
    adapter of `lora_dropout` (None: the full model trained)."""
    from arithmetic_task import build_tiny_llama
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    build_tiny_llama(folder / "my-llama")
    args = GRPOConfig(output_dir=str(folder / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=1, report_to="none", use_cpu=True, beta=0.04)  # fmt: skip
    lora = None if lora_dropout is None else LoraConfig(r=4, lora_dropout=lora_dropout, target_modules=["q_proj"])
    prompts = [f"What is {a}+{b}? " for a, b in [(1, 2), (3, 4)]]
    trainer = GRPOTrainer(model=str(folder / "my-llama"), reward_funcs=[digits], args=args, peft_config=lora,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))  # fmt: skip
    trainer.add_callback(CaptureCallback(folder / "captures", steps=[1]))
    trainer.train()
    return folder / "captures" / "step-1"


@pytest.fixture(scope="module")
def lora_capture(tmp_path_factory) -> Path:
    return user_capture(tmp_path_factory.mktemp("lora"), lora_dropout=0.1)


@pytest.fixture(scope="module")
def no_dropout_capture(tmp_path_factory) -> Path:
    return user_capture(tmp_path_factory.mktemp("plain"), lora_dropout=None)


def test_without_the_model_the_adapters_lora_dropout_is_read_and_agrees_with_the_full_doctor(lora_capture):
    from grpo_debug.capture.opening import open_capture

    ran = {f.id: f for f in diagnose_without_model(lora_capture).findings}
    found = ran["dropout"]
    assert found.severity == "warning" and "adapter lora_dropout=0.1" in found.summary, found
    assert found.evidence["sources"] == ["adapter lora_dropout=0.1"] and found.evidence["max_logp_gap"] is None
    assert "with dropout on in the trainer's forwards" in ran["kl_blowup"].summary, ran["kl_blowup"]
    full = {f.id: f for f in diagnose(open_capture(lora_capture, task=[digits]), flip=False).findings}
    assert full["dropout"].severity == found.severity, (full["dropout"], found)


def test_without_the_model_a_model_without_dropout_is_not_said_to_have_any(no_dropout_capture):
    report = diagnose_without_model(no_dropout_capture)
    ran = {f.id: f for f in report.findings}
    assert ran["dropout"].severity == "absent" and ran["dropout"].summary == "the model has no dropout"
    kl = ran["kl_blowup"]
    assert kl.evidence["source"] == "TRL's logged kl" and "dropout" not in kl.summary, kl
    assert report.config["dropout"] is True, "the report's config is the captured one (TRL's disable_dropout=False)"


def test_every_dropout_a_config_states_is_named():
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    from grpo_debug.doctor.without_model import adapter_dropouts, config_dropouts

    gpt2 = sorted(config_dropouts(GPT2Config().to_dict()))  # summary_first_dropout: a head a causal LM does not run
    assert gpt2 == ["config.attn_pdrop=0.1", "config.embd_pdrop=0.1", "config.resid_pdrop=0.1"], gpt2
    assert config_dropouts(Qwen2Config(attention_dropout=0.05).to_dict()) == ["config.attention_dropout=0.05"]
    assert config_dropouts(Qwen2Config().to_dict()) == [] and config_dropouts(LlamaConfig().to_dict()) == []
    assert config_dropouts({"hidden_dropout": 0.2, "dropout": True}) == ["config.hidden_dropout=0.2"]
    assert adapter_dropouts({"lora_dropout": 0.1}) == ["adapter lora_dropout=0.1"]
    assert adapter_dropouts({"lora_dropout": 0.0}) == adapter_dropouts(None) == []


def test_a_config_that_leaves_dropout_to_its_defaults_is_read_with_them(tmp_path):
    from grpo_debug.doctor.without_model import config_dropouts, model_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 32}))
    assert "config.attn_pdrop=0.1" in config_dropouts(model_config(tmp_path))  # GPT-2's default: 0.1
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-in-transformers", "p_dropout": 0.3}))
    assert config_dropouts(model_config(tmp_path)) == ["config.p_dropout=0.3"]


def test_the_start_of_a_lora_run_is_sampled_from_its_base_with_the_adapters_off(lora_capture):
    """`doctor.at_start` on a LoRA capture (beta 0.04): TRL's reference is the policy with its adapters off, a
    wrapper around the policy; sampling from it runs, scores with the user's function and leaves the adapter as it was."""
    from grpo_debug.capture.opening import open_capture
    from grpo_debug.doctor.at_start import sample_at_start

    step = open_capture(lora_capture, task=[digits])
    adapter = {k: v.clone() for k, v in step.policy.named_parameters() if v.requires_grad}
    start = sample_at_start(step, draws=2)
    assert start.groups == 2 * step.cfg.num_prompts and 0 <= start.cut <= 1, start
    assert all(torch.equal(v, dict(step.policy.named_parameters())[k]) for k, v in adapter.items()), "adapter moved"
    assert step.loaded.reference is not step.loaded.policy, "the reference was left swapped"
