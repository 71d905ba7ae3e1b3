"""The progress file survives a kill in the middle of an append: the torn last line is cut off the file when it is
opened again, so the next append starts a line of its own and every later resume reads every record."""

import pytest

from grpo_debug.runs.progress import Progress

HEADER = {"arms": ["fixed"], "steps": 3, "seeds": 2}
RECORDS = [
    {"arm": "fixed", "seed": 0, "step": 0, "eval": {"reward": -0.25, "per_prompt": [-1.0, 0.5]}},
    {"arm": "fixed", "seed": 0, "step": 1, "loss": 0.0123, "val_loss": float("nan"), "triage": "ok — naïve"},
    {"arm": "fixed", "seed": 0, "step": 1, "eval": {"reward": 0.125, "per_prompt": [0.0, 0.25]}},
    {"arm": "fixed", "seed": 0, "step": 2, "loss": -1.5e-07, "selected_fraction": 0.5, "seconds": 1.25},
]
NEW = {"arm": "fixed", "seed": 0, "step": 2, "loss": 0.5, "seconds": 2.0}


def written(path) -> bytes:
    progress = Progress(path, HEADER)
    for record in RECORDS:
        progress.add(record)
    return path.read_bytes()


def resumed_records(path) -> list[dict]:
    return Progress(path, HEADER).records


def same(a: list[dict], b: list[dict]) -> bool:
    """Equal records, NaN equal to NaN (a NaN is written and read back as NaN)."""
    return repr(a) == repr(b)


def test_a_kill_at_every_byte_of_the_last_append_loses_only_that_record(tmp_path):
    full = written(tmp_path / "full.jsonl")
    last_line_start = full.rstrip(b"\n").rfind(b"\n") + 1
    path = tmp_path / "torn.jsonl"
    for offset in range(last_line_start, len(full)):
        path.write_bytes(full[:offset])
        whole_but_newline = offset == len(full) - 1  # every byte of the record written, its newline not
        kept = RECORDS if whole_but_newline else RECORDS[:-1]
        progress = Progress(path, HEADER)
        assert same(progress.records, kept), offset
        progress.add(NEW)
        for _ in range(2):
            assert same(resumed_records(path), [*kept, NEW]), offset
        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b"" and len(lines) == len(kept) + 3, offset  # header, records, NEW, nothing after
        assert path.read_bytes().startswith(full[:last_line_start]), offset


def test_an_untorn_file_is_not_changed_by_opening_it(tmp_path):
    path = tmp_path / "p.jsonl"
    full = written(path)
    assert same(resumed_records(path), RECORDS) and path.read_bytes() == full


@pytest.mark.parametrize("bad", [b"not json", b'{"arm": "fixed", "se', b"\xff\xfe"])
def test_a_bad_line_before_the_last_is_refused_and_the_file_left_as_it_is(tmp_path, bad):
    path = tmp_path / "p.jsonl"
    lines = written(path).split(b"\n")
    lines[2] = bad
    damaged = b"\n".join(lines) + b'{"arm": "fixed", "se'  # and a torn last line after it
    path.write_bytes(damaged)
    with pytest.raises(ValueError, match=r"p.jsonl, line 3: not a JSON record"):
        Progress(path, HEADER)
    assert path.read_bytes() == damaged


def test_another_comparisons_torn_file_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "p.jsonl"
    torn = written(path)[:-5]
    path.write_bytes(torn)
    with pytest.raises(ValueError, match="holds another comparison"):
        Progress(path, {**HEADER, "steps": 4})
    assert path.read_bytes() == torn
