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
# # 00 · Set-up and baseline evaluation
#
# One GRPO step on a RookWorld chess model, phase by phase. This notebook loads the model and measures
# where it starts: its mean reward on held-out prompts it never saw in training, per reward component.
# Every later notebook starts from a `StepConfig` like this one; none relies on state from another.

# %%
from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None

# %%
from grpo_debug import load_model
from grpo_debug.paths import DEFAULT_MODEL

policy, reference, tokenizer = load_model(MODEL or DEFAULT_MODEL)
n_params = sum(p.numel() for p in policy.parameters())
print(f"{type(policy).__name__}: {n_params / 1e6:.2f}M parameters, {policy.config.n_layer} layers, "
      f"vocab {policy.config.vocab_size}, dropout {policy.config.resid_pdrop}")
print("pad == eos:", tokenizer.pad_token_id == tokenizer.eos_token_id)
assert not any(p.requires_grad for p in reference.parameters())

# %% [markdown]
# The two RookWorld tasks, as the model sees them. A policy (P:) prompt asks for the top-5 moves, their
# evaluations and the best move; an environment (A:) prompt asks for the position after a move, the
# reward, and whether the game ended (terminated) or the move was illegal (truncated).

# %%
from grpo_debug.chess.data import env_example, load_split, policy_example

for prompt, truth in [policy_example(load_split("policy_eval")[0]), env_example(load_split("env_eval")[0])]:
    print(prompt + "|" + truth)

# %% [markdown]
# ## Baseline: mean reward on held-out prompts
#
# The task's held-out test prompts, a few samples each at the step's temperature (printed below). The
# reward is in [-1, 1]; its components are documented in `grpo_debug/chess/rewards.py`.

# %%
import pandas as pd
from grpo_debug.config import StepConfig
from grpo_debug.evaluation import eval_side
from grpo_debug.task import load_task

cfg = StepConfig(model=MODEL or DEFAULT_MODEL)
task = load_task(cfg.task)  # the bundled RookWorld task: prompt sets and reward functions
prompts = task.prompts("test", cfg.eval_prompts)
print(f"{len(prompts)} test prompts ({sum(p.startswith('P:') for p in prompts)} P:, "
      f"{sum(p.startswith('A:') for p in prompts)} A:), {cfg.eval_samples} samples each at temperature {cfg.temperature}")
baseline = eval_side(policy, tokenizer, prompts, cfg, task)
print(f"mean reward {baseline.reward:.4f}")
pd.Series(baseline.components, name="mean").to_frame()

# %%
rows = [{"task": prompts[i // cfg.eval_samples][:2], "completion": c[:70]} for i, c in enumerate(baseline.completions)]
pd.DataFrame(rows).head(8)

# %% [markdown]
# **What to notice.** The reward is graded: a completion that parses but picks a weak move still earns
# more than garbage, so groups of samples differ and GRPO has something to learn from. The model card in
# `data/models/rookworld-tiny/README.md` has the full floor metrics (200 + 200 prompts x 8 samples).
