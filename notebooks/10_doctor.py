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
#
# %% [markdown]
# # 10 · The doctor: why does my step not learn?
#
# Start here with a run that does not learn. Point `CAPTURE` at a step captured from your TRL run
# (`CaptureCallback`, notebook 10_your_run) and run the notebook. The doctor runs every detector on that one
# step, flips each cause it finds on the same step (the same completions, the same weights) and ranks the
# findings. Each finding names its fix in TRL's names and the notebook section that teaches it.
#
# With no capture, the step is the bundled model's, taken the way TRL 1.16 takes it by default (the `trl`
# preset): no `position_ids` on left-padded rows of an absolute-position model, dropout on while scoring.
# The same report from the command line: `python -m grpo_debug doctor [CAPTURE] --json out.json --html report.html`.

# %%
from grpo_debug.presets import PRESET_SAMPLING, PRESETS
from grpo_debug.ui.notebook import open_step

# MODEL: a model folder or hub name (None: the bundled RookWorld-format model). CAPTURE: your captured step
# ("captures/step-2"), which the doctor then examines. TASK: your reward functions ("my_rewards.py:NAME") or a
# registered task (None: the captured rewards).
MODEL = None
CAPTURE = None
TASK = None
TRL_DEFAULTS = {**PRESETS["trl"], **PRESET_SAMPLING["trl"]}  # how TRL 1.16 takes a step with a default GRPOConfig
cfg, step = open_step(MODEL, CAPTURE, TASK, **({} if CAPTURE else TRL_DEFAULTS),
                      **({} if CAPTURE else dict(num_prompts=4, num_generations=4, max_new_tokens=48)))

# %% [markdown]
# ## The ranked report
#
# Each detector is one small function of the step's numbers (`grpo_debug/detectors/detectors.py`), and each pitfall
# is declared once, with its fix and its origin, in `grpo_debug/pitfalls.py`. A finding whose cause is a
# switch of the step is then flipped on this very step, and the two updates are compared:
#
# $$\cos(\Delta\theta, \Delta\theta') = \frac{\langle \theta_\text{after} - \theta_\text{before},\;
# \theta'_\text{after} - \theta_\text{before}\rangle}{\lVert\cdot\rVert\,\lVert\cdot\rVert}$$
#
# A cosine near 1 (and the same `grad_norm`) means the cause is cosmetic on this step: it changes a logged
# number, not where the step goes; a flip that takes the gradient away removes the update rather than fixing it.
#
# Some findings are symptoms of others: a sampler that drifts from the trainer because the trainer scores with
# dropout on. The doctor tells them apart by a differential (`grpo_debug/doctor/chain.py`): it applies the
# fix of one loud cause to the step, runs every detector again, and marks what went quiet as that cause's
# symptom, then goes on with the next cause, the earlier fixes kept. Causes are ranked by severity, then by how
# far their flip moves the update; each symptom sits after its causes and has no fix of its own.
#
# Where the task has held-out test prompts (the bundled task; a capture opened with a `Task` of yours), both
# updated policies also sample on the same held-out prompts with the same seeds, and the per-prompt difference
# in reward gets an interval (Student's t over prompts, at the Bonferroni level of the family of flips). One
# step moves the reward little: expect "not detected" more often than not. It is the update's direction, above,
# that tells a cosmetic cause from a real one.

# %% tags=["nbval-ignore-output"]
from grpo_debug.doctor import diagnose
from grpo_debug.doctor.present import details, short_table

report = diagnose(step)
short_table(report, at_least="info")

# %% [markdown]
# Each loud finding's evidence, its flip on this step and its fix, in the table's order (`present.table` gives every
# column as one wide table):

# %% tags=["nbval-ignore-output"]
print(details(report, at_least="warning"))

# %% [markdown]
# ## The learning signal, stage by stage
#
# A catalogue finds what it lists. What a user asks is "why does my step not learn", and GRPO's learning signal takes
# one path through the step, measured on every step whatever broke it (`grpo_debug/detectors/signal_path.py`):
#
# | stage | lets through |
# |---|---|
# | samples | the groups with two different completions (and the mass the sampler kept) |
# | rewards | the groups whose weighted reward varies: only they get an advantage |
# | advantages | the rows of those groups with a non-zero advantage |
# | tokens | the completion tokens that carry the policy term's gradient (masks, `top_entropy_quantile`, the clip) |
# | loss | the policy term's gradient $\partial \mathcal{L}/\partial \log\pi$ against the KL term's |
# | parameters | the trainable tensors the update moved |
# | update | the KL one update moves the policy by on its own completions |
#
# A stage that lets through a tenth or less of what came in (or a KL term whose gradient outweighs the policy
# term's) is `signal_lost`, named by the stage and the setting it traced, whether or not a catalogued pitfall
# explains it; where a loud one of that stage does, it leads and `signal_lost` says so at info.

# %% tags=["nbval-ignore-output"]
import pandas as pd

from grpo_debug.doctor.present import signal_path_of

path = pd.DataFrame(signal_path_of(report))
path[["stage", "kept", "lost", "said"]]

# %%
lost = path[path["lost"]]
print("the stage where the signal is lost:", lost["stage"].iloc[0] if len(lost) else "none (every stage lets most through)")

# %% [markdown]
# ## The evidence, drawn
#
# `doctor --html report.html` writes the report as one page: the verdict in a sentence, the causal chain as a picture,
# then one card per cause with its evidence as a figure, its flip as a table and, with `--horizon K`, both arms over
# the K steps. `doctor --png DIR` writes the same figures as files. Here the same functions draw them
# (`grpo_debug/ui/report_figures.py`): each finding picks its figure by its id (the per-token gap for a scoring
# pitfall, lengths against the cap for truncation, reward against length for a length-paying reward, what TRL logged
# for the KL or the learning rate, else each group's rewards and advantages).

# %%
from IPython.display import display

from grpo_debug.ui.report_figures import figures_of

figures = figures_of(report)
print(", ".join(figures))
for fig in figures.values():
    display(fig)

# %% [markdown]
# ## What to notice, and where to learn it

# %%
from grpo_debug.doctor import fix_of
from grpo_debug.pitfalls import PITFALLS

loud = report.present("warning")
print(f"{len(loud)} findings at warning or above ({len(report.causes())} causes), "
      f"{len(report.present('info')) - len(loud)} at info, "
      f"{sum(f.severity == 'absent' for f in report.findings)} checks found nothing")
for f in loud:
    if f.symptom_of:
        print(f"- {f.id} [{f.severity}]: a symptom of {' + '.join(f.symptom_of)}; fixing {'them' if len(f.symptom_of) > 1 else 'it'} clears it")
        continue
    moved = ("not flipped (no switch of the step removes it)" if f.effect is None else
             f"flipping {next(iter(f.effect['toggle']))} gives an update at cosine {f.effect['update_cosine']:+.2f} "
             f"to this one ({'cosmetic' if f.effect['cosmetic'] else 'it moves the update'})")
    held = f.effect and f.effect.get("held_out_reward")
    print(f"- {f.id} [{f.severity}]: {moved}")
    if held:
        print(f"    {held['verdict']};\n    {held['completions_changed']} of "
              f"{held['prompts'] * held['samples_per_prompt']} held-out completions changed")
    print(f"    fix: {fix_of(f, report.uses_vllm)}\n    learn: notebooks/{PITFALLS[f.id].teach}")

# %% [markdown]
# ## Checks

# %%
assert list(path["stage"]) == ["samples", "rewards", "advantages", "tokens", "loss", "parameters", "update"], (
    f"the signal's path is not measured stage by stage in order: {list(path['stage'])}"
)
order = [("problem", "warning", "info", "absent").index(f.severity) for f in report.findings if not f.symptom_of]
assert order == sorted(order), f"the causes are not ranked by severity: {[f.severity for f in report.findings]}"
place = {f.id: k for k, f in enumerate(report.findings)}
for f in report.findings:
    assert all(place[c] < place[f.id] for c in f.symptom_of), f"{f.id} is ranked above one of its causes {f.symptom_of}"
    assert not (f.symptom_of and fix_of(f, report.uses_vllm)), f"{f.id} is a symptom and still shows a fix"
    assert report.uses_vllm or "vllm" not in fix_of(f, False), f"{f.id}: vLLM advice on a run without vLLM"
for f in report.findings:
    if f.effect and "update_cosine" in f.effect:
        assert f.effect["cosmetic"] == (f.effect["update_cosine"] >= 0.99 and
                                        abs(f.effect["grad_norm"][1] - f.effect["grad_norm"][0])
                                        <= 0.01 * f.effect["grad_norm"][0]), f"{f.id}: 'cosmetic' disagrees with its numbers"
if CAPTURE is None:  # the bundled step under TRL's defaults: left-padded rows of GPT-2, no position_ids
    top = report.findings[0]
    assert top.id == "position_ids" and top.severity == "problem", (
        f"the bundled step without position_ids: the doctor's first finding is {top.id} ({top.severity})")
    assert not top.effect["cosmetic"], "passing position_ids on the bundled step did not move the update"
    print(f"position_ids ranks first: its flip moves the update to cosine {top.effect['update_cosine']:+.2f}")
    mismatch = next(f for f in report.findings if f.id == "sampler_mismatch")
    if mismatch.severity in ("problem", "warning"):  # the trainer's own drift: dropout and shifted positions
        assert mismatch.symptom_of and set(mismatch.symptom_of) <= {"position_ids", "dropout"}, (
            f"the sampler's drift on the bundled step is not marked a symptom of position_ids/dropout: {mismatch}")
        print(f"sampler_mismatch is a symptom of {' + '.join(mismatch.symptom_of)}")
print("every claim above holds")
