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
# # 07 · TracIn influence: its sign, its optimizer, its validation set
#
# **What you will learn.** What a training sample's influence is and how to read its sign and its
# histogram; when the prediction behind it holds (a plain gradient step, SGD) and when it has to be
# corrected (the step's AdamW); and why the validation set, more than the sign, decides which samples look
# helpful.
#
# **What you need first.** Notebooks 02 to 06 (log-probs, advantages, the loss, the update): a sample's
# gradient here is the gradient of its share of that loss. Notebook 07b follows this one.
#
# **Influence in plain words.** A step on one training sample moves the weights down that sample's loss
# gradient. Whether the step helps is measured on other samples, through their loss: the validation loss
# L_val. A sample's influence predicts, from the two gradients alone, how a small step on it changes L_val:
# it is their dot product. Its sign is the answer to "does a step on this sample help?": influence > 0, the
# two gradients point the same way and a small step on the sample lowers L_val (it helps); influence < 0, it
# raises L_val (it hurts); 0, the sample has no gradient (a zero advantage) or pulls at right angles to
# L_val. Its size says by how much. Formally:
#
# influence_i = <g_train_i, grad L_val>, with g_train_i the gradient of sample i's share of the GRPO loss.
# Under **SGD**, a step of size lr on sample i alone changes the validation loss by about -lr * influence_i
# (to first order: the prediction a straight line through the gradient makes, good for small steps), so
# influence > 0 means that step lowers L_val. The step's own optimizer is **AdamW**
# (`update.py`), whose first step is about lr * sign(g): under it the prediction has to be measured, or the
# gradient passed through AdamW's update map first (as LESS does). The TracIn-sign report argues that the sign of
# `-seq_logprob * advantage` is backwards and flips it; the same-batch TracIn report blames a top-reward validation set with no
# contrast. Both claims are measured here, the second on the reward in notebook 07b.
#
# Two cells take most of this notebook's time: section 1 takes one real step per training sample and
# validation set, and the validation-set table computes one validation gradient per set.
#
# Prompt sets are named and disjoint: the batch trains on `train` prompts, separate validation sets are
# sampled on `validation` prompts, and every reward measured after an update is measured on `test` prompts.

# %%
from grpo_debug.tracin.specs import specs_of
from grpo_debug.ui.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK, num_prompts=4, num_generations=4, beta=0.0)
task, model, tokenizer = step.task, step.policy, step.loaded.tokenizer  # every influence function takes (model, run, ...)
run = step.run(cfg, until="loss")
spec = specs_of(cfg)  # the phases' arguments (scoring, loss, optimizer, kernels, evaluation) the TracIn code takes

# %% [markdown]
# ## 1. What the first-order prediction predicts, optimizer by optimizer
#
# For every training sample, one real step on that sample alone (the weights restored in between), against
# a prediction of the change of L_val. A check of the Taylor expansion, nothing more:
#
# - **TracIn score, SGD step**: -lr * <g_val, g_i>, the identity TracIn rests on;
# - **TracIn score, the step's AdamW** (clip the gradient norm, one AdamW step from a fresh state, the
#   step's learning rate): what the selection experiments of the seeds silently assume;
# - **AdamW-aware score, the step's AdamW**: -lr * <g_val, U(clip(g_i))>, U = AdamW's update map from a
#   fresh state (m = v = 0), which is what `update.py` builds for every step;
# - **from a warmed state** ("batch"): the state after one AdamW step on the batch gradient. LESS warms Adam
#   with a short training run and reads m and v from its checkpoint; here the warm-up is the step itself,
#   the state a second step would start from. Both the TracIn score and the warmed AdamW-aware score
#   are compared with real AdamW steps from that state.
#
# Validation: a random set of 16 samples on validation prompts (advantages within their groups), and the
# training batch itself. Whether a prediction orders the samples as the real steps do is read as the
# correlation of their ranks: 1 when the two orders agree exactly, 0 when they are unrelated, -1 when
# reversed (*Spearman's rank correlation*). The *sign agreement* is the share of samples whose predicted and
# measured changes have the same sign.

# %%
import pandas as pd

from grpo_debug.tracin.first_order import first_order_checks
from grpo_debug.tracin.influence import validation_set
from grpo_debug.ui import plots
from grpo_debug.ui.influence import InfluenceCache, InfluenceChoice

influence = InfluenceCache(step.validation_run, pool_size=128)  # one pool of 128 samples on validation prompts; scores cached
check_sets = {"random 16": validation_set(run, "random", 16, influence.pool(cfg)),
              "same batch": validation_set(run, "same_batch")}
pairs = {"random 16": [("tracin", "sgd"), ("tracin", "adamw"), ("adam", "adamw"), ("tracin", "adamw_batch"),
                       ("adam_batch", "adamw_batch")],
         "same batch": [("tracin", "sgd"), ("tracin", "adamw"), ("adam", "adamw")]}
checks = {}
for name, val in check_sets.items():
    for c in first_order_checks(model, run.rollout, run.logprobs, run.advantages.values, spec, val,
                                pairs=pairs[name]):
        checks[(name, c.score, c.step)] = c
agreement = pd.DataFrame({k: {"lr": c.lr, "Spearman": c.spearman, "sign agreement": c.sign_agreement,
                              "samples": c.moved} for k, c in checks.items()}).T.astype({"samples": int})
agreement.index.names = ["validation", "score", "real step"]
# which samples clear the evaluation noise is decided near its floor, itself float32 noise: their count is this CPU's
print(f"samples resolved above the noise, row by row (measured on this CPU: {agreement['samples'].tolist()})")
agreement[["Spearman", "sign agreement"]]

# %%
import math


def ranks(c) -> str:
    """A check's Spearman, or why it has none: it is taken over the samples whose step moved L_val beyond the
    evaluation noise, and is undefined (NaN) with fewer than two of them, or when their changes are all equal."""
    if math.isnan(c.spearman):
        return f"undefined ({c.moved} sample(s) moved L_val beyond its noise floor {c.noise_floor:.1e})"
    return f"{c.spearman:+.2f}"


for name in check_sets:
    sgd, tracin_adamw, aware = (checks[(name, s, k)] for s, k in [("tracin", "sgd"), ("tracin", "adamw"), ("adam", "adamw")])
    agree = "" if math.isnan(sgd.spearman) else f" (sign agreement {sgd.sign_agreement:.0%})"
    print(f"{name}: TracIn vs SGD steps Spearman {ranks(sgd)}{agree}; "
          f"TracIn vs AdamW steps {ranks(tracin_adamw)}; AdamW-aware score vs AdamW steps {ranks(aware)}")
warm = checks[("random 16", "adam_batch", "adamw_batch")]
print(f"random 16, warmed AdamW: {(warm.measured < 0).float().mean():.0%} of the single-sample steps lower L_val; "
      f"noise floor of L_val {warm.noise_floor:.1e}")
plots.sign_scatter({f"{name}: {score} score, {kind} step": checks[(name, score, kind)]
                    for name in ["random 16"] for score, kind in pairs[name]})

# %% [markdown]
# What the printed lines and the scatter say. TracIn's first-order identity holds for SGD steps: it ranks
# single-sample SGD steps as they really happen (the assert). How far it carries over to the step's AdamW
# depends on the validation set (the Spearman printed for each): a fresh AdamW step moves every coordinate
# with a gradient by about lr, so the gradient's *magnitudes* no longer set the step. Passing each gradient
# through AdamW's update map before the inner product ranks the real AdamW steps better than TracIn does,
# on both sets (the second assert). From a warmed state the batch's momentum is part of every sample's
# step (the printed fraction of such steps that lower L_val); the ranking is what to read there. The
# statistics leave out samples whose step changes L_val by less than the noise floor of its evaluation
# (measured with random steps that have no first-order effect); under SGD and a fresh AdamW that includes
# every zero-advantage sample, whose step is exactly zero.
#
# The TracIn-sign report's flip negates L_val, so it negates its gradient, every score and every prediction: on the same
# real steps its agreement is the mirror image of the one above. That is an identity, not evidence about
# which samples help. The test of the sign on the quantity the report cares about, the reward, is notebook 07b.

# %% [markdown]
# ## 2. Influence under every toggle
#
# The panel shows the previous choice next to the current one, on the same 16 training samples, and below
# the histograms the paired view: each sample's score under both, the samples whose sign changed in red (the
# status line counts them and gives the rank correlation of the two). The sign
# flip negates cached scores (no recomputation); the validation loss, set, size, advantages and parameter set
# recompute the influence on the cached rollout; the temperature fix and the KL variant re-run the engine
# from their phase, and the scores are recomputed only if they can change (with beta = 0 the KL estimator
# multiplies nothing: served from the cache). Sizes 16, 64 and 128 share the pool of 128 samples. A score
# whose size is within a tolerance of zero (relative to the largest) counts as zero, neither > 0 nor < 0:
# zero-advantage samples have no gradient, and their scores are float noise.

# %% tags=["nbval-ignore-output"]
from grpo_debug.ui.influence import InfluenceExplorer, InfluencePanel

explorer = InfluenceExplorer(step, cache=influence)  # the panel follows the step's current run; same cache
panel = InfluencePanel(explorer, InfluenceChoice(source="random", size=16))
panel.widget()

# %% [markdown]
# ## The validation set decides what "helpful" means
#
# Each set's scores against the largest random set (128 samples), as rank correlation, for both validation
# losses. `val_advantages`: `per_group` keeps each validation sample's advantage within its own generation
# group (the step's convention); `whole_set` normalises the set's rewards over the whole set as one group,
# which is what the TracIn-sign report did (`compute_group_advantages(val_scores, 1)`) and what the same-batch TracIn report's proposed fix
# does to its random set ("advantages = (reward - mean) / std" over all of it).

# %%
from scipy.stats import spearmanr

from grpo_debug.tracin.influence import ZERO_TOLERANCE, sign_fractions

sets = {"seqloss-lastadv": [("same_batch", 16, "per_group"), ("random", 16, "per_group"), ("random", 64, "per_group"),
                            ("random", 64, "whole_set"), ("random", 128, "per_group"), ("topk", 16, "per_group"),
                            ("topk", 16, "whole_set"), ("topk", 64, "whole_set")],
        "seqloss-reward": [("same_batch", 16, "per_group"), ("random", 64, "per_group"), ("topk", 16, "per_group")]}
rows, panels = {}, {}
reference = influence.scores(model, run, InfluenceChoice(source="random", size=128)).numpy()
for kind, kind_sets in sets.items():
    for source, size, advantages in kind_sets:
        choice = InfluenceChoice(kind=kind, source=source, size=size, val_advantages=advantages)
        scores = influence.scores(model, run, choice)
        val = influence.validation_set(run, choice)
        label = "same batch" if source == "same_batch" else f"{source} {size}"
        fractions = sign_fractions(scores)
        rows[(kind, label, advantages)] = {"val mean reward": val.rewards.mean().item(), "fraction > 0": fractions["> 0"],
                                           "fraction = 0": fractions["= 0"], "mean": scores.mean().item(),
                                           "Spearman vs random 128": spearmanr(scores.numpy(), reference).statistic}
        if advantages == "per_group" or kind == "seqloss-lastadv" and source == "topk":
            panels[f"{kind}, {label}, {advantages.replace('_', ' ')}"] = scores.numpy()
print(f"'= 0': |score| <= {ZERO_TOLERANCE:g} x the largest |score| of the set")
table = pd.DataFrame(rows).T
table.index.names = ["validation loss", "set", "advantages"]
top_k_reward = table.loc[("seqloss-lastadv", "topk 16", "per_group"), "val mean reward"]
random_reward = table.loc[("seqloss-lastadv", "random 16", "per_group"), "val mean reward"]
print(f"mean reward of the validation set: top-k 16 {top_k_reward:.3f}, random 16 {random_reward:.3f}")
table[["val mean reward", "fraction > 0", "fraction = 0", "Spearman vs random 128"]]

# %% [markdown]
# **How to read the histograms.** Each panel scores the same 16 training samples against one validation
# set. The horizontal axis is the influence score, each panel on its own scale (compare the shapes and the
# sides of 0 across panels, not the values); a bar's height is how many samples have a score in its range;
# the black line is 0. Samples right of the line are predicted to help (a selection by influence > 0 keeps
# them), samples left of it to hurt (the flipped sign keeps those). The bar on the line holds the samples
# with no gradient, the zero-advantage ones (the table's "fraction = 0"). A panel with no bar left of the
# line (the same batch under seqloss-lastadv) rates no sample as harmful; a sample far from the rest carries
# most of any sum of scores.

# %%
plots.influence_histograms(panels, bins=12, title="influence of the same 16 training samples, by validation set")

# %% [markdown]
# Parameter sets: all parameters, the transformer blocks only, and LoRA adapters (peft, B = 0 at the
# start as peft initialises it, so only the B matrices carry a gradient).

# %%
all_params = influence.scores(model, run, InfluenceChoice(source="random", size=16)).numpy()
pd.DataFrame({ps: {"Spearman vs all": spearmanr(influence.scores(model, run, InfluenceChoice(source="random", size=16,
                                                                                           param_set=ps)).numpy(),
                                                all_params).statistic} for ps in ["all", "blocks", "lora"]}).T

# %% [markdown]
# ## 3. The same-batch self-term
#
# With validation = the training batch, influence_i contains <g_train_i, g_val_i>, the inner product with
# sample i's *own* share of the validation loss. At step 0 with beta = 0 both gradients lie along
# G_i = grad seq_logprob_i: g_train_i = c_train_i G_i with c_train_i = -A_i / (N T_i) under the grpo loss
# (T_i: i's completion tokens, from the loss's per-sequence mean), and g_val_i = c_val_i G_i with
# c_val_i = -A_i / N for seqloss-lastadv and -r_i / N for seqloss-reward. So
# self_i = (c_val_i / c_train_i) ||g_train_i||^2:
#
# - seqloss-lastadv: self_i = T_i ||g_train_i||^2 >= 0 (not <g_i, g_i> / N: the 1/T_i of the loss stays);
# - seqloss-reward: self_i = (r_i / A_i) T_i ||g_train_i||^2, of the sign of A_i * r_i: negative for a
#   below-average sample with a positive reward, or an above-average one with a negative reward.
#
# The cell measures every self-term with hooks and checks it against that relation.

# %%
import torch

from grpo_debug.tracin.influence import (
    VAL_LOSSES,
    per_sample_train_gradients,
    self_terms,
    self_terms_from_norms,
    signs,
    train_coefficients,
    validation_coefficients,
    validation_gradient,
)

train_grads = influence.train_gradients(model, run, "all")
same = validation_set(run, "same_batch")
c_train = train_coefficients(run.advantages.values, run.logprobs.mask, spec)
squared = train_grads.squared_norms()
self_rows, own_by_kind = {}, {}
for kind in VAL_LOSSES:
    own = self_terms(model, train_grads, same, spec, kind).double()
    relation = self_terms_from_norms(squared, c_train, validation_coefficients(same, kind))
    if not cfg.dropout:  # with dropout on, each forward draws other masks: no identity between two of them
        assert torch.allclose(own, relation, rtol=1e-3, atol=1e-6 * relation.abs().max().item())
    total = influence.scores(model, run, InfluenceChoice(kind=kind, source="same_batch")).double()
    own_by_kind[kind] = own
    self_rows[kind] = {"min self-term": own.min().item(), "self-terms < 0": int((signs(own) < 0).sum()),
                       "self-term share of the summed influence": (own.sum() / total.sum()).item(),
                       "influence > 0": (signs(total) > 0).float().mean().item(),
                       "influence - self > 0": (signs(total - own) > 0).float().mean().item()}
product_sign = torch.sign(run.advantages.values * run.rewards.total).long()
reward_own = own_by_kind["seqloss-reward"]
print(f"seqloss-lastadv: every self-term >= 0; seqloss-reward: {int((signs(reward_own) < 0).sum())} of "
      f"{len(reward_own)} self-terms < 0 (min {reward_own.min():.3g}), each of the sign of A_i * r_i")
pd.DataFrame(self_rows).T

# %% [markdown]
# Is the bias largest at small batches? The self-term is one product per sample, the cross terms N - 1; if
# those add up, the self-term's share shrinks as N grows. The same measurement (seqloss-lastadv) on a batch
# of 32 (8 prompts x 4 samples) next to the 16 above:

# %%
from grpo_debug.tracin.influence import influence_scores

bias = {run.rollout.num_samples: {"self-term share of the summed influence": self_rows["seqloss-lastadv"]["self-term share of the summed influence"],
             "influence > 0": self_rows["seqloss-lastadv"]["influence > 0"],
             "influence - self > 0": self_rows["seqloss-lastadv"]["influence - self > 0"]}}
if CAPTURE is None:  # a second, larger batch of the bundled task: a capture has only its own batch
    c = cfg.replace(num_prompts=8)
    r = step.run(c, until="loss", remember=False)  # a side run: the step (and the panel above) stay on the 16
    same32 = validation_set(r, "same_batch")
    grads = per_sample_train_gradients(model, r.rollout, r.logprobs, r.advantages.values, specs_of(c))
    total = influence_scores(grads, validation_gradient(model, same32, specs_of(c), "seqloss-lastadv")[1]).double()
    own32 = self_terms(model, grads, same32, specs_of(c), "seqloss-lastadv").double()
    bias[r.rollout.num_samples] = {"self-term share of the summed influence": (own32.sum() / total.sum()).item(),
                                   "influence > 0": (signs(total) > 0).float().mean().item(),
                                   "influence - self > 0": (signs(total - own32) > 0).float().mean().item()}
    share16, share32 = (bias[n]["self-term share of the summed influence"] for n in (16, 32))
    print(f"self-term share of the summed influence: {share16:.2f} at 16 samples, {share32:.2f} at 32")
else:
    print("a capture holds its own batch only: the 32-sample comparison is of the bundled task")
pd.DataFrame(bias).T.rename_axis("batch size")

# %% [markdown]
# The printed shares: on the bundled model the self-term carries most of the summed same-batch influence
# (the checks cell at the end: more than half at both sizes), less at 32 samples than at 16. For seqloss-lastadv, same-batch
# influence mostly says "this sample agrees with itself".

# %% [markdown]
# **What to notice.** The sign question splits in two. As a Taylor expansion it is settled by measurement
# and holds for SGD; under the step's AdamW the optimizer-aware score ranks single-sample steps better than
# TracIn on both validation sets, and the table in section 1 says by how much. On the reward, the quantity
# the TracIn-sign report cares about, notebook 07b takes a step on what each sign selects. What changes the
# histograms is the validation set: for seqloss-lastadv the same batch adds a non-negative self-term to every
# score; for seqloss-reward the self-term takes the sign of A_i * r_i; a top-k set has high rewards
# everywhere, so `seqloss-reward` just says "make these outputs likelier" (the same-batch TracIn report).
# Selecting by influence is only as good as the validation set and the optimizer behind it.

# %% [markdown]
# ## Summary
#
# - Influence is the dot product of a sample's gradient with L_val's: > 0 predicts that a small step on it lowers L_val.
# - The prediction holds for SGD steps; for the step's AdamW, a score passed through AdamW's update ranks real steps better.
# - Flipping the sign mirrors every score and prediction: an identity, not evidence; 07b tests the sign on the reward.
# - The validation set changes the histograms most: on the same batch, the samples' own terms carry most of the sum.

# %% [markdown]
# ## Checks
#
# *Maintainers' live check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
for name in check_sets:  # the first-order checks (section 1); a capture's learning rate may move L_val below its noise
    sgd, tracin_adamw, aware = (checks[(name, s, k)] for s, k in [("tracin", "sgd"), ("tracin", "adamw"), ("adam", "adamw")])
    if CAPTURE is None:  # measured on the bundled step
        assert sgd.spearman >= 0.95 and sgd.sign_agreement == 1.0
        assert aware.spearman > tracin_adamw.spearman
assert (signs(own_by_kind["seqloss-lastadv"]) >= 0).all()  # "every self-term >= 0"
assert torch.equal(signs(reward_own)[signs(reward_own) != 0], product_sign[signs(reward_own) != 0])  # sign of A_i r_i
if CAPTURE is None:  # measured on the bundled step
    assert top_k_reward > random_reward  # the top-k set's rewards are higher
    assert (signs(own32) >= 0).all()  # at 32 samples too
    assert share32 < share16 and share32 > 0.5  # "more than half at both sizes, less at 32 than at 16"
print("every claim above holds")
