"""Hook-based per-sample gradients against the naive reference: one backward per sample."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from grpo_debug.config import StepConfig
from grpo_debug.fast.per_sample import PerSampleGradients, SampleGradients
from grpo_debug.loss import Batch, Normalisation, loss_weights
from grpo_debug.specs import loss_spec_of, optimization_of, scoring_of
from grpo_debug.speed import kernels
from grpo_debug.step import GRPOStep
from grpo_debug.update import scored_rows_loss


def _share(model, run, cfg, rows):
    """These samples' share of the batch loss (the batch normalisation held fixed)."""
    weights = loss_weights(run.logprobs.mask, cfg.loss_type, cfg.max_new_tokens)
    batch = Batch(run.rollout, run.logprobs, run.advantages.values)
    score = kernels(model.config.model_type == "gpt2").score
    return scored_rows_loss(model, batch, scoring_of(cfg), loss_spec_of(cfg), Normalisation(weights), rows, score)[0]


def naive_per_sample_gradients(model, run, cfg):
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(run.rollout.num_samples):
        model.zero_grad(set_to_none=True)
        _share(model, run, cfg, [i]).backward()
        out.append(torch.cat([p.grad.flatten() for p in params]))
    model.zero_grad(set_to_none=True)
    return torch.stack(out)


def hook_per_sample_gradients(model, run, cfg):
    params = [p for p in model.parameters() if p.requires_grad]
    hooks = PerSampleGradients(model)
    with hooks.capture():
        _share(model, run, cfg, list(range(run.rollout.num_samples))).backward()
    captured = SampleGradients.of(hooks)
    grads = captured.gradients()
    model.zero_grad(set_to_none=True)
    assert set(map(id, grads)) == set(map(id, params))  # every parameter set is covered
    return torch.cat([grads[p].flatten(1) for p in params], dim=1), captured.norms()


@pytest.mark.parametrize("model_kind", ["bundled", "random_gpt2"])
@pytest.mark.parametrize("beta,loss_type", [(0.04, "grpo"), (0.0, "dr_grpo"), (0.1, "bnpo")])
def test_hooks_equal_the_naive_reference(model_kind, beta, loss_type):
    cfg = StepConfig(num_prompts=2, num_generations=3, beta=beta, loss_type=loss_type, max_new_tokens=40)
    step = GRPOStep(cfg)
    run = step.run(cfg, until="loss")
    model = step.policy
    if model_kind == "random_gpt2":
        torch.manual_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(vocab_size=len(step.loaded.tokenizer), n_positions=256, n_embd=32, n_layer=2, n_head=2)
        ).eval()
    # a perturbed policy, so the ratio, the clipping and the KL are all away from their step-0 values
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    naive = naive_per_sample_gradients(model, run, cfg)
    fast, norms = hook_per_sample_gradients(model, run, cfg)
    assert torch.allclose(fast, naive, rtol=1e-5, atol=1e-5 * naive.abs().max().item())
    # float64 reference: torch's float32 norm over millions of entries was off by 6e-4 here
    assert torch.allclose(norms.double(), naive.double().norm(dim=1), rtol=1e-5)


def test_ghost_products_equal_building_the_gradients():
    """Gram ("ghost") inner products against materialised ones, for every pairing of dense and lookup
    factors that a tied embedding / LM head produces, and the dot with a vector."""
    from grpo_debug.fast.per_sample import Outer, inner

    g = torch.Generator().manual_seed(0)
    N, T, S, V, d = 3, 7, 5, 11, 4
    head = Outer(torch.randn(N, T, V, generator=g), torch.randn(N, T, d, generator=g), V)
    emb = Outer(torch.randint(0, V, (N, S), generator=g), torch.randn(N, S, d, generator=g), V)
    for a in (head, emb):
        for b in (head, emb):
            built = (a.materialize().double() * b.materialize().double()).flatten(1).sum(1)
            assert torch.allclose(inner(a, b, ghost=True), built, rtol=1e-6)
            assert torch.allclose(inner(a, b, ghost=False), built, rtol=1e-6)
        vector = torch.randn(V, d, generator=g)
        exact = (a.materialize().double() * vector.double()).flatten(1).sum(1)
        assert torch.allclose(a.dot(vector), exact, rtol=1e-5, atol=1e-6 * exact.abs().max().item())  # float32 sums


@pytest.mark.parametrize("call_with", ["input_ids", "inputs_embeds"])
def test_tied_embedding_norms_without_materialising_match_naive_on_a_wide_vocab(call_with):
    """A GPT-2 whose vocabulary is much wider than a sequence: the tied wte / lm_head take the ghost path.
    GPT-2 builds (1, T) position ids itself here, with token ids or with embeddings passed in."""
    from grpo_debug.fast.per_sample import Outer, _ghost_is_cheaper

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=4000, n_positions=64, n_embd=48, n_layer=1, n_head=2)).eval()
    ids = torch.randint(0, 4000, (3, 12))

    def per_sample_loss(rows):
        inputs = (
            {"input_ids": ids[rows]}
            if call_with == "input_ids"
            else {"inputs_embeds": model.transformer.wte(ids[rows])}
        )
        logits = model(**inputs).logits
        return logits.log_softmax(-1)[:, :-1].gather(-1, ids[rows, 1:, None]).sum() * 0.1

    naive = []
    for i in range(3):
        model.zero_grad(set_to_none=True)
        per_sample_loss([i]).backward()
        naive.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    naive = torch.stack(naive).double().norm(dim=1)
    hooks = PerSampleGradients(model)
    with hooks.capture():
        per_sample_loss([0, 1, 2]).backward()
    captured = SampleGradients.of(hooks)
    tied = captured.chunks[0][model.lm_head.weight]
    assert len(tied) == 2 and all(_ghost_is_cheaper(a, b) for a in tied for b in tied if isinstance(a, Outer))
    assert torch.allclose(captured.norms().double(), naive, rtol=1e-5)


def test_update_builds_block_gradients_from_per_sample_ones_exactly():
    """With norms on, `update` takes the Conv1D weights' batch gradient as the sum of their per-sample
    gradients (autograd skips them): the norms equal the naive ones and the step equals autograd's."""
    from grpo_debug.fast.backward import HookedNorms
    from grpo_debug.update import update

    cfg = StepConfig(num_prompts=2, num_generations=3, max_new_tokens=40, learning_rate=1e-3)
    step = GRPOStep(cfg)
    run = step.run(cfg, until="loss")
    model, start = step.policy, {k: v.clone() for k, v in step.policy.state_dict().items()}
    naive = naive_per_sample_gradients(model, run, cfg).double().norm(dim=1)
    after = {}
    for norms in (False, True):
        model.load_state_dict(start)
        result = update(
            model,
            Batch(run.rollout, run.logprobs, run.advantages.values),
            scoring_of(cfg),
            loss_spec_of(cfg),
            optimization_of(cfg),
            per_sample_grad_norms=norms,
            norms=HookedNorms(),
        )
        after[norms] = ({k: v.clone() for k, v in model.state_dict().items()}, result)
    model.load_state_dict(start)
    assert torch.allclose(after[True][1].per_sample_grad_norms.double(), naive, rtol=1e-5)
    assert after[True][1].grad_norm == pytest.approx(after[False][1].grad_norm, rel=1e-6)
    assert after[True][1].update_norm == pytest.approx(after[False][1].update_norm, rel=1e-5)
    # AdamW's first step is about lr * sign(g): rounding moves only the few entries whose |g| is near its
    # eps (one of 2.9M by 1.3% of lr on this batch); a wrong gradient would move many by up to 2 x lr
    diffs = torch.cat([(after[True][0][k] - after[False][0][k]).abs().flatten() for k in start])
    assert (diffs > 0.01 * cfg.learning_rate).float().mean() < 1e-5 and diffs.max() < 0.1 * cfg.learning_rate
    assert all(p.requires_grad for p in model.parameters())  # the built weights are handed back to autograd


def _random_model(kind: str, vocab: int):
    """A tiny random model of each normalisation family transformers' decoders use."""
    from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, Qwen2Config

    torch.manual_seed(0)
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        head_dim=16,
    )
    config = {"llama": LlamaConfig, "qwen2": Qwen2Config, "gemma2": Gemma2Config}[kind](**common)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_rmsnorm_models_get_exact_per_sample_gradients_for_every_parameter(kind):
    """RMSNorm (Llama, Qwen2; Gemma's 1 + weight) has a rule: each parameter's per-sample gradient from the
    hooks equals autograd's one backward per sample."""
    cfg = StepConfig(num_prompts=2, num_generations=2, beta=0.04, max_new_tokens=24)
    step = GRPOStep(cfg)
    run = step.run(cfg, until="loss")
    model = _random_model(kind, len(step.loaded.tokenizer))
    with torch.no_grad():  # RMSNorm weights away from their initial ones (and zeros), so every rule is exercised
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    params = [p for p in model.parameters() if p.requires_grad]
    naive = naive_per_sample_gradients(model, run, cfg)
    fast, _ = hook_per_sample_gradients(model, run, cfg)
    start = 0
    for name, p in model.named_parameters():
        width = p.numel()
        assert torch.allclose(fast[:, start : start + width], naive[:, start : start + width], rtol=1e-4, atol=1e-6), (
            name
        )
        start += width
    assert start == naive.shape[1] and len(params) > 0
    assert any("norm" in name for name, _ in model.named_parameters())


def test_a_trainable_parameter_without_a_rule_is_refused_by_name():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=32, n_embd=8, n_layer=1, n_head=2))
    model.transformer.h[0].mlp.register_parameter("scale", torch.nn.Parameter(torch.ones(8)))
    with pytest.raises(ValueError, match=r"transformer\.h\.0\.mlp \(GPT2MLP\)"):
        with PerSampleGradients(model).capture():
            pass


def test_the_blocks_parameter_set_is_found_by_module_type():
    from grpo_debug.tracin.influence import block_parameter_names

    llama = _random_model("llama", 16)
    names = block_parameter_names(llama)
    assert names and all(n.startswith("model.layers.") for n in names)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=32, n_embd=8, n_layer=1, n_head=2))
    assert all(n.startswith("transformer.h.") for n in block_parameter_names(gpt2))
