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
# # 03 · Rewards: every component, engine-free
#
# **What you will learn.** How a completion's reward is made (the task's reward functions, weighted and summed as
# TRL sums them, and the chess components inside them); which components carry this step's signal; what malformed
# completions score. How the bundled analyses compare with a live Stockfish is notebook 03b's (optional).
#
# **What you need first.** Notebook 01 (the groups of completions).
#
# The engine sees a task only through its prompt sets and TRL-style reward functions
# $f_k(q, o) \to$ a number (or None), each with a weight $w_k$; the rewards phase sums them as TRL does, leaving
# out a None (NaN):
#
# $$r_i = \sum_k w_k\, f_k(q, o_i).$$
#
# The bundled chess task has one function, `rookworld`, which scores each completion against the bundled analysis
# of its position. A P: prompt (the policy task) is scored on the best move (by its rank among all legal moves),
# the candidates (against Stockfish's top 5) and the evaluations (against Stockfish's eval of each listed move);
# an A: prompt (the environment) on the next FEN (as a position, so either en-passant convention counts) and the
# three fields after it:
#
# $$r^{P} = \operatorname{clip}(0.5\, \text{best\_move} + 0.3\, \text{candidates} + 0.2\, \text{evals}, -1, 1), \qquad
# r^{A} = \operatorname{clip}(0.6\, \text{fen} + 0.2\, \text{reward} + 0.1\, \text{terminated} + 0.1\,
# \text{truncated}, -1, 1),$$
#
# each component in $[-1, 1]$ (`grpo_debug/chess/rewards.py` defines them; the A: component `reward` checks the
# completion's reward field, and `truncated` its illegal-move flag). The P: weights are the public RookWorld
# trainer's. Bundled positions carry an evaluation of every legal move, so scoring needs no engine.

# %%
from grpo_debug.ui.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK)

# %%
import torch

run = step.run(cfg, until="rewards")
per_function = torch.stack(list(run.rewards.per_function.values()), dim=1)  # (N, F): f_k(q, o_i)
weights = torch.tensor(step.task.weights, device=per_function.device)
by_hand = (per_function * weights).nansum(1)  # r_i = sum_k w_k f_k(q, o_i), a None (NaN) left out
by_hand[per_function.isnan().all(1)] = float("nan")  # no function scored it: unscorable, as TRL marks it
by_hand_gap = (by_hand - run.rewards.total).nan_to_num().abs().max().item()
print(f"r_i by hand for the first {cfg.num_generations}: " + " ".join(f"{v:+.4f}" for v in by_hand[:cfg.num_generations].tolist())
      + f"; max |by hand - engine| over the batch {by_hand_gap:.1e}")
if "best_move" in run.rewards.components and run.rollout.prompts[0].startswith("P:"):  # the chess task's P: formula
    c = {k: v[0].item() for k, v in run.rewards.components.items()}  # sample 0's components
    by_formula = max(-1.0, min(1.0, 0.5 * c["best_move"] + 0.3 * c["candidates"] + 0.2 * c["evals"]))
    assert abs(by_formula - by_hand[0].item()) < 1e-6
    print(f"sample 0: clip(0.5 x {c['best_move']:.4f} + 0.3 x {c['candidates']:.4f} + 0.2 x {c['evals']:.4f}) "
          f"= {by_formula:+.4f}")

# %%
from grpo_debug.ui.tables import per_sample

table = per_sample(run, wide=True)  # with every reward component
if CAPTURE is None:  # the bundled chess task's component weights
    from grpo_debug.chess.rewards import ENV_WEIGHTS, POLICY_WEIGHTS
    print("P: weights", POLICY_WEIGHTS, "| A: weights", ENV_WEIGHTS)
print("reward functions and weights:", dict(zip(step.task.reward_names, step.task.weights)))
from IPython.display import display

shown = table[["group", "completion", "reward", *[c for c in table.columns if c.startswith("rewards/")]]].head(16)
for _, rows in shown.groupby("group"):  # one table per prompt, with the components its task scores (no fen for a P:)
    display(rows.dropna(axis=1, how="all"))

# %%
from grpo_debug.ui import plots

plots.rewards_per_group(run.rewards, cfg.num_generations)

# %% [markdown]
# Which components carry this step's signal: a component's spread within the groups (each value minus its
# group's mean, squared and summed; unweighted), as a share of all the components' spread. One that every
# completion of a group shares adds nothing to any advantage (each reward minus its group's mean: notebook 04).

# %%
G = cfg.num_generations
spread = {}
for name, values in run.rewards.components.items():
    grouped = values.view(-1, G)
    spread[name] = (grouped - grouped.nanmean(1, keepdim=True)).pow(2).nansum().item()
varying = dict(sorted(((k, v) for k, v in spread.items() if v > 0), key=lambda kv: -kv[1]))
total = sum(varying.values())
print("spread within groups:", ", ".join(f"{k} {v / total:.0%}" for k, v in varying.items()) or "none")
print("the same in every group:", ", ".join(k for k, v in spread.items() if v == 0) or "none")

# %% [markdown]
# ## Malformed completions get documented scores, not exceptions

# %%
import pandas as pd

from grpo_debug.chess.data import load_split, policy_example
from grpo_debug.chess.engine import PositionAnalysis
from grpo_debug.chess.rewards import score_policy

record = load_split("policy_eval")[0]
analysis = PositionAnalysis.from_json(record)
truth = policy_example(record)[1]
cases = {"ground truth": truth, "empty": "", "garbage": "\u2603 M: ?? B:", "cut short": truth[:20],
         "illegal best move": truth.rsplit(" ", 1)[0] + " a1a1", "evals off by 1 pawn": truth.replace("E: ", "E: 1")}
pd.DataFrame({name: {**score_policy(analysis, text).components, "total": score_policy(analysis, text).total}
              for name, text in cases.items()}).T

# %% [markdown]
# **What to notice.** The step's signal is in the components that differ between the completions of a group
# (the spread printed under the reward plot); a component the model always gets right, or always wrong, is the
# same in every group and teaches nothing at this step. The graded best-move rank is what separates two legal
# answers. The ground truth scores exactly 1.0.

# %% [markdown]
# ## Summary
#
# - A reward is the weighted sum of the task's reward functions, $r_i = \sum_k w_k f_k(q, o_i)$, as TRL sums them.
# - The chess rewards are graded components; only those that differ within a group carry this step's signal.
# - A malformed completion gets a documented score, never an exception; the ground truth scores exactly 1.0.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # the bundled task: the engine's rewards, by hand
    assert torch.allclose(by_hand, run.rewards.total, equal_nan=True) and by_hand_gap < 1e-6
assert score_policy(analysis, truth).total == 1.0  # "the ground truth scores exactly 1.0"
print("every claim above holds")
