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
# **What you will learn.** One GRPO step, phase by phase, and which notebook opens each; the step as one function;
# the model, its two chess tasks and its reward before training; the glossary.
#
# **What you need first.** PyTorch, and the policy gradient of REINFORCE: for a policy $\pi_\theta$ and a
# reward $r$, $\nabla_\theta\, \mathbb{E}_{o \sim \pi_\theta}[r(o)] = \mathbb{E}_{o \sim \pi_\theta}[r(o)\,
# \nabla_\theta \log \pi_\theta(o)]$. Nothing of GRPO.
#
# **GRPO** (Group Relative Policy Optimization, DeepSeekMath 2024) trains a language model from rewards without a
# value network: it raises the log-probability of the completions rewarded above their group's mean and lowers
# those below. One step, each phase with its notebook:
#
# ```
# for each prompt q: o_1 .. o_G = sample(pi_old, q)       # 01 rollout: a group of G completions
# logp[i,t] = log pi_theta(o_i,t | q, o_i,<t)             # 02 log-probs, and log pi_ref the same way
# r[i] = sum_k w_k * f_k(q, o_i)                          # 03 rewards: the reward functions, weighted
# A[i] = (r[i] - mean(r of its group)) / (std(r of its group) + delta)   # 04 advantages
# rho[i,t] = exp(logp[i,t] - logp_old[i,t])               # 05 loss: the ratio, clipped, plus beta KL
# loss = normalise(-min(rho A, clip(rho, 1-eps, 1+eps) A) + beta KL)
# loss.backward(); adamw.step()                           # 06 update; then the held-out reward
# ```
#
# **Words used on the path**, one meaning each:
#
# | word | meaning here |
# |---|---|
# | group | the G completions of one prompt; advantages compare within it |
# | $\pi_\theta$, the policy | the model being trained |
# | $\pi_{\text{old}}$ (pi_old) | the policy that sampled the rollout; the ratio $\rho = \pi_\theta / \pi_{\text{old}}$ compares the two (02, 05) |
# | reference, $\pi_{\text{ref}}$ | a frozen copy of the starting model, fixed for the run; the KL term pulls towards it (05). Not $\pi_{\text{old}}$ |
# | normaliser | what the summed token losses are divided by: `loss_type` grpo, bnpo, dr_grpo or dapo (05) |
# | zero-std group | a group whose rewards are all equal: every advantage 0, no signal (04) |
# | phantom advantage | a full-size advantage from rewards that differ by almost nothing: a tiny std divides (04) |
# | unfinished | a completion that hit `max_new_tokens` before its EOS (01); TRL calls it truncated |
# | truncated | only the A: task's fourth field: RookWorld's illegal-move flag |
# | fixed, every fix on | the default step (`StepConfig()`): every log-prob pitfall of 02 fixed; TRL's advantages, with no std floor (04), and plain k3 KL, whose gradient is biased (05) |
#
# **Symbols**, one per quantity, with TRL's name where it has one:
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
# | $\beta_1$, $\beta_2$, $\epsilon_{\text{Adam}}$ | AdamW's two moment decays and its denominator's offset (not $\beta$, $\epsilon$) | `adam_beta1`, `adam_beta2`, `adam_epsilon` |

# %%
from grpo_debug.ui.notebook import open_step, show_source

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK)

# %% [markdown]
# ## The whole step in one function
#
# The pseudocode as the library runs it. The notebooks' `step` computes the same numbers bit for bit
# (`tests/test_reference_step.py`) and re-runs only the phases a change touches.

# %%
from grpo_debug.reference_step import grpo_step

show_source(grpo_step)

# %%
from grpo_debug.model import dropout_sources

policy, reference, tokenizer = step.loaded.policy, step.loaded.reference, step.loaded.tokenizer
print(f"{type(policy).__name__}: {sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters, vocab "
      f"{policy.config.vocab_size}, pad == eos: {tokenizer.pad_token_id == tokenizer.eos_token_id}")
print("dropout in train mode:", ", ".join(dropout_sources(policy)) or "none")

# %% [markdown]
# The two RookWorld tasks (prompt`|`right completion): a policy (P:) prompt asks for the top-5 moves, their
# evaluations and the best move; an environment (A:) prompt for the position after a move, its reward, whether
# the game ended (terminated) and the move was illegal (truncated).

# %%
from grpo_debug.chess.data import env_example, load_split, policy_example

examples = [policy_example(load_split("policy_eval")[0]), env_example(load_split("env_eval")[0])]
if CAPTURE is not None:  # your run's first prompt and completion instead
    examples = [(step.result.rollout.prompts[0], step.result.rollout.completions[0])]
print("\n".join(prompt + "|" + truth for prompt, truth in examples))

# %% [markdown]
# ## Baseline: mean reward on held-out prompts
#
# The chess reward, in [-1, 1], weights its components (03); the A: component `reward` scores the completion's
# reward field, not GRPO's reward.

# %%
from grpo_debug.evaluation import eval_side
from grpo_debug.specs import eval_sampling_of
from grpo_debug.speed import kernels
from grpo_debug.ui.tables import component_means

prompts = step.task.prompts("test", cfg.eval_prompts)  # the bundled RookWorld task unless CAPTURE/TASK say otherwise
baseline = eval_side(policy, tokenizer, prompts, eval_sampling_of(cfg), step.task, kernels(cfg.fast).generate)
print(f"{len(prompts)} prompts x {cfg.eval_samples} samples, T = {cfg.temperature}: mean reward {baseline.reward:.4f}")
component_means(baseline.components)

# %% [markdown]
# ## Summary
#
# - One GRPO step (`grpo_step`): sample groups, reward, compare within each group, clipped loss, optimizer step.
# - The baseline: the held-out reward before training.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
from grpo_debug.advantages import TRL_EPS
from grpo_debug.rewards import compute_rewards

assert not any(p.requires_grad for p in reference.parameters()), "the reference is not frozen"
assert TRL_EPS == 1e-4, "the Symbols table's delta is not the offset the advantage adds to its group's std"
if CAPTURE is None:  # the chess reward of every baseline sample in [-1, 1]
    totals = compute_rewards(prompts, baseline.completions, eval_sampling_of(cfg).num_generations, step.task).total
    assert totals.abs().max() <= 1, f"a baseline reward outside [-1, 1]: {totals.abs().max():.4f}"
print("every claim above holds")
