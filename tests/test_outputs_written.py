"""An output that cannot be written in full is an error (issue 57, item 3): `files.write_atomically` writes a
character device or a pipe in place (a rename would replace /dev/full with a file) and names the path where a
write, a flush or the close fails; every writer of the command line answers that with exit status 1 and one line
(`commands.cannot_write`)."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import captured_step, grpo_debug  # noqa: E402

from grpo_debug.files import write_atomically, write_text_atomically  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("task_registry_restored"),
    pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here"),
]
FULL = "/dev/full"


@pytest.fixture(autouse=True)
def devices_stay_devices():
    """A writer that renamed a file over /dev/full would turn the device into a file (as root): never."""
    yield
    for device in (FULL, os.devnull):
        assert stat.S_ISCHR(os.stat(device).st_mode), f"{device} is no longer a character device"
    assert not os.path.exists(FULL + ".tmp")


def test_a_device_that_is_full_is_an_error_naming_it():
    with pytest.raises(OSError, match=r"^\[Errno 28\] could not write /dev/full: No space left on device$"):
        write_text_atomically(FULL, "x" * 100_000)
    with pytest.raises(OSError, match="could not write /dev/full"):
        write_atomically(FULL, lambda f: f.write(b"x"), binary=True)


def test_a_device_that_takes_it_is_written_in_place():
    write_text_atomically(os.devnull, json.dumps({"a": 1}))


def test_a_pipe_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that opening it to write does not wait
    try:
        write_text_atomically(fifo, "through")
        assert os.read(reader, 100) == b"through"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("user")
    return {"folder": folder, "capture": captured_step(folder)}


def a_run(folder: Path) -> Path:
    """A FlightRecorder folder of two health lines (what timeline reads)."""
    folder.mkdir()
    lines = [{"step": k, "time": 0.0, "metrics": {}, "findings": {}, "trigger": [], "capture": None} for k in (1, 2)]
    (folder / "health.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


@pytest.mark.parametrize("flag", ["--json", "--html"])
def test_the_doctor_exits_1_when_its_output_is_not_written(user, flag):
    done = grpo_debug("doctor", user["capture"], "--no-model", flag, FULL, cwd=user["folder"])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[-1] == "python -m grpo_debug: error: could not write /dev/full: No space left on device", lines


def test_the_timeline_exits_1_when_its_page_is_not_written(tmp_path):
    done = grpo_debug("timeline", a_run(tmp_path / "run"), "--html", FULL, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "python -m grpo_debug: error: could not write /dev/full: No space left on device"
    ], done.stderr


def test_an_output_that_is_written_exits_0(tmp_path):
    done = grpo_debug("timeline", a_run(tmp_path / "run"), "--html", tmp_path / "run.html", cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "run.html").stat().st_size > 0, done.stderr


def test_a_file_name_too_long_is_refused_before_any_work_naming_it_cut(user):
    """A name past the file system's NAME_MAX passes the folder's check yet fails at the write: refused first, in one
    line that echoes the name cut to its start and end with its length."""
    name = "a" * 100_000
    done = grpo_debug("doctor", user["capture"], "--no-model", "--json", name, cwd=user["folder"])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "a file name longer than 255 bytes" in lines[0] and "(100000 characters)" in lines[0], lines
    assert len(lines[0]) < 400, f"the name echoed whole: {len(lines[0])} characters"


@pytest.mark.parametrize("case", ["dangling-link", "device", "the-json-file", "the-html-file"])
def test_a_png_folder_that_cannot_be_one_is_refused_before_any_work(user, tmp_path, case):
    """`--png` is checked with `--json` and `--html` before the diagnosis starts: a dangling link, a device, or the
    very file another flag writes is one line naming it, exit 2, and nothing is written."""
    out = tmp_path / "out"
    out.mkdir()
    args = {"--json": str(out / "r.json"), "--html": str(out / "r.html")}
    png = {
        "dangling-link": str(out / "gone"),
        "device": FULL,
        "the-json-file": args["--json"],
        "the-html-file": args["--html"],
    }[case]
    if case == "dangling-link":
        os.symlink(out / "nowhere", png)
    flags = [x for flag, path in args.items() for x in (flag, path)]
    done = grpo_debug("doctor", user["capture"], "--no-model", *flags, "--png", png, cwd=user["folder"])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"--png {png}" in lines[0], lines
    assert sorted(p.name for p in out.iterdir()) == (["gone"] if case == "dangling-link" else []), "a file was written"


def test_a_figure_that_cannot_be_written_leaves_no_half_written_file(tmp_path, monkeypatch):
    """write_pngs writes each figure whole or not at all: a disk that fills mid-figure leaves no .png behind."""
    import matplotlib.figure

    from grpo_debug.doctor.report import Report
    from grpo_debug.ui import doctor_page, report_figures

    fig = matplotlib.figure.Figure()
    fig.add_subplot().plot([0, 1])
    monkeypatch.setattr(report_figures, "figures_of", lambda report: {"1-finding-evidence": fig})

    def full(self, f, **kwargs):
        f.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    with pytest.raises(OSError, match="No space left on device"):
        doctor_page.write_pngs(Report((), {}, 0.0), tmp_path / "figs")
    assert list((tmp_path / "figs").iterdir()) == [], "a half-written figure was left"
