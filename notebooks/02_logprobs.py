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
# # 02 · Log-probs: six ways to get them wrong
#
# **What you will learn.** How a token's log-probability comes out of the logits (the shift by one position, the
# temperature), the ratio to $\pi_{\text{old}}$, and six ways its recomputation goes wrong, measured on one cached
# rollout.
#
# **What you need first.** Notebook 01 (the rollout, and the sampler's log-probs).
#
# ## A token's log-probability, and the ratio
#
# The logits $z \in \mathbb{R}^V$ at the position just before token $o_{i,t}$ score it. At the sampling
# temperature $T$:
#
# $$\log \pi_\theta(o_{i,t} \mid q, o_{i,<t}) = \frac{z_{o_{i,t}}}{T} - \log \sum_{v=1}^{V} \exp\frac{z_v}{T},$$
#
# a `log_softmax` of $z / T$ read at the token's index (a `gather`). The loss (05) uses the **ratio**
# $\rho_{i,t} = \exp\big(\log \pi_\theta(o_{i,t} \mid \cdot) - \log \pi_{\text{old}}(o_{i,t} \mid \cdot)\big)$.
# At the start of a step $\pi_\theta$ and $\pi_{\text{old}}$ are the same weights: a correct recomputation gives
# back the sampler's log-probs up to float rounding, and $\rho = 1$. One sample by hand (the engine's:
# `token_logps` in `grpo_debug/scoring.py`), against `sampler_logps_temperature_only`: the sampler's log-prob at
# $T$ only, before top_p/top_k, what a recomputation can match (01's `sampler_logps` here: top_p = 1, top_k = 0).

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

run = step.run(cfg, until="logprobs")
r, i = run.rollout, 0  # sample 0, by hand
P, C, n = r.prompt_ids.shape[1], r.completion_ids.shape[1], int(r.completion_lengths[i])
ids = torch.cat([r.prompt_ids[i], r.completion_ids[i]])[None]
attention = torch.cat([r.prompt_mask[i], torch.ones_like(r.completion_ids[i])])[None]
positions = (attention.cumsum(-1) - 1).clamp(min=0)  # left padding: count from the first real token
step.policy.eval()  # no dropout (a pitfall below)
with torch.no_grad():
    z = step.policy(input_ids=ids, attention_mask=attention, position_ids=positions).logits[0]
logp = (z[P - 1:P + C - 1] / cfg.temperature).log_softmax(-1).gather(-1, r.completion_ids[i][:, None])[:n, 0]
rho = torch.exp(logp - r.sampler_logps_temperature_only[i, :n])  # pi_theta / pi_old, pi_old's from the sampler
to_engine, to_one = (logp - run.logprobs.policy[i, :n]).abs().max().item(), (rho - 1).abs().max().item()
print(f"sample {i}: {n} tokens; max |by hand - engine| {to_engine:.1e}; max |rho - 1| {to_one:.1e}")

# %% [markdown]
# Each pitfall below flips one field of `Scoring` on the same cached rollout (its bug report: docs/notebooks.md).
# Five move the log-probs; the mask changes which tokens are scored:
#
# | toggle | what goes wrong |
# |---|---|
# | `logprob_temperature=False` | sampled at temperature $T$, scored at $T = 1$ |
# | `mask="drop_eos_and_pad"` | a mask built from token values drops the EOS (pad == eos) |
# | `dropout=True` | the policy scored with dropout on; the reference without |
# | `position_ids=False` | left-padded rows scored at shifted positions |
# | `dtype="bfloat16"` | scored in bfloat16 autocast |
# | `gather="first_position"` | every token scored at the first completion position |
#
# `TRL 1.16 as shipped` is TRL 1.16's `GRPOTrainer` under a default `GRPOConfig` (dropout on, no position_ids).
# The columns: `logps/max_sampler_gap`, **the gap**: the largest |sampler's log-prob − recomputed log-prob| over the
# batch's scored tokens, in nats; `logps/eos_kept`, the share of finished completions whose EOS the mask keeps;
# `kl`, the policy's distance from the reference model, in nats per token (k3, 05): 0 where they agree.

# %%
from grpo_debug.config import StepConfig
from grpo_debug.ui.tables import compare_variants

base = "every fix on" if CAPTURE is None else "as captured"  # a capture's step is the run's own config
SCORING_FIXED = {k: getattr(StepConfig(), k) for k in ["logprob_temperature", "dropout", "position_ids", "dtype",
                                                       "gather", "mask"]}  # the defaults: every fix on
pitfalls = {base: {}, **({} if CAPTURE is None else {"every scoring fix on": SCORING_FIXED}),
            "temperature not applied": {"logprob_temperature": False}, "dropout on": {"dropout": True},
            "no position_ids": {"position_ids": False}, "bfloat16": {"dtype": "bfloat16"},
            "first-position gather": {"gather": "first_position"}, "EOS and PAD dropped": {"mask": "drop_eos_and_pad"},
            "TRL 1.16 as shipped": StepConfig.preset_fields("trl")}
table = compare_variants(step, pitfalls, until="loss", columns=["logps/max_sampler_gap", "logps/eos_kept", "kl"])
table

# %%
from grpo_debug.ui import plots

plots.gaps_ranked(table["logps/max_sampler_gap"].to_dict(), base)

# %% [markdown]
# **What to notice.** With every fix on, the gap is float rounding. Dropout gives a KL far above 1 before any
# update (the reference is scored without dropout, as in TRL), larger even than its largest gap: k3 of a
# token's $d = \log \pi_{\text{ref}} - \log \pi_\theta$ is $e^d - d - 1$, about $d^2/2$ for a small $d$ but
# exponential in $d$. bfloat16 is small per token but not zero. Which rows TRL 1.16 gets wrong, and why:
# `02b_trl_rows`.
#
# ## The EOS when pad == eos
#
# GPT-2's tokenizer has no pad token, so TRL sets `pad_token = eos_token`; so does the step
# (`pad_with_eos=True`). A mask built from token values (`ids != pad`) then drops the real EOS too:
# the model is never rewarded for stopping. TRL keeps the first EOS and masks what follows, from the lengths.

# %%
import pandas as pd

from grpo_debug.logprobs import completion_mask

i = int(r.finished.nonzero()[0]) if r.finished.any() else 0  # the first completion that ended with an EOS
end = int(r.completion_lengths[i])
ids = r.completion_ids[i, end - 3:end + 2].tolist()
pd.DataFrame({mode: completion_mask(r, mode)[i, end - 3:end + 2].tolist()
              for mode in ["keep_first_eos", "drop_eos_and_pad", "all_positions"]},
             index=[f"{t}{' (EOS)' if t == r.eos_token_id else ''}" for t in ids]).T

# %% [markdown]
# ## Summary
#
# - $\log \pi_\theta(o_{i,t})$ is the `log_softmax` of the logits one position earlier, divided by $T$, read at the token.
# - The ratio $\rho = \exp(\log \pi_\theta - \log \pi_{\text{old}})$ is 1 where the recomputation is right.
# - Five pitfalls move the log-probs, dropout and positions by nats (both in TRL 1.16 as shipped; which rows:
#   02b); the mask changes what is scored.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # measured on the bundled step
    fixed_gap = table.loc[base, "logps/max_sampler_gap"]
    assert to_engine < 1e-4 and to_one < 1e-4, "the log-probs by hand are not the engine's, or the ratio is not 1"
    assert fixed_gap < 1e-4, "with every fix on, the gap is not float rounding"
    for name in ["temperature not applied", "dropout on", "no position_ids", "bfloat16", "first-position gather"]:
        assert table.loc[name, "logps/max_sampler_gap"] > 1e-2, f"{name} does not move the log-probs"
    assert table.loc["bfloat16", "logps/max_sampler_gap"] < 1.0, "bfloat16 is not small per token"
    assert table.loc[base, "logps/eos_kept"] == 1.0, "with every fix on, an EOS is masked"
    assert table.loc["EOS and PAD dropped", "logps/eos_kept"] == 0.0, "the value mask kept an EOS"
    assert table.loc["EOS and PAD dropped", "logps/max_sampler_gap"] <= fixed_gap, "the mask moved a log-prob"
    assert table.loc["dropout on", "kl"] > 1.0, "dropout's KL is not far above 1"
    assert abs(table.loc[base, "kl"]) < 1e-4, "the KL with every fix on is not 0: the policy is the reference"
    dropout_gap = table.loc["dropout on", "logps/max_sampler_gap"]
    assert table.loc["dropout on", "kl"] > dropout_gap, "dropout's KL per token is not above its largest gap"
    assert table.loc["TRL 1.16 as shipped", "logps/max_sampler_gap"] > 1.0, "TRL 1.16 as shipped is not off by nats"
    assert r.pad_token_id == r.eos_token_id, "pad != eos in the bundled rollout"
    assert cfg.top_p == 1 and cfg.top_k == 0 and torch.equal(r.sampler_logps, r.sampler_logps_temperature_only), \
        "top_p = 1 and top_k = 0, yet the temperature-only log-probs are not 01's sampler_logps"
print("every claim above holds")
