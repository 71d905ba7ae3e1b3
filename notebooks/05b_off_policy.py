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
# # 05b · Off-policy: ratios, clipping and importance sampling
#
# **What you will learn.** What changes once the policy has moved away from the weights that sampled its
# completions: the ratio pi / pi_old, clipping and which tokens it silences, what each of TRL's loss types
# sends to a token, how micro-batches are normalised, GSPO's one ratio per sequence, TRL's correction for the
# sampler/trainer gap, the high-entropy token mask, and the floor that numerics alone put under all of it.
#
# **What you need first.** Notebooks 02 (log-probs, and what dropout and position_ids do to them), 04
# (advantages), 05 (the loss at ratio 1) and 06 (the AdamW step that the second pass starts from).
#
# Notebook 05 took the loss at the weights that scored the rollout: pi / pi_old is exactly 1 there, so
# `epsilon_low` and `epsilon_high` do nothing and every `clip_ratio/*` TRL logs is 0. That is the most asked
# GRPO question ("clip_ratio is always 0", TRL issues #3120 and #3757), and the answer is
# `num_iterations = 1`: with one optimizer step per generation, the policy never leaves the weights that
# sampled. This notebook takes the other regime on the same cached rollout:
#
# - **mu > 1** (`num_iterations`): after the first update the same completions are re-scored and the
#   loss is taken again; pi_old is the rollout-time scoring, so the ratio leaves 1 and clipping bites.
# - **micro-batches** (`steps_per_generation`, `gradient_accumulation_steps`): the B*G samples split into
#   micro-batches, each normalised as TRL 1.16 normalises it.
# - **every loss TRL 1.16 offers**: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo; GSPO's
#   sequence-level ratio; `delta`; the top-entropy token mask.
# - **the sampler/trainer mismatch**: the completions were drawn from the sampler's distribution, and the
#   loss is an average under the trainer's; weighting each token by the ratio of its two probabilities turns
#   one into the other. That reweighting is *importance sampling*, and TRL applies it to vLLM's log-probs;
#   here the rollout's own sampler log-probs stand in for vLLM's.
# - **the null step**: learning rate 0 and mu = 2, the floor that numerics alone put under all of this.
#
# Every formula here is checked against TRL 1.16's `_compute_loss` on identical tensors in
# `tests/test_offpolicy_parity.py` (values and gradients within 1e-6, every loss type and option).

# %%
from grpo_debug.ui.notebook import open_step, show_source

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK, num_prompts=4, num_generations=8, per_sample_grad_norms=False)

# %%
import pandas as pd
import torch

one = step.run(cfg, until="update")  # mu = 1
two = step.run(cfg.replace(num_iterations=2), until="update", base=one, remember=False)  # same rollout, mu = 2
keys = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/high_max", "kl",
        "entropy"]
passes = {"mu = 1, pass 1": one.update.iterations[0], "mu = 2, pass 1": two.update.iterations[0],
          "mu = 2, pass 2": two.update.iterations[1]}
passes_table = pd.DataFrame({name: {**{k: it.metrics.get(k, float("nan")) for k in keys}, "grad_norm": it.grad_norms[0]}
                             for name, it in passes.items()}).T
passes_table

# %% [markdown]
# Where the step's weights are the ones that scored the completions (the bundled step; a capture's first
# optimizer step of a generation with dropout off), the first pass of either run is on-policy: no clipped
# token (the checks below say which this step is). The second pass of mu = 2 is taken after
# one AdamW step at `learning_rate` 1e-4, and a share of its tokens lie outside [1 - eps, 1 + eps] with an
# advantage that pushes them further: those tokens get no gradient. The KL to the reference (here still
# the weights that sampled) jumps from 0 and the gradient norm grows: k3 = exp(d) - d - 1 grows
# exponentially in the log-probs a step pushed down.

# %%
from grpo_debug.digits import significant  # pass 2's numbers follow an update: 3 digits hold on every CPU

it1, it2 = two.update.iterations
print(f"pass 2: {it2.metrics['clip_ratio/region_mean']:.4f} of the scored tokens clipped; "
      f"the ratio spans {it2.ratio[it2.trained.bool()].min().item():.3f} to {it2.ratio[it2.trained.bool()].max().item():.3f}; "
      f"kl {significant(it1.metrics['kl'])} -> {significant(it2.metrics['kl'])}; "
      f"grad_norm {significant(it1.grad_norms[0])} -> {significant(it2.grad_norms[0])}")

# %% [markdown]
# ## The ratio, per pass
#
# The importance weight of the token-level losses is w = pi / pi_old per token. The clipped objective is
# `-min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)`: for A > 0 it stops rewarding w above 1 + eps_high,
# for A < 0 it stops punishing w below 1 - eps_low; there the gradient is 0.

# %%
from grpo_debug.loss import importance_weight, policy_term

show_source(importance_weight)

# %%
show_source(policy_term)

# %%
from grpo_debug.ui import plots

scored = two.logprobs.mask.bool()
plots.ratio_histograms({"pass 1": it1.ratio[scored], "pass 2": it2.ratio[scored]}, cfg.epsilon_low, cfg.epsilon_high)

# %% [markdown]
# Which tokens are clipped, in the completion text (between « and »): the completions of pass 2 with the
# most clipped tokens.

# %%
from grpo_debug.ui.tables import marked_completions

most = it2.clipped.sum(1).argsort(descending=True)[:4].tolist()
marked_completions(two, it2.clipped, step.loaded.tokenizer, most)

# %% [markdown]
# ## What each loss type sends to a token
#
# The gradient d loss / d logp that one token receives, as a function of its ratio, for a positive and a
# negative advantage (one-token sequences, the normalisation undone). `cispo` is shown with TRL's
# recommended cap `epsilon_high = 5.0`; at the default 0.2 it scales every token by 0.2.

# %%
from grpo_debug.show.loss_gradients import token_gradient_curves

ratios = torch.logspace(-0.5, 0.5, 201)
curves = token_gradient_curves(["grpo", "sapo", "vespo"], ratios, epsilon_low=0.2, epsilon_high=0.2)
curves.update({"cispo": token_gradient_curves(["cispo"], ratios, epsilon_high=5.0)["cispo"]})
curves.update({"grpo, delta=1.5": token_gradient_curves(["grpo"], ratios, delta=1.5)["grpo"]})
plots.gradient_by_ratio(curves, ratios.numpy(), 0.2, 0.2)

# %%
at = {r: int(torch.argmin((ratios - r).abs())) for r in (0.5, 1.0, 1.5, 2.5)}
pd.DataFrame({f"{name}, {sign}": {f"ratio {r}": curves[name][sign][i] for r, i in at.items()}
              for name in curves for sign in curves[name]}).T.round(4)

# %% [markdown]
# What to notice: the clipped objective (grpo, bnpo, dr_grpo, dapo and luspo share it) is flat at 0 past
# 1 + eps for A > 0 and below 1 - eps for A < 0, and otherwise sends -w A, so a token whose ratio grew
# with a negative advantage is pushed down harder and harder; `delta` cuts that off above delta. `cispo`
# never zeroes a gradient: it sends -min(w, eps_high) A. `sapo` replaces the hard clip by a sigmoid gate:
# no cliff, a gradient that grows more slowly than w. `vespo` weights the whole sequence by a gamma-shaped
# phi(w) = exp(lambda + k log w - lambda w), 1 at w = 1, largest at w = k / lambda (2/3 for A >= 0 and 1.5
# for A < 0 with TRL's defaults), and falling towards 0 on both sides.

# %% [markdown]
# ## Micro-batches and their normalisers
#
# With `steps_per_generation = S` the N = B*G samples split into S micro-batches, and every
# `gradient_accumulation_steps = GA` of them make one optimizer step. Each loss type divides a micro-batch's
# token sum by its own normaliser: `bnpo` by the micro-batch's tokens, `dapo` by M x GA / S (M: tokens in
# the whole generation batch, TRL's `num_items_in_batch`; TRL PR #6024 fixed this scaling), `dr_grpo` by
# rows x `max_completion_length`, then all but dapo, cispo and vespo by GA.

# %%
from grpo_debug.loss import compute_loss, loss_weights

lp, adv = two.logprobs, two.advantages.values
M = lp.mask.sum()
chunks = lambda S: torch.arange(len(adv)).chunk(S)

def normalisers(loss_type, S):
    """What each of the S micro-batches divides its token sum by (GA = S): 1 / the weight of a scored token."""
    return [round(1 / loss_weights(lp.mask[rows], loss_type, cfg.max_new_tokens, num_items_in_batch=M,
                                   gradient_accumulation_steps=S, steps_per_generation=S)[lp.mask[rows].bool()][0].item())
            for rows in chunks(S)]

def accumulated_loss(loss_type, S):
    """One optimizer step's loss over S micro-batches (GA = S), on pass 2's log-probs (ratio != 1)."""
    return sum(compute_loss(it2.logps[rows], lp.policy[rows], None, adv[rows], lp.mask[rows], loss_type=loss_type, beta=0.0,
                            num_items_in_batch=M, gradient_accumulation_steps=S, steps_per_generation=S,
                            max_completion_length=cfg.max_new_tokens).loss.item() for rows in chunks(S))

print(f"tokens per micro-batch at S = 4: {[int(lp.mask[r].sum()) for r in chunks(4)]}; "
      f"in the generation batch M = {int(M)}")
table = pd.DataFrame({t: {"normalisers, S = GA = 1": normalisers(t, 1), "normalisers, S = GA = 4": normalisers(t, 4),
                          "loss, S = GA = 1": accumulated_loss(t, 1), "loss, S = GA = 4": accumulated_loss(t, 4)}
                      for t in ["bnpo", "dapo", "dr_grpo"]}).T
table

# %% [markdown]
# With one micro-batch bnpo and dapo are the same number. With four of unequal token counts they part:
# bnpo divides each micro-batch by its own tokens (times GA), so a short micro-batch's tokens weigh more;
# dapo divides every micro-batch by M, so every token of the generation batch weighs alike and the four
# micro-batches add up to the one-batch loss. `tests/test_offpolicy_step.py` checks the same on the real
# update: two micro-batches accumulate to the one-batch gradient under dapo and not under bnpo.

# %% [markdown]
# ## GSPO: one ratio per sequence
#
# `importance_sampling_level = "sequence"` replaces the token ratios by one weight per sequence,
# exp(mean_t log(pi / pi_old)), so clipping keeps or drops whole sequences. On pass 2's log-probs:

# %%
seq = importance_weight(it2.logps, lp.policy, lp.mask, "sequence")
plots.sequence_vs_token_ratios(it2.ratio, seq[:, 0], lp.mask)

# %%
gspo = step.run(cfg.replace(num_iterations=2, importance_sampling_level="sequence"), until="update", base=one,
                remember=False).update.iterations[1]
spread = lambda w: (w.log().abs().max().item())
print(f"pass 2: largest |log ratio| per token {spread(it2.ratio[scored]):.3f}, per sequence {spread(seq):.3f}; "
      f"clip_ratio/region_mean: token level {it2.metrics['clip_ratio/region_mean']:.4f}, "
      f"sequence level {gspo.metrics['clip_ratio/region_mean']:.4f} (a share of sequences)")

# %% [markdown]
# The sequence ratio is a geometric mean: token ratios far from 1 in both directions average out, so the
# sequence-level weight stays much closer to 1 than its most extreme tokens, and clipping, which now keeps
# or drops whole sequences, triggers far less often at the same epsilon.

# %% [markdown]
# ## The sampler against the trainer
#
# TRL 1.16 with vLLM weights each token by pi_old / pi_sampler (`vllm_importance_sampling_correction`,
# on by default there), where pi_old is the trainer's own scoring. The rollout here keeps the sampler's
# log-probs; with every fix on they agree with the trainer's to ~1e-6 and the weight is 1. With the `trl`
# preset's scoring (dropout on, no position_ids), or `top_p` < 1 at sampling, they do not, and the four
# modes treat the gap differently: `token_truncate` clamps each token's weight to [clip_min, clip_max],
# `token_mask` zeroes tokens outside, the `sequence_*` modes do the same to one product per sequence.

# %%
from grpo_debug.choices import SAMPLER_CORRECTION_MODES
from grpo_debug.sampler import sampler_importance_ratio, sampler_metrics
from grpo_debug.ui.tables import fit_column

trl_scored = step.run(cfg.with_preset("trl"), until="logprobs", base=one, remember=False)
fixed_scored = one if cfg.preset_name() == "fixed" else step.run(cfg.with_preset("fixed"), until="logprobs", base=one,
                                                                  remember=False)  # a capture: its rollout, every fix on
rows, weights = {}, {}
for label, scored in (("fixed", fixed_scored), ("trl preset", trl_scored)):
    for mode in SAMPLER_CORRECTION_MODES:
        L = scored.logprobs
        w = sampler_importance_ratio(L.policy, scored.rollout.sampler_logps, L.mask, mode)
        kept = (w[L.mask.bool()] if w.shape[1] > 1 else w[:, 0]) > 0
        rows[(label, mode)] = {**sampler_metrics(L.policy, scored.rollout.sampler_logps, L.mask, w),
                               "kept": kept.float().mean().item()}
        if label == "trl preset":
            weights[mode] = w[L.mask.bool()] if w.shape[1] > 1 else w[:, 0]
sampling = fit_column(pd.DataFrame(rows).T)  # headers wrap to the notebook's width
sampling.columns = [c.replace("sampling/", "") for c in sampling.columns]
sampling

# %%
plots.sampler_weights_by_mode(weights)

# %% [markdown]
# With every fix on, every weight is within a hair of 1 and all four modes keep everything. Under the trl
# preset's scoring the per-token log-prob differences run to several nats: `sequence_mask` (TRL's
# default mode) multiplies them over a sequence and zeroes every sequence whose product leaves
# [clip_min, clip_max]; `token_truncate` keeps every token with its weight clamped.

# %%
fixed_kept = sampling.loc[("fixed", "sequence_mask"), "kept"]
trl_kept = sampling.loc[("trl preset", "sequence_mask"), "kept"]
print(f"sequence_mask keeps {fixed_kept:.2f} of the sequences with every fix on, {trl_kept:.2f} under the trl preset's scoring")

# %% [markdown]
# ## Entropy, and training on the high-entropy tokens only
#
# TRL logs `entropy`, the mean entropy of the policy's next-token distribution over the scored tokens,
# on every step: how spread out the model's choice of the next token is (0 when one token takes all the
# probability). `top_entropy_quantile = rho` keeps only the top-rho tokens by entropy in the policy loss
# ("Beyond the 80/20 rule"); `entropy_coef` subtracts coef x mean entropy from the loss.

# %%
from grpo_debug.loss import high_entropy_mask

for rho in (1.0, 0.5, 0.2):
    kept = high_entropy_mask(lp.entropies, lp.mask, rho)
    print(f"top_entropy_quantile {rho}: {kept.sum().item() / lp.mask.sum().item():.3f} of the scored tokens trained, "
          f"their mean entropy {lp.entropies[kept].mean().item():.3f} nats")
top = high_entropy_mask(lp.entropies, lp.mask, 0.2)
share = (lp.entropies * top).sum().item() / (lp.entropies * lp.mask).sum().item()
print(f"the top 20% of tokens by entropy hold {share:.2f} of the batch's total entropy")
plots.token_entropies(lp.entropies, lp.mask, top, list(range(0, len(lp.mask), cfg.num_generations))[:3])  # 3 groups' first

# %% [markdown]
# The tokens rho = 0.2 trains on, in the text (between « and »): the rest are near-deterministic.

# %%
marked_completions(two, top, step.loaded.tokenizer, list(range(0, len(top), cfg.num_generations))[:4])

# %% [markdown]
# ## The null step: the floor under every number above
#
# Learning rate 0 and mu = 2: the weights never change, so every ratio != 1, clipped token or KL comes from
# numerics (the fast no-grad scoring against the training forward, bfloat16) or from dropout. A real
# failure shows up above this floor; a "clip ratio" below it is noise. Each variant is a full update with
# two passes, so on the bundled task the floor is measured on a rollout of half the prompts (a capture:
# its own batch).

# %%
from grpo_debug.show.diagnostics import null_step

floor = null_step(step, base=cfg.replace(num_prompts=2) if CAPTURE is None else cfg.with_preset("fixed"))  # every fix on, then one change
floor[[c for c in floor.columns if c.startswith("pass 2")]]

# %%
f = floor["pass 2: max |log ratio|"]
print(f"largest |log ratio| with identical weights: readable {f['fixed, readable paths']:.1e}, "
      f"fast {f['fixed, fast paths']:.1e}, bfloat16 {f['fixed, bfloat16 scoring']:.1e}, "
      f"dropout on {f['dropout on']:.2f}, trl preset {f['trl preset']:.2f}")

# %% [markdown]
# What to notice: with every fix on, the readable path scores bit for bit the same twice and the fast path
# (a shared-prompt cache without gradients) differs from the training forward by float rounding. bfloat16
# scoring done the same way twice is as reproducible: its rounding, large against the sampler (notebook
# 02), cancels in the ratio. None of them clips a token. Dropout alone, left on as TRL leaves it, moves log-probs by whole nats between two forwards of the
# same weights: with mu > 1 (or any off-policy correction) that noise is read as a policy change, clips
# tokens and inflates the KL, before a single weight has moved.

# %% [markdown]
# ## Try it
#
# mu, the clip range, delta, the loss type, the importance-sampling level, the sampler correction and its
# mode, and the top-entropy quantile, on this notebook's rollout. A change re-runs only what it touches:
# `num_iterations` the update alone; at mu >= 2 the clip range and delta the loss, with the passes re-read
# from their cached log-probs (pass 1 is on-policy, so they cannot move what pass 2 scores), any other
# loss-side control the loss and the update; at mu = 1 the loss alone. The rollout and its scoring stay
# cached. The panel shows each optimizer pass's clip ratio and entropy.

# %% tags=["nbval-ignore-output"]
from grpo_debug.ui.widgets import OFF_POLICY_FIELDS, StepPanel

panel = StepPanel(step, fields=["loss_type"] + OFF_POLICY_FIELDS)
panel.widget()

# %% [markdown]
# ## Summary
#
# - At mu = 1 the loss is taken where pi = pi_old: every ratio is 1 and clipping cannot bite; at mu > 1 it can.
# - The loss types differ in what a token far from ratio 1 receives: nothing (clipped), a capped weight, or a gate.
# - With micro-batches dapo's normaliser adds up to the one-batch loss; bnpo's weighs a short micro-batch's tokens more.
# - TRL's sampler correction weighs each token by pi_old / pi_sampler; its sequence modes mask whole completions.
# - The null step is the floor: identical weights clip nothing, while dropout alone moves log-probs by whole nats.

# %% [markdown]
# ## Checks
#
# *Maintainers' live check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
# pass 1 is on-policy where the step's weights are the ones that scored pi_old (every ratio 1): not on
# a later optimizer step of a captured generation, nor with dropout on while scoring
from grpo_debug.show.diagnostics import ON_POLICY, first_pass_ratio_gap

pass_1_on_policy = first_pass_ratio_gap(one) < ON_POLICY  # 1 up to the fast path's float rounding
if pass_1_on_policy:
    clipped = passes_table.loc["mu = 1, pass 1", keys[:4]]
    assert (clipped == 0).all(), f"pass 1 is on-policy, yet it clipped tokens: {clipped.to_dict()}"
else:
    print(f"pass 1 is not on-policy on this step (ratio != 1 before any update): its clip ratio is "
          f"{passes_table.loc['mu = 1, pass 1', 'clip_ratio/region_mean']:.3g}")
if CAPTURE is None:  # the bundled step's learning rate moves pass 2 off-policy
    assert passes_table.loc["mu = 2, pass 2", "clip_ratio/region_mean"] > 0, "mu = 2's second pass clipped nothing"
gap_1 = abs(table.loc["bnpo", "loss, S = GA = 1"] - table.loc["dapo", "loss, S = GA = 1"])
assert gap_1 < 1e-6, f"bnpo and dapo differ by {gap_1:.2g} with one micro-batch, where they are the same number"
gap_4 = abs(table.loc["bnpo", "loss, S = GA = 4"] - table.loc["dapo", "loss, S = GA = 4"])
counts = [int(lp.mask[r].sum()) for r in chunks(4)]
if len(set(counts)) > 1:
    assert gap_4 > 1e-4, f"micro-batches of {counts} tokens, yet bnpo and dapo agree (to {gap_4:.2g}) at S = 4"
else:  # every micro-batch holds as many tokens (e.g. every completion at max length): the two normalisers agree
    assert gap_4 < 1e-6, f"micro-batches of equal token counts {counts}, yet bnpo and dapo differ by {gap_4:.2g}"
    print(f"every micro-batch holds {counts[0]} tokens on this step: bnpo and dapo agree at S = 4 too")
assert f["fixed, readable paths"] == 0, f"the readable path scored the same weights twice {f['fixed, readable paths']:.2g} apart"
assert f["fixed, fast paths"] < 1e-4, f"the fast path is {f['fixed, fast paths']:.2g} from the training forward"
region_2 = "pass 2: clip_ratio/region_mean"
floor_clipped = floor.loc[["fixed, fast paths", "fixed, readable paths"], region_2]
assert (floor_clipped == 0).all(), f"identical weights clipped tokens in pass 2: {floor_clipped.to_dict()}"
if CAPTURE is None:  # measured on the bundled step
    assert f["dropout on"] > 1, f"dropout moved log-probs by {f['dropout on']:.2g} only"
    assert f["fixed, bfloat16 scoring"] < 1e-4 and floor.loc["fixed, bfloat16 scoring", region_2] == 0, (
        "bfloat16 scoring done the same way twice was not reproducible")
print("every claim above holds")
