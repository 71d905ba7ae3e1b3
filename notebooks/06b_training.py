# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06b · Beyond one step: do the pitfalls and the TracIn fixes change where training goes?
#
# **What you will learn.** How to ask whether a pitfall or a fix changes training, not one step: arms that
# differ in one setting, trained side by side on the same prompts and seeds, compared on held-out prompts;
# how to read an interval and a verdict ("not detected" included); and why a result found while exploring
# has to be tested again by a run planned in advance.
#
# **What you need first.** The one-step path, notebooks 01 to 06 (each pitfall's mechanism is shown there),
# and 08 for the zero-loss triage of section 3. Notebook 07 explains the TracIn scores of section 2.
#
# Notebooks 01 to 06 take one step and show each mechanism: a per-token gap, a lost gradient, a sign.
# Whether a mechanism matters is a question about training, and the bug reports behind this suite ask
# exactly that. One asks why the pretrained model degrades during training. One reports that
# TracIn-selected GRPO does worse than plain GRPO and blames the validation-loss sign. One blames a
# 16-sample top-reward validation set. One sees the loss read 0.0000 at the first iteration.
#
# `grpo_debug.runs.train` runs K GRPO steps per **arm**. It is a loop over the same phase functions: the update's
# weights become the next step's start (`GRPOStep.advance`), one AdamW carries on, and the reference stays
# the initial model. Step t of seed s uses the same prompts and the same sampling seed in every arm, so two
# arms differ only where their configs do: the arms are **paired**. Every few steps, the policy samples
# the held-out test prompts with fixed seeds.
#
# **How the intervals are made** (`grpo_debug.stats`, where each function states the design it assumes). The
# seed is the independent unit: each seed is its own training run. Every seed is evaluated on the same 24 test
# prompts with the same sampling seed, so seeds and prompts are *crossed*. An interval is the range of values
# the true difference could take, given how much the results vary: at 95%, intervals made this way hold the
# true value 95 times in 100. Seeds and prompts each add their own variation, and the intervals count both:
# for the held-out reward they are *two-way random-effects* intervals over seeds and prompts. With few seeds
# the seeds' variation is itself poorly known, and the interval widens for it: it comes from a *generalized
# pivot* that carries the seed term's few *degrees of freedom* (one less than the number of seeds) in full
# (their coverage at every level shown here, with 3, 8 and 12 seeds, is checked by simulation in
# `tests/test_stats.py`). A step metric's intervals are the usual ones for a mean of a few values (*Student's
# t* over seeds), and the KL's are on a log scale (it spans seven decades). An arm whose seeds gave identical
# results counts as one sample. When a table tests several claims at once, one of them can look like an effect
# by chance alone, so the table is treated as one **family** and corrected for its size: its intervals are
# shown at the *Bonferroni* level, 1 - 0.05 / (its size), and each verdict carries *Holm's adjusted p* (how
# likely a difference this large would be from noise alone, corrected for the family). A difference whose
# interval holds 0 is **not detected**, and its width is printed. Which files are read together and which claims form a family is defined once, in
# `data/experiments/comparisons.json`: `python -m grpo_debug analyze` reads the same file, so it prints the
# verdicts this notebook prints.
#
# **Exploratory, then confirmatory.** Sections 1 to 4 are exploratory: K went from 12 to 36, and 8-seed runs
# were added, after earlier results had been seen, so their verdicts are hypotheses. Section 5 is the
# confirmatory run whose claim, arms, K, seeds and analysis were committed in `data/experiments/plan.json`
# before it ran. Section 6 is the positive control, planned the same way: does the fixed step learn at all?
#
# The runs below were made by `data/experiments/run.sh` and committed (each JSON holds its command).
# `python -m grpo_debug analyze data/experiments/pitfalls.json` prints every family's verdicts of the
# comparison that file belongs to.
# This notebook loads them; section 4 (a maintainers' live check) re-runs the first two steps of two arms
# and checks that they reproduce the stored numbers.

# %%
from grpo_debug.ui.notebook import setup

setup()  # one torch thread, as the experiments ran: the same numbers on every run

# %%
import json
import textwrap

import pandas as pd
from IPython.display import display

from grpo_debug.files import DATA_DIR
from grpo_debug.runs.comparisons import open_comparison, read_comparisons
from grpo_debug.runs.results import base_config, detected, difference_curve, last_steps_mean, metric_curve
from grpo_debug.ui import plots
from grpo_debug.ui.tables import fit_column, verdict_table

EXPERIMENTS = DATA_DIR / "experiments"
# each comparison's files merged (merge_results pairs them only if they share base config, K, seeds and
# evaluation, and shared arms logged the same numbers), summarised in the families comparisons.json defines
results = {name: open_comparison(EXPERIMENTS, name) for name in read_comparisons(EXPERIMENTS)}
print(f"base config of the exploratory runs: {results['pitfalls']['base']}")
fit_column(pd.DataFrame([{"comparison": name, "K": r["steps"], "seeds": r["seeds"], "evaluated every": r["eval_every"],
                          "on": f"{r['eval_prompts']} {r.get('eval_set', 'test')} prompts", "question": r["question"]}
                         for name, r in results.items()]).set_index("comparison"))


def curves(r: dict, keys: list[str]) -> dict:
    return {key: [row for arm in r["arms"] for row in metric_curve(r, arm, key)] for key in keys}


def differences(r: dict, reference: str = "fixed") -> dict:
    """The held-out reward of every other arm minus the reference's, paired, at each evaluation."""
    return {f"held-out reward minus {reference}": [row for arm in r["arms"] if arm != reference
                                                   for row in difference_curve(r, arm, reference)]}


def answer(r: dict) -> dict:
    """A comparison's family of held-out claims (comparisons.json), shown as one table (intervals at the family's
    Bonferroni level, Holm's p); the claims by name."""
    out = {f"{arm} - {d['other']}": d for arm, row in r["summary"].items() for key, d in row.items()
           if key.startswith("minus_") and "claim" in d}
    for name, d in out.items():
        print(f"{name}: {d['claim']}")
    display(verdict_table(r, "claims"))
    return out


def fmt(d: dict) -> str:
    if d["ci_low"] is None:
        return f"{d['mean']:+.4f} (no interval)"
    return f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"


# %% [markdown]
# ## 1. The pitfalls over training
#
# `fixed` has every fix on. Each other arm leaves in one pitfall that changes the gradient, or switches to
# TRL's preset. The pitfalls are: the sampling temperature left out of the log-probs (`no_temperature`),
# the mask that drops EOS (`eos_dropped`), dropout on while scoring (`dropout`), scoring without
# position_ids under left padding (`no_position_ids`), the k1 KL estimator (`k1`) and sequence REINFORCE
# (`reinforce`).
#
# First the held-out test reward, one small panel per arm with `fixed` in grey behind it: at step 0 every arm
# is the same model sampled with the same seeds, so the lines start together. Then TRL's step metrics, plus
# the largest sampler-vs-recomputed log-prob gap: that gap is the per-token size of the pitfall at each step.

# %% tags=["nbval-ignore-output"]
pit = results["pitfalls"]
apart = [a for a, s in pit["summary"].items() if "minus_fixed" in s and detected(s["minus_fixed"])]
plots.arm_panels(curves(pit, ["eval/reward"])["eval/reward"], "fixed", "held-out reward",
                 title=f"held-out reward per arm, {pit['seeds']} seeds: {len(apart)} of {len(pit['arms']) - 1} arms "
                       f"detected apart from fixed after K = {pit['steps']} (band: 95%)")

# %% tags=["nbval-ignore-output"]
plots.training_curves(curves(pit, ["kl", "entropy", "completions/mean_length", "logps/max_sampler_gap", "grad_norm"]),
                      title="step metrics, mean over seeds (band: 95% interval; a metric spanning decades on a log axis)")

# %% [markdown]
# After K steps, per arm: the step-1 log-prob gap (before any update: the pitfall's size per token), the
# held-out reward and its difference from `fixed` (paired), and the differences in KL and completion
# length over the last quarter of the steps.

# %%
def gap_at_step_one(r: dict, arm: str) -> float:
    """The mean over seeds of the step-1 max |sampler - recomputed| log-prob (before any update)."""
    gaps = [x["logps/max_sampler_gap"] for x in r["records"] if x["arm"] == arm and x["step"] == 1 and "eval" not in x]
    return sum(gaps) / len(gaps)


rows = []
for arm, s in pit["summary"].items():
    row = {"arm": arm, "step-1 max |log-prob gap|": gap_at_step_one(pit, arm),
           "held-out reward, start": s["reward_start"], "after K": fmt(s["reward_final"])}
    if arm != "fixed":
        row.update({"minus fixed": fmt(s["minus_fixed"]), "KL: log ratio to fixed": fmt(s["kl minus_fixed"]),
                    "length minus fixed": fmt(s["completions/mean_length minus_fixed"])})
    rows.append(row)
pd.set_option("display.max_colwidth", 60)
pd.DataFrame(rows).set_index("arm").round(4)

# %% [markdown]
# What the numbers say, one table per family (its name and size head the table, its corrected level heads the
# interval column): did each arm's held-out reward move over K steps; which pitfalls change the held-out reward,
# KL or length beyond noise. "Seeds up" counts the seeds whose own estimate is above 0: where every seed points
# one way but the interval holds 0, the reading says so: the direction agrees, its size is not resolved.

# %%
fixed = pit["summary"]["fixed"]
for key in ("change_from_start", "minus_fixed", "kl minus_fixed", "completions/mean_length minus_fixed"):
    display(verdict_table(pit, key))

# %% [markdown]
# The KL panel above is on a log axis: the `trl` arm's KL is orders of magnitude above every other arm's. The
# `trl` arm leaves dropout on, scores left-padded rows without position_ids and trains with beta = 0, so no
# KL term pulls it back; the KL logged for it is the k3 estimate between that policy and the reference, each
# scored as the arm scores. Every seed agrees in direction, yet its corrected interval holds 0: the three
# seeds' log ratios are far apart (printed below), and with two degrees of freedom a spread that wide cannot
# exclude 0. Three seeds *can* exclude 0 where they agree closely: `no_position_ids`' KL (printed beside it).
# A test that uses only the direction cannot: the sign test's smallest two-sided p with three paired seeds is
# 0.25. The per-seed numbers:

# %%
window = (pit["steps"] - pit["steps"] // 4 + 1, pit["steps"])
kl = {arm: last_steps_mean(pit["records"], arm, pit["seeds"], "kl", *window).tolist() for arm in ("trl", "dropout", "fixed")}
for arm, values in kl.items():
    print(f"{arm:8s} KL over the last quarter, per seed: " + ", ".join(f"{v:.3g}" for v in values))
ratios = [t / f for t, f in zip(kl["trl"], kl["fixed"])]
print(f"trl / fixed per seed: {min(ratios):.2g} to {max(ratios):.2g}")
print(f"trl: {pit['summary']['trl']['kl minus_fixed']['verdict']}")
print(f"no_position_ids: {pit['summary']['no_position_ids']['kl minus_fixed']['verdict']}")

# %% [markdown]
# Three seeds are few for the fixed arm's own change: its seeds do not move alike. `fixed_seeds.json` runs
# the fixed arm alone on 8 seeds for the same K (added after the 3-seed results were seen: exploratory). Its
# first three seeds are the pitfalls run's own, with the same numbers (asserted). Its change is one verdict of
# the 8-seed comparison of section 2 (`tracin_8_seeds`), in that comparison's family of changes.

# %%
eight = results["tracin_8_seeds"]
fs = {**eight, "records": [r for r in eight["records"] if r["arm"] == "fixed"]}
numbers = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]
assert numbers(r for r in fs["records"] if r["seed"] < pit["seeds"]) == numbers(r for r in pit["records"] if r["arm"] == "fixed")
per_seed = [next(r["eval"]["reward"] for r in fs["records"] if r["seed"] == s and "eval" in r and r["step"] == fs["steps"])
            - eight["summary"]["fixed"]["reward_start"] for s in range(fs["seeds"])]
print("change of the held-out reward per seed:", " ".join(f"{d:+.3f}" for d in per_seed))
own = eight["summary"]["fixed"]["change_from_start"]
print(f"fixed, {fs['seeds']} seeds, after {fs['steps']} steps: {own['verdict']} (family of {own['family_size']})")

# %% [markdown]
# ## 2. The two TracIn reports: TracIn-selected GRPO
#
# Each step, every training sample gets a TracIn score: its gradient's dot product with the gradient of a
# validation loss. The update then takes only the samples that score > 0, and their loss is normalised over
# themselves, as the seeds' trainers did. The arms:
# - `tracin`: a random 64-sample validation set, drawn fresh from the validation prompts each step, with the
#   right sign.
# - `tracin_flipped`: the same set with the TracIn-sign report's flipped sign.
# - `tracin_top16`: the seeds' 16-sample top-by-reward set.
# - `tracin_random128`: a random 128-sample set.
# - `tracin_same_batch`: the training batch itself as the validation set (PPO's step_part_I), which the same-batch TracIn report
#   says fixed it.
#
# Every arm is compared with vanilla GRPO (`fixed`, the pitfalls run's arm) on the same prompts and seeds.

# %% tags=["nbval-ignore-output"]
tr = results["tracin"]
plots.training_curves({**curves(tr, ["eval/reward", "selected_fraction", "val_loss", "kl", "reward"]),
                       **differences(tr)})

# %%
rows = []
for arm, s in tr["summary"].items():
    row = {"arm": arm, "held-out reward after K": fmt(s["reward_final"])}
    if arm != "fixed":
        row.update({"selected per step": f"{s['selected_fraction']['mean']:.3f}"})
    rows.append(row)
pd.DataFrame(rows).set_index("arm")

# %% [markdown]
# Each seed claim (the family `comparisons.json` defines for these runs), answered at their K and with their 3
# seeds. The first line says how far the fixed arm itself moved by then: that is a verdict of the pitfalls
# comparison, whose arm this is.

# %%
print(f"TracIn runs: K = {tr['steps']} steps, {tr['seeds']} seeds")
print("fixed arm: " + pit["summary"]["fixed"]["change_from_start"]["verdict"])
answers = answer(tr)

# %% tags=["nbval-ignore-output"]
plots.interval_rows(answers, "held-out reward difference after K steps",
                    f"seed claims, one family ({100 * answers['tracin - fixed']['level']:.0f}% intervals; red: excludes 0)")

# %% [markdown]
# Three seeds leave every one of these intervals wide: the flipped sign's, which an earlier analysis (a
# bootstrap that resampled prompts within each seed, not the crossed design) called decided, is now wider
# than the reward's whole range of [-1, 1] (printed above, asserted). `tracin_seeds.json` and `tracin_sets_seeds.json` run `tracin`, `tracin_same_batch`
# and `tracin_top16` on 8 seeds, paired with the fixed arm's 8 seeds (`fixed_seeds.json`); their first three
# seeds are the runs above, with the same numbers (asserted). The seed count was raised after the 3-seed
# results were seen, so these are exploratory too. The 128-sample set and the flipped sign stayed at 3 seeds
# (a random-128 step is the costliest TracIn step, `benchmarks/README.md`); the flipped sign was left there on
# the strength of that earlier interval, which the crossed design does not support (asserted: its interval
# holds 0).

# %%
for arm in ("tracin", "tracin_same_batch", "tracin_top16"):
    assert numbers(r for r in eight["records"] if r["arm"] == arm and r["seed"] < tr["seeds"]) == \
        numbers(r for r in tr["records"] if r["arm"] == arm), arm
print(f"{eight['seeds']} seeds, K = {eight['steps']}")
print("fixed arm: " + eight["summary"]["fixed"]["change_from_start"]["verdict"])
answers8 = answer(eight)
for arm in ("tracin", "tracin_same_batch", "tracin_top16"):
    print(f"{arm}: selected per step {eight['summary'][arm]['selected_fraction']['mean']:.3f}")

# %% tags=["nbval-ignore-output"]
plots.interval_rows(answers8, "held-out reward difference after K steps",
                    f"seed claims on {eight['seeds']} seeds, one family ({100 * answers8['tracin - fixed']['level']:.1f}% "
                    "intervals; red: excludes 0)")

# %% [markdown]
# What to notice, asserted below. On 8 seeds, within the family of four claims, none is detected: TracIn
# selection against a random-64 or a top-16 validation set ends a few hundredths below vanilla GRPO, and the
# same-batch set a hundredth below, but every interval holds 0 and is about a tenth wide (printed). So at this
# K and with 8 seeds the suite cannot say that TracIn selection hurts, nor that the same-batch TracIn report's same-batch set
# closes a gap: a gap is not established to begin with. The confirmatory run of section 5 does not test these
# claims; a TracIn step costs 2 to 4 vanilla steps (`benchmarks/README.md`).

# %%
undecided = [name for name, d in answers8.items() if d["ci_low"] < 0 < d["ci_high"]]
print(f"{len(undecided)} of {len(answers8)} claims not detected; widths "
      + ", ".join(f"{d['ci_high'] - d['ci_low']:.3f}" for d in answers8.values()))

# %% [markdown]
# ## 3. The zero-loss notes: the loss reads 0.0000 at step 1
#
# Three arms:
# - `fixed`: loss_type grpo at ratio 1. The policy term is minus the mean advantage, and centred advantages
#   sum to 0. The KL is 0 at step 1, since the policy is the reference.
# - `dapo`: the same rollout, normalised by tokens. The value is sized by how advantages correlate with
#   lengths.
# - `identical_groups`: nucleus sampling with top_p = 1e-6, which keeps only the most likely token: greedy
#   decoding, so every group's completions, and so their rewards, are identical. At step 1 every advantage
#   is 0 (`frac_reward_zero_std`, printed below).
#
# The triage (`grpo_debug.show.diagnostics.triage_zero_loss`, notebook 08) gives its verdict at every step. The
# last cell counts, over every seed, the step-1 losses that print as 0.0000 and the triage's verdicts.

# %%
zl = results["zero_loss"]
table = pd.DataFrame([{"arm": x["arm"], "seed": x["seed"], "step": x["step"], "loss": f"{x['loss']:.4f}",
                       "frac_reward_zero_std": x["frac_reward_zero_std"], "grad_norm": round(x["grad_norm"], 4),
                       "triage": x["triage"].split(":")[0] + ": " + x["triage"].split(":")[1][:60]}
                      for x in zl["records"] if "eval" not in x and x["seed"] == 0])
table.set_index(["arm", "step"])

# %%
for arm in zl["arms"]:
    first = [x for x in zl["records"] if x["arm"] == arm and "eval" not in x and x["step"] == 1]
    zero = sum(f"{x['loss']:.4f}" in ("0.0000", "-0.0000") for x in first)
    verdicts = sorted({x["triage"].split(":")[0] for x in first})
    print(f"{arm:17s} step 1: {zero} of {len(first)} seeds print loss 0.0000; grad_norm "
          f"{min(x['grad_norm'] for x in first):.4f} to {max(x['grad_norm'] for x in first):.4f}; "
          f"frac_reward_zero_std {[x['frac_reward_zero_std'] for x in first]}; triage: {verdicts}")

# %% [markdown]
# In later steps of `identical_groups`, `frac_reward_zero_std` can read below 1 while every group is still
# greedy. The rewards are still identical, but TRL counts a group as varied unless
# `torch.isclose(std, 0)`, whose tolerance is 1e-8. The float32 mean of eight identical rewards can round,
# and then the std comes out a little above that. TRL divides by std + 1e-4, so those groups get advantages
# made of rounding noise, which the update takes as signal. The triage calls this a FAILURE too. Below:
# eight float32 copies of 0.7314049, then every step whose triage names it.

# %%
import torch

from grpo_debug.advantages import summarize_advantages

rewards = torch.full((8,), 0.7314049005508423)
same = summarize_advantages(rewards, 8)
print(f"eight identical float32 rewards of {rewards[0].item():.7f}: std {same.group_std.item():.2e}, TRL's frac_reward_zero_std "
      f"{same.frac_reward_zero_std}, max |advantage| {same.max_abs_advantage:.1e}")
rounding = pd.DataFrame([{"arm": x["arm"], "seed": x["seed"], "step": x["step"], "frac_reward_zero_std": x["frac_reward_zero_std"],
                          "grad_norm": f"{x['grad_norm']:.1e}"} for x in zl["records"] if "eval" not in x and "rounding" in x["triage"]])
print("the steps whose triage names rounding:")
rounding.set_index(["arm", "seed", "step"])

# %% [markdown]
# Does it matter? This arm's only reward signal is that noise; its KL term (beta, printed) only pulls toward
# the reference. AdamW scales each weight's step by that weight's running gradient size, so a gradient well
# above its eps (1e-8) still moves a weight by about the learning rate. Greedy decoding ignores the sampling
# seed, so the three seeds of `identical_groups` are one run three times (checked below), and it counts as
# one sample: its change from its start has an interval over test prompts only. Its held-out reward after K
# steps minus `fixed`'s (paired by seed and test prompt; the seeds vary through `fixed`), and minus its own
# at the start:

# %%
identical_runs = {tuple((x["step"], x["loss"], x["grad_norm"]) for x in zl["records"] if x["arm"] == "identical_groups"
                        and x["seed"] == s and "eval" not in x) for s in range(zl["seeds"])}
own = zl["summary"]["identical_groups"]["change_from_start"]
print(f"beta = {base_config(zl).beta}; identical_groups: {len(identical_runs)} distinct run(s) over {zl['seeds']} seeds")
print(f"after {zl['steps']} steps, {zl['summary']['identical_groups']['minus_fixed']['verdict']}")
print(f"{own['verdict']}\n    ({own['n_seeds']} sample: {own['method']})")

# %% [markdown]
# ## 4. Live check: the stored results still come from this code
#
# *Maintainers' live check: a reader may skip this section.*
#
# Two arms (`fixed` and `dropout`), seed 0, two steps, from the pitfalls experiment's own base config.
# The held-out reward at step 0 and every logged number of steps 1 and 2 must equal the committed ones, times
# aside, to float32 rounding (`record_differences`: within 1e-4 relative, or 1e-4 absolute for the noise-level
# numbers near 0, such as kl at step 1): another CPU's matmul kernels round differently, and on the machine that
# wrote them they are equal exactly.

# %%
from grpo_debug.runs.arms import ARMS, Plan
from grpo_debug.runs.results import record_differences
from grpo_debug.runs.train import train

live_plan = Plan([ARMS["fixed"], ARMS["dropout"]], 2, 1, base_config(pit), eval_every=pit["eval_every"],
                 eval_prompts=pit["eval_prompts"], train_prompts=pit["train_prompts"])
live = train(live_plan, "/tmp/grpo_debug_06b_live.progress.jsonl", show_progress=False)
strip = lambda x: {k: v for k, v in x.items() if k != "seconds"}
mine = [strip(x) for x in live["records"] if x["step"] <= 1 or ("eval" not in x and x["step"] == 2)]
stored = [strip(x) for x in pit["records"] if x["seed"] == 0 and x["arm"] in ("fixed", "dropout")
          and (x["step"] <= 1 or ("eval" not in x and x["step"] == 2))]
parted = record_differences(mine, stored)
assert not parted, f"the committed results no longer come out of this code (re-run data/experiments/run.sh): {parted}"
print(f"{len(mine)} records (held-out reward at step 0, steps 1 and 2 of fixed and dropout) equal the committed ones "
      f"to float32 rounding")

# %% [markdown]
# ## 5. Confirmatory: does dropout left on lower the held-out reward?
#
# Sections 1 to 4 chose their K and seed counts after seeing results, so their verdicts are hypotheses. One
# of them, dropout left on (TRL's default `disable_dropout=False`) against every fix on, became a confirmatory
# run: its 95% interval taken alone excluded 0 (the plan's `source`, printed below), though not within its
# family. The chance that a run of a given size detects an effect, if the effect is really there, is the
# run's *power*. Its claim, arms, K, seeds, analysis and a power estimate from the exploratory table were committed
# in `data/experiments/plan.json` before the run, which used seeds no other run had used. The plan, then its
# result, analysed as planned: one primary comparison (`comparisons.json`'s `confirm`), no correction, 95%.
# (The plan named the interval of its day, Student's t with Satterthwaite's df; the verdict below is today's
# interval's, which covers at its level in the regime these data are in.)

# %%
plan = json.loads((EXPERIMENTS / "plan.json").read_text())
print(plan["claim"])
print(f"arms {plan['arms']}, K = {plan['steps']}, {plan['seeds']} seeds from seed {plan['first_seed']}; "
      f"planned power {plan['power']['power_by_seeds'][str(plan['seeds'])]:.2f} at the exploratory effect")
print(textwrap.fill("source: " + plan["source"], 110))
print(textwrap.fill("analysis: " + plan["analysis"]["primary"], 110))
confirm = results["confirm"]
assert confirm["command"] == plan["commands"], "the confirmatory files were not made by the plan's commands"
assert confirm["seeds"] == plan["seeds"] and confirm["first_seed"] == plan["first_seed"] and confirm["steps"] == plan["steps"]
primary = confirm["summary"]["dropout"]["minus_fixed"]
assert primary["family_size"] == 1, "the plan has one primary comparison: no correction"
print(f"{primary['verdict']} (p {primary['p_value']:.3g}, {primary['n_seeds']} seeds)")
print("confirmed" if primary["ci_high"] < 0 else "not confirmed")

# %% tags=["nbval-ignore-output"]
plots.training_curves({**curves(confirm, ["eval/reward", "kl", "entropy"]), **differences(confirm)},
                      title=f"confirmatory run, {confirm['seeds']} seeds (band: 95% interval)", arms=plan["arms"])

# %% [markdown]
# What to notice, asserted below: the confirmatory run does not confirm the claim. On 12 new seeds the
# difference is less than half the exploratory estimate, and its interval holds 0 (its width is printed above).
# The exploratory -0.056 was picked from many comparisons because it stood out from its noise, and an estimate
# picked that way tends to overstate the effect. "Not detected" is the result: at K = 36 with 24 test prompts, this run cannot
# tell dropout left on from every fix on by the held-out reward (section 6, planned with 128, can). Dropout's effect on the log-probs themselves is not in question
# (notebook 02: a KL far from 0 at step 0).

# %%
exploratory = results["pitfalls"]["summary"]["dropout"]["minus_fixed"]["mean"]
print(f"exploratory estimate {exploratory:+.4f} (3 seeds); confirmatory {primary['mean']:+.4f} ({primary['n_seeds']} seeds)")

# %% [markdown]
# **The plan's power, recomputed.** A power estimate needs to know how much of the reward's variation comes
# from seeds, how much from prompts and how much is left over: the *variance components*, estimated by an
# analysis of variance (*ANOVA*). The plan's 0.87 at 12 seeds (printed above) took the exploratory table's
# variance components, where the seed and prompt variances read 0: the ANOVA's estimates are cut at 0, and a
# 3-seed table often reads a seed variance of 0 that is not there. Below, the power at the exploratory effect
# with today's interval, first with the plan's components, then with the components of the confirmatory
# table itself (12 seeds: an honest estimate, known only after the run; a plan would take them from a pilot
# of as many seeds, or an upper confidence bound of each).

# %%
from grpo_debug.runs.results import eval_table
from grpo_debug.stats import crossed_power, variance_components

planned = {k: plan["power"]["method"].split(f"{k} ")[1].split(",")[0] for k in ("seed", "prompt", "residual")}
planned = {k: float(v) for k, v in planned.items()}
table = (eval_table(confirm["records"], "dropout", confirm["seeds"], confirm["steps"])
         - eval_table(confirm["records"], "fixed", confirm["seeds"], confirm["steps"]))
measured = variance_components(table)
effect = -abs(exploratory)
power_planned = crossed_power(effect, planned, plan["seeds"], confirm["eval_prompts"])
power_measured = crossed_power(effect, measured, plan["seeds"], confirm["eval_prompts"])
print(f"components (seed, prompt, residual): planned {planned}; measured "
      + ", ".join(f"{measured[k]:.4f}" for k in ("seed", "prompt", "residual")))
print(f"power at effect {effect:+.4f} with {plan['seeds']} seeds: {power_planned:.2f} with the plan's components, "
      f"{power_measured:.2f} with the measured ones")

# %% [markdown]
# ## 6. The positive control: does the fixed step learn?
#
# Every "not detected" above leaves a question open: can these runs detect anything at all? Until an arm is seen
# to learn, a pitfall that does not change the held-out reward cannot be told from an experiment too small to
# see a change. A *positive control* answers it: a run in which an effect is expected, sized in advance for the
# power to detect it (the plan's power, printed below, is the share of such runs that would detect the
# exploratory effect). Its plan, `data/experiments/control_plan.json`, was committed before any of its runs
# (a test checks the order in git):
# 1. **Stage 1** chooses the learning rate on the *validation* prompts, never the test prompts: the fixed
#    configuration at four rates, 2 seeds, 24 steps, the rate with the highest mean validation reward.
# 2. **Stage 2** trains the fixed configuration at that rate, beside TRL 1.16 as shipped and two pitfalls alone
#    (dropout left on; log-probs without the sampling temperature), on 8 seeds no other run used, and
#    evaluates on 128 test prompts (earlier runs used 24: the prompts' variation dominated their intervals).
#    Its verdict is the fixed arm's change from its start, in the family of the four arms' changes (98.75%).

# %%
from grpo_debug.runs.control import chosen_rate, headline, rates

control_plan = json.loads((EXPERIMENTS / "control_plan.json").read_text())
print(textwrap.fill(control_plan["question"], 110))
power = control_plan["power"]
print(f"planned power: {power['power_by_test_prompts']['128']:.2f} at the exploratory effect, "
      f"{power['at_half_the_effect']['128']:.2f} at half of it (8 seeds x 128 test prompts)")
start = results["control_lr"]["summary"]["lr_2e-4"]["reward_start"]
rate = float(chosen_rate(EXPERIMENTS))
pd.DataFrame({"mean validation reward after 24 steps": rates(EXPERIMENTS)}).rename_axis("learning rate").assign(
    **{"change from its start": lambda t: t.iloc[:, 0] - start, "chosen": lambda t: t.index == rate}).round(4)

# %%
control = results["control"]
print(textwrap.fill("positive control: " + headline(control), 110))
display(verdict_table(control, "change_from_start"))
display(verdict_table(control, "minus_fixed"))

# %% [markdown]
# Each seed's held-out reward at the start and after K steps, for the fixed arm and TRL as shipped, and each arm's
# change from its start with its interval (paired by seed and test prompt, at the family's corrected level). TRL as
# shipped rose less: its change from its start is not detected, and it ends below `fixed` (asserted below).

# %%
K = control["steps"]
held_out = {arm: tuple(eval_table(control["records"], arm, control["seeds"], k).mean(1) for k in (0, K)) for arm in ("fixed", "trl")}
changes = {arm: control["summary"][arm]["change_from_start"] for arm in held_out}
plots.held_out_by_seed(held_out, changes, K, title=f"{K} steps on {control['seeds']} seeds: " + ", ".join(
    f"{arm} {d['mean']:+.3f} from its start ({'detected' if detected(d) else 'not detected'})" for arm, d in changes.items()))

# %% tags=["nbval-ignore-output"]
below = [a for a, s in control["summary"].items() if "minus_fixed" in s and detected(s["minus_fixed"])
         and s["minus_fixed"]["mean"] < 0]
plots.arm_panels(differences(control)["held-out reward minus fixed"], None, "held-out reward minus fixed",
                 title=f"paired by seed and test prompt at lr {rate:g} (band: 95%): {' and '.join(below) or 'no arm'} "
                       "detected below fixed")

# %% [markdown]
# **What to notice**, asserted below. The fixed configuration learns: every seed's held-out reward rose
# (printed), and the rise is detected at the family's corrected level. So these runs can detect a change of
# this size, and each "not detected" above reads against it. Beside it, in the plan's secondary family, TRL
# 1.16 as shipped and dropout left on end below `fixed`, and the temperature left out of the log-probs is not
# detected apart from it. Section 5 did not confirm dropout's difference; this run, planned with 128 test
# prompts instead of 24 (and K = 24 instead of 36), detects it. The two intervals, printed together below,
# overlap: both runs are consistent with a drop of a few hundredths, which section 5's interval, with fewer test
# prompts, could not tell from 0.

# %%
from grpo_debug.runs.results import per_seed

rose = per_seed(control, "fixed", "change_from_start")
print(f"fixed: {int((rose > 0).sum())} of {len(rose)} seeds rose; per seed " + " ".join(f"{d:+.3f}" for d in rose))
here = control["summary"]["dropout"]["minus_fixed"]
print(f"dropout minus fixed, section 5 (K = {confirm['steps']}, {confirm['seeds']} seeds, {confirm['eval_prompts']} test "
      f"prompts, 95%): {fmt(primary)}")
print(f"dropout minus fixed, here (K = {control['steps']}, {control['seeds']} seeds, {control['eval_prompts']} test "
      f"prompts, {100 * here['level']:.2f}%): {fmt(here)}")

# %% [markdown]
# ## Summary
#
# - Whether a pitfall matters is a question about training: paired arms, held-out prompts, one family per table.
# - "Not detected" means the interval holds 0 at this K, seed and prompt count; its width bounds what could hide.
# - The positive control (section 6): the fixed step learns, detectably; TRL as shipped and dropout end below it.
# - The TracIn claims are not detected either way on 8 seeds; the flipped sign's 3-seed interval is very wide.
# - A loss of zero at step 1 is normal under loss_type grpo (centred advantages); identical groups make it a failure.

# %% [markdown]
# ## Checks
#
# *Maintainers' live check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert min(ratios) > 1e4 and pit["summary"]["trl"]["kl minus_fixed"]["ci_low"] < 0  # unanimous, not decidable
assert answers["tracin_flipped - tracin"]["ci_low"] < 0 < answers["tracin_flipped - tracin"]["ci_high"]  # the sign: undecided
assert undecided == list(answers8) and all(d["ci_high"] - d["ci_low"] < 0.15 for d in answers8.values())
assert all(d["mean"] < 0 for name, d in answers8.items() if name.endswith("- fixed"))
assert same.frac_reward_zero_std == 0.0 and same.rounding_std_groups == [0]  # identical rewards, a std of ~1e-8
assert len(identical_runs) == 1 and own["n_seeds"] == 1  # greedy: one run three times, one sample
assert primary["ci_low"] < 0 < primary["ci_high"] and abs(primary["mean"]) < abs(exploratory) / 2  # the confirmatory run
assert measured["seed"] > 0 and measured["prompt"] > 0 and power_measured < power_planned  # the plan's 0s were not 0
assert detected(control["summary"]["fixed"]["change_from_start"]) and (rose > 0).all(), "the fixed step no longer learns"
assert (K, control["eval_prompts"]) == (24, 128), "the control is no longer 24 steps on 128 held-out prompts"
assert not detected(changes["trl"]) and changes["trl"]["mean"] < changes["fixed"]["mean"], "TRL's change from its start"
assert all(detected(control["summary"][a]["minus_fixed"]) and control["summary"][a]["minus_fixed"]["mean"] < 0
           for a in ("trl", "dropout")), "TRL as shipped or dropout no longer ends below fixed"
assert not detected(control["summary"]["no_temperature"]["minus_fixed"])
assert max(primary["ci_low"], here["ci_low"]) < min(primary["ci_high"], here["ci_high"]) < 0 < primary["ci_high"], \
    "section 5's and section 6's dropout intervals no longer overlap below 0, or section 5's no longer holds 0"
d = answers["tracin_flipped - tracin"]
assert d["ci_high"] - d["ci_low"] > 2, "the flipped sign's interval is no longer wider than the reward's range"
print("every claim above holds")
