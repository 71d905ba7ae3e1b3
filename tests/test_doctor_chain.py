"""The doctor's differential (`doctor.chain`): a cause's fix quiets its symptoms, which are then ranked after it
with no fix of their own; a symptom of two causes needs both; a clean step has no chain. The detectors here are
planted: `detect_under` answers what each finding's severity would be with a set of fixes applied."""

import dataclasses

from grpo_debug.detectors.findings import Finding
from grpo_debug.doctor import Report, rank
from grpo_debug.doctor.chain import differential
from grpo_debug.doctor.present import text


def planted(severities: dict[str, str]) -> list[Finding]:
    return [Finding(i, s, f"{i} planted") for i, s in severities.items()]


def world(base: dict[str, str], quiet_when: dict[str, set[str]]):
    """`detect_under(changes)`: each finding as in `base`, but `absent` once every field in its quiet_when set
    is among the changes' fields (a finding quiets when its causes are fixed); and counts the calls."""
    calls = []

    def detect_under(changes: dict) -> dict[str, Finding]:
        calls.append(dict(changes))
        fixed = set(changes)
        return {
            i: Finding(i, "absent" if i in quiet_when and quiet_when[i] <= fixed else s, i) for i, s in base.items()
        }

    return detect_under, calls


def test_a_symptom_is_ranked_after_its_cause_and_shows_no_fix():
    base = {"sampler_mismatch": "problem", "dropout": "warning", "length_reward": "info"}
    detect_under, _ = world(base, {"dropout": {"dropout"}, "sampler_mismatch": {"dropout"}})
    toggles = {"dropout": {"dropout": False}, "sampler_mismatch": {"vllm_importance_sampling_correction": True}}
    findings, causes = differential(planted(base), toggles, detect_under)
    by_id = {f.id: f for f in findings}
    assert causes == ["dropout"], f"the chain fixed {causes}, not dropout (whose fix quiets the mismatch) alone"
    assert by_id["sampler_mismatch"].symptom_of == ("dropout",), by_id["sampler_mismatch"]
    assert by_id["dropout"].clears == ("sampler_mismatch",), by_id["dropout"]
    ranked = [f.id for f in rank(findings, causes)]
    assert ranked[:2] == ["dropout", "sampler_mismatch"], f"the problem-level symptom outranks its cause: {ranked}"
    shown = text(Report(rank(findings, causes), {}, 0.0))
    mismatch = shown.split("sampler_mismatch:")[1].split("\n 3.")[0]
    assert "a symptom of dropout" in mismatch and "fix:" not in mismatch, f"the symptom's lines:\n{mismatch}"


def test_a_symptom_of_two_causes_names_both_and_one_of_one_cause_names_it_alone():
    base = {"position_ids": "problem", "dropout": "warning", "sampler_mismatch": "warning", "clip_saturated": "warning"}
    quiet = {
        "position_ids": {"position_ids"},
        "dropout": {"dropout"},
        "sampler_mismatch": {"position_ids", "dropout"},  # needs both fixes
        "clip_saturated": {"dropout"},  # the second cause's alone
    }
    detect_under, _ = world(base, quiet)
    toggles = {"position_ids": {"position_ids": True}, "dropout": {"dropout": False, "sample_dropout": False}}
    findings, causes = differential(planted(base), toggles, detect_under)
    by_id = {f.id: f for f in findings}
    assert causes == ["dropout", "position_ids"], f"dropout quiets another finding: it goes first, not {causes}"
    assert by_id["sampler_mismatch"].symptom_of == ("dropout", "position_ids"), by_id["sampler_mismatch"]
    assert by_id["clip_saturated"].symptom_of == ("dropout",), by_id["clip_saturated"]
    ranked = [f.id for f in rank(findings, causes)]
    assert ranked[:2] == ["position_ids", "dropout"], f"causes not ranked by severity: {ranked}"
    assert ranked.index("sampler_mismatch") > ranked.index("dropout"), f"a symptom above one of its causes: {ranked}"


def test_a_cause_that_clears_more_goes_first_among_equals_and_a_quiet_step_has_no_chain():
    base = {"truncation": "warning", "dropout": "warning", "sampler_mismatch": "warning"}
    detect_under, _ = world(base, {"dropout": {"dropout"}, "sampler_mismatch": {"dropout"}})
    toggles = {"truncation": {"mask_truncated_completions": True}, "dropout": {"dropout": False}}
    findings, causes = differential(planted(base), toggles, detect_under)
    assert causes[0] == "dropout", f"the fix that quiets another finding was not tried first: {causes}"
    assert causes == ["dropout", "truncation"], causes
    quiet = {"kl_off": "info", "dropout": "absent"}
    detect_under, calls = world(quiet, {})
    findings, causes = differential(planted(quiet), {"dropout": {"dropout": False}}, detect_under)
    assert causes == [] and not calls, f"a step with nothing loud ran the chain: {causes}, {calls}"
    assert all(not f.symptom_of and not f.clears for f in findings)


def test_the_rounds_stop_and_every_fix_is_kept_in_the_next_round():
    base = {f"cause_{k}": "warning" for k in range(6)}
    detect_under, calls = world(base, {f"cause_{k}": {f"field_{k}"} for k in range(6)})
    toggles = {f"cause_{k}": {f"field_{k}": True} for k in range(6)}
    findings, causes = differential(planted(base), toggles, detect_under, rounds=3)
    assert len(causes) == 3, causes
    kept = {f"field_{k}" for k in range(3)}
    assert any(kept <= set(c) for c in calls), f"the third round did not keep the first two fixes: {calls}"


def test_the_table_leaves_out_a_column_no_finding_fills():
    from grpo_debug.doctor.present import table

    shown = table(Report(tuple(planted({"dropout": "warning", "kl_off": "info"})), {}, 0.0), at_least="info")
    assert "over steps" not in shown.columns, "no fix was followed over steps: the column would be empty"
    assert {"severity", "finding", "what", "fix"} <= set(shown.columns) and len(shown) == 2


def test_a_finding_that_began_after_another_with_no_fix_of_its_own_is_its_consequence():
    """The logged course: the KL jumped at step 2, every completion cut from step 3. Truncation (no fix of its own
    in the chain) is ranked kl_blowup's consequence and says when each began; a finding already past its level at
    the first logged step has no before, and a cause the chain fixed keeps its place."""
    from grpo_debug.doctor.onsets import after_onsets, onsets_of

    course = [
        {"step": 1, "kl": 0.0, "completions/clipped_ratio": 0.1},
        {"step": 2, "kl": 5.09, "completions/clipped_ratio": 0.1},
        {"step": 3, "kl": 5.88, "completions/clipped_ratio": 1.0},
    ]
    onsets = onsets_of(course, max_grad_norm=1.0)
    assert onsets == {"kl_blowup": 2, "update_size": 2, "truncation": 3}, onsets
    base = {"truncation": "problem", "kl_blowup": "problem", "update_size": "info"}
    marked = {f.id: f for f in after_onsets(planted(base), [], onsets)}
    assert marked["truncation"].symptom_of == ("kl_blowup",), marked["truncation"]
    assert "began at step 3, after kl_blowup at step 2" in marked["truncation"].summary, marked["truncation"].summary
    ranked = [f.id for f in rank(list(marked.values()), [])]
    assert ranked.index("kl_blowup") < ranked.index("truncation"), f"the consequence is ranked above: {ranked}"
    clearing = [
        dataclasses.replace(f, clears=("zero_std_groups",)) if f.id == "truncation" else f for f in planted(base)
    ]
    fixed = {f.id: f for f in after_onsets(clearing, ["truncation"], onsets)}
    assert not fixed["truncation"].symptom_of, "a cause whose fix cleared findings was made a consequence"
    chained_alone = {f.id: f for f in after_onsets(planted(base), ["truncation"], onsets)}
    assert chained_alone["truncation"].symptom_of == ("kl_blowup",), "a fix that cleared nothing kept it a cause"
    from_the_start = onsets_of([{"step": 1, "kl": 5.0, "completions/clipped_ratio": 1.0}], max_grad_norm=1.0)
    assert from_the_start == {}, f"a level past its threshold from the first logged step has no onset: {from_the_start}"


def test_a_function_that_went_flat_when_the_kl_jumped_began_with_the_jump():
    """held-out-3 seed 287 (studied after its totals were read), as TRL logged it: `exact` varied at step 1 (std
    0.315) and was flat from step 2, where the KL jumped to 4.68; `thorough` varied throughout. constant_reward,
    naming exact, began with the jump; naming thorough, or with no spread logged, it has no onset."""
    from grpo_debug.doctor.onsets import onsets_of

    course = [
        {"step": 1, "kl": 0.0, "rewards/exact/std": 0.315, "rewards/thorough/std": 0.0047, "reward_std": 0.31},
        {"step": 2, "kl": 4.68, "rewards/exact/std": 0.0, "rewards/thorough/std": 0.0155, "reward_std": 0.016},
        {"step": 3, "kl": 4.66, "rewards/exact/std": 0.0, "rewards/thorough/std": 0.0529, "reward_std": 0.053},
    ]
    assert onsets_of(course, None, flat=("exact",))["constant_reward"] == 2
    assert "constant_reward" not in onsets_of(course, None, flat=("thorough",)), "a varying function went flat"
    assert "constant_reward" not in onsets_of(course, None, flat=("exact", "thorough")), "one still varied"
    assert "constant_reward" not in onsets_of(course, None, flat=("missing",)), "a function TRL never logged"
    flat_from_the_start = [{**h, "rewards/exact/std": 0.0} for h in course]
    assert "constant_reward" not in onsets_of(flat_from_the_start, None, flat=("exact",)), "flat with no before"


def test_a_problem_begins_where_its_value_reached_the_problems_level():
    """A learning-rate blow-up's course (stranger tuning seed 38): half the groups without signal at step 1 (a draw
    of five prompts), the KL at 1141 and every group without signal from step 2. Every group without signal began
    with the jump, so as a problem it is the jump's consequence; at the warning's level it was there from the start."""
    from grpo_debug.doctor.onsets import after_onsets, onsets_of

    course = [
        {"step": 1, "kl": 0.018, "frac_reward_zero_std": 0.6},
        {"step": 2, "kl": 1140.8, "frac_reward_zero_std": 1.0},
        {"step": 3, "kl": 5.0, "frac_reward_zero_std": 1.0},
    ]
    assert "zero_std_groups" not in onsets_of(course, None), "a warning's level crossed at the first logged step"
    onsets = onsets_of(course, None, {"zero_std_groups": "problem", "update_size": "problem"})
    assert onsets["zero_std_groups"] == 2 and onsets["update_size"] == 2, onsets
    base = {"zero_std_groups": "problem", "update_size": "problem"}
    marked = {f.id: f for f in after_onsets(planted(base), [], onsets)}
    assert marked["zero_std_groups"].symptom_of == ("update_size",), marked["zero_std_groups"]


def test_groups_without_signal_that_are_groups_of_one_text_follow_from_identical_groups():
    """Two of three groups hold six copies of one completion (sampled at temperature 0.1): any reward gives them one
    value, so the zero-std groups follow from identical_groups and are ranked after it, whatever the history says;
    where the groups without signal that are not identical reach its warning level alone (2 of 4), zero_std_groups
    stays a cause; kl_blowup is update_size's
    symptom with no logged history at all."""
    from grpo_debug.doctor.onsets import after_onsets

    def findings(zero_groups: list[int], of_groups: int = 3) -> list[Finding]:
        return [
            Finding("zero_std_groups", "warning", "groups", evidence={"groups": zero_groups, "of_groups": of_groups}),
            Finding("identical_groups", "warning", "2 of 3 groups identical", evidence={"identical_groups": [0, 2]}),
            Finding("large_advantages", "problem", "max |A| 667"),
        ]

    marked = {f.id: f for f in after_onsets(findings([0, 2]), [], {})}
    assert marked["zero_std_groups"].symptom_of == ("identical_groups",), marked["zero_std_groups"]
    assert "2 are groups of one text" in marked["zero_std_groups"].summary, marked["zero_std_groups"].summary
    ranked = [f.id for f in rank(list(marked.values()), [])]
    assert ranked.index("identical_groups") < ranked.index("zero_std_groups"), f"the consequence ranked above: {ranked}"
    other = {f.id: f for f in after_onsets(findings([0, 1, 3], of_groups=4), [], {})}
    assert not other["zero_std_groups"].symptom_of, "a group of varied completions without signal was explained away"
    both = [Finding("update_size", "problem", "KL 5.09"), Finding("kl_blowup", "problem", "KL 5.92")]
    kl = {f.id: f for f in after_onsets(both, [], {})}["kl_blowup"]
    assert kl.symptom_of == ("update_size",), f"kl_blowup with no logged history is no symptom: {kl}"


def test_groups_of_one_text_whose_fix_leaves_the_groups_without_signal_are_no_explanation():
    """Every group is one text (top_p 0.39), so every group without signal is one by construction; yet identical_groups's
    fix, sampled anew, left 75% of the groups without signal (num_generations 2 on a yes/no reward: `chain.lessened`).
    The intervention outranks the count: zero_std_groups stays a cause, ranked after identical_groups; where no fix
    measured it, the count still makes it identical_groups's symptom."""
    from grpo_debug.doctor.chain import lessened
    from grpo_debug.doctor.onsets import after_onsets

    zero = Finding("zero_std_groups", "problem", "8 of 8 groups", evidence={"groups": list(range(8)), "of_groups": 8})
    same = Finding(
        "identical_groups", "problem", "8 of 8 groups one text", evidence={"identical_groups": list(range(8))}
    )
    left = lessened(zero, "identical_groups", Finding("zero_std_groups", "warning", "75% of groups without signal"))
    measured = {f.id: f for f in after_onsets([left, same], [], {})}
    assert not measured["zero_std_groups"].symptom_of, "the fix's measurement was overruled by the count"
    ranked = [f.id for f in rank(list(measured.values()), [])]
    assert ranked[:2] == ["identical_groups", "zero_std_groups"], f"both causes, the sampler first: {ranked}"
    counted = {f.id: f for f in after_onsets([zero, same], [], {})}
    assert counted["zero_std_groups"].symptom_of == ("identical_groups",), "without a fix's measurement, the count"


def test_groups_of_two_alike_whose_own_fix_recovers_more_are_a_cause_beside_the_sampler():
    """G = 2 under top_p 0.91 (held-out-3 seed 359, studied after its totals were read): 10 of 16 pairs one text;
    sampled anew, doubling num_generations gives 29% of the groups a gradient and top_p 1 gives 16%, so the groups
    are alike for their size too: zero_std_groups is a cause again. Where 2G gives 5% (seed 341), or less than the
    sampling fix, it stays identical_groups' symptom."""
    from grpo_debug.doctor.narrowed import a_cause_of_its_own

    def findings(own: float, sampling_fix: float) -> list[Finding]:
        zero = Finding("zero_std_groups", "warning", "69% of groups without signal", symptom_of=("identical_groups",),
                       evidence={"resampled": {"recovered": own}})  # fmt: skip
        drawn = {"as_run": {"without_signal": 0.64}, "fixed": {"without_signal": 0.64 - sampling_fix}}
        same = Finding("identical_groups", "warning", "10 of 16 groups one text", clears=("zero_std_groups",),
                       evidence={"resampled": drawn})  # fmt: skip
        return [same, zero]

    kept = {f.id: f for f in a_cause_of_its_own(findings(0.29, 0.16))}
    assert not kept["zero_std_groups"].symptom_of, "pairs alike that doubling G recovers more were explained away"
    assert "a cause of its own" in kept["zero_std_groups"].summary and not kept["identical_groups"].clears
    assert [f.id for f in rank(list(kept.values()), [])][:2] == ["identical_groups", "zero_std_groups"]
    for own, fix in ((0.05, 0.16), (0.29, 0.40)):
        marked = {f.id: f for f in a_cause_of_its_own(findings(own, fix))}
        assert marked["zero_std_groups"].symptom_of == ("identical_groups",), (own, fix, marked["zero_std_groups"])


def test_a_function_constant_for_want_of_scored_completions_is_bad_rewards_symptom():
    """A closeness reward that returns None on 19 of 20 completions (fresh tuning seed 146) is constant within every
    group because no group holds two scored completions: constant_reward follows from bad_reward by construction. A
    function constant where it did score stays a cause."""
    from grpo_debug.doctor.construction import by_construction

    def findings(unscored: list[str]) -> list[Finding]:
        constant = Finding("constant_reward", "problem", "close_or_none is constant within every group",
                           evidence={"named": ["close_or_none"], "unscored_within_groups": unscored})  # fmt: skip
        return [constant, Finding("bad_reward", "warning", "None rewards: close_or_none 19/20")]

    marked = {f.id: f for f in by_construction(findings(["close_or_none"]))}
    assert marked["constant_reward"].symptom_of == ("bad_reward",), marked["constant_reward"]
    assert "nothing within a group to vary" in marked["constant_reward"].summary, marked["constant_reward"].summary
    assert [f.id for f in rank(list(marked.values()), [])][0] == "bad_reward", "the consequence ranked first"
    kept = {f.id: f for f in by_construction(findings([]))}
    assert not kept["constant_reward"].symptom_of, "a function constant where it scored was explained away"


def test_a_sliver_made_by_a_length_paying_function_is_length_rewards_symptom():
    """A group whose answers all earn one closeness and whose only spread is a length-paying function's 0.025
    (fresh tuning seed 138) is divided into full-size advantages: advantage_scale follows from length_reward by
    construction. A sliver another function makes stays a cause."""
    from grpo_debug.doctor.construction import by_construction

    def findings(slivers: list[str]) -> list[Finding]:
        scale = Finding("advantage_scale", "warning", "1 group whose reward std is below 1% of the batch's",
                        evidence={"sliver_functions": slivers})  # fmt: skip
        return [scale, Finding("length_reward", "warning", "thorough pays for length", evidence={"paid": ["thorough"]})]

    marked = {f.id: f for f in by_construction(findings(["thorough"]))}
    assert marked["advantage_scale"].symptom_of == ("length_reward",), marked["advantage_scale"]
    assert [f.id for f in rank(list(marked.values()), [])][0] == "length_reward", "the consequence ranked first"
    for slivers in (["close"], ["close", "thorough"], []):
        kept = {f.id: f for f in by_construction(findings(slivers))}
        assert not kept["advantage_scale"].symptom_of, f"a sliver of {slivers} was explained away"


def test_a_gain_inside_its_noise_ranks_nothing_and_ties_go_to_the_earlier_phase():
    """Two causes of one severity whose fixes' horizons were 'not detected' (fresh tuning seed 150: -0.0013 and
    -0.0027, each interval across 0) are ranked as if not followed; with nothing else between them, the one that
    acts earlier in the step goes first (a reward function before the groups its rewards leave without signal)."""
    from grpo_debug.doctor.report import rank

    def followed(mean, low, high):
        return {"difference": {"mean": mean, "ci_low": low, "ci_high": high}}

    zero = Finding("zero_std_groups", "warning", "z", learning=followed(-0.0013, -0.0115, 0.0089))
    cut = Finding("truncation", "warning", "t", learning=followed(-0.0027, -0.0231, 0.0177))
    bad = Finding("bad_reward", "warning", "b")
    assert [f.id for f in rank([zero, bad, cut], [])] == ["truncation", "bad_reward", "zero_std_groups"]
    gained = dataclasses.replace(zero, learning=followed(0.2, 0.1, 0.3))
    assert [f.id for f in rank([cut, bad, gained], [])][0] == "zero_std_groups", "a measured gain did not rank first"


def test_a_cause_only_a_sampling_fix_shows_is_named_behind_it_after_every_cause_the_step_shows():
    """Rewards in per-mille with scale_rewards='none' whose groups were all one text (top_p 0.37, fresh tuning seed
    231): every advantage 0, large_advantages quiet on the step; sampled anew at top_p 1 its groups vary and the
    advantages reach 667, while the resample without the fix keeps them 0 (`diagnose._revealed` marks it). The
    chain names it behind identical_groups, after every loud cause the step shows and before every quiet one."""

    def detect_under(changes: dict) -> dict[str, Finding]:
        if "top_p" not in changes:
            return {f.id: f for f in planted(base)}
        shown = Finding("large_advantages", "problem", "max |A| 667", evidence={"revealed": True})
        return {"identical_groups": Finding("identical_groups", "absent", "-"), "large_advantages": shown,
                "dropout": Finding("dropout", "warning", "d"), "kl_off": Finding("kl_off", "info", "k")}  # fmt: skip

    base = {"identical_groups": "warning", "large_advantages": "absent", "dropout": "warning", "kl_off": "info"}
    toggles = {"identical_groups": {"top_p": 1.0}}
    findings, causes = differential(planted(base), toggles, detect_under)
    by_id = {f.id: f for f in findings}
    assert by_id["large_advantages"].severity == "problem", by_id["large_advantages"]
    assert by_id["large_advantages"].evidence["behind"] == "identical_groups", by_id["large_advantages"].evidence
    assert "hidden behind identical_groups" in by_id["large_advantages"].summary, by_id["large_advantages"].summary
    ranked = [f.id for f in rank(findings, causes)]
    assert ranked == ["identical_groups", "dropout", "large_advantages", "kl_off"], ranked


def test_a_finding_a_fix_makes_less_severe_keeps_what_it_leaves_ranked_with_what_fixes_show():
    """Every completion cut at max_completion_length 6 under per-mille rewards (held-out-3 seed 295, studied after
    its totals were read): every group without signal on the step; sampled anew with the length raised, 67% of
    them (a warning: the rest its own) and the rewards' units blow the advantages up to 429 (a problem the fix
    reveals). Both are read under truncation's fix, so they rank after it by the severity it left them. An update's
    size is no share of groups: a fix that changes the batch does not split it (seed 351)."""

    def detect_under(changes: dict) -> dict[str, Finding]:
        if "max_new_tokens" not in changes:
            return {f.id: f for f in planted(base)}
        return {"truncation": Finding("truncation", "absent", "-"),
                "zero_std_groups": Finding("zero_std_groups", "warning", "67% of groups without signal"),
                "large_advantages": Finding("large_advantages", "problem", "max |A| 429", evidence={"revealed": True}),
                "update_size": Finding("update_size", "warning", "KL 0.96"), "dropout": Finding("dropout", "info", "d")}  # fmt: skip

    base = {"truncation": "problem", "zero_std_groups": "problem", "large_advantages": "absent", "dropout": "info",
            "update_size": "problem"}  # fmt: skip
    findings, causes = differential(planted(base), {"truncation": {"max_new_tokens": 24}}, detect_under)
    by_id = {f.id: f for f in findings}
    zero = by_id["zero_std_groups"]
    assert zero.severity == "warning" and zero.evidence["lessened_by"] == "truncation" and not zero.symptom_of, zero
    assert "with truncation's fix it is a warning, the rest its own" in zero.summary, zero.summary
    assert [f.id for f in rank(findings, causes) if f.id != "update_size"][:3] == [
        "truncation", "large_advantages", "zero_std_groups"]  # fmt: skip
    size = by_id["update_size"]  # held-out-3 seed 351: an update's KL 1.07 on the step, 0.96 on the fix's batch
    assert size.severity == "problem" and "lessened_by" not in size.evidence, f"a size was split into parts: {size}"
    quieted = {**base, "zero_std_groups": "warning"}
    findings, _ = differential(planted(quieted), {"truncation": {"max_new_tokens": 24}}, detect_under)
    assert "lessened_by" not in {f.id: f for f in findings}["zero_std_groups"].evidence, "as severe: not lessened"


def test_only_what_the_fix_made_loud_is_marked_revealed():
    from grpo_debug.doctor.diagnose import _revealed

    quiet = Finding("large_advantages", "absent", "max |A| 0")
    loud_now = Finding("large_advantages", "problem", "max |A| 667")
    assert _revealed(loud_now, quiet).evidence == {"revealed": True}, "a finding only the fix shows was not marked"
    assert _revealed(Finding("large_advantages", "info", "1"), quiet) is quiet, "a quiet finding was marked"
    assert _revealed(loud_now, Finding("large_advantages", "warning", "w")).severity == "warning", "the step's lost"
    signal = Finding("zero_std_groups", "warning", "z")
    assert _revealed(signal, Finding("zero_std_groups", "info", "i")).severity == "info", "the fix's own signal"


def test_a_fix_after_sampling_leaves_the_texts_as_the_trainers_finding_says():
    """identical_groups' severity comes from sampling anew (1 of 3 groups one text in the draw, every group in the
    resample: fresh tuning seed 230). A fix that acts after sampling (scale_rewards) scores the same completions, so
    it cannot have cleared that finding; read afresh by the detector alone it would look quieted by any such fix."""
    from grpo_debug.config import StepConfig
    from grpo_debug.doctor.diagnose import _detect_under
    from grpo_debug.step import GRPOStep

    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=8))
    base = step.run(until="update")
    as_found = Finding("identical_groups", "problem", "resampled: 100% one text", evidence={"resampled": {}})
    under = _detect_under(step, base, {}, [as_found])({"scale_rewards": "none"})
    assert under["identical_groups"] is as_found, f"the same completions' texts were read afresh: {under}"
    assert under["zero_std_groups"].id == "zero_std_groups", "the other detectors ran on the changed step"


def test_the_kl_began_where_it_moved_from_step_ones_and_equal_rewards_where_the_batch_went_flat():
    """Stranger tuning seed 518 as TRL logged it (learning_rate 0.036, dropout on): step 1's KL, logged before any
    update, is the policy's dropout (0.34 nats); it jumped to 5.3 at step 2, where every completion was cut and the
    batch's rewards went flat (std 1.5e-8, which TRL's isclose still logged as frac_reward_zero_std 0). The KL's
    onset is step 2, and so is zero_std_groups': all three are the jump's consequences."""
    from grpo_debug.doctor.onsets import after_onsets, onsets_of

    course = [
        {"step": 1, "kl": 0.343, "completions/clipped_ratio": 0.0, "reward_std": 0.171, "frac_reward_zero_std": 0.0},
        {"step": 2, "kl": 5.31, "completions/clipped_ratio": 1.0, "reward_std": 1.5e-8, "frac_reward_zero_std": 0.0},
        {"step": 3, "kl": 7.00, "completions/clipped_ratio": 1.0, "reward_std": 1.5e-8, "frac_reward_zero_std": 0.0},
    ]
    severities = dict.fromkeys(("truncation", "zero_std_groups", "update_size", "constant_reward"), "problem")
    onsets = onsets_of(course, 1.0, severities)
    expected = {"kl_blowup": 2, "update_size": 2, "truncation": 2, "constant_reward": 2, "zero_std_groups": 2}
    assert onsets == expected, onsets
    marked = {f.id: f for f in after_onsets(planted({**severities, "dropout": "warning"}), [], onsets)}
    for consequence in ("truncation", "zero_std_groups", "constant_reward"):
        assert marked[consequence].symptom_of == ("update_size",), marked[consequence]
    assert not marked["dropout"].symptom_of, "dropout has no onset: it stays a cause"
    noisy_from_the_start = onsets_of([{**h, "kl": 0.34 + 0.01 * h["step"]} for h in course], 1.0)
    assert "kl_blowup" not in noisy_from_the_start, f"a KL that stayed at step 1's noise began: {noisy_from_the_start}"
    later = onsets_of([{**h, "step": h["step"] + 4} for h in course], 1.0)
    assert "kl_blowup" not in later, "a history that starts past step 1 has no reference in it: no onset from 0.34"


def test_groups_of_twice_the_size_dilute_groups_of_one_text_and_clear_nothing():
    """Stranger tuning seed 510, temperature 0.24: resampled at 2G (zero_std_groups' fix) a group of one text is
    rarer, yet the sampler is as narrow; the chain does not make identical_groups that fix's symptom (the sampling
    fix gave 36% of the groups a gradient, 2G 7%), while the sampling fix may still clear zero_std_groups."""
    from grpo_debug.doctor.chain import DILUTED

    assert ("zero_std_groups", "identical_groups") in DILUTED
    base = {"zero_std_groups": "warning", "identical_groups": "warning"}
    detect_under, _ = world(base, {"identical_groups": {"num_generations"}})
    findings, causes = differential(planted(base), {"zero_std_groups": {"num_generations": 10}}, detect_under)
    by_id = {f.id: f for f in findings}
    assert by_id["identical_groups"].symptom_of == () and by_id["zero_std_groups"].clears == (), findings
    detect_under, _ = world(base, {"zero_std_groups": {"temperature"}, "identical_groups": {"temperature"}})
    findings, causes = differential(planted(base), {"identical_groups": {"temperature": 1.0}}, detect_under)
    assert {f.id: f for f in findings}["zero_std_groups"].symptom_of == ("identical_groups",), findings


def test_ranking_places_a_symptoms_symptoms_after_it_and_leaves_nothing_out():
    """A symptom of a symptom follows it; a cycle of symptoms (each the other's: the chain one way, construction the
    other, seed 510 before DILUTED) is still reported, after the rest: a report never drops a finding."""
    import dataclasses

    cause, first, second = Finding("update_size", "problem", "u"), Finding("truncation", "problem", "t"), None
    first = dataclasses.replace(first, symptom_of=("update_size",))
    second = Finding("zero_std_groups", "problem", "z", symptom_of=("truncation",))
    assert [f.id for f in rank([second, first, cause], [])] == ["update_size", "truncation", "zero_std_groups"]
    a = Finding("zero_std_groups", "warning", "z", symptom_of=("identical_groups",))
    b = Finding("identical_groups", "warning", "i", symptom_of=("zero_std_groups",))
    ranked = rank([a, b, Finding("length_reward", "warning", "l")], [])
    assert {f.id for f in ranked} == {"zero_std_groups", "identical_groups", "length_reward"}, ranked
