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
# # 03b · The bundled analyses against a live Stockfish; malformed answers
#
# **What you will learn.** How the engine-free scorer's bundled analyses compare with a live Stockfish on the same
# position (the legal moves, the evaluations, the two rankings), and what the live scorer does when an engine dies
# or a position is invalid; what a weakened or malformed answer scores.
#
# **What you need first.** Notebook 03 (the chess reward's components, scored against a bundled analysis).

# %%
from grpo_debug.ui.notebook import setup

setup()  # pandas floats at 3 significant digits, as every notebook prints them
import pandas as pd

from grpo_debug.chess.data import load_split
from grpo_debug.chess.engine import PositionAnalysis

record = load_split("policy_eval")[0]
analysis = PositionAnalysis.from_json(record)

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
# **What to notice.** The engine-free scores rest on analyses searched deeper than a live scorer can afford per
# call; the two agree on the moves and, mostly, on their order (the Spearman above).

# %% [markdown]
# ## Malformed completions get documented scores, not exceptions
#
# The position above, answered right, weakened and broken, scored engine-free as 03 scores a P: completion.

# %%
from grpo_debug.chess.data import policy_example
from grpo_debug.chess.rewards import score_policy
from grpo_debug.ui.tables import scored_cases

truth = policy_example(record)[1]  # the same position as above
head, ranked = truth.rsplit(" ", 1)[0] + " ", list(analysis.evals)  # ranked: the legal moves, best first
cases = {"ground truth": truth, "a middling best move": head + ranked[len(ranked) // 2], "the worst legal best move":
         head + ranked[-1], "illegal best move": head + "a1a1", "evals off by 1 pawn": truth.replace("E: ", "E: 1"),
         "garbage": "\u2603 M: ?? B:"}
scored_cases(lambda text: score_policy(analysis, text), cases)

# %% [markdown]
# **What to notice.** The graded best-move rank separates legal answers: a weaker legal move earns less than the
# right answer and more than garbage, so a group's samples differ. The ground truth scores exactly 1.0.

# %% [markdown]
# ## Summary
#
# - The bundled analyses and a live Stockfish agree on the legal moves; their evaluations differ where their depths do.
# - A malformed completion gets a documented score, never an exception; a weaker legal move scores
#   between the right answer and garbage.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed.

# %%
assert set(live.evals) == set(analysis.evals)  # "the two agree on the legal moves"
total = scored_cases(lambda text: score_policy(analysis, text), cases)["total"]
assert total["ground truth"] == 1.0, "the ground truth does not score exactly 1.0"
assert total["ground truth"] > total["a middling best move"] > total["garbage"], "a weaker legal move is not between"
assert total["ground truth"] > total["the worst legal best move"] > total["garbage"], "the worst legal move not between"
print("every claim above holds")
