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
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Debug your own TRL run: capture a step, open it here, flip a toggle
#
# The notebooks before this one explain steps that grpo-debug takes itself. Your failing step was taken
# by TRL's `GRPOTrainer`. Three lines added to your training script capture it:
#
# ```python
# from grpo_debug.capture import CaptureCallback
# trainer.add_callback(CaptureCallback("captures", steps=[2]))   # the optimizer steps to keep
# trainer.train()                                                 # writes captures/step-2/
# ```
#
# `GRPOStep.from_capture("captures/step-2")` then opens that step. The captured batch is the cached
# rollout. Scoring, rewards (replayed from the captured values), advantages, the loss and the update are
# recomputed under the `trl` preset with your run's own `GRPOConfig`.
#
# The replay first reports whether it reproduces what TRL logged for that step, and names every cause of
# difference it can detect. After that, any toggle applies to your real step. `python -m grpo_debug replay
# captures/step-2 --json out.json [--set KEY=VALUE]` does the same from the command line.
#
# Here the run is a 2-step TRL run of the bundled model on CPU. Set `CAPTURE` to your own capture folder
# to skip it.

# %%
from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

CAPTURE = None  # a capture folder ("captures/step-2") opens your step instead of the demo run below
TASK = None  # your registered task (the run's reward functions), for the notebooks' cells that sample anew

# %% tags=["nbval-ignore-output"]
import tempfile
from pathlib import Path

from grpo_debug.capture import CaptureCallback
from grpo_debug.config import StepConfig
from grpo_debug.trl_bridge import trl_trainer

if CAPTURE is None:
    out = Path(tempfile.mkdtemp(prefix="grpo_debug_capture_"))
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, beta=0.04)  # the fixed preset, in TRL
    trainer = trl_trainer(cfg, str(out), max_steps=2, disable_dropout=True)
    callback = CaptureCallback(out / "captures", steps=[2])
    trainer.add_callback(callback)
    trainer.train()
    CAPTURE = out / "captures" / "step-2"
print(sorted(p.name for p in Path(CAPTURE).iterdir()))

# %% [markdown]
# ## Does the replay reproduce the trainer's step?
#
# Below, TRL's logged numbers for step 2 are set beside ours, recomputed from the captured batch at the
# captured weights. The per-token log-probs are compared as well: ours against the trainer's own scoring
# of the same batch.

# %% tags=["nbval-ignore-output"]
import pandas as pd

from grpo_debug.replay import reproduction
from grpo_debug.step import GRPOStep

step = GRPOStep.from_capture(CAPTURE, TASK)
run = step.run(until="update")
report = reproduction(run, step.capture, step.policy)
table = pd.DataFrame({"TRL logged": report["logged"], "replayed": report["replayed"],
                      "difference": report["difference"]})
table.round(6)

# %%
logged, replayed = report["logged"], report["replayed"]
reproduced = [k for k in logged if abs(replayed[k] - logged[k]) <= 1e-4 * max(abs(logged[k]), abs(replayed[k])) + 1e-7]
print(f"reproduced within 1e-4 relative (+ 1e-7 absolute): {len(reproduced)} of {len(logged)} logged numbers")
print(f"per-token log-probs: max |ours - trainer's| below 1e-4: {report['logps']['max_abs_difference'] < 1e-4}")
for cause, verdict in report["causes"].items():
    print(f"{cause:12s} {verdict}")
print(f"the captured config is the {run.config.preset_name() or 'custom'} preset: "
      f"loss_type={run.config.loss_type}, beta={run.config.beta}, dropout={run.config.dropout}, "
      f"position_ids={run.config.position_ids}")

# %% [markdown]
# The demo run used `PositionIdsGRPOTrainer` with dropout disabled, so both detectable causes are absent and
# the step reproduces. A run on TRL's own defaults would show dropout present: its random masks move the
# loss, KL and grad_norm. It would also show the position pitfall present: the bundled model has absolute
# position embeddings, and TRL scores left-padded rows without position_ids. Notebook 02 explains both.
#
# ## Flip a toggle on the captured step
#
# Each change re-runs only the phases after it, on the captured batch. Here, TRL's own scoring without
# position_ids, on your real step:

# %%
toggled = step.run(step.cfg.replace(position_ids=False), until="update")
moved = (toggled.logprobs.policy - run.logprobs.policy).abs()[run.logprobs.mask.bool()]
print(f"re-ran: {list(toggled.rerun)}")
print(f"without position_ids, the largest per-token log-prob moves by more than 1 nat: {moved.max().item() > 1.0}")
print(f"loss changes: {toggled.update.loss != run.update.loss}; "
      f"grad_norm changes: {toggled.update.grad_norm != run.update.grad_norm}")

# %% [markdown]
# ## Your step in every notebook
#
# Every notebook from 00 to 09 (06b aside: it reads the committed training runs) has `MODEL`, `CAPTURE` and
# `TASK` at its top. Set `CAPTURE` to the folder above and it walks your step instead of the bundled one: the
# log-prob pitfalls of 02, the loss family of 05, the passes of 05b, the update of 06, the dashboard of 09.
# Cells that sample new completions (the post-update evaluation, TracIn's validation sets) need rewards for
# completions the run never saw: set `TASK` to your task plug-in, registered with
# `grpo_debug.task.register_task`, holding the run's reward functions and your prompt sets. Without it those
# cells stop with an error that says so. The prose describes the bundled step; the checks that hold only
# there are skipped under a capture.
