"""How benchmarks/stranger_corpus.py scores a run against what was planted in it: a defect that is one only where
vLLM samples (`Defect.only_with_vllm`: a truncating sampler biases vLLM's importance ratio, TRL #6789) is optional
in a run whose trainer samples with its own model (named or not, no miss: its ids and their symptoms are taken out
and the run scored on the rest), and an ordinary defect where the run uses vLLM."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from stranger_corpus import expected_ids, optional, score_run  # noqa: E402
from stranger_runs import defects_of, draw_run, spec_json  # noqa: E402

TRUNCATION_SINGLE = next(s for s in range(0, 1000, 2) if defects_of(s) == ("sampler_truncation",))
TRUNCATION_DOUBLE = next(s for s in range(0, 1000, 2) if defects_of(s) == ("sampler_truncation", "constant_reward"))


def finding(id_: str, severity: str = "warning", symptom_of: tuple[str, ...] = ()) -> dict:
    return {"id": id_, "severity": severity, "symptom_of": list(symptom_of), "summary": "", "evidence": {}}


def with_vllm(spec: dict) -> dict:
    return {**spec, "config": {**dict(spec["config"]), "use_vllm": True}}


def test_a_mild_truncation_without_vllm_is_a_clean_run_whether_or_not_its_narrowed_groups_are_named():
    spec = spec_json(draw_run(TRUNCATION_SINGLE))
    assert optional(spec) == ["sampler_truncation"], optional(spec)
    assert score_run(spec, [])["quiet"] is True, "a quiet doctor on a run without the defect's effect scored wrong"
    narrowed = [finding("identical_groups"), finding("zero_std_groups", symptom_of=("identical_groups",))]
    assert score_run(spec, narrowed)["quiet"] is True, "naming the truncation's narrowed groups scored as noise"
    loud = score_run(spec, [finding("large_advantages")])
    assert loud["quiet"] is False and loud["planted"] == ["clean"], f"another loud finding is a false alarm: {loud}"


def test_the_same_truncation_with_vllm_is_a_single_defect_to_name():
    spec = with_vllm(spec_json(draw_run(TRUNCATION_SINGLE)))
    assert optional(spec) == [] and list(expected_ids(spec)) == ["sampler_truncation"], expected_ids(spec)
    assert score_run(spec, [finding("sampler_truncation")])["top1"] is True
    assert score_run(spec, [])["top1"] is False, "an unnamed truncation under vLLM scored as named"


def test_a_double_with_a_mild_truncation_is_scored_on_its_other_defect_alone():
    spec = spec_json(draw_run(TRUNCATION_DOUBLE))
    row = score_run(spec, [finding("identical_groups"), finding("constant_reward"), finding("zero_std_groups")])
    assert row["planted"] == ["constant_reward"] and row["top1"] is True, row
    assert row["optional"] == ["sampler_truncation"], row
    assert score_run(spec, [finding("zero_std_groups"), finding("constant_reward")])["top1"] is False
    assert "both_top2" in score_run(with_vllm(spec), [finding("constant_reward")]), "under vLLM it is a double again"


def test_a_per_mille_reward_that_varies_within_no_group_is_not_in_the_step(tmp_path):
    """reward_x1000 scales a reward's variance; a captured step where it has none (every completion cut alike) does
    not hold the defect, and the run is left out of the rates, as position_ids with nothing left-padded is."""
    import json

    from stranger_corpus import absent_from_step

    seed = next(s for s in range(0, 1000, 2) if defects_of(s) == ("reward_x1000",))
    spec = spec_json(draw_run(seed))
    name = next(n for n in draw_run(seed).rewards if n.endswith("_x1000"))

    def captured(values: list) -> Path:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        body = {"prompts": ["a", "b"], "grpo_config": {"num_generations": 2}, "rewards": {name: values}}
        (folder / "capture.json").write_text(json.dumps(body))
        return folder

    assert absent_from_step(spec, captured([200.0, 200.0, 0.0, 0.0])) == ["reward_x1000"]
    assert absent_from_step(spec, captured([200.0, None, 0.0, 0.0])) == ["reward_x1000"], "a None is not variance"
    assert absent_from_step(spec, captured([200.0, 0.0, 0.0, 0.0])) == [], "one varied group holds the defect"


def test_the_readmes_doctor_section_states_the_held_out_reports_it_names():
    """README.md says how the doctor did on runs it was not tuned on, naming the saved reports: its sentences must be
    what those reports computed (each catalogue half's rates, and their pool: the runs summed over the halves it
    names; the held-out kinds' right and silent rates; the probe's sides)."""
    import json
    import re

    root = BENCHMARKS.parent
    readme = " ".join((root / "README.md").read_text().split())
    named = re.findall(r"`benchmarks/results/(stranger-[^`]+\.json)`\): single defects", readme)
    assert named, "README.md names no held-out report before its catalogue rates"
    targets = {"top1_rate_single": 0.9, "both_in_top2_rate_double": 0.8, "quiet_rate_clean": 0.95}
    pooled = {"single": [0, 0], "double": [0, 0], "clean": [0, 0]}
    short = []  # the halves under a target of their own
    for name in named:
        r = json.loads((BENCHMARKS / "results" / name).read_text())
        n = r["scored"]
        said = (f"single defects named first in {r['top1_rate_single']:.0%} ({n['single']}), both of a double in the "
                f"top two in {r['both_in_top2_rate_double']:.0%} ({n['double']}), clean runs quiet in "
                f"{r['quiet_rate_clean']:.0%} ({n['clean']})")  # fmt: skip
        assert said in readme, f"README.md does not state {name}: {said}"
        for kind, rate in (("single", "top1_rate_single"), ("double", "both_in_top2_rate_double"),
                           ("clean", "quiet_rate_clean")):  # fmt: skip
            pooled[kind][0] += round(r[rate] * n[kind])
            pooled[kind][1] += n[kind]
        short += [name] if any(r[rate] < target for rate, target in targets.items()) else []
    if "Pooled over these halves" in readme:
        (s, n1), (d, n2), (c, n3) = pooled["single"], pooled["double"], pooled["clean"]
        said = (f"Pooled over these halves: single defects first in {s} of {n1} ({s / n1:.0%}), doubles in the top two "
                f"in {d} of {n2} ({d / n2:.0%}), clean runs quiet in {c} of {n3} ({c / n3:.0%})")  # fmt: skip
        assert said in readme, f"README.md's pool is not the sum of the halves it names: {said}"
        assert ("The doubles and the clean runs miss their targets" in readme) == (d / n2 < 0.8 and c / n3 < 0.95), (
            "README.md says the pooled doubles and clean runs miss their targets where they meet them, or the reverse"
        )
        if "The pooled rates meet the targets" in readme:
            met = all(share >= target for share, target in zip((s / n1, d / n2, c / n3), targets.values()))
            assert met, "README.md says the pool meets targets it misses"
        if "the halves one by one, with their few doubles each, do not all" in readme:
            assert short, "README.md says a half misses a target: every half meets them"
    named = re.search(r"`benchmarks/results/(stranger-[^`]+\.json)`\), kinds it was never tuned on", readme)
    assert named, "README.md names no held-out report before the held-out kinds' rates"
    r = json.loads((BENCHMARKS / "results" / named.group(1)).read_text())
    o, p = r["outside"]["held_out_kinds"], r["probe"]
    wrong = p["pipeline"]["carries"] + sum(p["reward"][v] for v in ("lost", "slow", "turned away"))
    said = (f"right {o['right_rate']:.0%} ({o['runs']}), silent {o['silent_rate']:.0%} ({o['runs']}); the probe put "
            f"{p['pipeline']['right']} of {p['pipeline']['runs']} pipeline-side runs and {p['reward']['right']} of "
            f"{p['reward']['runs']} reward-side runs on their side and {wrong} on the wrong one")  # fmt: skip
    assert said in readme, f"README.md does not state {named.group(1)}: {said}"
