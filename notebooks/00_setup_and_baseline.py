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
# **GRPO in one paragraph.** Group Relative Policy Optimization (DeepSeekMath, 2024) trains a language model from
# rewards without a value network. For each prompt it samples a group of G completions and scores each with reward
# functions; a completion's advantage is its reward minus its group's mean (divided by the group's spread), and
# every token of it shares that advantage. The loss raises the log-probability of the tokens of completions that
# beat their group and lowers it for those below, through PPO's clipped probability ratio, which keeps the updated
# policy near the one that sampled; an optional KL term (`beta`) keeps it near a frozen reference model. One step:
# sample, score the log-probabilities, reward, advantage, loss, update.
#
# One GRPO step on a RookWorld chess model, phase by phase. This notebook loads the model and measures
# where it starts: its mean reward on held-out prompts it never saw in training, per reward component.
# Every notebook opens its step the same way (`open_step`): on the bundled model, on a model of yours
# (`MODEL`), or on a step captured from your own TRL run (`CAPTURE`); none relies on state from another.

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
# The two RookWorld tasks, as the model sees them. A policy (P:) prompt asks for the top-5 moves, their
# evaluations and the best move; an environment (A:) prompt asks for the position after a move, the
# reward, and whether the game ended (terminated) or the move was illegal (truncated).

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
# function to keep open beside them: each line is one phase, its comment naming the notebook that opens it,
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
# reward is in [-1, 1]; its components are documented in `grpo_debug/chess/rewards.py`.

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
pd.Series(baseline.components, name="mean").rename(lambda name: f"component: {name}").to_frame()

# %%
rows = [{"task": prompts[i // cfg.eval_samples][:2], "completion": c[:70]} for i, c in enumerate(baseline.completions)]
pd.DataFrame(rows).head(8)

# %% [markdown]
# **What to notice.** The reward is graded: a completion that parses but picks a weak move still earns
# more than garbage, so groups of samples differ and GRPO has something to learn from. The model card in
# `data/models/rookworld-tiny/README.md` has the full floor metrics (200 + 200 prompts x 8 samples).

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert not any(p.requires_grad for p in reference.parameters())  # the reference is frozen
print("every claim above holds")
