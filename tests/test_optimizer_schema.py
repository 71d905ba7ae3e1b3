"""The trainer's optimizer read like the weights (`capture.optimizer_schema`): a capture from a real TRL 1.16 run
(a user's script on a tiny Qwen2, weight decay and a linear schedule), damaged as a reliability probe damaged it
(capture.json's optimizer block or optimizer.safetensors) and resealed so that the damage reaches the parser, is
refused by `replay` and `doctor --no-model` in one line naming the file and the field, before anything is built;
a legitimately partial state is replayed as torch reads it, and said so; the undamaged capture lands on the
trainer's next weights bit for bit. Also: a float16 replay on a CPU under the run's bfloat16 autocast is refused
before the model loads, and a long command-line value is echoed cut to 200 characters."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import qwen2_user, user_train_run  # noqa: E402

from grpo_debug.checksums import write_checksums  # noqa: E402
from grpo_debug.cli.commands import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
RUN = {"capture": [2, 3], "max_steps": 3, "learning_rate": 1e-3, "weight_decay": 0.01}


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> Path:
    """A user's 3-step run (user_train.py), steps 2 and 3 captured: AdamW, two groups, state from step 1."""
    return user_train_run(qwen2_user(tmp_path_factory.mktemp("user")), "run", RUN)


def damaged(captures: Path, tmp_path: Path, meta=None, tensors=None, step: str = "step-2") -> Path:
    """`step` (step 2) copied, `meta(capture.json)` and `tensors(optimizer state)` applied in place, then resealed."""
    folder = tmp_path / step
    shutil.copytree(captures / step, folder)
    if meta:
        js = json.loads((folder / "capture.json").read_text())
        meta(js)
        (folder / "capture.json").write_text(json.dumps(js))
    if tensors is flipped_tail:
        flipped_tail(folder / "optimizer.safetensors")
    elif tensors:
        state = load_file(str(folder / "optimizer.safetensors"))
        tensors(state)
        save_file(state, str(folder / "optimizer.safetensors"))
    write_checksums(folder)
    return folder


def command(capsys, *argv) -> tuple[int, str, str]:
    """The command line's own `main`, in process: (exit status, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def first(state: dict, part: str) -> str:
    return next(k for k in sorted(state) if k.endswith(f"/{part}"))


def optimizer(js: dict) -> dict:
    return js["optimizer"]


def set_entry(key, value):
    return lambda js: optimizer(js).__setitem__(key, value)


def set_group(key, value):
    return lambda js: optimizer(js)["groups"][0].__setitem__(key, value)


def set_tensor(part, change):
    def apply(state):
        key = first(state, part)
        state[key] = change(state[key])

    return apply


def negative_entry(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = -3.2e-05
    return t


def drop_parameter(state: dict) -> None:
    name = first(state, "exp_avg").rpartition("/")[0]
    for part in ("step", "exp_avg", "exp_avg_sq"):
        del state[f"{name}/{part}"]


def as_sgd(js: dict) -> None:
    optimizer(js)["class"], optimizer(js)["module"] = "SGD", "torch.optim.sgd"


def flipped_tail(file: Path) -> None:
    """1000 bytes flipped at the end of the file (its data: the tensors stored last)."""
    raw = bytearray(file.read_bytes())
    raw[-1000:] = bytes(b ^ 0xFF for b in raw[-1000:])
    file.write_bytes(bytes(raw))


NAN = float("nan")
CASES = {  # damage: (capture.json change, optimizer state change, the field the one line names and what it says)
    "learning_rate NaN": (set_entry("learning_rate", [NAN, NAN]), None, r"optimizer\.learning_rate\[0\] = nan is not"),
    "learning_rate -1": (set_entry("learning_rate", [-1, -1]), None, r"optimizer\.learning_rate\[0\] = -1 is not a rate from 0 to 10"),
    "learning_rate 1e300": (set_entry("learning_rate", [1e300, 1e300]), None, r"optimizer\.learning_rate\[0\] = 1e\+300 is not a rate from 0 to 10"),
    "lr 1e300 in the group and at the top": (lambda js: (set_entry("learning_rate", [1e300, 1e300])(js), set_group("lr", 1e300)(js)), None, r"optimizer\.groups\[0\]\.lr = 1e\+300 is not a rate from 0 to 10"),
    "exp_avg 1e38": (None, set_tensor("exp_avg", lambda t: torch.full_like(t, 1e38)), r"/exp_avg is not an Adam first moment beside its exp_avg_sq: \|exp_avg\| passes 7\.\d+ x sqrt\(exp_avg_sq\)"),
    "fused and differentiable": (lambda js: (set_group("fused", True)(js), set_group("differentiable", True)(js)), None, r"optimizer\.groups\[0\] sets fused and differentiable: torch's optimizers take fused with neither"),
    "step 0 with its moments kept": (None, set_tensor("step", lambda t: torch.zeros_like(t)), r"/step is 0 beside moments that are not"),
    "learning_rate missing": (lambda js: optimizer(js).pop("learning_rate"), None, r"optimizer\.learning_rate is missing"),
    "one rate for two groups": (set_entry("learning_rate", [0.0005]), None, r"optimizer\.learning_rate = \[0\.0005\] is not one rate per parameter group \(2\)"),
    "learning_rate a string": (set_entry("learning_rate", "0.0005"), None, r"optimizer\.learning_rate = '0\.0005' is not one rate per parameter group"),
    "learning_rate strings": (set_entry("learning_rate", ["0.0005", "0.0005"]), None, r"optimizer\.learning_rate\[0\] = '0\.0005' is not a rate from 0 to 10"),
    "negative exp_avg_sq": (None, set_tensor("exp_avg_sq", negative_entry), r"/exp_avg_sq has negative entries \(min -3\.2e-05\); an Adam second moment is >= 0"),
    "step -1": (None, set_tensor("step", lambda t: torch.tensor(-1.0)), r"/step = -1 is not a count of steps"),
    "step of shape (5,)": (None, set_tensor("step", lambda t: torch.ones(5)), r"/step has shape \(5,\), not a scalar"),
    "NaN betas": (set_group("betas", [NAN, 0.999]), None, r"optimizer\.groups\[0\]\.betas = \[nan, 0\.999\] is not two numbers in \[0, 1\)"),
    "betas of length 3": (set_group("betas", [0.9, 0.999, 0.5]), None, r"optimizer\.groups\[0\]\.betas = \[0\.9, 0\.999, 0\.5\] is not two numbers"),
    "betas as strings": (set_group("betas", ["0.9", "0.999"]), None, r"optimizer\.groups\[0\]\.betas = \['0\.9', '0\.999'\] is not two numbers"),
    "eps -1": (set_group("eps", -1), None, r"optimizer\.groups\[0\]\.eps = -1 is not a finite number > 0"),
    "eps a string": (set_group("eps", "1e-8"), None, r"optimizer\.groups\[0\]\.eps = '1e-8' is not a finite number > 0"),
    "NaN weight decay": (set_group("weight_decay", NAN), None, r"optimizer\.groups\[0\]\.weight_decay = nan is not a finite number >= 0"),
    "every state tensor removed": (None, lambda s: s.clear(), r"holds 0 bytes of state \(no state for .*, 27 parameter\(s\) in all\), but capture\.json's optimizer\.bytes = \d+ were written"),
    "one parameter's state removed": (None, drop_parameter, r"bytes of state \(no state for \S+, 1 parameter\(s\) in all\)"),
    "one tensor removed": (None, lambda s: s.pop(first(s, "exp_avg_sq")), r"/exp_avg_sq is missing: a parameter with AdamW state holds step, exp_avg, exp_avg_sq"),
    "exp_avg int64": (None, set_tensor("exp_avg", lambda t: t.to(torch.int64)), r"/exp_avg is stored as torch\.int64, not a floating dtype"),
    "exp_avg float16": (None, set_tensor("exp_avg", lambda t: t.half()), r"/exp_avg is torch\.float16, its parameter torch\.float32 \(model\.safetensors\)"),
    "module null": (set_entry("module", None), None, r"optimizer\.module = None is not a name"),
    "module an int": (set_entry("module", 7), None, r"optimizer\.module = 7 is not a name"),
    "class SGD over Adam's state": (as_sgd, None, r"optimizer\.groups\[0\] has no 'momentum': SGD's groups hold lr, momentum"),
    "1000 flipped bytes at the end": (None, flipped_tail, r"/(exp_avg_sq has negative entries|exp_avg_sq holds NaN or inf|step = )"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_optimizer_is_refused_in_one_line_naming_the_file_and_field(captures, tmp_path, capsys, case):
    meta, tensors, says = CASES[case]
    folder = damaged(captures, tmp_path, meta, tensors)
    file = "capture.json" if meta else "optimizer.safetensors"
    for argv in (["replay", folder], ["doctor", folder, "--no-model"]):
        code, out, err = command(capsys, *argv)
        errors = [line for line in err.splitlines() if "error:" in line]
        assert code == 2 and len(errors) == 1, f"{case}, {argv[0]}: exit {code}\n{err[-2000:]}\n{out[-1000:]}"
        assert "Traceback" not in err, err
        assert f"{folder / file}: " in errors[0], f"{case}: names no file: {errors[0]}"
        assert re.search(says, errors[0]), f"{case}: {errors[0]!r} does not say {says!r}"
        assert "Loading weights" not in err, f"{case}: a model was loaded before the refusal"


def test_the_undamaged_capture_replays_exactly_and_lands_on_the_trainers_next_weights(captures, capsys):
    from grpo_debug.capture import open_capture
    from grpo_debug.capture.landing import landing

    code, out, err = command(capsys, "replay", captures / "step-2")
    assert code == 0, err[-2000:]
    update = next(line for line in out.splitlines() if line.startswith("update"))
    assert "the trainer's AdamW as captured: its state before step 2" in update and "no state" not in update, update
    task = f"{captures.parent.parent / 'user_train.py'}:REWARD_FUNCS"
    landed = landing(open_capture(captures / "step-2", task), captures / "step-3")
    assert landed["exact"] and landed["bit_equal"], landed


def replayed_update(folder: Path) -> tuple[str, dict]:
    """The replay's words for the optimizer, and each weight's move."""
    from grpo_debug.capture import open_capture
    from grpo_debug.capture.replay import trainer_update

    step = open_capture(folder)
    update = trainer_update(step, step.run(until="advantages"))
    return update.optimizer, update.delta


def rebooked(js: dict, state: dict) -> None:
    """capture.json's optimizer.bytes set to what the state holds: a partial state as the trainer wrote it."""
    optimizer(js)["bytes"] = sum(t.numel() * t.element_size() for t in state.values())


def test_a_parameter_the_trainer_never_stepped_starts_fresh_as_torch_starts_it_and_is_said(captures, tmp_path):
    """One parameter without state, capture.json counting the bytes without it (as the callback writes a state where
    that parameter had no gradient yet): torch's AdamW starts it fresh at its first step, and so does the replay;
    the other parameters move exactly as in the full replay."""
    state = load_file(str(captures / "step-2" / "optimizer.safetensors"))
    drop_parameter(state)
    name = first(load_file(str(captures / "step-2" / "optimizer.safetensors")), "exp_avg").rpartition("/")[0]
    folder = damaged(captures, tmp_path, lambda js: rebooked(js, state), drop_parameter)
    said, delta = replayed_update(folder)
    assert f"1 of 27 parameters hold no state (never stepped, e.g. {name})" in said, said
    assert "starts fresh at this step" in said, said
    _, full = replayed_update(captures / "step-2")
    assert all(torch.equal(delta[n], full[n]) for n in full if n != name), "a parameter with state moved otherwise"
    # a fresh AdamW's first step on that parameter: lr * g / (|g| + eps) = lr * sign(g), plus the weight decay
    assert not torch.equal(delta[name], full[name]) and float(delta[name].abs().max()) > 0


def test_an_empty_state_written_as_empty_is_replayed_fresh_and_said(captures, tmp_path, capsys):
    folder = damaged(captures, tmp_path, lambda js: optimizer(js).__setitem__("bytes", 0), lambda s: s.clear())
    code, out, err = command(capsys, "replay", folder)
    assert code == 0, err[-2000:]
    assert "its state before step 2 is empty (no parameter had been stepped)" in out, out[-1500:]


@pytest.mark.parametrize("name", ["replay", "doctor"])
def test_a_float16_replay_on_a_cpu_under_bfloat16_autocast_is_refused_before_loading(captures, capsys, name):
    capture = captures / "step-2"
    assert json.loads((capture / "capture.json").read_text())["grpo_config"]["bf16"] is True  # TRL's default on a CPU
    code, _, err = command(capsys, name, capture, "--dtype", "float16", "--device", "cpu")
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert "--dtype float16 on the CPU under dtype=bfloat16" in errors[0] and "--set dtype=float32" in errors[0]
    assert "Loading weights" not in err, "the model was loaded before the refusal"


def test_float16_weights_without_autocast_replay(captures, capsys):
    """The refusal's own advice runs: float16 weights scored without autocast."""
    code, out, err = command(capsys, "replay", captures / "step-2", "--dtype", "float16", "--set", "dtype=float32")
    assert code == 0, err[-2000:]
    assert "weights float16" in out and "Traceback" not in err


LONG = 100_000


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--device", "x" * LONG),
        ("--task", "y" * LONG + ".py:F"),
        ("--set", "beta=" + "a" * LONG),
        ("--json", "no such\nfolder/" * 10_000 + "out.json"),
    ],
)
def test_a_long_value_is_echoed_cut_to_200_characters_on_one_line(captures, capsys, flag, value):
    code, _, err = command(capsys, "replay", captures / "step-2", flag, value)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "error:" in lines[0], err[:2000]
    assert len(lines[0]) < 600 and re.search(r"….* \(\d+ characters\)", lines[0]), lines[0][:1000]


def test_shown_cuts_a_value_to_200_characters_with_its_length():
    from grpo_debug.echo import bounded, shown

    assert shown("short") == "short" and shown("a\nb") == "a\\nb"
    cut = shown("x" * LONG)
    assert cut.startswith("x" * 160 + "…") and cut.endswith("x" * 40 + f" ({LONG} characters)"), cut
    assert bounded(f"--device {'x' * LONG!r} is not a device", ["x" * LONG]).count("x") == 200


LANDING_CASES = ["learning_rate 1e300", "exp_avg 1e38", "fused and differentiable", "step 0 with its moments kept"]


@pytest.mark.parametrize("which", ["first", "second"])
@pytest.mark.parametrize("case", LANDING_CASES)
def test_landing_refuses_a_damaged_optimizer_in_either_folder_as_replay_does(captures, tmp_path, capsys, case, which):
    """`landing` opens both captures as `replay` opens one: the same damage, in step k or in step k+1, is one line
    naming the file and the field, exit 2, before a model loads."""
    meta, tensors, says = CASES[case]
    if which == "first":
        folders = [damaged(captures, tmp_path, meta, tensors), captures / "step-3"]
    else:
        folders = [captures / "step-2", damaged(captures, tmp_path, meta, tensors, step="step-3")]
    code, out, err = command(capsys, "landing", *folders)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (
        f"{case} in the {which}: exit {code}\n{err[-2000:]}"
    )
    assert re.search(says, errors[0]), f"{case} in the {which}: {errors[0]!r} does not say {says!r}"
    assert "Loading weights" not in err, f"{case}: a model was loaded before the refusal"
