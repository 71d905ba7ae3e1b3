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
# **What you will learn.** How a reward is made from the task's reward functions and the chess components inside
# them; which components carry a step's signal. A live Stockfish, and what weakened or malformed answers score (a
# documented score, never an exception): 03b (optional).
#
# **What you need first.** Notebook 01 (the groups of completions).
#
# Each reward function $f_k(q, o)$ returns a number (or None) and has a weight $w_k$; the sum, as TRL's, skips a
# None (NaN):
#
# $$r_i = \sum_k w_k\, f_k(q, o_i).$$
#
# The chess task's one function, `rookworld`, scores against bundled analyses (no engine runs): a P: completion on
# its best move (its rank among the legal moves), its candidates (against Stockfish's top 5) and its evaluations;
# an A: completion on the next FEN and the three fields after it:
#
# $$r^{P} = \operatorname{clip}(0.5\, \text{best\_move} + 0.3\, \text{candidates} + 0.2\, \text{evals}, -1, 1), \qquad
# r^{A} = \operatorname{clip}(0.6\, \text{fen} + 0.2\, \text{reward} + 0.1\, \text{terminated} + 0.1\,
# \text{truncated}, -1, 1),$$
#
# each component in $[-1, 1]$ (`grpo_debug/chess/rewards.py`; the P: weights are the public RookWorld trainer's).
# The component `format` (the completion parses) enters neither.

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

run, G = step.run(cfg, until="rewards"), cfg.num_generations
per_function = torch.stack(list(run.rewards.per_function.values()), dim=1)  # (N, F): f_k(q, o_i)
by_hand = (per_function * per_function.new_tensor(step.task.weights)).nansum(1)  # r_i = sum_k w_k f_k(q, o_i)
by_hand[per_function.isnan().all(1)] = float("nan")  # no function scored it: unscorable, as TRL marks it
by_hand_gap = (by_hand - run.rewards.total).nan_to_num().abs().max().item()
print(f"r_i by hand for the first {G}: " + " ".join(f"{v:+.4f}" for v in by_hand[:G].tolist())
      + f"; max |by hand - engine| over the batch {by_hand_gap:.1e}")
if CAPTURE is None:  # the chess components' weights, as in the formulas above
    from grpo_debug.chess.rewards import ENV_WEIGHTS, POLICY_WEIGHTS
    print("P: weights", POLICY_WEIGHTS, "| A: weights", ENV_WEIGHTS)

# %%
from IPython.display import display

from grpo_debug.ui.tables import components_by_group, per_sample

display(*components_by_group(per_sample(run, wide=True), groups=2, rows=3))  # a table a group: its task's components

# %%
from grpo_debug.ui import plots

plots.rewards_per_group(run.rewards, cfg.num_generations)

# %% [markdown]
# Which components carry the signal: each one's spread within the groups (its values times its weight above, minus
# their group's mean, squared, summed), as a share of all; `format` (weight 0) is left out. A captured run's
# components: unweighted. A component a whole group shares adds nothing to its advantages (04).

# %%
from grpo_debug.ui.tables import within_group_spread

weights = {**POLICY_WEIGHTS, **ENV_WEIGHTS} if CAPTURE is None else None  # the formulas' w; None: unweighted
shares = within_group_spread(run.rewards.components, G, weights)
print(f"share of the {'weighted' if weights else 'unweighted'} spread within groups:",
      ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v > 0) or "none")
print("the same in every group:", ", ".join(k for k, v in shares.items() if v == 0) or "none")

# %% [markdown]
# ## Summary
#
# - $r_i = \sum_k w_k f_k(q, o_i)$: the task's reward functions, weighted and summed as TRL sums them.
# - Only the components that differ within a group carry the step's signal.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # the bundled task: the engine's rewards, by hand, and the P: formula on a P: sample
    assert torch.allclose(by_hand, run.rewards.total, equal_nan=True) and by_hand_gap < 1e-6, "by hand != engine"
    i = next(i for i, q in enumerate(run.rollout.prompts) if q.startswith("P:")) * G  # a P: group's first sample
    c = {k: v[i].item() for k, v in run.rewards.components.items()}
    by_formula = max(-1.0, min(1.0, 0.5 * c["best_move"] + 0.3 * c["candidates"] + 0.2 * c["evals"]))
    assert abs(by_formula - by_hand[i].item()) < 1e-6, "the P: formula does not give the reward"
    assert POLICY_WEIGHTS == {"best_move": 0.5, "candidates": 0.3, "evals": 0.2}, "the P: formula's weights"
    assert ENV_WEIGHTS == {"fen": 0.6, "reward": 0.2, "terminated": 0.1, "truncated": 0.1}, "the A: formula's weights"
    assert "format" not in shares and set(shares) <= set(weights), "a component of weight 0 in the weighted shares"
print("every claim above holds")
