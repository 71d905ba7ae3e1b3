"""Every fast path against its readable twin: the same attention, samples, log-probs, norms and step."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo_debug.config import StepConfig
from grpo_debug.fast.shared_prompt import shared_prompt_attention
from grpo_debug.model import load_model
from grpo_debug.rollout import rollout
from grpo_debug.specs import sampling_of
from grpo_debug.speed import kernels


def test_attention_over_a_shared_prompt_equals_sdpa():
    g = torch.Generator().manual_seed(0)
    B, G, H, Q, D, prompt_len, filled, length = 3, 4, 2, 5, 8, 6, 9, 12
    key = torch.randn(B, 1, H, length, D, generator=g).expand(-1, G, -1, -1, -1).clone()
    value = torch.randn(B, 1, H, length, D, generator=g).expand(-1, G, -1, -1, -1).clone()
    own = torch.randn(B, G, H, length - prompt_len, D, generator=g)  # each sample's own keys after the prompt
    key[..., prompt_len:, :], value[..., prompt_len:, :] = own, own.flip(-1)
    key, value = key.flatten(0, 1), value.flatten(0, 1)
    query = torch.randn(B * G, H, Q, D, generator=g)
    mask = torch.ones(B * G, 1, Q, length, dtype=torch.bool)
    mask[:, :, :, filled:] = False  # the static cache's unfilled tail
    mask[:G, :, :, :2] = False  # the first prompt's left padding
    mask[:, :, torch.arange(Q).unsqueeze(1) + prompt_len < torch.arange(length)] = False  # causal among new tokens

    class Layer(torch.nn.Module):
        pass

    layer = Layer()
    expected, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=D**-0.5)
    layer._shared_prompt = (prompt_len, G)
    shared, _ = shared_prompt_attention(layer, query, key, value, mask, scaling=D**-0.5)
    assert shared.shape == expected.shape
    assert torch.allclose(shared, expected, atol=1e-6)


def _sample(fast, **overrides):
    from grpo_debug.task import load_task

    cfg = StepConfig(num_prompts=3, num_generations=4, max_new_tokens=48, task="mixed", **overrides)
    policy, _, tokenizer = load_model()
    prompts = load_task(cfg.task).prompts("train", cfg.num_prompts)
    return policy, rollout(policy, tokenizer, prompts, sampling_of(cfg), kernels(fast).generate)


def test_rollout_samples_the_same_tokens_fast_and_readable():
    policy, fast = _sample(True)
    _, plain = _sample(False)
    assert policy.config._attn_implementation == "sdpa"  # handed back
    assert torch.equal(fast.completion_ids, plain.completion_ids)
    assert torch.allclose(fast.sampler_logps, plain.sampler_logps, atol=1e-4)
    assert (fast.sampler_logps - plain.sampler_logps).abs().max() > 0  # the two paths really differ in rounding


@pytest.mark.parametrize(
    "scoring",
    [
        dict(),
        dict(mask="all_positions"),
        dict(position_ids=False),
        dict(dtype="bfloat16"),
        dict(gather="first_position"),
        dict(support="sampler_support", top_p=0.8, top_k=20),
    ],
    ids=str,
)
def test_fast_scoring_equals_the_readable_forward(scoring):
    """Trimmed padding, and a group's prompt computed once (no grad): the same log-probs as one plain forward."""
    from grpo_debug.fast.scoring import per_token_logps_fast, prompt_is_shared, trim
    from grpo_debug.logprobs import completion_mask
    from grpo_debug.scoring import Scoring, per_token_logps

    policy, r = _sample(True)
    spec = Scoring(temperature=0.7, **scoring)
    scored = completion_mask(r, "all_positions" if spec.score_after_eos else "keep_first_eos")
    tolerance = 0.1 if spec.dtype == "bfloat16" else 2e-5  # bf16 rounding depends on the batch's shape
    with torch.no_grad():
        for rows in ([0, 1, 2, 3], list(range(r.num_samples))):  # one group (its prompt shared), and mixed groups
            part = r.rows(rows)
            fast = per_token_logps_fast(policy, part, spec)
            plain = per_token_logps(policy, part, spec)
            assert fast.shape == plain.shape
            assert ((fast - plain).abs() * scored[rows]).max() <= tolerance
        assert prompt_is_shared(policy, trim(r.rows([0, 1, 2, 3]), True, True)[0], Scoring(temperature=0.7))


def test_fast_update_equals_the_readable_one():
    """Per-sample norms from hooks in the one backward (Conv1D weights' gradient summed from them) against
    one backward per sample; the total gradient and the step against plain autograd."""
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(num_prompts=2, num_generations=3, max_new_tokens=40, learning_rate=1e-3)
    step = GRPOStep(cfg)
    fast = step.run(cfg, until="update")
    readable = step.run(cfg.replace(fast=False), until="update")
    assert torch.equal(fast.rollout.completion_ids, readable.rollout.completion_ids)
    assert torch.allclose(fast.logprobs.policy, readable.logprobs.policy, atol=2e-5)
    assert torch.allclose(
        fast.update.per_sample_grad_norms, readable.update.per_sample_grad_norms, rtol=1e-4, atol=1e-7
    )
    assert fast.update.grad_norm == pytest.approx(readable.update.grad_norm, rel=1e-5)
    assert fast.update.update_norm == pytest.approx(readable.update.update_norm, rel=1e-3)
    assert fast.loss.loss.item() == pytest.approx(readable.loss.loss.item(), abs=1e-6)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], list(range(12)), [0, 1, 4, 5, 8, 9]], ids=["group", "groups", "pairs"])
def test_scoring_a_groups_prompt_once_with_gradients_equals_the_readable_forward(rows):
    """The update's twin (`score_update`): each run of rows sharing a prompt computes it once, gradients flowing
    back through its repeated keys and values; the log-probs and every parameter's gradient as one plain forward's."""
    from grpo_debug.fast.scoring import per_token_logps_and_entropies_per_group, shares_with_grad, trim
    from grpo_debug.logprobs import completion_mask
    from grpo_debug.scoring import Scoring, per_token_logps_and_entropies

    policy, r = _sample(True)
    policy.eval()
    spec = Scoring(temperature=0.7)
    part = r.rows(rows)
    assert shares_with_grad(policy, trim(part, True, True)[0], spec) == (4 if len(rows) != 6 else 2)
    scored = completion_mask(part, "keep_first_eos")
    results = []
    for score in (per_token_logps_and_entropies_per_group, per_token_logps_and_entropies):
        policy.zero_grad(set_to_none=True)
        logps, _ = score(policy, part, spec)
        (logps * scored * torch.linspace(-1, 1, len(rows))[:, None]).sum().backward()  # advantages of both signs
        results.append((logps.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (fast, fast_grads), (plain, plain_grads) = results
    assert ((fast - plain).abs() * scored).max() <= 2e-5, "the log-probs differ beyond float rounding"
    for name, g in plain_grads.items():
        diff = (fast_grads[name] - g).norm() / g.norm().clamp(min=1e-12)
        assert diff <= 1e-4, f"{name}: the gradient differs by {diff:.2e} of its norm"
    policy.zero_grad(set_to_none=True)


@pytest.mark.parametrize("sampling", [dict(), dict(top_p=0.8, top_k=20), dict(min_p=0.1, temperature=1.3)], ids=str)
def test_the_decode_loop_written_out_samples_what_generate_samples(sampling):
    """The GPT-2 decode loop (`fast.decode`) against `generate` itself, warpers and all: the same tokens, the
    sampler's log-probs to float rounding."""
    from grpo_debug.fast.decode import decode_per_prompt, decodes_by_hand
    from grpo_debug.rollout import generate_repeated
    from grpo_debug.task import load_task

    cfg = StepConfig(num_prompts=3, num_generations=4, max_new_tokens=48, task="mixed", **sampling)
    policy, _, tokenizer = load_model()
    assert decodes_by_hand(policy.eval()), "the bundled GPT-2 should take the loop written out"
    prompts = load_task(cfg.task).prompts("train", cfg.num_prompts)
    by_hand = rollout(policy, tokenizer, prompts, sampling_of(cfg), decode_per_prompt)
    plain = rollout(policy, tokenizer, prompts, sampling_of(cfg), generate_repeated)
    assert torch.equal(by_hand.completion_ids, plain.completion_ids), "the loop drew other tokens than generate"
    assert torch.allclose(by_hand.sampler_logps, plain.sampler_logps, atol=1e-4)
    assert torch.allclose(by_hand.sampler_logps_temperature_only, plain.sampler_logps_temperature_only, atol=1e-4)


def test_the_decode_loop_leaves_to_generate_what_it_does_not_reproduce():
    """A repetition penalty in the model's generation config, a train-mode model, bfloat16 weights: `generate`."""
    from grpo_debug.fast.decode import decodes_by_hand

    policy, _, _ = load_model()
    policy.eval()
    assert decodes_by_hand(policy)
    policy.generation_config.repetition_penalty = 1.3
    assert not decodes_by_hand(policy), "a repetition penalty is not reproduced by the loop"
    policy.generation_config.repetition_penalty = 1.0
    policy.train()
    assert not decodes_by_hand(policy), "dropout on: one mask per sample is generate's"
    policy.eval()
    assert not decodes_by_hand(policy.to(torch.bfloat16)), "bfloat16 weights round otherwise"


def test_a_groups_prompt_is_computed_once_only_where_it_may_be():
    """Dropout, bfloat16, no position_ids, a train-mode model or no gradient: the plain forward."""
    from grpo_debug.fast.scoring import shares_with_grad, trim
    from grpo_debug.scoring import Scoring

    policy, r = _sample(True)
    policy.eval()
    part = trim(r.rows([0, 1, 2, 3]), True, True)[0]
    assert shares_with_grad(policy, part, Scoring(temperature=0.7)) == 4
    for spec in (Scoring(temperature=0.7, dropout=True), Scoring(temperature=0.7, dtype="bfloat16")):
        assert shares_with_grad(policy, part, spec) == 1, spec
    assert shares_with_grad(policy, part, Scoring(temperature=0.7, position_ids=False)) == 1
    with torch.no_grad():
        assert shares_with_grad(policy, part, Scoring(temperature=0.7)) == 1
    policy.train()
    assert shares_with_grad(policy, part, Scoring(temperature=0.7)) == 1
    policy.eval()


def test_the_fast_update_without_per_sample_norms_equals_the_readable_one():
    """The step TRL's benchmark row times: no per-sample norms, so the update scores each group's prompt once."""
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(
        num_prompts=2, num_generations=4, max_new_tokens=40, learning_rate=1e-3, per_sample_grad_norms=False
    )
    step = GRPOStep(cfg)
    fast = step.run(cfg, until="update")
    readable = step.run(cfg.replace(fast=False), until="update")
    assert torch.equal(fast.rollout.completion_ids, readable.rollout.completion_ids)
    assert fast.update.grad_norm == pytest.approx(readable.update.grad_norm, rel=1e-5)
    assert fast.update.update_norm == pytest.approx(readable.update.update_norm, rel=1e-3)
    assert fast.update.loss == pytest.approx(readable.update.loss, abs=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_keeping_the_completions_logits_only_gives_the_same_logits(dtype, tmp_path):
    """Without a gradient, `completion_logits` asks the model for the last C + 1 positions' logits alone
    (`logits_to_keep`): bit for bit the slice of every position's, on GPT-2 and on a Qwen2 (its LM head's rows are
    computed one by one, whatever the other rows)."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from arithmetic_task import build_tiny_qwen2

    from grpo_debug.scoring import Scoring, completion_logits, keeps_logits

    policy, r = _sample(True)
    qwen2 = load_model(build_tiny_qwen2(tmp_path / "qwen2")).policy
    spec = Scoring(temperature=0.7, dtype=dtype)
    P, C = r.prompt_ids.shape[1], r.completion_ids.shape[1]
    for model in (policy, qwen2):
        assert keeps_logits(model), f"{type(model).__name__} takes no logits_to_keep"
        V = model.config.vocab_size
        rows = dataclasses.replace(r.rows(list(range(8))), prompt_ids=r.prompt_ids[:8] % V)
        rows = dataclasses.replace(rows, completion_ids=rows.completion_ids % V)
        with torch.no_grad():
            kept = completion_logits(model, rows, spec)
        with torch.enable_grad():
            every = completion_logits(model, rows, spec).detach()  # with a gradient: every position's logits
        assert kept.shape == every.shape == (8, C, model.config.vocab_size) and P > 0
        assert torch.equal(kept, every), f"{type(model).__name__}: the kept logits differ from the slice"
