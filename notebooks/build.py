"""Write the notebooks from their cells: `python notebooks/build.py`, then execute them in place with
`jupyter nbconvert --to notebook --execute --inplace notebooks/0*.ipynb` so the stored outputs are today's.
Editing a notebook in JupyterLab is fine too; this script is only the source the suite started from.
"""

from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent

SETUP = """from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None"""

CONFIG = """from grpo_debug.config import StepConfig
from grpo_debug.paths import DEFAULT_MODEL
from grpo_debug.step import GRPOStep

cfg = StepConfig(model=MODEL or DEFAULT_MODEL)
step = GRPOStep(cfg)"""

NOTEBOOKS = {
    "00_setup_and_baseline": [
        ("md", """# 00 · Set-up and baseline evaluation

One GRPO step on a RookWorld chess model, phase by phase. This notebook loads the model and measures
where it starts: its mean reward on held-out prompts it never saw in training, per reward component.
Every later notebook starts from a `StepConfig` like this one; none relies on state from another."""),
        ("code", SETUP),
        ("code", """from grpo_debug import load_model
from grpo_debug.paths import DEFAULT_MODEL

policy, reference, tokenizer = load_model(MODEL or DEFAULT_MODEL)
n_params = sum(p.numel() for p in policy.parameters())
print(f"{type(policy).__name__}: {n_params / 1e6:.2f}M parameters, {policy.config.n_layer} layers, "
      f"vocab {policy.config.vocab_size}, dropout {policy.config.resid_pdrop}")
print("pad == eos:", tokenizer.pad_token_id == tokenizer.eos_token_id)
assert not any(p.requires_grad for p in reference.parameters())"""),
        ("md", """The two RookWorld tasks, as the model sees them. A policy (P:) prompt asks for the top-5 moves, their
evaluations and the best move; an environment (A:) prompt asks for the position after a move, the
reward, and whether the game ended (terminated) or the move was illegal (truncated)."""),
        ("code", """from grpo_debug.data import env_example, load_split, policy_example

for prompt, truth in [policy_example(load_split("policy_eval")[0]), env_example(load_split("env_eval")[0])]:
    print(prompt + "|" + truth)"""),
        ("md", """## Baseline: mean reward on held-out prompts

32 held-out prompts (16 P:, 16 A:), 4 samples each at temperature 0.7. The reward is in [-1, 1]; its
components are documented in `grpo_debug/rewards.py`."""),
        ("code", """import pandas as pd
from grpo_debug.config import StepConfig
from grpo_debug.evaluation import eval_prompts, eval_side
from grpo_debug.rewards import RewardScorer

cfg = StepConfig(model=MODEL or DEFAULT_MODEL)
scorer = RewardScorer.bundled()
baseline = eval_side(policy, tokenizer, eval_prompts(cfg.task, cfg.eval_prompts), cfg, scorer)
print(f"mean reward {baseline.reward:.4f}")
pd.Series(baseline.components, name="mean").to_frame()"""),
        ("code", """prompts = eval_prompts(cfg.task, cfg.eval_prompts)
rows = [{"task": prompts[i // cfg.eval_samples][:2], "completion": c[:70]} for i, c in enumerate(baseline.completions)]
pd.DataFrame(rows).head(8)"""),
        ("md", """**What to notice.** The reward is graded: a completion that parses but picks a weak move still earns
more than garbage, so groups of samples differ and GRPO has something to learn from. The model card in
`data/models/rookworld-tiny/README.md` has the full floor metrics (200 + 200 prompts x 8 samples)."""),
    ],
    "01_generation": [
        ("md", """# 01 · Generation: B prompts x G samples

The rollout samples G completions for each of B prompts in **one** `generate` call (left padding, KV
cache, model in eval mode, seeded), and keeps the sampler's own log-probability of every sampled token,
so phase 2 can check that recomputing them gives the same numbers."""),
        ("code", SETUP),
        ("code", CONFIG + """
run = step.run(cfg, until="rollout")
r = run.rollout
print(f"{r.num_samples} samples = {len(r.prompts)} prompts x {r.num_generations}; "
      f"prompt width {r.prompt_ids.shape[1]} tokens (left-padded), completion width {r.completion_ids.shape[1]}")"""),
        ("code", """import pandas as pd
table = pd.DataFrame({"group": [i // r.num_generations for i in range(r.num_samples)],
                      "task": [r.prompts[i // r.num_generations][:2] for i in range(r.num_samples)],
                      "length": r.completion_lengths.tolist(), "finished": r.finished.tolist(),
                      "completion": [c[:80] for c in r.completions]})
table.head(16)"""),
        ("code", """print("left padding per prompt:", (r.prompt_mask == 0).sum(1)[::r.num_generations].tolist())
print("groups whose G completions are identical:", r.identical_groups)
print("completions/mean_length:", round(r.completion_lengths.float().mean().item(), 2))
assert (r.prompt_mask == 0).any(), "A: prompts are longer than P: prompts, so P: rows are left-padded"
assert r.finished.all() or r.completion_lengths.max() == cfg.max_new_tokens"""),
        ("md", """**What to notice.** P: prompts (the policy task) are shorter than A: prompts, so they are left-padded:
phase 2 shows what happens when a forward pass ignores that. Identical groups give zero reward std and
no learning signal (phase 4). The per-prompt loop of the seed-003 script is `generation="loop"`; its
cost against the one-call rollout is in notebook 08."""),
    ],
    "02_logprobs": [
        ("md", """# 02 · Log-probs: six ways to get them wrong

GRPO needs log pi(token) for every sampled token, under the policy and under the reference. With every
fix on, recomputing them gives what the sampler used (up to float rounding). Each pitfall from the
seeds breaks that on its own:

| toggle | pitfall | seed |
|---|---|---|
| `logprob_temperature=False` | sampled at T=0.7, scored at T=1 | 004 |
| `mask="seed004"` | EOS dropped; with pad == eos a value mask drops it too | 004 |
| `dropout=True` | model left in train mode while scoring (dropout 0.1) | RookWorld log |
| `position_ids=False` | left-padded rows scored with shifted positions | DESIGN 4 |
| `dtype="bfloat16"` | scored in bfloat16 | |
| `gather="seed003"` | every token gathered from the first position's distribution | 003 |"""),
        ("code", SETUP),
        ("code", CONFIG + """
run = step.run(cfg, until="logprobs")
print(f"all fixes on: max |sampler - recomputed| = {run.logprobs.max_sampler_gap:.2e} nats")
assert run.logprobs.max_sampler_gap < 1e-4"""),
        ("code", """from grpo_debug.tables import compare_variants

pitfalls = {"all fixes on": {}, "temperature not applied": {"logprob_temperature": False},
            "dropout on": {"dropout": True}, "no position_ids": {"position_ids": False},
            "bfloat16": {"dtype": "bfloat16"}, "seed-003 gather": {"gather": "seed003"},
            "seed-004 mask": {"mask": "seed004"}, "no mask": {"mask": "none"}}
table = compare_variants(step, pitfalls, until="loss",
                         columns=["logps/max_sampler_gap", "logps/eos_kept", "kl", "loss"])
table"""),
        ("code", """from grpo_debug import plots
plots.gap_by_toggle(table["logps/max_sampler_gap"].to_dict())"""),
        ("code", """for name in ["temperature not applied", "dropout on", "no position_ids", "bfloat16", "seed-003 gather"]:
    assert table.loc[name, "logps/max_sampler_gap"] > 1e-2, name
assert table.loc["all fixes on", "logps/eos_kept"] == 1.0 and table.loc["seed-004 mask", "logps/eos_kept"] == 0.0
assert table.loc["dropout on", "kl"] > 1.0  # policy with dropout vs reference without: a huge KL at step 0"""),
        ("md", """## Where the gap sits: no position_ids

Only the left-padded rows (the P: prompts, shorter than the A: ones) are shifted; the longest prompts
have no padding and are unaffected."""),
        ("code", """run = step.run(cfg.replace(position_ids=False), until="logprobs")
fig = plots.logprob_gap_heatmap(run.logprobs, "no position_ids: |sampler - recomputed|")
step.run(cfg, until="loss")
fig"""),
        ("md", """## The EOS with pad == eos

GPT-2 (and RookWorld-LM-124M) pad with the EOS token. A mask built from token values (`ids != pad`)
cannot tell the real EOS from padding and drops it: the model is never rewarded for stopping. TRL keeps
the first EOS and masks what follows, from the lengths."""),
        ("code", """import pandas as pd
from grpo_debug.logprobs import completion_mask

r = step.result.rollout
i = int(r.finished.nonzero()[0])
end = int(r.completion_lengths[i])
ids = r.completion_ids[i, end - 3:end + 2].tolist()
pd.DataFrame({mode: completion_mask(r, mode)[i, end - 3:end + 2].tolist() for mode in ["trl", "seed004", "none"]},
             index=[f"{t}{' (EOS)' if t == r.eos_token_id else ''}" for t in ids]).T"""),
        ("md", """**What to notice.** With every fix on the gap is float rounding (~1e-6). Dropout gives the largest
error and, because the reference is scored without dropout (as TRL does), a KL far from 0 at step 0:
the RookWorld debug log's "policy -440 vs reference -45". bfloat16 is small per token but not zero."""),
    ],
    "03_rewards": [
        ("md", """# 03 · Rewards: every component, engine-free

The P: reward compares the completion with Stockfish's analysis of the position: best move (by its rank
among all legal moves), candidates (against the top 5), evaluations (against Stockfish's eval of each
listed move), format. Weights 0.5 / 0.3 / 0.2 as the public RookWorld trainer. The A: reward checks the
next FEN (as a position, so either en-passant convention counts), the reward value and the two flags.
Bundled positions carry an evaluation of every legal move, so scoring needs no engine."""),
        ("code", SETUP),
        ("code", CONFIG + """
run = step.run(cfg, until="rewards")
from grpo_debug.tables import per_sample
table = per_sample(run)
table[["group", "completion", "reward", "best_move", "candidates", "evals", "format", "fen", "truncated"]].head(16)"""),
        ("code", """from grpo_debug import plots
plots.rewards_per_group(run.rewards, cfg.num_generations)"""),
        ("md", """## Malformed completions get documented scores, not exceptions"""),
        ("code", """import pandas as pd
from grpo_debug.data import load_split, policy_example
from grpo_debug.engine import PositionAnalysis
from grpo_debug.rewards import score_policy

record = load_split("policy_eval")[0]
analysis = PositionAnalysis.from_json(record)
truth = policy_example(record)[1]
cases = {"ground truth": truth, "empty": "", "garbage": "\\u2603 M: ?? B:", "truncated": truth[:20],
         "illegal best move": truth.rsplit(" ", 1)[0] + " a1a1", "evals off by 1 pawn": truth.replace("E: ", "E: 1")}
pd.DataFrame({name: {**score_policy(analysis, text).components, "total": score_policy(analysis, text).total}
              for name, text in cases.items()}).T"""),
        ("md", """## Engine-free vs live Stockfish

For a position that is not bundled, the scorer starts one Stockfish process (restarted if it dies) and
analyses every legal move. On a bundled position the two agree on the legal moves; the evaluations can
differ slightly because a search depends on the engine's hash history."""),
        ("code", """import chess
from grpo_debug.engine import Stockfish

with Stockfish(depth=8) as engine:
    live = engine.analyse(chess.Board(record["fen"]))
print("same legal moves:", set(live.evals) == set(analysis.evals))
print("bundled top 3:", analysis.top5[:3])
assert set(live.evals) == set(analysis.evals)"""),
        ("md", """**What to notice.** A weak model's signal comes mostly from format, legality and the A: flags; the
graded best-move rank is what separates two legal answers. The ground truth scores exactly 1.0."""),
    ],
    "04_advantages": [
        ("md", """# 04 · Advantages: group-relative, and where they go wrong

advantage = (reward - mean of its group) / (std + 1e-4), exactly as TRL 1.16 (`scale_rewards="group"`);
`"batch"` divides by the batch std, `"none"` does not divide. A group with identical rewards has
advantage 0 everywhere (`frac_reward_zero_std`); a group whose std is tiny but not zero turns noise into
full-size advantages (phantom advantages): `std_floor` clamps the std from below."""),
        ("code", SETUP),
        ("code", CONFIG + """
run = step.run(cfg, until="advantages")
adv = run.advantages
print(f"reward {adv.reward:.4f}, reward_std {adv.reward_std:.4f}, frac_reward_zero_std {adv.frac_reward_zero_std:.3f}")
sums = adv.values.view(-1, cfg.num_generations).sum(1)
print("advantages summed per group:", [round(s, 6) for s in sums.tolist()])
assert sums.abs().max() < 1e-4"""),
        ("code", """from grpo_debug import plots
plots.advantages_bars(adv, cfg.num_generations)"""),
        ("code", """from grpo_debug.tables import compare_variants
compare_variants(step, {"group (TRL default)": {}, "batch": {"scale_rewards": "batch"},
                        "none": {"scale_rewards": "none"}, "group + std_floor 0.1": {"std_floor": 0.1}},
                 until="advantages", columns=["reward_std", "frac_reward_zero_std", "advantages/max_abs",
                                              "advantages/phantom_groups"])"""),
        ("md", """## Phantom advantages, on purpose

Two groups: one whose rewards differ only by 1e-4 (noise), one with a real win/loss split."""),
        ("code", """import pandas as pd
import torch
from grpo_debug.advantages import compute_advantages

rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
pd.DataFrame({"reward": rewards, "TRL (group)": compute_advantages(rewards, 4),
              "std_floor=0.1": compute_advantages(rewards, 4, std_floor=0.1)})"""),
        ("md", """**What to notice.** A 1e-4 difference becomes an advantage of 0.5, the same order as a real win/loss;
the floor removes it and leaves the real group untouched. Zero-std groups contribute nothing to the
gradient, whatever the loss type."""),
    ],
    "05_loss_and_kl": [
        ("md", """# 05 · Loss and KL

Token-level GRPO (TRL): ratio = exp(logp - old_logp), clipped, times the advantage, plus beta times a KL
estimate; `grpo`, `bnpo`, `dr_grpo`, `dapo` normalise differently. The seed-003 script uses sequence
REINFORCE, `-A * sum(logp)` (or divided by the length). At step 0, logp == old_logp: the ratio is exactly
1 and the loss value is about 0, while its gradient is not."""),
        ("code", SETUP),
        ("code", CONFIG + """
run = step.run(cfg, until="loss")
import torch
assert torch.equal(run.loss.ratio, torch.ones_like(run.loss.ratio))
print(f"loss {run.loss.loss.item():.2e} (ratio is exactly 1 at step 0)")"""),
        ("code", """from grpo_debug.tables import compare_variants, gradient_of_loss_wrt_logps
variants = {t: {"loss_type": t} for t in ["grpo", "bnpo", "dr_grpo", "dapo", "reinforce_sum", "reinforce_mean"]}
table = compare_variants(step, variants, until="loss", columns=["loss", "loss/policy", "loss/kl"])
for name, changes in variants.items():
    run = step.run(cfg.replace(**changes), until="loss")
    table.loc[name, "|d loss / d logp|"] = gradient_of_loss_wrt_logps(run, run.config).norm().item()
step.run(cfg, until="loss")
table"""),
        ("md", """The loss values differ by orders of magnitude (REINFORCE sums log-probs, so its value is large), yet
the gradient each sends into the log-probs is what moves the model."""),
        ("md", """## KL estimators

With d = ref_logp - logp: k1 = -d, k2 = d^2/2, k3 = exp(d) - d - 1 (TRL), and TRL's importance-corrected
k3 (x ratio). Their values AND their gradients differ (Tang & Munos 2025). Below: each estimator's
sample-mean value and autograd gradient against the exact reverse KL of a categorical policy."""),
        ("code", """import pandas as pd
from grpo_debug.loss import kl_estimator_check
check = pd.DataFrame(kl_estimator_check()).T
check["value biased"] = (check["value"] - check["exact_kl"]).abs() > 0.02
check["gradient biased"] = check["grad_rel_error"] > 0.1
check"""),
        ("code", """assert list(check.index[check["gradient biased"]]) == ["k1", "k3"]
assert list(check.index[check["value biased"]]) == ["k2"]"""),
        ("md", """## Per-token KL on real tokens

At step 0 policy and reference are the same weights, so every estimator is 0. Scoring the policy with
dropout on (phase 2's pitfall) makes them differ, and the estimators disagree token by token."""),
        ("code", """from grpo_debug import plots
run = step.run(cfg.replace(dropout=True), until="loss")
fig = plots.kl_per_token(run.logprobs.policy, run.logprobs.reference, run.logprobs.mask,
                         title="per-token KL with dropout on while scoring")
step.run(cfg, until="loss")
fig"""),
        ("md", """**What to notice.** k1's gradient is zero in expectation (it pulls nowhere); k3 (TRL's default
value) has the gradient of the *forward* KL; k2 and the corrected k3 have the reverse-KL gradient. The
value you log and the gradient you apply are different questions."""),
    ],
    "06_update_and_eval": [
        ("md", """# 06 · Update and post-update evaluation

Backward, gradient norms (total and per sample, from one backward with layer hooks), clipping, one
AdamW step; then the same held-out prompts are sampled with the same seeds before and after, and the
paired difference gets a bootstrap confidence interval."""),
        ("code", SETUP),
        ("code", CONFIG + """
run = step.run(cfg)
u = run.update
print(f"loss {u.loss:.2e}  but grad_norm {u.grad_norm:.4f} (clipped: {u.clipped}), update norm {u.update_norm:.4f}")
assert abs(u.loss) < 1e-5 and u.grad_norm > 1e-3"""),
        ("code", """from grpo_debug import plots
plots.per_sample_grad_norms(u.per_sample_grad_norms, run.advantages.values)"""),
        ("md", """"Loss 0.0000" (seed 002) with a non-zero gradient is the normal state of a GRPO step. Samples with
advantage 0 (zero-std groups) still have a gradient norm here only through the KL term."""),
        ("code", """ev = run.evaluation
print(f"held-out reward before {ev.before.reward:.4f} after {ev.after.reward:.4f}: "
      f"delta {ev.delta:+.4f}, 95% CI [{ev.ci_low:+.4f}, {ev.ci_high:+.4f}]")
plots.eval_before_after(ev)"""),
        ("code", """import pandas as pd
pd.DataFrame({"before": ev.before.components, "after": ev.after.components,
              "delta": ev.component_deltas})"""),
        ("md", """**What to notice.** One step on 64 samples moves the held-out reward by a few hundredths at most; the
interval says whether that is more than sampling noise. Try a smaller `learning_rate` or `beta`, or a
pitfall from notebook 02, and re-run: the evaluation uses the same seeds, so the comparison is paired."""),
    ],
    "07_tracin": [
        ("md", """# 07 · TracIn influence and its sign

influence_i = <grad L_train_i, grad L_val>. A gradient step of size lr on sample i changes the validation
loss by about -lr * influence_i, so influence > 0 means the step *lowers* L_val: it helps. Seed 000
argues that the sign of `-seq_logprob * advantage` is backwards and flips it; seed 001 finds the real
problem: a validation set of only top-reward samples has no contrast. Here both claims are measured."""),
        ("code", SETUP),
        ("code", CONFIG.replace("cfg = StepConfig(model=MODEL or DEFAULT_MODEL)",
                                "cfg = StepConfig(model=MODEL or DEFAULT_MODEL, num_prompts=4, num_generations=4, beta=0.0)") + """
run = step.run(cfg, until="loss")"""),
        ("md", """## The experiment that settles the sign

For every training sample: the predicted change of L_val (-lr x influence) against the change measured
after a real SGD step on that sample alone, the model restored in between. Validation = the batch itself."""),
        ("code", """from grpo_debug.influence import sign_experiment, validation_set
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
plots.sign_scatter(experiments)"""),
        ("md", """The loss as written is right: its influence predicts the real steps. The flip predicts the opposite of
what happens."""),
        ("md", """## Influence under every toggle

The panel shows the previous choice next to the current one, on the same 16 training samples. The sign
flip negates cached scores (no recomputation); the validation loss, set, size and parameter set
recompute the influence on the cached rollout; the temperature fix and the KL variant re-run the engine
from their phase and recompute. Sizes 16, 64 and 128 share one pool of 128 held-out samples."""),
        ("code", """# NBVAL_IGNORE_OUTPUT
from grpo_debug.influence import InfluenceChoice, InfluenceExplorer
from grpo_debug.widgets import InfluencePanel
explorer = InfluenceExplorer(step, pool_size=128)
panel = InfluencePanel(explorer, InfluenceChoice(source="random", size=16))
panel.widget()"""),
        ("md", """## The validation set decides what "helpful" means

Each set's scores against the largest random set (128 held-out samples), as rank correlation, for both
validation losses."""),
        ("code", """import pandas as pd
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
table"""),
        ("code", """plots.influence_histograms(panels, bins=12, title="influence of the 16 training samples")"""),
        ("md", """Parameter sets: all parameters, the transformer blocks only, and LoRA adapters (peft, B = 0 at the
start as peft initialises it, so only the B matrices carry a gradient)."""),
        ("code", """all_params = explorer.scores(InfluenceChoice(source="random", size=16)).numpy()
pd.DataFrame({ps: {"Spearman vs all": spearmanr(explorer.scores(InfluenceChoice(source="random", size=16, param_set=ps)).numpy(),
                                                all_params).statistic} for ps in ["all", "blocks", "lora"]}).T"""),
        ("md", """## Selection: one update on the chosen samples

Keep the samples with influence > 0, the top half, the bottom half or a random half (validation: random
64), take one step of the same optimizer on them alone, and measure L_val and the held-out reward
(8 prompts x 4 samples, the same sampling seeds before and after: a small, noisy check)."""),
        ("code", """from grpo_debug.influence import selection_experiment
val = validation_set(step, "random", 64, explorer.pool())
results = selection_experiment(step, val, explorer.scores(InfluenceChoice(source="random", size=64)), eval_prompts=8)
selection = pd.DataFrame([vars(r) for r in results]).set_index("strategy")
selection["L_val change"] = selection.val_loss_after - selection.val_loss_before
by = selection["L_val change"]
print(f"top half {by['top_half']:+.4f} vs bottom half {by['bottom_half']:+.4f}")
assert by["top_half"] < by["bottom_half"]
selection"""),
        ("code", """plots.selection_results(results)"""),
        ("md", """## The same-batch self-term

With validation = the training batch, influence_i includes <g_i, grad of sample i's own share of L_val>,
which is >= 0 for seqloss-lastadv (the two losses push sample i the same way): a bias upwards."""),
        ("code", """from grpo_debug.influence import influence_scores, per_sample_train_gradients, self_terms, validation_gradient
train_grads = per_sample_train_gradients(step.policy, run.rollout, run.logprobs, run.advantages.values, cfg)
val = validation_set(step, "same_batch")
_, val_grad = validation_gradient(step.policy, val, cfg, "seqloss-lastadv")
total = influence_scores(train_grads, val_grad)
own = self_terms(step.policy, train_grads, val, cfg, "seqloss-lastadv")
table = pd.DataFrame({"influence": total, "self term": own, "without self": total - own})
print(f"self term >= 0 for all samples: {bool((own >= -1e-9).all())}; positive influence with self "
      f"{(total > 0).float().mean():.0%}, without {((total - own) > 0).float().mean():.0%}")
assert (own >= -1e-9).all()
table.head(8)"""),
        ("md", """Is the bias largest at small batches? The self-term is 1/N of a sample's own product, the cross
terms are 1/N of N - 1 products with the other samples; if those add up, the self-term's share shrinks as
N grows. The same measurement on a batch of 32 (8 prompts x 4 samples) next to the 16 above:"""),
        ("code", """bias = {16: {"self-term share of the summed influence": (own.sum() / total.sum()).item(),
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
pd.DataFrame(bias).T.rename_axis("batch size")"""),
        ("md", """On the bundled model the self-term is about all of the summed influence at 16 samples and three
quarters of it at 32: the bias shrinks with the batch, slowly, because samples of different prompts have
nearly orthogonal gradients and the cross terms stay small. Same-batch influence mostly says "this sample
agrees with itself"."""),
        ("md", """**What to notice.** The sign question is settled by measurement, not by argument. What changes the
histograms is the validation set: the same batch inflates every score by its self-term; a top-k set has high rewards everywhere, so `seqloss-reward` just says "make these outputs
likelier" (seed 001). Selecting by influence is only as good as the validation set behind it."""),
    ],
    "08_diagnostics": [
        ("md", """# 08 · Diagnostics from seed 002

"iter 1: loss 0.0000" and "time 103634 ms": is the loss a failure, and where does the time go?"""),
        ("code", SETUP),
        ("code", CONFIG + """
from grpo_debug.diagnostics import triage_zero_loss
run = step.run(cfg, until="update")
print(triage_zero_loss(run))"""),
        ("md", """Now the real failure: every group gets the same reward (a constant reward function)."""),
        ("code", """import copy
import torch
from grpo_debug.advantages import summarize_advantages
broken = copy.copy(run)
broken.advantages = summarize_advantages(torch.full((run.rollout.num_samples,), 0.5), cfg.num_generations)
print(triage_zero_loss(broken))
assert triage_zero_loss(broken).startswith("FAILURE") and triage_zero_loss(run).startswith("NORMAL")"""),
        ("md", """## Time and memory per phase (they vary run to run: not compared by nbval)"""),
        ("code", """# NBVAL_IGNORE_OUTPUT
from grpo_debug import plots
plots.time_per_phase({k: v.seconds for k, v in run.timings.items()})"""),
        ("code", """# NBVAL_IGNORE_OUTPUT
step.result.rollout = None
batched = step.run(cfg.replace(generation="batched"), until="rollout").rollout.seconds
step.result.rollout = None
loop = step.run(cfg.replace(generation="loop"), until="rollout").rollout.seconds
print(f"one generate call: {batched:.2f} s; one call per prompt (seed 003): {loop:.2f} s; ratio {loop / batched:.2f}")"""),
        ("md", """## torch.compile on and off

The scoring forward (8 rows) eager and compiled: the first compiled call pays the compilation; the
numbers must agree. (Timings vary: not compared by nbval; the agreement is asserted.)"""),
        ("code", """# NBVAL_IGNORE_OUTPUT
from grpo_debug.diagnostics import compile_comparison
compiled = compile_comparison(step, rows=8)
print(compiled)
assert compiled.error == "" and compiled.max_abs_diff < 1e-4"""),
        ("md", """**What to notice.** A zero loss is a failure only when the advantages (or the mask, or the log-probs)
are zero. `benchmarks/step.py` prints the full timing and memory table, including a 124M GPT-2 shape
and a TRL step on the same configuration."""),
    ],
    "09_dashboard": [
        ("md", """# 09 · Dashboard: every toggle in one panel

Each control is a `StepConfig` field; a change re-runs only the phases after the one it belongs to, on
the same cached rollout, and redraws. Below the panel, the same comparisons as static tables."""),
        ("code", SETUP),
        ("code", CONFIG.replace("cfg = StepConfig(model=MODEL or DEFAULT_MODEL)",
                                "cfg = StepConfig(model=MODEL or DEFAULT_MODEL, num_prompts=4, num_generations=4)")),
        ("code", """# NBVAL_IGNORE_OUTPUT
from grpo_debug.widgets import StepPanel
panel = StepPanel(step)
panel.widget()"""),
        ("code", """from grpo_debug.widgets import apply_change
result = apply_change(step, "kl_estimator", "k2")
print("re-ran:", result.rerun)
assert result.rerun == ["loss"]
result = apply_change(step, "mask", "seed004")
print("re-ran:", result.rerun)
assert result.rerun[0] == "logprobs" and result.run.rollout is step.result.rollout
restored = step.run(cfg, until="loss")
print("back to", restored.config.mask, restored.config.kl_estimator)"""),
        ("code", """from grpo_debug.tables import compare_variants
compare_variants(step, {"all fixes": {}, "T not applied": {"logprob_temperature": False},
                        "dropout": {"dropout": True}, "seed004 mask": {"mask": "seed004"},
                        "k1": {"kl_estimator": "k1"}, "batch scale": {"scale_rewards": "batch"},
                        "dr_grpo": {"loss_type": "dr_grpo"}},
                 until="loss", columns=["logps/max_sampler_gap", "logps/eos_kept", "frac_reward_zero_std", "kl", "loss"])"""),
        ("md", """**What to notice.** Only the rows with a log-prob pitfall move the sampler gap; only the loss-phase
rows change the loss and nothing before it."""),
    ],
}


def build() -> None:
    for name, cells in NOTEBOOKS.items():
        nb = nbf.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in cells]
        nbf.write(nb, HERE / f"{name}.ipynb")


if __name__ == "__main__":
    build()
