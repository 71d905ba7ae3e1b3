"""Reading a group's prompt once: the same attention, the same samples, as the plain path."""

import contextlib

import torch

import grpo_debug.shared_prompt as shared_prompt_module
from grpo_debug.config import StepConfig
from grpo_debug.model import load_model
from grpo_debug.rollout import rollout
from grpo_debug.shared_prompt import shared_prompt_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward


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
    expected, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=D ** -0.5)
    layer._shared_prompt = (prompt_len, G)
    shared, _ = shared_prompt_attention(layer, query, key, value, mask, scaling=D ** -0.5)
    assert shared.shape == expected.shape
    assert torch.allclose(shared, expected, atol=1e-6)


def test_rollout_samples_the_same_tokens_with_and_without_it(monkeypatch):
    cfg = StepConfig(num_prompts=3, num_generations=4, max_new_tokens=48, task="mixed")
    policy, _, tokenizer = load_model()
    shared = rollout(policy, tokenizer, cfg)
    monkeypatch.setattr(shared_prompt_module, "attending_once_per_group", lambda *a: contextlib.nullcontext())
    plain = rollout(policy, tokenizer, cfg)
    assert policy.config._attn_implementation == "sdpa"  # handed back
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.allclose(shared.sampler_logps, plain.sampler_logps, atol=1e-4)
    assert (shared.sampler_logps - plain.sampler_logps).abs().max() > 0  # the two paths really differ in rounding
