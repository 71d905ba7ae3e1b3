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
# # 06 · Update and post-update evaluation
#
# **What you will learn.** The AdamW step, and why the size of one step is set by the learning rate, not by the
# gradient's norm; each sample's gradient norm (the samples with advantage 0 send none); how to read one step's
# change on held-out prompts, and why one step cannot show learning; a GRPO step you write in plain torch, run as a
# loop that learns; and GRPO learning over 24 steps, from the committed runs of the positive control.
#
# **What you need first.** Notebook 05 (the loss and its gradient).
#
# ## The AdamW step
#
# The update backpropagates the loss, clips the gradient $g = \nabla_\theta \mathcal{L}$ to norm `max_grad_norm`
# if it is longer, and takes one AdamW step. For each weight, with step count $k$, learning rate $\eta$, weight
# decay $\lambda$ and torch's defaults for Adam's moment decays $\beta_1 = 0.9$, $\beta_2 = 0.999$ and its
# offset $\epsilon_{\text{Adam}} = 10^{-8}$ (Adam's own symbols, no relation to the KL weight $\beta$ or the clip's $\epsilon$):
#
# $$m \leftarrow \beta_1 m + (1 - \beta_1)\, g, \qquad v \leftarrow \beta_2 v + (1 - \beta_2)\, g^2, \qquad
# \theta \leftarrow \theta - \eta \Big(\frac{m / (1 - \beta_1^k)}{\sqrt{v / (1 - \beta_2^k)} + \epsilon_{\text{Adam}}}
# + \lambda\, \theta\Big).$$
#
# On the first step ($k = 1$, $m = v = 0$ before it) the bias corrections give back $g$ and $g^2$, so
#
# $$\Delta\theta = -\eta\, \frac{g}{|g| + \epsilon_{\text{Adam}}} \approx -\eta\, \operatorname{sign}(g):$$
#
# every weight whose gradient is well above $\epsilon_{\text{Adam}}$ moves by $\eta$, whatever the gradient's size.
# Scaling the loss by 100, or clipping its gradient to norm 1, changes nothing for those weights (only a gradient
# within a few hundred $\epsilon_{\text{Adam}}$ of 0, the third weight below, moves by a little less), and the step's
# norm is about $\eta \sqrt{\text{number of weights with a gradient}}$. In plain torch, against `torch.optim.AdamW`:

# %%
import torch

g = torch.tensor([3.0, -0.02, 1e-6, 0.0])  # one gradient per weight: large, small, tiny, none
steps = {}
for scale in (1.0, 100.0):
    w = torch.zeros(4, requires_grad=True)
    w.grad = scale * g
    adamw = torch.optim.AdamW([w], lr=1e-4, weight_decay=0.0)
    adamw.step()
    steps[scale] = w.detach()
    print(f"gradient x {scale:<3g}: AdamW's step {' '.join(f'{v:+.2e}' for v in steps[scale].tolist())}")
by_hand = -1e-4 * g / (g.abs() + 1e-8) + 0.0  # (+ 0.0: no -0)
print(f"-lr g / (|g| + eps): by hand     {' '.join(f'{v:+.2e}' for v in by_hand.tolist())}")
print(f"(torch's AdamW defaults: betas {adamw.defaults['betas']}, eps {adamw.defaults['eps']:g})")

# %%
from grpo_debug.ui.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK, per_sample_grad_norms=True)
run = step.run(cfg, until="update")
u = run.update
after = dict(step.policy.named_parameters())
delta = torch.cat([(after[name].detach().to(before.device) - before).flatten() for name, before in step.initial_state.items()])
weight_norm = torch.cat([v.flatten() for v in step.initial_state.values()]).norm().item()  # the trained weights'
moved = int((delta != 0).sum())
print(f"loss {u.loss:.2e}  but grad_norm {u.grad_norm:.4f} (clipped: {u.clipped}); learning rate {cfg.learning_rate:g}")
print(f"{moved / delta.numel():.2%} of the {delta.numel()} weights moved; max |delta| {delta.abs().max():.3e}; "
      f"{(delta.abs() > 0.99 * cfg.learning_rate).sum() / max(moved, 1):.1%} of them by at least 0.99 lr")
print(f"update norm {u.update_norm:.4f}; lr x sqrt(weights moved) = {cfg.learning_rate * moved ** 0.5:.4f}; "
      f"{u.update_norm / weight_norm:.3%} of the weights' norm {weight_norm:.1f}")

# %% [markdown]
# Each sample's gradient norm, from one backward with layer hooks (`per_sample_grad_norms`). A loss that prints
# `0.0000` with a non-zero gradient is the normal state of a grpo step at ratio 1 (notebook 05). Samples with
# advantage 0 (zero-std groups) get no gradient at step 0: their policy term is 0, and the KL term's gradient is 0
# too while the policy still equals the reference.

# %%
from grpo_debug.ui import plots

plots.per_sample_grad_norms(u.per_sample_grad_norms, run.advantages.values)

# %%
zero = run.advantages.values == 0
norms = u.per_sample_grad_norms
if zero.any() and (~zero).any():
    in_flat_groups = len(run.advantages.zero_std_groups) * cfg.num_generations  # notebook 04's zero-std groups
    print(f"{int(zero.sum())} samples with advantage 0 ({in_flat_groups} in groups whose rewards are all equal, "
          f"{int(zero.sum()) - in_flat_groups} with a reward exactly at their group's mean): max gradient norm "
          f"{norms[zero].max():.2g}; the others: median {norms[~zero].median():.3g}")

# %% [markdown]
# ## One step on held-out prompts
#
# The same held-out test prompts are sampled with the same seeds before and after the update, so each prompt's
# change is paired, and the mean change gets a 95% bootstrap interval over prompts.

# %%
ev = step.run(cfg).evaluation  # samples anew on the test prompts: under CAPTURE, needs TASK
apart = "told apart from 0" if ev.ci_low > 0 or ev.ci_high < 0 else "not told apart from 0: the interval holds 0"
print(f"reward on the test prompts before {ev.before.reward:.4f} after {ev.after.reward:.4f}: "
      f"delta {ev.delta:+.4f}, 95% CI [{ev.ci_low:+.4f}, {ev.ci_high:+.4f}], {apart}")
plots.eval_before_after(ev)

# %%
import pandas as pd

pd.DataFrame({"before": ev.before.components, "after": ev.after.components,
              "delta": ev.component_deltas})

# %% [markdown]
# **What to notice.** One step moves the reward on the test prompts by the delta printed above, and the interval
# says whether that is more than sampling noise (printed). Expect it not to be: one AdamW step moves each weight by
# about the learning rate, a fraction of a percent of the weights' norm (printed above), and what a step does to
# learning shows over many steps and seeds, not in one. To see the pairing at work, change one setting (a pitfall
# from notebook 02, `learning_rate`, `beta`) and re-run: the evaluation samples with the same seeds.

# %% [markdown]
# ## Exercise 4: a GRPO step of your own (about 20 minutes)
#
# Everything so far, in one function of plain torch and transformers, with no grpo_debug inside it: sample $G$
# completions per prompt at temperature $T$ (01), score them with the task's reward function as TRL calls it (03),
# the group advantage (04), each completion token's log-prob at $T$ (02), the loss (05: one optimizer step per
# batch, so the ratio is 1 and the clip is idle; no KL term, $\beta = 0$), backward and one optimizer step. Write
# `grpo_step(model, tokenizer, optimizer, prompts, reward_fn, G, temperature, max_new_tokens)`, returning the
# $B \cdot G$ rewards. The checker runs it on a tiny random GPT-2: the reward function gets each prompt $G$ times in
# a row, a group whose rewards are all equal moves no weight, and the step raises the log-prob of the completions
# with a positive advantage against the others. (The cell holds a solution; `make exercises` empties it.)

# %% tags=["solution"]
def grpo_step(model, tokenizer, optimizer, prompts, reward_fn, G, temperature, max_new_tokens):
    """One GRPO step in plain torch, on-policy and without the KL term: sample G completions per prompt, score
    them, group advantages, the loss, backward, one optimizer step. Returns the (B*G,) rewards."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)  # (B, P), padded on the left
    P = enc["input_ids"].shape[1]
    with torch.no_grad():
        seqs = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                              max_new_tokens=max_new_tokens, num_return_sequences=G,
                              pad_token_id=tokenizer.pad_token_id)  # (B*G, P + C): prompt i's group is rows iG..iG+G-1
    ids = seqs[:, P:]  # (B*G, C) the completions' tokens
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    rewards = torch.tensor(reward_fn([p for p in prompts for _ in range(G)], texts), dtype=torch.float32)
    grouped = rewards.view(-1, G)  # 04's advantage
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
    is_eos = ids == tokenizer.eos_token_id
    ends = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1] - 1)  # each completion's last token
    mask = (torch.arange(ids.shape[1])[None] <= ends[:, None]).float()  # (B*G, C): up to and with its EOS
    attention = torch.cat([enc["attention_mask"].repeat_interleave(G, 0), mask.long()], 1)
    logits = model(seqs, attention_mask=attention).logits[:, P - 1 : -1] / temperature  # 02: position t predicts t+1
    logps = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)  # (B*G, C)
    per_token = -torch.exp(logps - logps.detach()) * advantages[:, None]  # 05 at ratio 1: gradient -A grad log pi
    loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()  # 05's "grpo" normaliser
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return rewards


# %%
from grpo_debug.exercises import check_grpo_step

print(check_grpo_step(grpo_step))

# %% [markdown]
# **Your loop.** Your step, run `LOOP_STEPS` times on the bundled model from its start, on 4 training prompts of the
# policy task (`P:` prompts: a best move, with candidates and their evaluations, in a short completion),
# each seed on its own: the reward on those 4 prompts, sampled anew (16 completions each, the same seeds before and
# after), before and after the loop. The seed is the unit: the interval is a t interval over the seeds' changes.
# The rate is 10 times the step's above (the stored outputs are this CPU's: sampling over many steps can part on
# another CPU's kernels, the Checks hold on any), so that a few steps show on a few prompts what 06b's control needs 24
# steps and 128 held-out prompts to show: a loop learns its own prompts first.

# %% tags=["nbval-ignore-output"]
import numpy as np
import scipy.stats
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_debug.files import DEFAULT_MODEL
from grpo_debug.task import load_task

policy_task = load_task("policy")
loop_prompts = policy_task.prompts("train", 4)
tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)


def task_reward(prompts, completions):  # the task's functions, weighted and summed as TRL sums them
    scores = [f(prompts=prompts, completions=completions) for f in policy_task.reward_funcs]
    return [sum(w * s for w, s in zip(policy_task.weights, row) if s is not None) for row in zip(*scores)]


def reward_on_the_prompts(model, seed, n=16):
    torch.manual_seed(seed)
    enc = tokenizer(loop_prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        seqs = model.generate(**enc, do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=40,
                              num_return_sequences=n, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(task_reward([p for p in loop_prompts for _ in range(n)], texts)) / len(texts)


LOOP_STEPS, LOOP_SEEDS, LOOP_LR = 6, 4, 1e-3
loop_change = []
for seed in range(LOOP_SEEDS):
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval()  # eval: dropout off (02's fix)
    start = reward_on_the_prompts(model, 10_000 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LOOP_LR)
    torch.manual_seed(seed)
    for _ in range(LOOP_STEPS):
        grpo_step(model, tokenizer, optimizer, loop_prompts, task_reward, 8, 0.7, 40)
    end = reward_on_the_prompts(model, 10_000 + seed)
    loop_change.append(end - start)
    print(f"seed {seed}: reward on the 4 prompts {start:+.2f} -> {end:+.2f} after {LOOP_STEPS} steps")
loop_ci = scipy.stats.t.interval(0.95, LOOP_SEEDS - 1, loc=np.mean(loop_change), scale=scipy.stats.sem(loop_change))
print(f"change over {LOOP_SEEDS} seeds: {np.mean(loop_change):+.2f}, 95% t interval [{loop_ci[0]:+.2f}, "
      f"{loop_ci[1]:+.2f}]: {'above 0, your loop learns' if loop_ci[0] > 0 else 'not above 0'}")

# %% [markdown]
# **What to notice.** Every seed's reward on its prompts rises, and the interval over the seeds (printed) lies above
# 0: a correct step learns in a few steps what it is rewarded for. Change one line of `grpo_step` (the advantage's
# sign, the mean over the whole batch instead of each group, the mask) and run the loop again. On held-out prompts
# learning is slower and smaller: the next section's control.

# %% [markdown]
# ## GRPO learning, over 24 steps
#
# One step cannot show learning; 24 can. Notebook 06b's positive control, planned before its runs
# (`data/experiments/control_plan.json`), trained the fixed configuration (every fix of this path on) and TRL 1.16
# as shipped for 24 steps on 8 seeds each, the same prompts and sampling seeds in both arms, and sampled 128
# held-out test prompts at the start and at the end. The committed results are loaded here, nothing is trained.
# The figure draws each seed's held-out reward at the start and the end, and each arm's change from its start with
# its interval, paired by seed and test prompt, at the corrected level of its family of four claims (06b says how).

# %%
import textwrap

from grpo_debug.files import DATA_DIR
from grpo_debug.runs.control import chosen_rate, headline, positive_control
from grpo_debug.runs.results import detected, eval_table, per_seed

control = positive_control(DATA_DIR / "experiments")
K, seeds = control["steps"], control["seeds"]
held_out = {arm: tuple(eval_table(control["records"], arm, seeds, k).mean(1) for k in (0, K)) for arm in ("fixed", "trl")}
changes = {arm: control["summary"][arm]["change_from_start"] for arm in held_out}
rose = per_seed(control, "fixed", "change_from_start")
interval = lambda d: f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
verdict = lambda d: "detected" if detected(d) else "not detected"
print(textwrap.fill("positive control: " + headline(control), 110))
trl = control["summary"]["trl"]
print(f"fixed: {int((rose > 0).sum())} of {len(rose)} seeds rose. TRL as shipped: change from its start "
      f"{interval(changes['trl'])} ({verdict(changes['trl'])}); minus fixed at the end "
      f"{interval(trl['minus_fixed'])} ({verdict(trl['minus_fixed'])})")
rate, start = float(chosen_rate(DATA_DIR / "experiments")), control["summary"]["fixed"]["reward_start"]
print(f"its rate {rate:g} was chosen by the plan's stage 1 on validation prompts, before any test prompt was seen "
      f"(this notebook's step uses {cfg.learning_rate:g});\nits start, {start:.3f}, is the mean over its "
      f"{control['eval_prompts']} test prompts; 00's baseline is over the first {cfg.eval_prompts}")
plots.held_out_by_seed(held_out, changes, K, title=f"{K} steps on {seeds} seeds: " + ", ".join(
    f"{arm} {d['mean']:+.3f} from its start ({verdict(d)})" for arm, d in changes.items()))

# %% [markdown]
# ## Summary
#
# - A fresh AdamW's first step moves every weight with a gradient by about the learning rate, whatever $|g|$.
# - Samples with advantage 0 send no gradient; the loss's value says nothing about the step's size.
# - One step's held-out change is not told apart from noise here; your own loop learns its prompts within a few steps.
# - Over 24 steps the fixed configuration's held-out reward rises, detected; TRL as shipped ends below it.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed. nbval runs every notebook in CI, so a sentence that stops being true fails
# here instead of going stale. (An identity a cell demonstrates, such as "bit for bit", stays in that cell: it is
# part of the lesson.)

# %%
assert torch.allclose(steps[1.0], by_hand, rtol=1e-4, atol=1e-12), "AdamW's first step is not -lr g / (|g| + eps)"
assert torch.allclose(steps[1.0][:2], steps[100.0][:2]) and torch.allclose(steps[1.0][0], -steps[1.0][1])
assert 0.95 < steps[1.0][2] / steps[100.0][2] < 1, "the gradient near eps no longer moves a little less at scale 1"
if CAPTURE is None:  # the bundled step: grpo at ratio 1 with the policy at the reference, a fresh AdamW
    assert abs(u.loss) < 1e-5 and u.grad_norm > 1e-3  # a loss of ~0, yet a gradient
    assert norms[zero].max() < 1e-3 * norms[~zero].median()  # zero-advantage samples send no gradient
    assert u.update_norm / weight_norm < 0.01  # "a fraction of a percent of its weights"
    assert abs(delta.abs().max() - cfg.learning_rate) < 0.01 * cfg.learning_rate  # each weight moves by about lr
    assert abs(u.update_norm / (cfg.learning_rate * moved**0.5) - 1) < 0.05  # the norm: lr x sqrt(weights moved)
    assert ev.ci_low < 0 < ev.ci_high  # one step: not told apart from 0
assert min(loop_change) > 0 and loop_ci[0] > 0, f"your loop did not learn its prompts: changes {loop_change}"
assert LOOP_LR == 10 * cfg.learning_rate or CAPTURE is not None, "the loop's rate is no longer 10 times the step's"
assert (K, control["eval_prompts"]) == (24, 128), "the control is no longer 24 steps on 128 held-out prompts"
assert detected(control["summary"]["fixed"]["change_from_start"]) and (rose > 0).all(), "the fixed step no longer learns"
assert not detected(trl["change_from_start"]) and detected(trl["minus_fixed"]) and trl["minus_fixed"]["mean"] < 0
print("every claim above holds")
