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
# # 00 · Set-up and baseline evaluation
#
# **What you will learn.** What one GRPO step does, as a map of the notebooks that open each phase; the model and
# its two chess tasks; the whole step as one short function; where the model starts (its reward on held-out
# prompts, per reward component); the words the path uses, each with one meaning (the glossary below).
#
# **What you need first.** PyTorch, and the policy gradient of REINFORCE: for a policy $\pi_\theta$ and a
# reward $r$, $\nabla_\theta\, \mathbb{E}_{o \sim \pi_\theta}[r(o)] = \mathbb{E}_{o \sim \pi_\theta}[r(o)\,
# \nabla_\theta \log \pi_\theta(o)]$. Nothing of GRPO.
#
# **GRPO in one paragraph.** Group Relative Policy Optimization (DeepSeekMath, 2024) trains a language model from
# rewards without a value network. For each prompt it samples a group of G completions and scores each with reward
# functions; a completion's advantage is its reward minus its group's mean (divided by the group's spread), and
# every token of it shares that advantage. The loss raises the log-probability of the tokens of completions that
# beat their group and lowers it for those below, through PPO's clipped probability ratio, which keeps the updated
# policy near the one that sampled; an optional KL term (`beta`) keeps it near a frozen reference model.
#
# | phase | what it computes | opens in |
# |---|---|---|
# | rollout | $G$ completions $o_1, \dots, o_G$ of each prompt $q$, sampled from $\pi_{\text{old}}$ | 01 |
# | log-probs | $\log \pi_\theta(o_{i,t} \mid q, o_{i,<t})$ per token, and $\log \pi_{\text{ref}}$ | 02 |
# | rewards | one number $r_i$ per completion | 03 |
# | advantages | $A_i = (r_i - \operatorname{mean}(r)) / (\operatorname{std}(r) + \delta)$ within each group | 04 |
# | loss | the clipped surrogate $-\min(\rho A, \operatorname{clip}(\rho) A)$ plus $\beta$ KL, normalised | 05 |
# | update | one AdamW step on the loss's gradient; then the reward on held-out prompts | 06 |
#
# This notebook loads the model and measures where it starts. Every notebook opens its step the same way
# (`open_step`): on the bundled model, on a model of yours (`MODEL`), or on a step captured from your own TRL run
# (`CAPTURE`); none relies on state from another.
#
# **Words used on the path**, one meaning each:
#
# | word | meaning here |
# |---|---|
# | group | the G completions sampled for one prompt; advantages compare within it |
# | $\pi_\theta$, the policy | the model being trained |
# | $\pi_{\text{old}}$ (pi_old) | the policy as it was when it sampled the rollout; the ratio $\rho = \pi_\theta / \pi_{\text{old}}$ compares the two (02, 05) |
# | reference, $\pi_{\text{ref}}$ | a frozen copy of the starting model, held fixed for the whole run; the KL term pulls towards it (05). Not $\pi_{\text{old}}$ |
# | normaliser | what the loss divides the summed token losses by: `loss_type` grpo, bnpo, dr_grpo or dapo (05) |
# | zero-std group | a group whose rewards are all equal: every advantage 0, no signal (04) |
# | phantom advantage | a full-size advantage from a group whose rewards differ by almost nothing: a tiny std divides (04) |
# | unfinished | a completion that hit `max_new_tokens` before its EOS (01); TRL calls it truncated |
# | truncated | only the A: task's fourth field: RookWorld's flag for an illegal move (below) |
# | fixed, every fix on | the default step (`StepConfig()`): every log-prob pitfall of notebook 02 fixed; its advantages are TRL's, with no std floor (04), and its KL estimator is plain k3, whose gradient is biased (05) |
#
# **Symbols**, one per quantity on the path, with TRL's name where it has one:
#
# | symbol | quantity | TRL |
# |---|---|---|
# | $q$, $o_i$, $o_{i,t}$ | a prompt, its $i$-th completion, that completion's $t$-th token | |
# | $B$, $G$, $N = BG$ | prompts in a batch, completions per prompt, completions in the batch | `num_generations` is $G$ |
# | $\lvert o_i \rvert$ | completion $i$'s scored tokens (up to and with its EOS) | |
# | $T$ | the sampling temperature, and nothing else | `temperature` |
# | $r_i$, $A_i$ | completion $i$'s reward and advantage | |
# | $\delta = 10^{-4}$ | what the advantage adds to its group's std | |
# | $\rho_{i,t}$ | the ratio $\pi_\theta / \pi_{\text{old}}$ of one token | |
# | $\epsilon$ ($\epsilon_{\text{low}}$, $\epsilon_{\text{high}}$) | the clip's half-width, below and above 1 | `epsilon`, `epsilon_high` |
# | $\beta$ | the KL term's weight | `beta` |
# | $\eta$ | the learning rate | `learning_rate` |
# | $\beta_1$, $\beta_2$, $\epsilon_{\text{Adam}}$ | AdamW's two moment decays and its denominator's offset (no relation to $\beta$, $\epsilon$) | `adam_beta1`, `adam_beta2`, `adam_epsilon` |

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
from grpo_debug.model import dropout_sources

policy, reference, tokenizer = step.loaded.policy, step.loaded.reference, step.loaded.tokenizer
n_params = sum(p.numel() for p in policy.parameters())
print(f"{type(policy).__name__}: {n_params / 1e6:.2f}M parameters, {policy.config.num_hidden_layers} layers, "
      f"vocab {policy.config.vocab_size}, dropout in train mode: {', '.join(dropout_sources(policy)) or 'none'}")
print("pad == eos:", tokenizer.pad_token_id == tokenizer.eos_token_id)

# %% [markdown]
# The two RookWorld tasks, as the model sees them (prompt, then `|`, then the right completion). A policy (P:)
# prompt asks for the top-5 moves, their evaluations and the best move; an environment (A:) prompt asks for the
# position after a move and three fields: the game's reward for the move, whether the game ended (terminated) and
# whether the move was illegal (truncated).

# %%
from grpo_debug.chess.data import env_example, load_split, policy_example

examples = [policy_example(load_split("policy_eval")[0]), env_example(load_split("env_eval")[0])]
if CAPTURE is not None:  # your run's first prompt and completion instead
    examples = [(step.result.rollout.prompts[0], step.result.rollout.completions[0])]
for prompt, truth in examples:
    print(prompt + "|" + truth)

# %% [markdown]
# ## The whole step in one function
#
# Notebooks 01-06 take one GRPO step apart, one phase each. Here is the same step in one piece, the
# function to keep open beside them (its names are opened in the notebooks its comments name; read it now for its
# shape only): each line is one phase, its comment naming the notebook that opens it,
# called with tensors and the plain settings `grpo_debug/specs.py` reads from the config (the sampler
# correction is TRL's vLLM option, off here: notebook 05c). The `step` object the notebooks use computes the
# same numbers bit for bit (`tests/test_reference_step.py`); it only keeps each phase's result and re-runs
# just the phases a change touches.

# %%
from grpo_debug.reference_step import grpo_step
from grpo_debug.ui.notebook import show_source

show_source(grpo_step)

# %% [markdown]
# ## Baseline: mean reward on held-out prompts
#
# The task's held-out test prompts, a few samples each at the step's temperature (printed below). The
# reward is in [-1, 1], a weighted sum of components (notebook 03 opens them); the table says what each scores. The
# A: task's component `reward` scores the completion's own reward field, not the reward GRPO trains on.

# %%
import pandas as pd

from grpo_debug.evaluation import eval_side
from grpo_debug.specs import eval_sampling_of
from grpo_debug.speed import kernels

task = step.task  # prompt sets and reward functions: the bundled RookWorld task unless CAPTURE/TASK say otherwise
prompts = task.prompts("test", cfg.eval_prompts)
print(f"{len(prompts)} test prompts ({sum(p.startswith('P:') for p in prompts)} P:, "
      f"{sum(p.startswith('A:') for p in prompts)} A:), {cfg.eval_samples} samples each at temperature {cfg.temperature}")
baseline = eval_side(policy, tokenizer, prompts, eval_sampling_of(cfg), task, kernels(cfg.fast).generate)
print(f"mean reward {baseline.reward:.4f} (the weighted sum of the reward functions); below, each component's mean")
SCORES = {"best_move": "P: the best move's rank among the legal moves", "candidates": "P: the 5 moves against "
          "Stockfish's top 5", "evals": "P: the 5 evaluations against Stockfish's", "format": "the completion parses",
          "fen": "A: the position after the move", "reward": "A: the completion's reward field (0.001 legal, -1 illegal)",
          "terminated": "A: the game-over flag", "truncated": "A: the illegal-move flag"}
pd.DataFrame({"mean": baseline.components, "what it scores": {k: SCORES.get(k, "") for k in baseline.components}})

# %%
from grpo_debug.rewards import compute_rewards

shown = baseline.completions[:2 * cfg.eval_samples]  # the first two prompts' samples, each with its reward
rewards = compute_rewards(prompts[:2], shown, cfg.eval_samples, task).total
pd.DataFrame({"task": [prompts[i // cfg.eval_samples][:2] for i in range(len(shown))], "reward": rewards.tolist(),
              "completion": [c[:70] for c in shown]})

# %% [markdown]
# The reward is graded: one position's right answer, then the same answer with a middling and with the worst legal
# best move, then garbage, each scored by the task's own reward function:

# %%
from grpo_debug.chess.data import load_split, policy_example
from grpo_debug.chess.engine import PositionAnalysis
from grpo_debug.chess.rewards import score_policy

record = load_split("policy_eval")[0]
analysis, truth = PositionAnalysis.from_json(record), policy_example(record)[1]
ranked = list(analysis.evals)  # the legal moves, best first
graded = {"right answer": truth, "a middling best move": truth.rsplit(" ", 1)[0] + " " + ranked[len(ranked) // 2],
          "the worst legal best move": truth.rsplit(" ", 1)[0] + " " + ranked[-1], "garbage": "\u2603 M: ?? B:"}
graded = {name: score_policy(analysis, text).total for name, text in graded.items()}
print(", ".join(f"{name} {value:+.2f}" for name, value in graded.items()))

# %% [markdown]
# **What to notice.** A completion that parses but picks a weak move earns less than the right answer and more
# than garbage (printed above), so the samples of one prompt differ and GRPO has something to learn from. The
# model card in `data/models/rookworld-tiny/README.md` has the full floor metrics (200 + 200 prompts x 8 samples).

# %% [markdown]
# ## Summary
#
# - One GRPO step: sample G completions per prompt, score their tokens, reward them, compare each reward with its
#   group's, take the clipped loss, step the optimizer; `grpo_step` is that step in one function.
# - The bundled model starts with the mean held-out reward printed above, graded per component.
# - The glossary above fixes one meaning for each word the notebooks use.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert not any(p.requires_grad for p in reference.parameters())  # the reference is frozen
values = list(graded.values())
assert values == sorted(values, reverse=True) and values[1] < values[0] and values[-1] < values[-2], graded
print("every claim above holds")
