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
# # 07 · TracIn influence and its sign
#
# influence_i = <grad L_train_i, grad L_val>. A gradient step of size lr on sample i changes the validation
# loss by about -lr * influence_i, so influence > 0 means the step *lowers* L_val: it helps. Seed 000
# argues that the sign of `-seq_logprob * advantage` is backwards and flips it; seed 001 finds the real
# problem: a validation set of only top-reward samples has no contrast. Here both claims are measured.

# %%
from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None

# %%
from grpo_debug.config import StepConfig
from grpo_debug.paths import DEFAULT_MODEL
from grpo_debug.step import GRPOStep

cfg = StepConfig(model=MODEL or DEFAULT_MODEL, num_prompts=4, num_generations=4, beta=0.0)
step = GRPOStep(cfg)
run = step.run(cfg, until="loss")

# %% [markdown]
# ## The experiment that settles the sign
#
# For every training sample: the predicted change of L_val (-lr x influence) against the change measured
# after a real SGD step on that sample alone, the model restored in between. Validation = the batch itself.

# %%
from grpo_debug.influence import sign_experiment, validation_set
from grpo_debug import plots
val = validation_set(step, "same_batch")
args = (step.policy, run.rollout, run.logprobs, run.advantages.values, cfg, val)
as_written = sign_experiment(*args, lr=1e-3)
experiments = {"as written (-seq_logp * A)": as_written,
               "seed-000 flip": as_written.flipped()}  # the same real steps; the flip negates the prediction
for name, e in experiments.items():
    print(f"{name:28s} Spearman {e.spearman:+.3f}  sign agreement {e.sign_agreement:.0%} over {e.moved} samples")
assert experiments["as written (-seq_logp * A)"].sign_agreement >= 0.95
assert experiments["seed-000 flip"].sign_agreement <= 0.1
plots.sign_scatter(experiments)

# %% [markdown]
# The loss as written is right: its influence predicts the real steps. The flip predicts the opposite of
# what happens.

# %% [markdown]
# ## Influence under every toggle
#
# The panel shows the previous choice next to the current one, on the same 16 training samples. The sign
# flip negates cached scores (no recomputation); the validation loss, set, size and parameter set
# recompute the influence on the cached rollout; the temperature fix and the KL variant re-run the engine
# from their phase and recompute. Sizes 16, 64 and 128 share one pool of 128 held-out samples.

# %% tags=["nbval-ignore-output"]
from grpo_debug.influence import InfluenceChoice, InfluenceExplorer
from grpo_debug.widgets import InfluencePanel
explorer = InfluenceExplorer(step, pool_size=128)
panel = InfluencePanel(explorer, InfluenceChoice(source="random", size=16))
panel.widget()

# %% [markdown]
# ## The validation set decides what "helpful" means
#
# Each set's scores against the largest random set (128 held-out samples), as rank correlation, for both
# validation losses.

# %%
import pandas as pd
from scipy.stats import spearmanr
sets = {"seqloss-lastadv": [("same_batch", 16), ("random", 16), ("random", 64), ("random", 128), ("topk", 16), ("topk", 64)],
        "seqloss-reward": [("same_batch", 16), ("topk", 16)]}
rows, panels = {}, {}
reference = explorer.scores(InfluenceChoice(kind="seqloss-lastadv", source="random", size=128)).numpy()
for kind, kind_sets in sets.items():
    for source, size in kind_sets:
        scores = explorer.scores(InfluenceChoice(kind=kind, source=source, size=size)).numpy()
        val = validation_set(step, source, size, None if source == "same_batch" else explorer.pool())
        rows[(kind, f"{source} {size}")] = {"val mean reward": val.rewards.mean().item(),
                                            "fraction > 0": (scores > 0).mean(), "mean": scores.mean(),
                                            "Spearman vs random 128": spearmanr(scores, reference).statistic}
        if kind == "seqloss-lastadv" or source == "topk":
            panels[f"{kind}, {source} {size}"] = scores
table = pd.DataFrame(rows).T
table

# %%
plots.influence_histograms(panels, bins=12, title="influence of the 16 training samples")

# %% [markdown]
# Parameter sets: all parameters, the transformer blocks only, and LoRA adapters (peft, B = 0 at the
# start as peft initialises it, so only the B matrices carry a gradient).

# %%
all_params = explorer.scores(InfluenceChoice(source="random", size=16)).numpy()
pd.DataFrame({ps: {"Spearman vs all": spearmanr(explorer.scores(InfluenceChoice(source="random", size=16, param_set=ps)).numpy(),
                                                all_params).statistic} for ps in ["all", "blocks", "lora"]}).T

# %% [markdown]
# ## Selection: one update on the chosen samples
#
# Keep the samples with influence > 0, the top half, the bottom half or a random half (validation: random
# 64), take one step of the same optimizer on them alone, and measure L_val and the held-out reward
# (8 prompts x 4 samples, the same sampling seeds before and after: a small, noisy check).

# %%
from grpo_debug.influence import selection_experiment
val = validation_set(step, "random", 64, explorer.pool())
results = selection_experiment(step, val, explorer.scores(InfluenceChoice(source="random", size=64)), eval_prompts=8)
selection = pd.DataFrame([vars(r) for r in results]).set_index("strategy")
selection["L_val change"] = selection.val_loss_after - selection.val_loss_before
by = selection["L_val change"]
print(f"top half {by['top_half']:+.4f} vs bottom half {by['bottom_half']:+.4f}")
assert by["top_half"] < by["bottom_half"]
selection

# %%
plots.selection_results(results)

# %% [markdown]
# ## The same-batch self-term
#
# With validation = the training batch, influence_i includes <g_i, grad of sample i's own share of L_val>,
# which is >= 0 for seqloss-lastadv (the two losses push sample i the same way): a bias upwards.

# %%
from grpo_debug.influence import influence_scores, per_sample_train_gradients, self_terms, validation_gradient
train_grads = per_sample_train_gradients(step.policy, run.rollout, run.logprobs, run.advantages.values, cfg)
val = validation_set(step, "same_batch")
_, val_grad = validation_gradient(step.policy, val, cfg, "seqloss-lastadv")
total = influence_scores(train_grads, val_grad)
own = self_terms(step.policy, train_grads, val, cfg, "seqloss-lastadv")
table = pd.DataFrame({"influence": total, "self term": own, "without self": total - own})
print(f"self term >= 0 for all samples: {bool((own >= -1e-9).all())}; positive influence with self "
      f"{(total > 0).float().mean():.0%}, without {((total - own) > 0).float().mean():.0%}")
assert (own >= -1e-9).all()
table.head(8)

# %% [markdown]
# Is the bias largest at small batches? The self-term is 1/N of a sample's own product, the cross
# terms are 1/N of N - 1 products with the other samples; if those add up, the self-term's share shrinks as
# N grows. The same measurement on a batch of 32 (8 prompts x 4 samples) next to the 16 above:

# %%
bias = {16: {"self-term share of the summed influence": (own.sum() / total.sum()).item(),
             "positive with self": (total > 0).float().mean().item(),
             "positive without": ((total - own) > 0).float().mean().item()}}
for prompts in [8]:
    c = cfg.replace(num_prompts=prompts)
    r = step.run(c, until="loss")
    same = validation_set(step, "same_batch")
    grads = per_sample_train_gradients(step.policy, r.rollout, r.logprobs, r.advantages.values, c)
    total = influence_scores(grads, validation_gradient(step.policy, same, c, "seqloss-lastadv")[1])
    own = self_terms(step.policy, grads, same, c, "seqloss-lastadv")
    assert (own >= -1e-9).all()
    bias[r.rollout.num_samples] = {"self-term share of the summed influence": (own.sum() / total.sum()).item(),
                                   "positive with self": (total > 0).float().mean().item(),
                                   "positive without": ((total - own) > 0).float().mean().item()}
run = step.run(cfg, until="loss")
pd.DataFrame(bias).T.rename_axis("batch size")

# %% [markdown]
# On the bundled model the self-term is about all of the summed influence at 16 samples and three
# quarters of it at 32: the bias shrinks with the batch, slowly, because samples of different prompts have
# nearly orthogonal gradients and the cross terms stay small. Same-batch influence mostly says "this sample
# agrees with itself".

# %% [markdown]
# **What to notice.** The sign question is settled by measurement, not by argument. What changes the
# histograms is the validation set: the same batch inflates every score by its self-term; a top-k set has high rewards everywhere, so `seqloss-reward` just says "make these outputs
# likelier" (seed 001). Selecting by influence is only as good as the validation set behind it.
