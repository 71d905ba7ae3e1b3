"""Every file the package reads with torch.load is read with weights_only=True: a pickle payload planted in it is
refused, and never runs (it would write a marker file)."""

import random
from pathlib import Path

import pytest
import torch


class Payload:
    marker: Path = Path()

    def __reduce__(self):
        return (Path.write_text, (self.marker, "the payload ran"))


@pytest.fixture
def planted(tmp_path):
    Payload.marker = tmp_path / "PWNED"

    def plant(path: Path, wrap=lambda p: p) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(wrap(Payload()), path)
        return path

    yield plant
    assert not Payload.marker.exists(), "a planted payload ran"


def test_a_training_checkpoint_with_a_payload_is_refused(planted, tmp_path):
    from grpo_debug.runs.progress import Progress

    progress = Progress(tmp_path / "run.json.progress.jsonl", {"command": "test"})
    planted(progress.checkpoint("fixed", 0), lambda p: {"step": p, "policy": {}, "optimizer": None})
    with pytest.raises(Exception, match="Weights only load failed"):
        progress.resume_point("fixed", 0)


def test_a_bundled_model_state_with_a_payload_is_refused(planted, tmp_path):
    from grpo_debug.chess.card import model_facts
    from grpo_debug.chess.train_model import restore_state

    planted(tmp_path / "model" / "train_state.pt", lambda p: {"model": p})
    with pytest.raises(Exception, match="Weights only load failed"):
        model_facts(tmp_path / "model")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(Exception, match="Weights only load failed"):
        restore_state(tmp_path / "model", model, torch.optim.SGD(model.parameters(), lr=0.1), random.Random(0))


def test_a_capture_batch_with_a_payload_is_refused(planted, tmp_path):
    import json

    from grpo_debug.capture.reading import CaptureError, load_capture
    from grpo_debug.checksums import write_checksums

    capture = tmp_path / "step-2"
    planted(capture / "batch.pt", lambda p: {"prompt_ids": p})
    (capture / "capture.json").write_text(json.dumps({"step": 2}))
    write_checksums(capture)  # sealed as a capture would be: the payload must still be refused when read
    with pytest.raises(CaptureError, match="batch.pt"):
        load_capture(capture)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    """A full disk in the middle of a write: the reader keeps the old file, the error names the file."""
    import errno

    from grpo_debug.files import write_atomically

    path = tmp_path / "results.json"
    path.write_text("old")

    def fill_the_disk(f):
        f.write("half of the new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"could not write .*results\.json: No space left on device"):
        write_atomically(path, fill_the_disk)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    write_atomically(path, lambda f: f.write("new"))
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


class _Step:
    """What Progress.save and Progress.load touch of a GRPOStep: the policy and the optimizer."""

    def __init__(self, policy):
        self.policy, self.optimizer, self.started = policy, None, False

    def start_from_current_weights(self, optimizer_state):
        self.started = True


@pytest.mark.parametrize("damage", ["a flipped byte", "truncated", "weights of another shape", "no checksum"])
def test_a_damaged_training_checkpoint_is_refused_naming_the_file(tmp_path, damage):
    """The checkpoint carries the SHA-256 of its own contents (one file: a kill cannot part them)."""
    from grpo_debug.runs.progress import Progress

    progress = Progress(tmp_path / "run.json.progress.jsonl", {"command": "test"})
    saved = torch.nn.Linear(4, 4)
    progress.save(_Step(saved), "fixed", 0, 3)
    path = progress.checkpoint("fixed", 0)
    restored = _Step(torch.nn.Linear(4, 4))
    progress.load(restored, None, "fixed", 0)  # the good one loads, weights as saved
    assert restored.started and torch.equal(restored.policy.weight, saved.weight)
    target = _Step(torch.nn.Linear(4, 4))
    if damage == "a flipped byte":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif damage == "weights of another shape":
        target = _Step(torch.nn.Linear(4, 5))
    else:
        torch.save({"step": 3, "policy": {}, "optimizer": None}, path)
    with pytest.raises(ValueError) as refused:
        progress.load(target, None, "fixed", 0)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value), refused.value
