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
# temperature), what the ratio to $\pi_{\text{old}}$ is, and six ways a recomputation of the log-probs goes wrong,
# each measured on the same cached rollout; why TRL 1.16 as shipped is hit twice on this model.
#
# **What you need first.** Notebook 01 (the rollout, and the sampler's log-prob of each token it keeps).
#
# ## A token's log-probability, and the ratio
#
# The model reads prompt and completion in one forward pass and returns logits $z \in \mathbb{R}^V$ at every
# position; the logits at the position just before token $o_{i,t}$ score it (position $P + t - 1$ for the $t$-th
# completion token after a prompt of width $P$). At the sampling temperature $T$:
#
# $$\log \pi_\theta(o_{i,t} \mid q, o_{i,<t}) = \frac{z_{o_{i,t}}}{T} - \log \sum_{v=1}^{V} \exp\frac{z_v}{T},$$
#
# a `log_softmax` of $z / T$ read at the sampled token's index (a `gather`). The loss (notebook 05) is built on
# the **ratio** of the policy being trained to the policy that sampled:
#
# $$\rho_{i,t}(\theta) = \frac{\pi_\theta(o_{i,t} \mid q, o_{i,<t})}{\pi_{\text{old}}(o_{i,t} \mid q, o_{i,<t})}
# = \exp\big(\log \pi_\theta(o_{i,t} \mid \cdot) - \log \pi_{\text{old}}(o_{i,t} \mid \cdot)\big).$$
#
# At the start of a step $\pi_\theta$ and $\pi_{\text{old}}$ are the same weights, so a correct recomputation gives
# back the sampler's own log-probs up to float rounding, and $\rho = 1$. Below, one sample by hand in plain torch
# (the engine's version: `completion_logits` and `token_logps` in `grpo_debug/scoring.py`).

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
P, C, n = r.prompt_ids.shape[1], r.completion_ids.shape[1], int(r.completion_lengths[0])
ids = torch.cat([r.prompt_ids[i], r.completion_ids[i]])[None]
attention = torch.cat([r.prompt_mask[i], torch.ones_like(r.completion_ids[i])])[None]
positions = (attention.cumsum(-1) - 1).clamp(min=0)  # left padding: count from the first real token
step.policy.eval()  # no dropout (a pitfall below)
with torch.no_grad():
    z = step.policy(input_ids=ids, attention_mask=attention, position_ids=positions).logits[0]
logp = (z[P - 1:P + C - 1] / cfg.temperature).log_softmax(-1).gather(-1, r.completion_ids[i][:, None])[:, 0]
by_hand = logp[:n]  # the tokens up to and with the EOS
rho = torch.exp(by_hand - r.sampler_logps_temperature_only[i, :n])  # pi_theta / pi_old, pi_old's from the sampler
to_engine, to_one = (by_hand - run.logprobs.policy[i, :n]).abs().max().item(), (rho - 1).abs().max().item()
print(f"sample {i}: {n} tokens, log-probs {by_hand[0]:.3f} {by_hand[1]:.3f} ...; max |by hand - engine| "
      f"{to_engine:.1e}; ratio to the sampler's: max |rho - 1| {to_one:.1e}")

# %% [markdown]
# Each pitfall below is one field of `Scoring`, flipped on the same cached rollout (docs/notebooks.md, "Where each
# toggle comes from", says which bug report each one is from). Five break that agreement on their own; the mask
# leaves every log-prob as it is and changes which tokens the loss scores (its row's gap is at most the fixed
# step's: the same log-probs, fewer of them):
#
# | toggle | what goes wrong |
# |---|---|
# | `logprob_temperature=False` | sampled at the step's temperature, scored at T=1 |
# | `mask="drop_eos_and_pad"` | the EOS is dropped from the loss; with pad == eos a value mask drops it too |
# | `dropout=True` | the policy scored in train mode (dropout on); the reference in eval mode |
# | `position_ids=False` | left-padded rows scored at shifted positions |
# | `dtype="bfloat16"` | scored in bfloat16 autocast |
# | `gather="first_position"` | every token scored by the first completion position's distribution |
#
# The row `TRL 1.16 as shipped` is the step TRL 1.16's `GRPOTrainer` takes with a default `GRPOConfig`: the
# `trl` preset (dropout on, no position_ids, and two loss settings notebook 05 opens: loss dapo, beta 0). The `kl`
# and `loss` columns are opened in notebook 05; here read `kl` as how far the policy's log-probs are from the
# reference model's (0 where they agree) and `loss` as the step's loss. `kl` is in nats per scored token:
# k3 = exp(d) - 1 - d averaged over tokens, with d = log pi_ref - log pi. It is about d^2 / 2 for small gaps and
# grows exponentially with large ones, so a scoring pitfall that moves log-probs by nats (dropout does: its largest
# gap is printed below) shows up as a KL far above 1 (checked at the end). With beta = 0 TRL neither computes nor logs a KL; the `kl` column of
# its row is this suite's k3, shown for comparison.

# %%
from grpo_debug.config import StepConfig

base = "every fix on" if CAPTURE is None else "as captured"  # a capture's step is the run's own config
fixed_gap = run.logprobs.max_sampler_gap
print(f"{base}: max |sampler - recomputed| = {fixed_gap:.2e} nats")

# %%
from grpo_debug.ui.tables import compare_variants

SCORING_FIXED = {"logprob_temperature": True, "dropout": False, "position_ids": True, "dtype": "float32",
                 "gather": "per_position", "mask": "keep_first_eos"}
pitfalls = {base: {}, **({} if CAPTURE is None else {"every scoring fix on": SCORING_FIXED}),
            "temperature not applied": {"logprob_temperature": False},
            "dropout on": {"dropout": True}, "no position_ids": {"position_ids": False},
            "bfloat16": {"dtype": "bfloat16"}, "first-position gather": {"gather": "first_position"},
            "EOS and PAD dropped": {"mask": "drop_eos_and_pad"}, "every position": {"mask": "all_positions"},
            "TRL 1.16 as shipped": StepConfig.preset_fields("trl")}
table = compare_variants(step, pitfalls, until="loss",
                         columns=["logps/max_sampler_gap", "logps/eos_kept", "kl", "loss"])
table

# %%
from grpo_debug.ui import plots

gap = table["logps/max_sampler_gap"]
pitfall_gap = gap.drop([base, "every scoring fix on"], errors="ignore")  # the rows that turn a fix off
worst, side = pitfall_gap.idxmax(), "below" if gap[base] < plots.GAP_LINE else "above"
plots.gap_by_toggle(gap.to_dict(), title=f"{base}: max gap {gap[base]:.2g} nats, {side} the dashed 1e-4 line\n"
                    f"{(pitfall_gap > plots.GAP_LINE).sum()} of {len(pitfall_gap)} pitfall rows above it; "
                    f"largest: {worst} ({pitfall_gap[worst]:.3g} nats)")

# %%
gaps = table["logps/max_sampler_gap"].drop(base).sort_values(ascending=False)
print("largest max gap first:")
print("\n".join(f"  {name:24s} {gap:.3g}" for name, gap in gaps.items()))
at_reference = " (the policy is the reference here: 0 up to rounding)" if step.at_reference else ""
print(f"KL to the reference (k3, nats per token) with dropout on: {table.loc['dropout on', 'kl']:.3g}; "
      f"{base}: {table.loc[base, 'kl']:.3g}{at_reference}")

# %% [markdown]
# ## Which rows TRL 1.16 gets wrong, and why
#
# GPT-2 (and so RookWorld-LM-124M) adds a learned embedding of each token's absolute position. `generate()`
# counts positions from the attention mask, so a row behind k pad tokens starts at position 0. TRL 1.16
# scores completions with `input_ids` and `attention_mask` only: the model then counts from the first
# column, and every token of a padded row sits k positions later than when it was sampled. Rows without
# padding are unaffected, and so is any model with rotary positions (Llama, Qwen), which sees only
# distances between tokens. Dropout, on in TRL's default, moves every row.

# %%
import pandas as pd

r = step.result.rollout
per_row = {"task": [p[:2] for i, p in enumerate(r.prompts) for _ in range(r.num_generations)],
           "left padding": (r.prompt_mask == 0).sum(1).tolist()}
for name in ["no position_ids", "dropout on", "TRL 1.16 as shipped"]:
    lp = step.run(cfg.replace(**pitfalls[name]), until="logprobs", remember=False).logprobs  # same rollout
    per_row[name] = lp.sampler_gap.max(1).values.tolist()
rows = pd.DataFrame(per_row)
padded = rows["left padding"] > 0
print(f"{padded.sum()} of {len(rows)} rows are left-padded ({', '.join(sorted(set(rows.task[padded])))} prompts)")
print(f"no position_ids: padded rows {rows['no position_ids'][padded].min():.3g} to {rows['no position_ids'][padded].max():.3g} "
      f"nats, unpadded rows at most {rows['no position_ids'][~padded].max():.2g}")
print(f"TRL 1.16 as shipped: padded rows {rows['TRL 1.16 as shipped'][padded].min():.3g} to "
      f"{rows['TRL 1.16 as shipped'][padded].max():.3g}, unpadded rows {rows['TRL 1.16 as shipped'][~padded].min():.3g} to "
      f"{rows['TRL 1.16 as shipped'][~padded].max():.3g} (dropout alone)")
rows.groupby(["task", "left padding"]).max().round(4)

# %%
run = step.run(cfg.replace(position_ids=False), until="logprobs", remember=False)
row_gap = pd.Series(run.logprobs.sampler_gap.max(1).values.numpy())  # each row's largest gap, as drawn
plots.logprob_gap_heatmap(run.logprobs, "no position_ids: largest |sampler - recomputed| log-prob gap\n" + ", ".join(
    f"{row_gap[rows].max():.3g} nats on the {rows.sum()} {name} rows"
    for name, rows in {"left-padded": padded, "unpadded": ~padded}.items() if rows.any()))

# %% [markdown]
# The fix outside this notebook: `grpo_debug.capture.trl_bridge.PositionIdsGRPOTrainer` is a drop-in `GRPOTrainer`
# that passes `position_ids` from the attention mask on every scoring pass (tested on a real TRL step).
#
# ## The EOS when pad == eos
#
# GPT-2's tokenizer has no pad token, and TRL's `GRPOTrainer` then sets `pad_token = eos_token`. The bundled
# tokenizer has its own `<pad>` (notebook 00 prints `pad == eos: False`); the step simulates GPT-2's case with
# `pad_with_eos=True`, its default. A mask built from token values (`ids != pad`) cannot tell the real EOS
# from padding and drops it: the model is never rewarded for stopping. TRL keeps the first EOS and masks
# what follows, from the lengths.

# %%
from grpo_debug.logprobs import completion_mask

print("pad == eos in this rollout:", r.pad_token_id == r.eos_token_id)
i = int(r.finished.nonzero()[0]) if r.finished.any() else 0  # the first completion that ended with an EOS
end = int(r.completion_lengths[i])
ids = r.completion_ids[i, end - 3:end + 2].tolist()
pd.DataFrame({mode: completion_mask(r, mode)[i, end - 3:end + 2].tolist()
              for mode in ["keep_first_eos", "drop_eos_and_pad", "all_positions"]},
             index=[f"{t}{' (EOS)' if t == r.eos_token_id else ''}" for t in ids]).T

# %% [markdown]
# **What to notice.** With every fix on, the gap is float rounding. The ranking above shows which pitfall
# moves a log-prob most; the KL at step 0 shows what dropout does to the loss: the reference is scored
# without dropout (as TRL does), so policy and reference disagree before any update, as in a public
# RookWorld debug log where one completion scored -440 under the policy and -45 under the reference.
# bfloat16 is small per token but not zero. TRL 1.16 as shipped is hit twice: by dropout on every row,
# and by positions on every left-padded row.

# %% [markdown]
# ## Summary
#
# - $\log \pi_\theta(o_{i,t})$ is the `log_softmax` of the logits one position earlier, divided by $T$, read at the token.
# - The ratio $\rho = \exp(\log \pi_\theta - \log \pi_{\text{old}})$ is exactly 1 where the recomputation is right.
# - Five pitfalls break the recomputation, the mask changes what is scored; dropout and positions move nats.
# - TRL 1.16 as shipped is hit by dropout on every row and by positions on every left-padded row.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # measured on the bundled step
    assert to_engine < 1e-4 and to_one < 1e-4  # the token log-probs by hand: the engine's, and ratio 1
    assert fixed_gap < 1e-4  # "with every fix on, the gap is float rounding"
    for name in ["temperature not applied", "dropout on", "no position_ids", "bfloat16", "first-position gather"]:
        assert table.loc[name, "logps/max_sampler_gap"] > 1e-2, name
    assert table.loc["bfloat16", "logps/max_sampler_gap"] < 1.0  # small per token, but not zero
    assert table.loc[base, "logps/eos_kept"] == 1.0 and table.loc["EOS and PAD dropped", "logps/eos_kept"] == 0.0
    assert table.loc["EOS and PAD dropped", "logps/max_sampler_gap"] <= fixed_gap, "the mask moved a log-prob"
    assert table.loc["dropout on", "kl"] > 1.0  # "a KL far above 1"
    assert abs(table.loc[base, "kl"]) < 1e-4  # "0 up to rounding": the policy is the reference at step 0
    assert rows["no position_ids"][padded].min() > 1.0 and rows["no position_ids"][~padded].max() < 1e-4
print("every claim above holds")
