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
# **What you will learn.** Why one AdamW step moves each weight by about the learning rate; that samples with
# advantage 0 send no gradient; why one step cannot show learning; and a GRPO step of your own in plain torch, run
# as a loop that learns.
#
# **What you need first.** Notebook 05 (the loss and its gradient).
#
# ## The AdamW step
#
# The update clips the gradient $g = \nabla_\theta \mathcal{L}$ to norm `max_grad_norm` and takes one AdamW step,
# with step count $k$, learning rate $\eta$, weight decay $\lambda$ and 00's $\beta_1$, $\beta_2$,
# $\epsilon_{\text{Adam}}$ (torch's defaults, printed below):
#
# $$m \leftarrow \beta_1 m + (1 - \beta_1)\, g, \qquad v \leftarrow \beta_2 v + (1 - \beta_2)\, g^2, \qquad
# \theta \leftarrow \theta - \eta \Big(\frac{m / (1 - \beta_1^k)}{\sqrt{v / (1 - \beta_2^k)} + \epsilon_{\text{Adam}}}
# + \lambda\, \theta\Big).$$
#
# On the first step ($k = 1$, $m = v = 0$) the bias corrections give back $g$ and $g^2$, so
#
# $$\Delta\theta = -\eta\, \frac{g}{|g| + \epsilon_{\text{Adam}}} \approx -\eta\, \operatorname{sign}(g):$$
#
# every weight whose gradient is well above $\epsilon_{\text{Adam}}$ moves by $\eta$, whatever the loss's scale (a
# gradient near $\epsilon_{\text{Adam}}$ moves a little less), and the step's norm is about
# $\eta \sqrt{\text{number of weights with a gradient}}$. Against torch's AdamW:

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
    print(f"{f'AdamW, gradient x {scale:g}':<25} {' '.join(f'{v:+.2e}' for v in steps[scale].tolist())}")
by_hand = -1e-4 * g / (g.abs() + 1e-8) + 0.0  # (+ 0.0: no -0)
print(f"{'-lr g / (|g| + eps_Adam)':<25} {' '.join(f'{v:+.2e}' for v in by_hand.tolist())}")
print(f"(torch's AdamW defaults: beta_1, beta_2 {adamw.defaults['betas']}, eps_Adam {adamw.defaults['eps']:g})")

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
# At ratio 1 the loss is about 0 (notebook 05), yet the gradient is not. Per sample (`per_sample_grad_norms`: one
# backward with layer hooks), those with advantage 0 send none: their policy term is 0, and so is the KL term's
# gradient while the policy equals the reference.

# %%
from grpo_debug.ui import plots

plots.per_sample_grad_norms(u.per_sample_grad_norms, run.advantages.values)

# %% [markdown]
# ## One step on held-out prompts
#
# The test prompts, sampled with the same seeds before and after the update: each prompt's change is paired, with a
# 95% bootstrap interval over prompts. One step's holds 0: each weight moved by about $\eta$, a fraction of a
# percent of the weights' norm (above). Learning shows over many steps and seeds.

# %%
ev = step.run(cfg).evaluation  # samples anew on the test prompts: under CAPTURE, needs TASK
print(f"{len(ev.before.per_prompt)} test prompts: reward {ev.before.reward:+.3f} -> {ev.after.reward:+.3f}, change "
      f"{ev.delta:+.4f}, 95% interval [{ev.ci_low:+.4f}, {ev.ci_high:+.4f}]")

# %% [markdown]
# ## Exercise 4: a GRPO step of your own (about 20 minutes)
#
# Everything so far in plain torch and transformers: sample $G$ completions per prompt at temperature $T$ (01),
# score them with the task's reward function as TRL calls it (03), the group advantage (04), the token log-probs at
# $T$ (02), the loss (05, at ratio 1 and $\beta = 0$), backward and one optimizer step. Write `grpo_step(model,
# tokenizer, optimizer, prompts, reward_fn, G, temperature, max_new_tokens)`, returning the $B \cdot G$ rewards;
# the checker runs it on a tiny random GPT-2.

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
# **Your loop.** Your step 6 times from the bundled model on 4 training prompts, once per seed: their reward before
# and after (the same draws), and a t interval over the seeds. The rate is 10 times the step's above.

# %% tags=["nbval-ignore-output"]
from grpo_debug.exercises import run_student_loop

loop = run_student_loop(grpo_step, steps=6, seeds=4, lr=1e-3)  # a line per seed (a few minutes), then the interval

# %% [markdown]
# **What to notice.** Every seed's reward rises and the interval lies above 0. Break one line of `grpo_step` (the
# advantage's sign, the mask) and run the loop again. Learning on held-out prompts, with a positive control:
# notebook 06b, section 6.

# %% [markdown]
# ## Summary
#
# - A fresh AdamW's first step moves every weight with a gradient by about $\eta$, whatever $|g|$.
# - Samples with advantage 0 send no gradient; the loss's value says nothing about the step's size.
# - One step's held-out change is not told apart from noise; your own loop learns its prompts within a few steps.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed. nbval runs every notebook in CI, so a sentence that stops being true fails
# here instead of going stale. (An identity a cell demonstrates, such as "bit for bit", stays in that cell: it is
# part of the lesson.)

# %%
assert torch.allclose(steps[1.0], by_hand, rtol=1e-4, atol=1e-12), "AdamW's first step is not -lr g / (|g| + eps_Adam)"
assert torch.allclose(steps[1.0][:2], steps[100.0][:2]) and torch.allclose(steps[1.0][0], -steps[1.0][1]), (
    "AdamW's first step depends on the loss's scale"
)
assert 0.95 < steps[1.0][2] / steps[100.0][2] < 1, "the gradient near eps_Adam no longer moves a little less at scale 1"
if CAPTURE is None:  # the bundled step: grpo at ratio 1 with the policy at the reference, a fresh AdamW
    zero, norms = run.advantages.values == 0, u.per_sample_grad_norms
    assert abs(u.loss) < 1e-5 and u.grad_norm > 1e-3, "the loss is not ~0 with a gradient"
    assert norms[zero].max() < 1e-3 * norms[~zero].median(), "zero-advantage samples send a gradient"
    assert u.update_norm / weight_norm < 0.01, "the step is not a fraction of a percent of the weights' norm"
    assert abs(delta.abs().max() - cfg.learning_rate) < 0.01 * cfg.learning_rate, "the largest move is not about lr"
    assert abs(u.update_norm / (cfg.learning_rate * moved**0.5) - 1) < 0.05, "the norm is not lr x sqrt(weights moved)"
    assert ev.ci_low < 0 < ev.ci_high, "one step's held-out change is told apart from 0"
assert min(loop.change) > 0 and loop.ci[0] > 0, f"your loop did not learn its prompts: changes {loop.change}"
assert loop.lr == 10 * cfg.learning_rate or CAPTURE is not None, "the loop's rate is no longer 10 times the step's"
print("every claim above holds")
