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
# The P: reward compares the completion with Stockfish's analysis of the position: best move (by its rank
# among all legal moves), candidates (against the top 5), evaluations (against Stockfish's eval of each
# listed move), format. Weights 0.5 / 0.3 / 0.2 as the public RookWorld trainer. The A: reward checks the
# next FEN (as a position, so either en-passant convention counts), the reward value and the two flags.
# Bundled positions carry an evaluation of every legal move, so scoring needs no engine.
#
# The engine sees a task only through its prompt sets and TRL-style reward functions
# (`f(prompts, completions) -> list[float]`, with weights); the rewards phase sums them as TRL does:

# %%
from grpo_debug.rewards import compute_rewards
from grpo_debug.ui.notebook import show_source

show_source(compute_rewards)

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
run = step.run(cfg, until="rewards")
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
# completion of a group shares adds nothing to any advantage.

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
cases = {"ground truth": truth, "empty": "", "garbage": "\u2603 M: ?? B:", "truncated": truth[:20],
         "illegal best move": truth.rsplit(" ", 1)[0] + " a1a1", "evals off by 1 pawn": truth.replace("E: ", "E: 1")}
pd.DataFrame({name: {**score_policy(analysis, text).components, "total": score_policy(analysis, text).total}
              for name, text in cases.items()}).T

# %% [markdown]
# ## Engine-free vs live Stockfish
#
# For a position that is not bundled, the scorer starts one Stockfish process and analyses every legal
# move, with a time limit per call; an engine that dies or freezes is restarted once, and a position that
# still fails, is invalid or is already over gets the documented score (-1, format 0) with the reason. The
# engine's hash is cleared before each analysis, so a score does not depend on what was analysed before.
# On a bundled position the two agree on the legal moves; the evaluations differ where the depths do
# (the bundled analyses searched to `analysis.depth`, the live one below to depth 8). The table puts the
# two evaluations of each move side by side (pawns, side to move), best first by the bundled analysis;
# the lines under it say how far the two rankings agree.

# %%
import chess

from grpo_debug.chess.engine import Stockfish
from grpo_debug.stats import spearman

with Stockfish(depth=8) as engine:
    live = engine.analyse(chess.Board(record["fen"]))
moves = list(analysis.evals)
engines = pd.DataFrame({f"bundled (depth {analysis.depth})": analysis.evals,
                        f"live (depth {live.depth})": {m: live.evals[m] for m in moves},
                        "bundled rank": {m: i + 1 for i, m in enumerate(moves)},
                        "live rank": {m: live.ranked_moves.index(m) + 1 for m in moves}})
engines["difference"] = engines.iloc[:, 1] - engines.iloc[:, 0]
print(f"{len(moves)} legal moves, the same set in both; best move: bundled {moves[0]}, live {live.ranked_moves[0]}; "
      f"Spearman of the two evaluations {spearman(engines.iloc[:, 0].tolist(), engines.iloc[:, 1].tolist()):+.2f}; "
      f"median |difference| {engines['difference'].abs().median():.2f} pawns")
engines.head(8).round(2)

# %% [markdown]
# **What to notice.** The step's signal is in the components that differ between the completions of a group
# (the spread printed under the reward plot); a component the model always gets right, or always wrong, is the
# same in every group and teaches nothing at this step. The graded best-move rank is what separates two legal
# answers. The ground truth scores exactly 1.0.

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert set(live.evals) == set(analysis.evals)  # "the two agree on the legal moves"
assert score_policy(analysis, truth).total == 1.0  # "the ground truth scores exactly 1.0"
print("every claim above holds")
