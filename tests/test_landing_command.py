"""`python -m grpo_debug landing STEP_K STEP_K+1`: on a scheduled run's two captures (a user's script: warm-up,
cosine schedule, weight decay), the replayed update of step 3 lands on step 4's weights, said on the terminal and in
`--json`; two folders that are not consecutive steps of one run, in order, are refused in one line."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import qwen2_user, user_train_run  # noqa: E402

from grpo_debug.cli.commands import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
SCHEDULE = {"learning_rate": 1e-3, "warmup_steps": 0.1, "weight_decay": 0.01, "lr_scheduler_type": "cosine"}


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> Path:
    """A user's run of 4 steps on a tiny Qwen2, steps 2, 3 and 4 captured."""
    changes = {**SCHEDULE, "max_steps": 4, "capture": [2, 3, 4]}
    return user_train_run(qwen2_user(tmp_path_factory.mktemp("user")), "run", changes)


def refusal(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["landing", *map(str, argv)])
    assert exit.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_replayed_update_of_step_3_lands_on_step_4_said_and_written(captures, tmp_path, capsys):
    """Step 3 is the cosine's second decaying step: its scheduled rate is below the peak."""
    out_json = tmp_path / "landing.json"
    assert main(["landing", str(captures / "step-3"), str(captures / "step-4"), "--json", str(out_json)]) == 0
    said = capsys.readouterr().out
    print(said)
    out = json.loads(out_json.read_text())
    assert out["step"] == 3 and out["exact"] and out["bit_equal"], out
    assert out["cosine"] >= 0.99 and abs(out["norm_ratio"] - 1) <= 0.02, out
    rate = json.loads((captures / "step-3" / "capture.json").read_text())["optimizer"]["learning_rate"]
    assert out["scheduled_learning_rate"] == rate and 0 < rate[0] < SCHEDULE["learning_rate"], rate
    for line in (
        f"update cosine                {out['cosine']:+.6f}",
        f"update norm ratio            {out['norm_ratio']:.6f}",
        f"max |weight difference|      {out['max_abs_difference']:.3g}",
        "bit-equal                    yes",
        f"learning rate as scheduled   {rate[0]:.6g}",
    ):
        assert line in said, f"{line!r} not in:\n{said}"


def test_folders_that_are_not_consecutive_steps_of_one_run_in_order_are_refused_in_one_line(captures, tmp_path, capsys):
    step_2, step_3, step_4 = (str(captures / f"step-{k}") for k in (2, 3, 4))
    said = refusal(capsys, step_3, step_2)
    assert f"wrong order: {step_3} is step 3, {step_2} is step 2: give the earlier step first" in said, said
    said = refusal(capsys, step_2, step_4)
    assert "steps 2 and 4 are not consecutive" in said, said
    assert "both step 2" in refusal(capsys, step_2, step_2)
    other = tmp_path / "other" / "step-3"
    shutil.copytree(step_3, other)
    meta = json.loads((other / "capture.json").read_text())
    meta["grpo_config"]["learning_rate"] = 0.5
    (other / "capture.json").write_text(json.dumps(meta))
    said = refusal(capsys, step_2, other)
    assert "are not captures of one run: their grpo_config differs at learning_rate: 0.001 and 0.5" in said, said
    said = refusal(capsys, step_2, tmp_path)
    assert f"{tmp_path} is not a capture: no capture.json" in said, said


def _copy(captures: Path, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name / "step-4"
    shutil.copytree(captures / "step-4", out)
    return out


def _weights(folder: Path) -> Path:
    return next((folder / "policy").glob("*.safetensors"))


def test_the_second_capture_is_checked_as_the_first_before_anything_is_compared(captures, tmp_path, capsys):
    """Issue 70: a changed step k+1 (no reseal), NaN weights, another run's weights resealed, a truncated or removed
    weights file, `step: true`: each refused in one line naming the folder, never a cosine."""
    from safetensors.torch import load_file, save_file

    from grpo_debug.checksums import write_checksums

    step_3 = captures / "step-3"
    changed = _copy(captures, tmp_path, "changed")
    weights = load_file(str(_weights(changed)))
    key = sorted(weights)[0]
    save_file({**weights, key: weights[key] + 1e-3}, str(_weights(changed)), metadata={"format": "pt"})
    said = refusal(capsys, step_3, changed)
    assert str(changed) in said and "checksum" in said, said

    nan = _copy(captures, tmp_path, "nan")
    save_file({**weights, key: weights[key] * float("nan")}, str(_weights(nan)), metadata={"format": "pt"})
    write_checksums(nan)  # resealed: the checksums hold, the values do not
    said = refusal(capsys, step_3, nan)
    assert str(nan) in said and key in said and ("NaN" in said or "not finite" in said), said

    other = _copy(captures, tmp_path, "other")
    save_file({k: v + 0.05 * torch.randn_like(v) for k, v in weights.items()}, str(_weights(other)),
              metadata={"format": "pt"})  # fmt: skip
    write_checksums(other)  # another initialisation of one config, sealed as its own
    said = refusal(capsys, step_3, other)
    assert "are not one AdamW step from" in said and str(other) in said, said

    shape = _copy(captures, tmp_path, "shape")
    save_file({**weights, key: weights[key][:1]}, str(_weights(shape)), metadata={"format": "pt"})
    write_checksums(shape)
    said = refusal(capsys, step_3, shape)
    assert str(shape) in said and key in said and "shape" in said, said

    cut = _copy(captures, tmp_path, "cut")
    _weights(cut).write_bytes(_weights(cut).read_bytes()[:100])
    write_checksums(cut)
    said = refusal(capsys, step_3, cut)
    assert "not a readable safetensors file" in said and str(cut) in said, said

    gone = _copy(captures, tmp_path, "gone")
    _weights(gone).unlink()
    said = refusal(capsys, step_3, gone)
    assert str(gone) in said, said

    assert (
        json.loads((captures / "step-3" / "capture.json").read_text())["run"]
        == json.loads((captures / "step-4" / "capture.json").read_text())["run"]
    ), "two captures of one run carry one run id"
    foreign = _copy(captures, tmp_path, "foreign")
    meta = json.loads((foreign / "capture.json").read_text())
    (foreign / "capture.json").write_text(json.dumps({**meta, "run": "0" * 32}))
    write_checksums(foreign)  # another recorder's capture of the same config, sealed as its own
    said = refusal(capsys, step_3, foreign)
    assert "are not captures of one run: their recorders' run ids differ" in said, said

    boolean = _copy(captures, tmp_path, "boolean")
    meta = json.loads((boolean / "capture.json").read_text())
    (boolean / "capture.json").write_text(json.dumps({**meta, "step": True}))
    said = refusal(capsys, step_3, boolean)
    assert f"{boolean} is not a capture" in said, said
