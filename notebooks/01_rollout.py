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
# # 01 · Generation: B prompts x G samples
#
# **What you will learn.** What a group is and what the rollout keeps of each sample; why the prompts are
# left-padded; why a group of identical completions teaches nothing.
#
# **What you need first.** Notebook 00.
#
# ## The group
#
# For each of the B prompts $q$, the policy as it is now, $\pi_{\text{old}}$, samples a **group** of $G$
# completions at temperature $T$ (and `top_p`), each until an EOS or `max_new_tokens`:
#
# $$o_1, \dots, o_G \sim \pi_{\text{old}}(\cdot \mid q), \qquad
# \pi_{\text{old}}(o_i \mid q) = \prod_{t=1}^{|o_i|} \pi_{\text{old}}(o_{i,t} \mid q, o_{i,<t}).$$
#
# The rollout keeps each sample's tokens (the EOS included), its length $|o_i|$, whether it ended with an EOS, and
# the sampler's log-probability of each token (02 recomputes it). Rows $bG$ to $bG + G - 1$ are group $b$. One
# `generate` call on the prompts repeated G times (left padding, KV cache, eval mode, seeded) samples them all:
# `sample` in `grpo_debug/rollout.py` (its time: 08b).

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

r = step.run(cfg, until="rollout").rollout
B, G, C = len(r.prompts), r.num_generations, r.completion_ids.shape[1]
print(f"{r.num_samples} samples = {B} prompts x {G}; prompt width {r.prompt_ids.shape[1]} tokens, completion width {C}")
kept = torch.arange(C) < r.completion_lengths[:, None]  # the tokens up to and with the EOS
seq_logp = (r.sampler_logps * kept).sum(1)  # log pi_old(o_i | q): the sum of its tokens' log-probs
print(f"group 0: lengths {r.completion_lengths[:G].tolist()}, log pi_old(o_i | q) "
      + " ".join(f"{v:.1f}" for v in seq_logp[:G].tolist()))

# %%
from grpo_debug.ui.tables import rollout_table

rollout_table(r, groups=2, per_group=4)  # the first 4 samples of groups 0 and 1, each cut to 80 characters

# %% [markdown]
# An A: completion in full (the table cuts its fields off):

# %%
env_rows = [i for i in range(r.num_samples) if r.prompts[i // G].startswith("A:")]
print(r.prompts[env_rows[0] // G] + "|" + r.completions[env_rows[0]] if env_rows else "no A: prompt in this batch")

# %%
padding = (r.prompt_mask == 0).sum(1)[::G]  # pad tokens in front of each prompt
print("left padding per prompt:", ", ".join(f"{q[:2]} {n}" for q, n in zip(r.prompts, padding.tolist())))
print(f"unfinished (no EOS within max_new_tokens={cfg.max_new_tokens}): {int((~r.finished).sum())} of {r.num_samples}")
print("groups whose G completions are identical:", r.identical_groups)

# %% [markdown]
# **What to notice.** Every prompt shorter than the longest is left-padded: the P: prompts by many tokens, the A:
# prompts by a few or none; 02 shows what a forward pass that ignores it gets wrong. An identical group has zero
# reward std: no signal (04).

# %% [markdown]
# ## Summary
#
# - A group: G completions of one prompt from $\pi_{\text{old}}$; the batch holds B groups, prompt by prompt.
# - A sample keeps its tokens, length, EOS or not, and each token's sampler log-prob.
# - Prompts are left-padded to the longest; an identical group carries no signal.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed. nbval runs every notebook in CI, so a sentence that stops being true fails
# here instead of going stale. (An identity a cell demonstrates, such as "bit for bit", stays in that cell: it is
# part of the lesson.)

# %%
assert torch.equal(r.completion_ids.view(B, G, C)[-1], r.completion_ids[-G:]), "the last group is not the last G rows"
assert r.finished.all() or r.completion_lengths.max() == cfg.max_new_tokens
assert (padding == r.prompt_ids.shape[1] - r.prompt_mask.sum(1)[::G]).all()
if CAPTURE is None:  # the bundled step's mixed task: A: prompts are longer than P: prompts
    assert padding.min() == 0  # the longest prompt sets the width
    task_of = [q[:2] for q in r.prompts]
    p_pad = [n for t, n in zip(task_of, padding.tolist()) if t == "P:"]
    a_pad = [n for t, n in zip(task_of, padding.tolist()) if t == "A:"]
    assert min(p_pad) > max(a_pad) and min(a_pad) < max(a_pad), "P: padded by more than A:, A: by a few or none"
print("every claim above holds")
