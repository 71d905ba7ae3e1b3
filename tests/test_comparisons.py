"""One verdict per claim: the committed results, `analyze` and the notebooks read the families that
data/experiments/comparisons.json defines once."""

import json
import shutil
import subprocess
import sys

import pytest

from grpo_debug.files import DATA_DIR, ROOT
from grpo_debug.runs.comparisons import analyze, comparison_of, open_comparison, read_comparisons, share_of

EXPERIMENTS = DATA_DIR / "experiments"
RESULT_FILES = sorted(p.name for p in EXPERIMENTS.glob("*.json") if "records" in json.loads(p.read_text()))


def test_every_committed_result_belongs_to_one_comparison_and_stores_its_verdicts():
    comparisons = read_comparisons(EXPERIMENTS)
    opened = {name: open_comparison(EXPERIMENTS, name) for name in comparisons}
    for file in RESULT_FILES:
        name = comparison_of(EXPERIMENTS / file)
        assert name is not None, f"{file} is in no comparison of comparisons.json: its verdicts have no family"
        stored = json.loads((EXPERIMENTS / file).read_text())
        expected = json.loads(json.dumps(share_of(stored, opened[name])))  # as written: strict JSON
        assert stored["summary"] == expected["summary"], f"{file}'s stored summary is stale: run analyze --write"


def test_analyze_prints_the_verdict_the_notebook_prints(tmp_path):
    """The issue's example: the trl arm's KL was 'higher' from pitfalls.json alone (a family of 4) and 'not
    detected' in 06b's merged family of 7. Now both read the comparison."""
    out = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "analyze", str(EXPERIMENTS / "pitfalls.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout
    pitfalls = open_comparison(EXPERIMENTS, "pitfalls")
    kl = pitfalls["summary"]["trl"]["kl minus_fixed"]
    assert kl["family_size"] == 7 and kl["verdict"] in out, out
    for arm, row in pitfalls["summary"].items():
        for value in row.values():
            if isinstance(value, dict) and "verdict" in value:
                assert value["verdict"] in out, f"{arm}: {value['verdict']} not printed by analyze"


def test_a_borrowed_arm_keeps_the_verdict_of_its_own_comparison():
    tracin = open_comparison(EXPERIMENTS, "tracin")
    assert "change_from_start" not in tracin["summary"]["fixed"]  # the pitfalls comparison's verdict
    claims = [d for row in tracin["summary"].values() for k, d in row.items() if k.startswith("minus_")]
    assert len(claims) == 5 and {d["family_size"] for d in claims} == {5}


def test_a_bad_comparisons_file_is_refused_in_one_line(tmp_path):
    for file in ("zero_loss.json", "precision.json"):
        shutil.copy(EXPERIMENTS / file, tmp_path / file)
    write = lambda value: (tmp_path / "comparisons.json").write_text(json.dumps(value))
    write({"comparisons": {"a": {"files": ["zero_loss.json"]}, "b": {"files": ["zero_loss.json"]}}})
    with pytest.raises(ValueError, match="zero_loss.json is in both 'a' and 'b'"):
        read_comparisons(tmp_path)
    write({"comparisons": {"a": {"files": ["missing.json"]}}})
    with pytest.raises(ValueError, match="names missing.json, which is not in"):
        read_comparisons(tmp_path)
    write({"comparisons": {"a": {"files": ["zero_loss.json"], "claims": [["only two", "dapo"]]}}})
    with pytest.raises(ValueError, match=r"claims as \[text, arm, other\]"):
        read_comparisons(tmp_path)
    (tmp_path / "comparisons.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a comparisons file"):
        read_comparisons(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "analyze", str(tmp_path / "zero_loss.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "not a comparisons file" in out.stderr and "Traceback" not in out.stderr


def test_a_file_of_no_comparison_is_summarised_alone(tmp_path):
    shutil.copy(EXPERIMENTS / "zero_loss.json", tmp_path / "mine.json")
    results, writes = analyze(str(tmp_path / "mine.json"))
    assert "comparison" not in results and list(writes) == [str(tmp_path / "mine.json")]
    assert results["summary"]["dapo"]["minus_fixed"]["family_size"] == 2


def test_a_reader_that_goes_away_gets_no_traceback():
    """`analyze FILE | head -1`: the pipe closes before the table is written; the command ends quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_debug", "analyze", str(EXPERIMENTS / "pitfalls.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before the command has loaded anything: its first write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and "Traceback" not in err, err


def test_a_family_reads_as_one_table_whose_words_never_contradict_unanimous_seeds():
    import torch

    from grpo_debug.runs.results import eval_table, per_seed
    from grpo_debug.ui.tables import verdict_table

    pitfalls = open_comparison(EXPERIMENTS, "pitfalls")
    records, seeds, steps = pitfalls["records"], pitfalls["seeds"], pitfalls["steps"]
    change = per_seed(pitfalls, "dropout", "change_from_start")
    expected = (eval_table(records, "dropout", seeds, steps) - eval_table(records, "dropout", seeds, 0)).mean(1)
    assert torch.equal(change, expected), "a seed's change is its mean over test prompts of final minus start"
    table = verdict_table(pitfalls, "minus_fixed")
    assert table.index.name == "held-out reward difference (family of 7)" and len(table) == 7
    assert list(table.columns) == ["estimate", "interval (99.29%)", "Holm p", "seeds up", "reading"]
    for arm, row in table.iterrows():
        d = pitfalls["summary"][arm.split(" - ")[0]]["minus_fixed"]
        assert row["estimate"] == f"{d['mean']:+.4f}"
        up = per_seed(pitfalls, arm.split(" - ")[0], "minus_fixed")
        unanimous = bool((up > 0).all() or (up < 0).all())
        detected = d["ci_low"] > 0 or d["ci_high"] < 0
        assert row["reading"].startswith("detected") == detected
        assert ("all 3 seeds" in row["reading"]) == (unanimous and not detected), (arm, row["reading"])
    kl = verdict_table(pitfalls, "kl minus_fixed")
    assert kl.loc["trl", "reading"] == "not detected; all 3 seeds up", "trl's KL: every seed far above fixed's"
    assert kl.loc["no_position_ids", "reading"] == "detected: up"
    claims = verdict_table(open_comparison(EXPERIMENTS, "tracin"), "claims")
    assert "tracin_flipped - tracin" in claims.index and len(claims) == 5
    with pytest.raises(ValueError, match="no arm of this comparison has a 'nothing' family of verdicts"):
        verdict_table(pitfalls, "nothing")
    with pytest.raises(ValueError, match="'reward_final' family"):
        verdict_table(pitfalls, "reward_final")  # an interval, not a family of verdicts
    for key in ("change_from_start", "minus_fixed", "kl minus_fixed", "completions/mean_length minus_fixed"):
        for arm, row in pitfalls["summary"].items():
            if key in row:  # each seed's own value averages to the family's estimate
                assert abs(per_seed(pitfalls, arm, key).mean().item() - row[key]["mean"]) < 1e-9, (key, arm)
    zero_loss = open_comparison(EXPERIMENTS, "zero_loss")
    greedy = verdict_table(zero_loss, "change_from_start").loc["identical_groups"]
    assert greedy["seeds up"] == "-" and "all" not in greedy["reading"], "three identical seeds are one sample"


def test_small_multiples_draw_one_labelled_panel_per_arm_beside_the_reference():
    from grpo_debug.runs.results import metric_curve
    from grpo_debug.ui import plots

    pitfalls = open_comparison(EXPERIMENTS, "pitfalls")
    rows = [row for arm in pitfalls["arms"] for row in metric_curve(pitfalls, arm, "eval/reward")]
    fig = plots.arm_panels(rows, "fixed", "held-out reward")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [f"{a} (grey: fixed)" for a in pitfalls["arms"] if a != "fixed"]
    assert all(len(ax.lines) == 2 for ax in panels), "each panel: the arm and the reference"
    assert [bool(ax.get_ylabel()) for ax in panels] == [True, False, False, False, True, False, False], "first column"
    from grpo_debug.runs.results import difference_curve

    paired = [row for arm in list(pitfalls["arms"])[1:] for row in difference_curve(pitfalls, arm, "fixed")]
    fig = plots.arm_panels(paired, None, "held-out reward minus fixed")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 7 and all(len(ax.lines) == 2 for ax in panels), "each panel: its difference and the 0 line"
    assert [ax.lines[1].get_ydata()[0] for ax in panels] == [0.0] * 7, "at step 0 every arm is the same model"
