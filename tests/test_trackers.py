"""The flight recorder's health in the user's tracker (issue 73), each with its own library in its offline or local
mode, on the user's run of tests/test_flight_recorder.py (a plain GRPOConfig, a reward that turns constant at step
3): the health keys at every step under grpo_debug/, the break step's alert or text entry, and the trainer's own
logged numbers bit-identical with the recorder's trackers on and off."""

import glob
import json
import os
import struct
import sys
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from test_flight_recorder import STEPS, TURNS_CONSTANT, build_model_that_stops, user_run  # noqa: E402

from grpo_debug.capture.trackers import PREFIX, TrackerLog, alert_of, health_scalars  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
BREAK = f"{PREFIX}findings/constant_reward"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_model_that_stops(tmp_path_factory.mktemp("user") / "my-model")


def trained_numbers(logged: list[dict]) -> list[dict]:
    """What the trainer logged each step, less its wall-clock seconds."""
    return [{k: v for k, v in step.items() if "time" not in k and "per_second" not in k} for step in logged]


def both_ways(tmp_path: Path, model: Path, report_to: str, end=lambda: None) -> tuple[Path, list[dict]]:
    """The user's run with the recorder's trackers on and off (`end` called after each: the tracker's run closed,
    as the user's script ends): (the run's folder with them on, TRL's logs of it); the logs asserted bit-identical
    first."""
    on, logged_on, _ = user_run(tmp_path / "on", model, TURNS_CONSTANT, report_to=report_to)
    end()
    off, logged_off, _ = user_run(tmp_path / "off", model, TURNS_CONSTANT, report_to=report_to, trackers=False)
    end()
    assert trained_numbers(logged_on) == trained_numbers(logged_off), "the trackers changed the run's numbers"
    assert len(logged_on) == STEPS
    return tmp_path / "on", logged_on


def test_tensorboard_holds_the_health_keys_each_step_and_the_break_steps_text(tmp_path, model):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, logged = both_ways(tmp_path, model, "tensorboard")
    events = glob.glob(str(folder / "run" / "runs" / "*" / "events.out.tfevents.*"))
    assert len(events) == 1, f"the health is not in the trainer's own TensorBoard run: {events}"
    read = EventAccumulator(events[0], size_guidance={"scalars": 0, "tensors": 0})
    read.Reload()
    levels = [(e.step, e.value) for e in read.Scalars(BREAK)]
    assert levels == [(1, 0.0), (2, 0.0), (3, 2.0), (4, 2.0)], levels
    assert [e.step for e in read.Scalars("train/loss")] == [1, 2, 3, 4], "the trainer's own scalars are not there"
    alerts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in read.Tensors(f"{PREFIX}alert/text_summary")]
    assert [s for s, _ in alerts] == [TURNS_CONSTANT] and "constant_reward (problem)" in alerts[0][1], alerts
    off = glob.glob(str(tmp_path / "off" / "run" / "runs" / "*" / "events.out.tfevents.*"))
    read = EventAccumulator(off[0], size_guidance={"scalars": 0})
    read.Reload()
    assert not [t for t in read.Tags()["scalars"] if t.startswith(PREFIX)], "trackers=False still logged health"


def wandb_records(path: str) -> list[bytes]:
    """The records of an offline W&B run file (`run-ID.wandb`): LevelDB's log format (32 KiB blocks, each record
    a 7-byte header, crc32, length, type (full, first, middle, last)) after W&B's 7-byte header, as wandb writes it."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, block, out, parts = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # the block's tail: padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            parts = chunk
        else:
            parts += chunk
            if kind == 4:
                out.append(parts)
    return out


def test_wandb_offline_holds_the_health_keys_at_the_trainers_steps_and_the_break_steps_alert(
    tmp_path, model, monkeypatch
):
    import wandb
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "grpo-debug-test")
    both_ways(tmp_path, model, "wandb", end=wandb.finish)
    history, alerts = {}, []
    run_files = sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert len(run_files) == 2, run_files
    on = next(f for f in run_files if any(b"grpo_debug" in r for r in wandb_records(f)))
    for raw in wandb_records(on):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.HasField("history"):
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            if BREAK in row:
                history[row["train/global_step"]] = row[BREAK]
        if record.HasField("alert"):
            alerts.append(record.alert.text)
    assert history == {1: 0, 2: 0, 3: 2, 4: 2}, history
    assert len(alerts) == 1 and alerts[0].startswith(f"step {TURNS_CONSTANT}: ") and "constant_reward" in alerts[0]


def test_mlflow_file_store_holds_the_health_metrics_at_each_step_and_the_break_steps_text(tmp_path, model, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's local store without a database
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    both_ways(tmp_path, model, "mlflow")
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 2, [r.info.run_id for r in runs]
    on = next(r for r in runs if BREAK in r.data.metrics)
    levels = [(m.step, m.value) for m in client.get_metric_history(on.info.run_id, BREAK)]
    assert sorted(levels) == [(1, 0.0), (2, 0.0), (3, 2.0), (4, 2.0)], levels
    texts = [a.path for a in client.list_artifacts(on.info.run_id, "grpo_debug")]
    assert texts == [f"grpo_debug/alert-step-{TURNS_CONSTANT}.txt"], texts


def test_trackio_local_holds_the_health_keys_at_each_step_and_the_break_steps_alert(tmp_path, model):
    """trackio reads TRACKIO_DIR once, when imported: each run in a process of its own; its SQLite store read back."""
    import sqlite3
    import subprocess

    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    logged = {}
    for side in ("on", "off"):
        done = subprocess.run(
            [sys.executable, str(TESTS / "tracked_run.py"), str(tmp_path / side), str(model), "trackio", side],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        logged[side] = json.loads(done.stdout.strip().splitlines()[-1])
    assert trained_numbers(logged["on"]) == trained_numbers(logged["off"]), "the trackers changed the run's numbers"
    stores = list((tmp_path / "trackio").glob("*.db"))
    assert len(stores) == 1, stores
    with sqlite3.connect(stores[0]) as db:
        rows = [
            (run, step, json.loads(m)) for run, step, m in db.execute("select run_name, step, metrics from metrics")
        ]
        alerts = db.execute("select run_name, step, text from alerts").fetchall()
    levels = sorted((step, m[BREAK]) for _, step, m in rows if BREAK in m)
    assert levels == [(1, 0.0), (2, 0.0), (3, 2.0), (4, 2.0)], levels
    assert len({run for run, _, m in rows if BREAK in m}) == 1, "health logged to both runs: trackers=False ignored"
    assert [(step, "constant_reward" in text) for _, step, text in alerts] == [(TURNS_CONSTANT, True)], alerts


def test_a_tracker_that_fails_is_switched_off_with_one_warning_and_the_others_go_on():
    class Broken:
        name = "broken"

        def active(self):
            return True

        def log(self, scalars, step):
            raise OSError("No space left on device")

    class Kept:
        name = "kept"

        def __init__(self):
            self.steps = []

        def active(self):
            return True

        def log(self, scalars, step):
            self.steps.append(step)

        def alert(self, title, text, step):
            pass

    kept = Kept()
    log = TrackerLog([Broken(), kept])
    line = {"step": 1, "findings": {"x": {"severity": "ok", "value": 0.5}}, "metrics": {}, "trigger": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2, 3):
            log.log_line({**line, "step": step}, step)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "stopped logging health to broken (OSError: No space left on device)" in said[0]
    assert kept.steps == [1, 2, 3], "a failing tracker stopped the others"


def test_a_health_line_becomes_scalars_and_its_trigger_an_alert():
    line = {
        "step": 3,
        "findings": {"constant_reward": {"severity": "problem", "value": 1.0}, "truncation": {"severity": "ok"}},
        "metrics": {"update/relative_norm": 0.01, "loss": 0.5, "rewards/d/length_correlation": -0.2},
        "trigger": [{"id": "constant_reward", "severity": "problem", "summary": "d constant"}],
        "capture": "step-3",
    }
    scalars = health_scalars(line)
    assert scalars == {
        f"{PREFIX}findings/constant_reward": 2.0,
        f"{PREFIX}values/constant_reward": 1.0,
        f"{PREFIX}findings/truncation": 0.0,
        f"{PREFIX}update/relative_norm": 0.01,
        f"{PREFIX}rewards/d/length_correlation": -0.2,
        f"{PREFIX}triggered": 1.0,
    }, "TRL's own loss was logged again, or a health number was left out"
    assert alert_of(line) == (
        "grpo_debug: step 3 triggered",
        "step 3: constant_reward (problem): d constant (captured in step-3)",
    )
    assert alert_of({**line, "trigger": []}) is None
