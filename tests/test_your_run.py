"""Your run, exactly: the user's own script (`user_train.py`: a plain GRPOConfig, a model in a relative folder, two
reward functions), captured with TRL's default logging_steps=10 and replayed from another directory with the CLI,
must reproduce every number the same run logs at that step with logging_steps=1 (same seed, same numbers).
Then a matrix of batch layouts and loss types, in-process, each captured step against its own log."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from arithmetic_task import build_tiny_llama, build_tiny_model  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("task_registry_restored"),
    pytest.mark.slow,  # `make test-slow`: a user's TRL runs and replay commands, each a fresh process (two minutes)
]
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
)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-7


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    build_tiny_model(folder / "my-model")
    shutil.copy(TESTS / "user_train.py", folder / "user_train.py")
    return folder


def train(user_dir: Path, out: str, logging_steps: int, changes: dict) -> Path:
    done = subprocess.run(
        [sys.executable, "user_train.py", out, str(logging_steps), json.dumps(changes)],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return user_dir / out


def replay_cli(capture: Path, cwd: Path, *extra: str) -> dict:
    out = cwd / f"replay-{capture.name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "replay", str(capture), "--json", str(out), *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def logged_steps(run: Path) -> dict[int, dict]:
    return {h["step"]: h for h in json.loads((run / "log_history.json").read_text()) if "loss" in h}


def assert_reproduces(replayed: dict, logged: dict, must: tuple[str, ...]) -> None:
    for name in must:
        assert name in replayed["replayed"], (name, sorted(replayed["replayed"]))
    for name, value in replayed["replayed"].items():
        assert close(value, logged[name]), (replayed["step"], name, value, logged[name])


@pytest.mark.parametrize(
    "changes,steps,must",
    [
        ({}, [2], ("loss", "grad_norm", "reward", "reward_std", "entropy", "clip_ratio/region_mean")),
        (
            {"num_iterations": 2, "gradient_accumulation_steps": 2, "beta": 0.04, "loss_type": "grpo", "max_steps": 4},
            [1, 2, 3, 4],
            ("loss", "grad_norm", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean"),
        ),
    ],
    ids=["defaults", "mu2-ga2-beta-grpo"],
)
def test_a_plain_config_captured_every_10_steps_replays_each_step_from_another_directory(
    user_dir, tmp_path, changes, steps, must
):
    name = "-".join(f"{k}{v}" for k, v in changes.items()) or "defaults"
    captured = train(user_dir, f"run10-{name}", 10, {**changes, "capture": steps})
    every_step = train(user_dir, f"run1-{name}", 1, {**changes, "capture": steps[:1]})
    logs = logged_steps(every_step)
    assert sorted(p.name for p in (captured / "captures").iterdir()) == [f"step-{k}" for k in steps]
    meta = json.loads((captured / "captures" / f"step-{steps[0]}" / "capture.json").read_text())
    assert meta["grpo_config"]["epsilon_high"] is None and meta["resolved"]["epsilon_high"] == 0.2  # TRL's None
    assert meta["grpo_config"]["disable_dropout"] is False and meta["resolved"]["mixed_precision"] == "bf16"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for k in steps:
        out = replay_cli(captured / "captures" / f"step-{k}", elsewhere)
        assert_reproduces(out, logs[k], must)
        assert out["logps"]["max_abs_difference"] == 0.0  # the trainer's dropout masks, replayed
        assert out["causes"]["dropout"].startswith("absent: the trainer's dropout masks are replayed")
        assert "dropout" in out["pitfalls"]
    if changes:  # pass 2 of each generation: pi != pi_old, the clip region can be hit
        schedule = [
            json.loads((captured / "captures" / f"step-{k}" / "capture.json").read_text())["schedule"] for k in steps
        ]
        assert [s["micro_batches"][0]["pass"] for s in schedule] == [0, 1, 0, 1]


def test_a_step_spanning_two_generations_is_named_at_the_end(user_dir):
    """steps_per_generation 1 and GA 2: each optimizer step spans two generation batches, which a capture cannot
    hold; the warning names the step and why, and step 3 (beyond max_steps) is named too."""
    done = subprocess.run(
        [
            sys.executable,
            "user_train.py",
            "run-span",
            "1",
            json.dumps({"gradient_accumulation_steps": 2, "steps_per_generation": 1, "capture": [1, 3]}),
        ],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1 was not captured: it spans two generation batches" in done.stderr
    assert "step 3 was not captured: training ended at step 2" in done.stderr


LAYOUTS = {
    "steps_per_generation 2, GA 1 (dr_grpo)": dict(steps_per_generation=2, loss_type="dr_grpo"),
    "mu 2, sequence-level ratio": dict(num_iterations=2, importance_sampling_level="sequence", beta=0.04),
    "cispo, mu 2": dict(num_iterations=2, loss_type="cispo", epsilon_high=5.0),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_replays_each_captured_step_in_process(layout, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from user_train import REWARD_FUNCS

    from grpo_debug.capture import CaptureCallback, open_capture
    from grpo_debug.capture.replay import reproduction

    build_tiny_model(tmp_path / "model")
    prompts = [f"What is {a}+{b}? " for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=12,
        max_steps=2,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        **LAYOUTS[layout],
    )
    trainer = GRPOTrainer(
        model=str(tmp_path / "model"),
        reward_funcs=REWARD_FUNCS,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
    )
    trainer.add_callback(CaptureCallback(tmp_path / "captures", steps=[1, 2]))
    trainer.train()
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    for k in (1, 2):
        step = open_capture(tmp_path / "captures" / f"step-{k}", task=REWARD_FUNCS)
        out = reproduction(step.run(until="advantages"), step.capture, step.policy, step)
        assert_reproduces(out, logs[k], ("loss", "grad_norm", "entropy"))
        assert out["rewards"] == {"digits": 0.0, "short": 0.0}  # your functions give the captured rewards back


def test_a_llama_with_rmsnorm_replays_its_steps(tmp_path):
    """Rotary positions, RMSNorm, no dropout in its config: mu 2, GA 2, beta 0.04."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from user_train import REWARD_FUNCS

    from grpo_debug.capture import CaptureCallback, open_capture
    from grpo_debug.capture.replay import reproduction

    build_tiny_llama(tmp_path / "llama")
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        num_iterations=2,
        gradient_accumulation_steps=2,
        beta=0.04,
    )
    trainer = GRPOTrainer(
        model=str(tmp_path / "llama"),
        reward_funcs=REWARD_FUNCS,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["What is 1+2? ", "What is 33+4? "]}),
    )
    trainer.add_callback(CaptureCallback(tmp_path / "captures", steps=[1, 2]))
    trainer.train()
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    for k in (1, 2):
        step = open_capture(tmp_path / "captures" / f"step-{k}")
        out = reproduction(step.run(until="advantages"), step.capture, step.policy, step)
        assert_reproduces(out, logs[k], ("loss", "grad_norm", "kl", "entropy"))


# ---- a capture is untrusted input


def _damage(capture: Path, how: str) -> None:
    batch, meta = capture / "batch.pt", capture / "capture.json"
    if how == "no batch.pt":
        batch.unlink()
    elif how == "truncated batch.pt":
        batch.write_bytes(batch.read_bytes()[:200])
    elif how == "corrupted batch.pt":
        data = bytearray(batch.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
        batch.write_bytes(bytes(data))
    elif how == "a pickle payload in batch.pt":
        import pickle

        class Payload:
            def __reduce__(self):
                return (print, ("payload ran",))

        batch.write_bytes(pickle.dumps({"prompt_ids": Payload()}))
    elif how in ("NaN old log-probs", "advantages of another shape", "a token id outside the vocabulary"):
        tensors = torch.load(batch, weights_only=True)
        if how == "NaN old log-probs":
            tensors["old_per_token_logps"] = torch.full_like(tensors["completion_ids"], float("nan"), dtype=torch.float)
        elif how == "advantages of another shape":
            tensors["advantages"] = tensors["advantages"][:-1]
        else:
            tensors["completion_ids"][0, 0] = 10**6
        torch.save(tensors, batch)
    elif how == "truncated capture.json":
        meta.write_text(meta.read_text()[:100])
    elif how in ("edited architecture", "a schedule row out of range", "rewards of another length"):
        data = json.loads(meta.read_text())
        if how == "edited architecture":
            config = capture / "policy" / "config.json"
            cfg = json.loads(config.read_text())
            cfg.update(n_layer=32, n_embd=4096)
            config.write_text(json.dumps(cfg))
        elif how == "a schedule row out of range":
            data["schedule"]["micro_batches"][0]["rows"][0] = 999
        else:
            first = next(iter(data["rewards"]))
            data["rewards"][first] = data["rewards"][first][:-1]
        meta.write_text(json.dumps(data))
    elif how == "no weights":
        for f in (capture / "policy").glob("*.safetensors"):
            f.unlink()
    elif how == "a flipped byte in the weights":
        weights = next((capture / "policy").glob("*.safetensors"))
        data = bytearray(weights.read_bytes())
        data[-100] ^= 0x40
        weights.write_bytes(bytes(data))
    elif how in ("a NaN weight", "inf weights", "int32 weights"):
        from safetensors.torch import load_file, save_file

        weights = next((capture / "policy").glob("*.safetensors"))
        tensors = load_file(weights)
        first = next(iter(tensors))
        if how == "a NaN weight":
            tensors[first].view(-1)[0] = float("nan")
        elif how == "inf weights":
            tensors = {k: torch.full_like(v, float("inf")) for k, v in tensors.items()}
        else:
            tensors = {k: v.to(torch.int32) for k, v in tensors.items()}
        save_file(tensors, weights, metadata={"format": "pt"})
    elif how == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
            (capture / "policy" / name).unlink(missing_ok=True)
    elif how in ("100000 layers in the config", "a 9.7B-parameter config"):
        config = capture / "policy" / "config.json"
        cfg = json.loads(config.read_text())
        cfg.update(
            {"num_hidden_layers": 100000}
            if how == "100000 layers in the config"
            else {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 48, "vocab_size": 32000}
        )
        config.write_text(json.dumps(cfg))
    elif how in ("float token ids", "an all-zero completion mask"):
        tensors = torch.load(batch, weights_only=True)
        if how == "float token ids":
            tensors["completion_ids"] = tensors["completion_ids"].float()
        else:
            tensors["completion_mask"] = torch.zeros_like(tensors["completion_mask"])
        torch.save(tensors, batch)
    elif how in ("string rewards", "string reward weights", "a list for grpo_config", "policy folder outside"):
        data = json.loads(meta.read_text())
        first = next(iter(data["rewards"]))
        if how == "string rewards":
            data["rewards"][first] = ["1.0"] * len(data["rewards"][first])
        elif how == "string reward weights":
            data["reward_weights"][first] = "1"
        elif how == "a list for grpo_config":
            data["grpo_config"] = [1, 2]
        else:
            shutil.copytree(capture / "policy", capture.parent / "elsewhere")
            data["policy"]["folder"] = "../elsewhere"
        meta.write_text(json.dumps(data))


DAMAGES = [
    "no batch.pt",
    "truncated batch.pt",
    "corrupted batch.pt",
    "a pickle payload in batch.pt",
    "NaN old log-probs",
    "advantages of another shape",
    "a token id outside the vocabulary",
    "truncated capture.json",
    "edited architecture",
    "a schedule row out of range",
    "rewards of another length",
    "no weights",
    "a flipped byte in the weights",
    "a NaN weight",
    "inf weights",
    "int32 weights",
    "no tokenizer",
    "100000 layers in the config",
    "a 9.7B-parameter config",
    "float token ids",
    "an all-zero completion mask",
    "string rewards",
    "string reward weights",
    "a list for grpo_config",
    "policy folder outside",
]
# resealed, a flipped byte is an edit nothing can tell from a real weight: the checksum is what catches it
UNDETECTABLE_ONCE_RESEALED = {"a flipped byte in the weights"}


@pytest.fixture(scope="module")
def good_capture(user_dir) -> Path:
    run = train(user_dir, "run-damage", 1, {"num_iterations": 2, "capture": [2]})
    return run / "captures" / "step-2"


@pytest.mark.parametrize(
    "how, resealed",
    [(how, False) for how in DAMAGES] + [(how, True) for how in DAMAGES if how not in UNDETECTABLE_ONCE_RESEALED],
    ids=lambda v: {False: "as damaged", True: "checksums rewritten"}.get(v, v) if isinstance(v, bool) else v,
)
def test_a_damaged_capture_is_refused_naming_the_file(good_capture, tmp_path, how, resealed, capsys):
    """As damaged, the checksums catch it; with checksums.json rewritten over the damage (an edit made on
    purpose), the checks of what the files hold still refuse it."""
    from grpo_debug.capture.reading import CaptureError, load_capture
    from grpo_debug.checksums import write_checksums

    copy = tmp_path / "capture"
    shutil.copytree(good_capture, copy)
    load_capture(copy)  # the good one opens
    _damage(copy, how)
    if resealed:
        write_checksums(copy)
    with pytest.raises(CaptureError) as refused:
        load_capture(copy)
    assert str(copy) in str(refused.value), refused.value
    if not resealed and how != "no batch.pt":
        assert "checksums.json" in str(refused.value), f"not refused by the capture's checksums: {refused.value}"
    if resealed:
        assert "checksums.json" not in str(refused.value), f"resealed, yet refused by checksums.json: {refused.value}"
    assert "\n" not in str(refused.value), f"not one line: {refused.value}"
    assert "payload ran" not in capsys.readouterr().out
    print(f"{how} ({'resealed' if resealed else 'as damaged'}): {refused.value}")


@pytest.mark.parametrize("reference", ["a 9.7B-parameter config over small weights", "/etc"])
def test_a_reference_from_outside_the_capture_is_checked_before_it_is_built(good_capture, tmp_path, reference):
    """The reference folder a capture names is not the capture's own: its config is bounded by its weights'
    headers before transformers builds anything (a config describing ~9.7B parameters allocated them)."""
    from grpo_debug.capture import open_capture
    from grpo_debug.capture.reading import CaptureError
    from grpo_debug.checksums import write_checksums

    copy = tmp_path / "capture"
    shutil.copytree(good_capture, copy)
    if reference == "/etc":
        named = Path("/etc")
    else:
        named = tmp_path / "reference"
        shutil.copytree(good_capture / "policy", named)
        cfg = json.loads((named / "config.json").read_text())
        cfg.update(hidden_size=4096, intermediate_size=11008, num_hidden_layers=48, vocab_size=32000)
        (named / "config.json").write_text(json.dumps(cfg))
    meta = json.loads((copy / "capture.json").read_text())
    meta["reference"]["name_or_path"] = str(named)
    (copy / "capture.json").write_text(json.dumps(meta))
    write_checksums(copy)
    with pytest.raises(CaptureError) as refused:
        open_capture(copy)
    assert str(named) in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_trl_generates_in_train_mode_with_dropout_on_and_the_trl_preset_samples_so(tmp_path):
    """TRL 1.16's GRPOTrainer generates with the policy in train mode when disable_dropout=False (its default):
    every generation forward (no grad) sees module.training. The `trl` preset samples the same way; a preset
    switched on a cached rollout keeps the rollout's mode; the bridge refuses the mix TRL cannot express."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from user_train import REWARD_FUNCS

    from grpo_debug.capture.trl_bridge import no_trl_switch
    from grpo_debug.config import StepConfig

    build_tiny_model(tmp_path / "model")
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=str(tmp_path / "model"),
        reward_funcs=REWARD_FUNCS,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["What is 1+2? "] * 4}),
    )
    modes = []
    trainer.model.register_forward_pre_hook(
        lambda m, a: modes.append(m.training) if not torch.is_grad_enabled() else None
    )
    trainer.train()
    assert modes and all(modes)  # every no-grad forward (generation) ran in train mode
    assert StepConfig.preset("trl").sample_dropout and not StepConfig().sample_dropout
    assert not StepConfig().with_preset("trl").sample_dropout  # a cached rollout is kept on a preset switch
    assert no_trl_switch(StepConfig.preset("trl")) == {}
    assert no_trl_switch(StepConfig().with_preset("trl")) == {"sample_dropout": False}


def test_a_default_config_is_opened_with_the_values_the_trainer_resolved(tmp_path):
    """TRL keeps None in the saved GRPOConfig where the trainer resolves a value at run time; the replay's
    StepConfig holds the trainer's own values."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from user_train import REWARD_FUNCS

    from grpo_debug.capture import CaptureCallback
    from grpo_debug.capture.captured_config import config_from_capture
    from grpo_debug.capture.reading import load_capture

    build_tiny_model(tmp_path / "model")
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=str(tmp_path / "model"),
        reward_funcs=REWARD_FUNCS,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["What is 1+2? "] * 4}),
    )
    trainer.add_callback(CaptureCallback(tmp_path / "captures", steps=[1]))
    trainer.train()
    capture = load_capture(tmp_path / "captures" / "step-1")
    assert capture.meta["grpo_config"]["epsilon_high"] is None  # as saved
    cfg = config_from_capture(capture)
    assert (cfg.epsilon_low, cfg.epsilon_high) == (trainer.epsilon_low, trainer.epsilon_high)
    assert (cfg.micro_batches, cfg.gradient_accumulation_steps) == (
        trainer.args.steps_per_generation,
        trainer.args.gradient_accumulation_steps,
    )
    assert (cfg.num_iterations, cfg.beta, cfg.loss_type, cfg.temperature) == (
        trainer.num_iterations,
        trainer.beta,
        trainer.loss_type,
        trainer.temperature,
    )
    assert cfg.dtype == ("bfloat16" if str(trainer.accelerator.mixed_precision) == "bf16" else "float32")
    assert cfg.dropout == cfg.sample_dropout == (not trainer.args.disable_dropout)
    assert cfg.max_new_tokens == trainer.max_completion_length and cfg.learning_rate == trainer.args.learning_rate


@pytest.mark.parametrize("how", ["100000 layers in the config", "a 9.7B-parameter config"])
def test_a_config_too_large_for_its_weights_is_refused_within_a_memory_and_time_bound(good_capture, tmp_path, how):
    """Under a 3 GB address-space limit and a 120 s timeout, in a fresh process: the check reads the weights'
    headers and bounds the config by them before building anything (before: the 100000-layer config ran past
    120 s with memory rising, the ~9.7B one allocated its parameters)."""
    from grpo_debug.checksums import write_checksums

    copy = tmp_path / "capture"
    shutil.copytree(good_capture, copy)
    _damage(copy, how)
    write_checksums(copy)
    bounded = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))\n"
        "from grpo_debug.capture.reading import CaptureError, load_capture\n"
        "try:\n"
        f"    load_capture({str(copy)!r})\n"
        "except CaptureError as e:\n"
        "    print(e)\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", bounded], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, f"not refused within the bounds (exit {done.returncode}):\n{done.stderr[-2000:]}"
    assert "config.json" in done.stdout and "layers" in done.stdout, done.stdout


def test_a_bad_change_to_a_capture_blames_the_change_not_the_capture(good_capture):
    """`open_step(..., beta="0.0")` once read "its GRPOConfig has no StepConfig here", blaming the capture."""
    from grpo_debug.capture import open_capture

    with pytest.raises(ValueError, match=r"your change to the captured step \(beta\): StepConfig.beta = '0.0'"):
        open_capture(good_capture, beta="0.0")
