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
# # 10 · Debug your own TRL run: capture a step, open it here, flip a toggle
#
# The notebooks before this one explain steps that grpo-debug takes itself. Your failing step was taken
# by TRL's `GRPOTrainer`. Two lines added to your training script, before `trainer.train()`, capture it
# (whatever `logging_steps`, `num_iterations` and the micro-batches are):
#
# ```python
# from grpo_debug.capture import CaptureCallback
# trainer.add_callback(CaptureCallback("captures", steps=[2]))   # writes captures/step-2/ during train()
# ```
#
# `open_capture("captures/step-2", task=[your, reward, functions])` then opens that step. The captured
# batch is the cached rollout. Scoring, rewards (your functions, or the captured values without them),
# advantages, the loss and the update are recomputed under the `trl` preset with your run's own `GRPOConfig`.
#
# The replay first takes the captured optimizer step as TRL took it (its micro-batches, its pass, the
# trainer's own dropout masks) and reports whether it reproduces the numbers TRL computed for that step. After that, any toggle applies to your real step. `python -m grpo_debug replay
# captures/step-2 --json out.json [--set KEY=VALUE]` does the same from the command line.
#
# Here the run is a 2-step run of TRL's own `GRPOTrainer` with its defaults for the loss, dropout and
# scoring, on the bundled model on CPU. Set `CAPTURE` to your own capture folder to skip it.

# %%
from grpo_debug.ui.notebook import setup

setup()  # one torch thread: the same numbers on every run

CAPTURE = None  # a capture folder ("captures/step-2") opens your step instead of the demo run below
TASK = None  # your reward functions ([f, g], or "my_rewards.py:NAME"), or a registered task: for cells that sample anew

# %% tags=["nbval-ignore-output"]
import tempfile
from pathlib import Path

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.ui.tables import trained_log

trl_log = None
if CAPTURE is None:
    out = Path(tempfile.mkdtemp(prefix="grpo_debug_capture_"))
    cfg = StepConfig.preset("trl", num_prompts=2, num_generations=4, max_new_tokens=32)  # TRL's defaults
    trainer = trl_trainer(cfg, str(out), max_steps=3)  # GRPOTrainer itself: dropout on, no position_ids
    callback = CaptureCallback(out / "captures", steps=[2, 3])  # step 3: where step 2's update landed
    trainer.add_callback(callback)
    trl_log = trained_log(trainer, ["loss", "grad_norm", "reward", "reward_std", "frac_reward_zero_std"])  # TRL's log
    CAPTURE = out / "captures" / "step-2"
print(sorted(p.name for p in Path(CAPTURE).iterdir()))
trl_log

# %% [markdown]
# ## Does the replay reproduce the trainer's step?
#
# The demo run's table above is a few of the numbers TRL logged at each step, under TRL's names (its row
# for step 2 is the step captured). Below, the numbers TRL computed for step 2 (read from the trainer at that
# step) are set beside ours, recomputed from the captured batch at the captured weights, micro-batch by
# micro-batch. The per-token log-probs are compared as well: ours against the trainer's own scoring of the
# same batch.

# %% tags=["nbval-ignore-output"]
import pandas as pd

from grpo_debug.capture import open_capture
from grpo_debug.capture.replay import reproduction

step = open_capture(CAPTURE, TASK)
run = step.run(until="update")
report = reproduction(run, step.capture, step.policy, step)
table = pd.DataFrame({report["logged_source"]: report["logged"], "replayed": report["replayed"],
                      "difference": report["difference"]})
table.round(6)

# %%
logged, replayed = report["logged"], report["replayed"]
reproduced = [k for k in logged if abs(replayed[k] - logged[k]) <= 1e-4 * max(abs(logged[k]), abs(replayed[k])) + 1e-7]
print(f"reproduced within 1e-4 relative (+ 1e-7 absolute): {len(reproduced)} of {len(logged)} logged numbers")
print(f"per-token log-probs: max |ours - trainer's| below 1e-4: {report['logps']['max_abs_difference'] < 1e-4}")
for cause, verdict in report["causes"].items():
    print(f"cause   {cause:12s} {verdict}")
for name, what in report["pitfalls"].items():
    print(f"pitfall {name:12s} {what}")
print(f"the captured config is the {run.config.preset_name() or 'custom'} preset: "
      f"loss_type={run.config.loss_type}, beta={run.config.beta}, dropout={run.config.dropout}, "
      f"position_ids={run.config.position_ids}")

# %% [markdown]
# The demo run is TRL's own defaults, dropout on: the capture kept the random state each of the trainer's
# forwards started from, so the replay draws the same dropout masks and the step reproduces. The run's two
# pitfalls are named as pitfalls, not as causes of a difference: dropout on in the policy's forward passes,
# and left-padded rows of an absolute-position model (the bundled GPT-2) scored without position_ids.
# Notebook 02 explains both.
#
# ## Does the replayed update land where the trainer's did?
#
# A capture also holds the trainer's optimizer as it was before the step: AdamW's moments, its parameter groups
# (no weight decay on biases and norms) and the learning rate its scheduler set for the step. So the update phase
# on a capture is the trainer's own step, and where the run also captured step k+1, the replayed step k must land
# on its weights: the cosine between our move and the trainer's, the ratio of their norms, and how far the weights
# after are from the trainer's (`grpo_debug.capture.landing`). Whether they are bit-equal is a fact about the CPU's
# float32 matmul kernels, not about the replay: on one Intel Xeon with AVX-512 they were bit-equal under MKL's
# compatible path (`MKL_CBWR=COMPATIBLE`) and within float rounding under MKL's own AVX-512 path, whose kernels
# follow each matmul's shape (docs/development.md, "Same seed, same numbers"). The line below says what this CPU gives.

# %%
from grpo_debug.capture.landing import landing

following = Path(CAPTURE).parent / f"step-{step.capture.meta['step'] + 1}"
print(f"the update phase steps with: {report['optimizer']}")
if following.is_dir():
    land = landing(step, following)
    close = land["max_abs_difference"] < 0.1 * land["learning_rate"]  # Adam moves a weight by about lr at most
    print(f"replayed step {step.capture.meta['step']} against {following.name}: cosine {land['cosine']:.6f}, "
          f"norm ratio {land['norm_ratio']:.6f}, largest weight difference below a tenth of the learning rate: "
          f"{close} (measured on this CPU: largest {land['max_abs_difference']:.2g}, bit-equal {land['bit_equal']})")
    assert land["cosine"] >= 0.99 and abs(land["norm_ratio"] - 1) <= 0.02, (
        f"the replayed update is not the trainer's: {land}")
else:
    print(f"no {following.name} beside the capture: capture consecutive steps to see where the update lands")

# %% [markdown]
# ## Flip a toggle on the captured step
#
# Each change re-runs only the phases after it, on the captured batch. Here, the position fix (position_ids
# from the attention mask, as generation had them), on your real step:

# %%
toggled = step.run(step.cfg.replace(position_ids=not step.cfg.position_ids), until="update")
moved = (toggled.logprobs.policy - run.logprobs.policy).abs()[run.logprobs.mask.bool()]
print(f"re-ran: {list(toggled.rerun)}")
from grpo_debug.model import absolute_positions

print(f"position_ids={toggled.config.position_ids}: the largest per-token log-prob moves by {moved.max().item():.2g} nats")
grad_change = abs(toggled.update.grad_norm - run.update.grad_norm) / run.update.grad_norm
print(f"grad_norm {run.update.grad_norm:.4g} -> {toggled.update.grad_norm:.4g} ({grad_change:.1e} of it; the loss "
      "itself is ~0 at ratio 1, notebook 08)")
if not absolute_positions(step.policy):
    print("this model adds no absolute position embeddings (rotary positions, say): shifting a row's positions "
          "changes its scores by float rounding only, so position_ids cannot matter on it")

# %% [markdown]
# ## Your step in every notebook
#
# Every notebook from 00 to 09 (06b aside: it reads the committed training runs) has `MODEL`, `CAPTURE` and
# `TASK` at its top. Set `CAPTURE` to the folder above and it walks your step instead of the bundled one: the
# log-prob pitfalls of 02, the loss family of 05, the passes of 05b, the update of 06, the dashboard of 09.
# Cells that sample new completions (the post-update evaluation, TracIn's validation sets) need rewards for
# completions the run never saw: set `TASK` to your reward functions, or to a task plug-in registered with
# `grpo_debug.task.register_task`, which also brings validation and test prompts. Without it those
# cells stop with an error that says so. The prose describes the bundled step; the checks that hold only
# there are skipped under a capture.

# %% [markdown]
# ## A run you cannot stop to ask: the flight recorder
#
# A capture by step number needs the step in advance. `FlightRecorder` watches every optimizer step instead:
# TRL's own metrics for the step and the doctor's cheap findings (none needs another forward pass), one JSON
# line each in `health.jsonl`, and it captures a step whole, as above, when a finding's severity rises,
# grad_norm spikes or the reward collapses:
#
# ```python
# from grpo_debug.capture import FlightRecorder
# trainer.add_callback(FlightRecorder("flight"))     # flight/health.jsonl, flight/step-<k>/
# ```
#
# and `python -m grpo_debug timeline flight --html run.html --doctor` draws the run. Below, a 4-step TRL run of
# the bundled model on its P: prompts whose reward function breaks at step 3: from then on it returns 0.5
# for every completion, as a reward whose check every completion passes would.

# %% tags=["nbval-ignore-output"]
import dataclasses

from grpo_debug.capture import FlightRecorder
from grpo_debug.task import load_task

BREAKS_AT = 3


def breaks_at(reward, step: int):
    """`reward` until optimizer step `step`, then 0.5 for every completion (TRL passes `trainer_state`)."""

    def broken(prompts, completions, trainer_state=None, **kwargs):
        if trainer_state.global_step + 1 >= step:
            return [0.5] * len(completions)
        return reward(prompts, completions, **kwargs)

    broken.__name__ = reward.__name__
    return broken


run_dir = Path(tempfile.mkdtemp(prefix="grpo_debug_flight_"))
flight_cfg = StepConfig.preset("trl", task="policy", num_prompts=4, num_generations=4, max_new_tokens=48)
task = load_task("policy")
task = dataclasses.replace(task, reward_funcs=[breaks_at(f, BREAKS_AT) for f in task.reward_funcs])
trainer = trl_trainer(flight_cfg, str(run_dir / "run"), task, max_steps=4)
trainer.add_callback(FlightRecorder(run_dir / "flight"))
trl_log_flight = trained_log(trainer, ["reward", "frac_reward_zero_std", "grad_norm"])  # the recorder's table shows them

# %%
from grpo_debug.show.timeline import read_run

flight = read_run(run_dir / "flight")
health = pd.DataFrame([{"step": line["step"], "reward": line["metrics"]["reward"],
                        "frac_reward_zero_std": line["metrics"]["frac_reward_zero_std"],
                        "grad_norm": line["metrics"]["grad_norm"],
                        **{f"{id}": f["severity"] for id, f in line["findings"].items()
                           if id in ("zero_std_groups", "constant_reward", "truncation")},
                        "captured": line["capture"] or ""} for line in flight.lines]).set_index("step")
for k, entry in flight.captures.items():
    print(f"step {k} captured: " + "; ".join(f"{r['id']} ({r['severity']})" for r in entry["trigger"]))
health

# %% tags=["nbval-ignore-output"]
from IPython.display import HTML

from grpo_debug.show.timeline import page

HTML(page(flight, run_dir / "run.html"))  # the run page, as `timeline` writes it

# %% [markdown]
# **What to notice.** Every step has its line; the step where the reward breaks is the one captured, for the
# reason the doctor gives (every group's rewards equal: no advantage, no gradient), and it is a capture like the
# one above: `open_capture(run_dir / "flight" / "step-3", TASK)` opens it. The condition persists at step 4 and is
# not captured again: a rise in severity triggers, not its staying there.

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed.

# %%
assert BREAKS_AT in flight.captures, f"the step where the reward breaks was not captured: {sorted(flight.captures)}"
assert "constant_reward" in {r["id"] for r in flight.captures[BREAKS_AT]["trigger"]}
assert BREAKS_AT + 1 not in flight.captures, "a persisting condition triggered twice"
assert health.loc[BREAKS_AT, "frac_reward_zero_std"] == 1.0
assert (health[trl_log_flight.columns] - trl_log_flight).abs().max().max() < 1e-6, "health.jsonl has TRL's own metrics"
