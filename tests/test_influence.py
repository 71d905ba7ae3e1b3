"""TracIn: hook-based influence equals the naive reference; the same-batch self-term follows its derived
relation for each validation loss; the optimizer-aware score is the inner product with AdamW's own step;
TracIn's first-order prediction holds for small SGD steps; validation and test prompts never meet."""

import dataclasses

import pytest
import torch
from test_per_sample import naive_per_sample_gradients

from grpo_debug.config import StepConfig
from grpo_debug.step import GRPOStep
from grpo_debug.tracin.influence import (
    ValidationSet,
    _val_share,
    batch_influence,
    influence_scores,
    per_sample_train_gradients,
    validation_gradient,
)
from grpo_debug.tracin.specs import specs_of

CFG = StepConfig(num_prompts=3, num_generations=4, beta=0.0, max_new_tokens=104)
SPEC = specs_of(CFG)


@pytest.fixture(scope="module")
def setup():
    step = GRPOStep(CFG)
    run = step.run(CFG, until="loss")
    val = ValidationSet(run.rollout, run.logprobs, run.advantages.values, run.rewards.total)
    return step, run, val


@pytest.fixture(scope="module")
def naive_train(setup):
    step, run, _ = setup
    return naive_per_sample_gradients(step.policy, run, CFG).double()


def _flat(grads: dict, params) -> torch.Tensor:
    return torch.cat([grads[p].flatten() for p in params])


@pytest.mark.parametrize("kind", ["seqloss-lastadv", "seqloss-reward"])
def test_influence_equals_naive_inner_products(setup, naive_train, kind):
    step, run, val = setup
    model = step.policy
    grads = per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, SPEC)
    _, val_grad = validation_gradient(model, val, SPEC, kind)
    fast = influence_scores(grads, val_grad)
    params = [p for p in model.parameters() if p.requires_grad]
    # float64 products: a float32 dot product over 2.8M entries was itself off by 2e-3 relative here
    naive = naive_train @ _flat(val_grad, params).double()
    assert torch.allclose(fast.double(), naive, rtol=1e-5, atol=1e-5 * naive.abs().max().item())
    streamed = batch_influence(model, run.rollout, run.logprobs, run.advantages.values, SPEC, val_grad)
    assert torch.allclose(streamed, fast, rtol=1e-6, atol=1e-6 * fast.abs().max().item())


def _naive_val_shares(model, val, spec, kind) -> torch.Tensor:
    """(N, P) autograd gradient of each sample's share of L_val, one backward per sample."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(val.rollout.num_samples):
        out.append(
            torch.cat([g.flatten() for g in torch.autograd.grad(_val_share(model, val, spec, kind, [i]), params)])
        )
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["seqloss-lastadv", "seqloss-reward"])
def test_same_batch_self_term_follows_the_derived_relation(setup, naive_train, kind):
    """g_val_i = (c_val_i / c_train_i) g_train_i for every sample with a gradient, so the self-term is
    that ratio times ||g_train_i||^2: >= 0 for seqloss-lastadv (ratio T_i under grpo), of the sign of
    A_i * r_i for seqloss-reward (negative for some samples of this batch)."""
    from grpo_debug.tracin.influence import (
        self_terms,
        self_terms_from_norms,
        train_coefficients,
        validation_coefficients,
    )

    step, run, val = setup
    model = step.policy
    g_train = naive_train
    g_val = _naive_val_shares(model, val, SPEC, kind).double()
    c_train = train_coefficients(run.advantages.values, run.logprobs.mask, SPEC)
    c_val = validation_coefficients(val, kind)
    moved = c_train != 0
    ratio = c_val[moved] / c_train[moved]
    scale = g_val.abs().max().item()
    assert torch.allclose(g_val[moved], ratio.unsqueeze(1) * g_train[moved], atol=1e-5 * scale)
    autograd = (g_train * g_val).sum(1)
    hooks = per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, SPEC)
    by_relation = self_terms_from_norms(hooks.squared_norms(), c_train, c_val)
    measured = self_terms(model, hooks, val, SPEC, kind).double()
    tol = 1e-5 * autograd.abs().max().item()
    assert torch.allclose(by_relation, autograd, rtol=1e-5, atol=tol)
    assert torch.allclose(measured, autograd, rtol=1e-4, atol=tol)
    tokens = run.logprobs.mask.sum(1).double()
    if kind == "seqloss-lastadv":  # grpo: the ratio is exactly T_i, not 1 / N_val
        assert torch.allclose(ratio, tokens[moved]) and (autograd >= -tol).all()
    else:
        product = run.advantages.values.double() * run.rewards.total.double()
        big = autograd.abs() > tol
        assert torch.equal(torch.sign(autograd[big]), torch.sign(product[big]))
        assert (autograd < -tol).any()  # the "self-term >= 0" claim fails here


def test_train_coefficients_refuse_a_kl_term(setup):
    from grpo_debug.tracin.influence import train_coefficients

    _, run, _ = setup
    with pytest.raises(ValueError, match="beta"):
        train_coefficients(run.advantages.values, run.logprobs.mask, specs_of(CFG.replace(beta=0.04)))


def test_adam_direction_is_torch_adamw_step():
    """Fresh and warmed states, with clipping: the update map against torch's AdamW doing the steps."""
    from grpo_debug.tracin.optimizer import adam_direction, clip_by_total_norm, warmed_state

    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(4, generator=g))]
    batch = {p: torch.randn(p.shape, generator=g) for p in params}
    grad = {p: 0.3 * torch.randn(p.shape, generator=g) for p in params}
    for warm in ("fresh", "batch"):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        optimizer = torch.optim.AdamW(copies, lr=1.0, weight_decay=0.0)
        for step_grads in ([batch] if warm == "batch" else []) + [grad]:
            before = [c.detach().clone() for c in copies]
            for c, p in zip(copies, params):
                c.grad = step_grads[p].clone()
            torch.nn.utils.clip_grad_norm_(copies, 1.0)
            optimizer.step()
        expected = {p: b - c.detach() for p, b, c in zip(params, before, copies)}
        state = warmed_state(params, batch, warm, max_grad_norm=1.0)
        direction = adam_direction(clip_by_total_norm(grad, 1.0), state)
        for p in params:
            assert torch.allclose(direction[p], expected[p], atol=1e-6), warm
    fresh = adam_direction(grad, warmed_state(params, batch, "fresh", 0.0))
    assert all(torch.allclose(fresh[p].abs(), torch.ones_like(fresh[p]), atol=1e-5) for p in params)  # ~sign(g)


@pytest.mark.parametrize("score", ["adam", "adam_batch"])
def test_optimizer_aware_score_is_the_inner_product_with_adamw_steps(setup, score):
    """scores_for(..., 'adam'|'adam_batch') against <g_val, theta_before - theta_after> of torch's AdamW at
    lr 1 on a copy of the weights, sample by sample (the batch warm-up step taken by torch too)."""
    from grpo_debug.tracin.first_order import scores_for

    step, run, val = setup
    model = step.policy
    train = per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, SPEC).gradients()
    _, val_grad = validation_gradient(model, val, SPEC, "seqloss-lastadv")
    params = list(train)
    fast = scores_for(train, val_grad, SPEC, score)
    independent = []
    for i in range(len(fast)):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        optimizer = torch.optim.AdamW(copies, lr=1.0, weight_decay=0.0)
        steps = ([lambda p: train[p].sum(0)] if score == "adam_batch" else []) + [lambda p, i=i: train[p][i]]
        for grad_of in steps:
            before = [c.detach().clone() for c in copies]
            for c, p in zip(copies, params):
                c.grad = grad_of(p).clone()
            torch.nn.utils.clip_grad_norm_(copies, CFG.max_grad_norm)
            optimizer.step()
        independent.append(
            sum(
                (val_grad[p].double() * (b - c.detach()).double()).sum() for p, b, c in zip(params, before, copies)
            ).item()
        )
    independent = torch.tensor(independent, dtype=torch.float64)
    assert torch.allclose(fast.double(), independent, rtol=1e-4, atol=1e-5 * independent.abs().max().item())
    assert not torch.allclose(fast.double(), scores_for(train, val_grad, SPEC, "tracin"), rtol=0.1)


def test_sgd_single_sample_steps_agree_with_the_first_order_prediction(setup):
    """A real SGD step of lr 1e-4 on each sample alone changes L_val by -lr * influence_i to 5% (the
    second-order term) plus 5e-6 (float32 noise of L_val ~ 1.7, measured ~3e-6 here)."""
    from grpo_debug.tracin.first_order import first_order_checks

    step, run, val = setup
    (check,) = first_order_checks(
        step.policy,
        run.rollout,
        run.logprobs,
        run.advantages.values,
        SPEC,
        val,
        lrs={"sgd": 1e-4},
        pairs=(("tracin", "sgd"),),
    )
    assert check.moved >= 8
    assert ((check.measured - check.predicted).abs() <= 0.05 * check.predicted.abs() + 5e-6).all()
    assert check.spearman > 0.9 and check.sign_agreement == 1.0


def test_flip_sign_negates_the_validation_gradient_exactly(setup):
    """The TracIn-sign report's flip is an identity on the scores (no evidence either way): it negates grad L_val."""
    step, run, val = setup
    _, right = validation_gradient(step.policy, val, SPEC, "seqloss-lastadv")
    _, flipped = validation_gradient(step.policy, val, SPEC, "seqloss-lastadv", flip_sign=True)
    assert all(torch.equal(flipped[p], -right[p]) for p in right)


def test_validation_pool_and_test_prompts_are_disjoint(setup):
    from grpo_debug.tracin.influence import validation_pool, validation_set

    step, run, _ = setup
    test_prompts = set(step.task.prompts("test", 256))
    for source in ("random", "topk"):
        val = validation_set(run, source, 4, validation_pool(step.validation_run(8)))
        assert val.prompt_set == "validation" and val.name == f"{source} 4"
        used = set(val.rollout.prompts)
        assert used and used.isdisjoint(test_prompts) and used.isdisjoint(run.rollout.prompts)
    assert set(run.rollout.prompts).isdisjoint(test_prompts)
    with pytest.raises(ValueError, match="pool"):
        validation_set(run, "random", 4)
    with pytest.raises(ValueError, match="'validation' prompts"):
        validation_pool(run)  # the training batch is no pool


def test_validation_advantages_per_group_and_whole_set(setup):
    from grpo_debug.advantages import compute_advantages
    from grpo_debug.tracin.influence import validation_pool, validation_set

    step, run, _ = setup
    pool = validation_pool(step.validation_run(16))
    for source in ("random", "topk"):
        per_group = validation_set(run, source, 8, pool, "per_group")
        whole = validation_set(run, source, 8, pool, "whole_set")
        assert torch.equal(per_group.rewards, whole.rewards)
        assert (
            torch.allclose(whole.advantages, compute_advantages(whole.rewards, 8))
            and whole.advantages.sum().abs() < 1e-4
        )
    random = validation_set(run, "random", 8, pool, "per_group")
    assert torch.allclose(random.advantages, compute_advantages(random.rewards, CFG.num_generations))
    same = validation_set(run, "same_batch", val_advantages="per_group")
    assert torch.equal(same.advantages, run.advantages.values)
    with pytest.raises(ValueError, match="val_advantages"):
        validation_set(run, "random", 8, pool, "one_group")


def test_sign_tolerance_counts_float_noise_as_zero():
    from grpo_debug.tracin.influence import sign_fractions, signs
    from grpo_debug.tracin.selection import select

    scores = torch.tensor([0.3, -0.1, 1e-12, 2.0, -5.0, 1.0, -3e-11])
    assert signs(scores).tolist() == [1, -1, 0, 1, -1, 1, 0]
    assert sign_fractions(scores) == pytest.approx({"> 0": 3 / 7, "= 0": 2 / 7, "< 0": 2 / 7})
    assert select(scores, "influence>0").tolist() == [0, 3, 5]
    assert select(scores, "influence<0").tolist() == [1, 4]


def test_selection_strategies_keep_what_they_say():
    from grpo_debug.tracin.selection import select

    scores = torch.tensor([0.3, -0.1, 0.0, 2.0, -5.0, 1.0])
    assert select(scores, "all").tolist() == [0, 1, 2, 3, 4, 5]
    assert select(scores, "influence>0").tolist() == [0, 3, 5]
    assert select(scores, "top_half").tolist() == [0, 3, 5]
    assert select(scores, "bottom_half").tolist() == [1, 2, 4]
    random_half = select(scores, "random_half", seed=1)
    assert len(random_half) == 3 and torch.equal(random_half, select(scores, "random_half", seed=1))
    with pytest.raises(ValueError, match="selection must be one of"):
        select(scores, "best")


def test_selection_under_sgd_and_adamw_lowers_l_val_and_reports_its_sets(setup):
    from grpo_debug.tracin.influence import validation_pool, validation_set
    from grpo_debug.tracin.selection import held_out_baseline, influence_of_batch, selection_experiment

    step, run, _ = setup
    model, tokenizer = step.policy, step.loaded.tokenizer
    val = validation_set(run, "random", 16, validation_pool(step.validation_run(16)))
    scores = influence_of_batch(model, run, SPEC, val)
    weights = [p.detach().clone() for p in model.parameters()]
    baseline = held_out_baseline(model, tokenizer, step.task, SPEC, 4)
    for optimizer in ("sgd", "adamw"):
        results = {
            r.strategy: r
            for r in selection_experiment(
                model,
                run,
                SPEC,
                tokenizer,
                step.task,
                val,
                scores,
                strategies=("top_half", "bottom_half"),
                optimizer=optimizer,
                eval_prompts=4,
                baseline=baseline,
            )
        }
        top, bottom = results["top_half"], results["bottom_half"]
        assert top.val_loss_after < bottom.val_loss_after and top.val_loss_after < top.val_loss_before, optimizer
        assert top.reward_prompts == "test" and top.val_set == "random 16 (validation prompts)"
        assert top.optimizer == optimizer and (top.lr == CFG.learning_rate) == (optimizer == "adamw")
        assert top.reward_ci_low <= top.reward_delta <= top.reward_ci_high
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # restored


def test_explorer_cache_is_keyed_on_what_the_scores_depend_on():
    from grpo_debug.ui.influence import InfluenceCache, InfluenceChoice, InfluenceExplorer, score_key

    assert score_key(CFG) == score_key(CFG.replace(kl_estimator="k1", learning_rate=1.0, eval_prompts=2))
    assert score_key(CFG.replace(beta=0.1)) != score_key(CFG.replace(beta=0.1, kl_estimator="k1"))
    cfg = CFG.replace(num_prompts=2)
    step = GRPOStep(cfg)
    run = step.run(cfg, until="loss")
    cache = InfluenceCache(step.validation_run, pool_size=8)
    choice = InfluenceChoice(source="random", size=8)
    first = cache.scores(step.policy, run, choice)
    k1 = step.run(cfg.replace(kl_estimator="k1"), until="loss")  # beta = 0: the estimator multiplies nothing
    assert cache.is_cached(k1, choice) and torch.equal(cache.scores(step.policy, k1, choice), first)
    k1_beta = step.run(cfg.replace(kl_estimator="k1", beta=0.1), until="loss")
    assert not cache.is_cached(k1_beta, choice)
    assert not torch.equal(
        cache.scores(step.policy, k1_beta, choice), first
    )  # k1's gradient at step 0 is beta * grad logp
    flipped = dataclasses.replace(choice, flip_sign=True)
    assert torch.equal(cache.scores(step.policy, k1_beta, flipped), -cache.scores(step.policy, k1_beta, choice))
    explorer = InfluenceExplorer(step, cache=cache)  # the panel's entry: follows the step's current run
    assert explorer.is_cached(choice) and torch.equal(
        explorer.scores(choice), cache.scores(step.policy, k1_beta, choice)
    )


@pytest.mark.parametrize("model_kind", ["bundled", "random_gpt2"])
@pytest.mark.parametrize("param_set", ["all", "blocks", "lora"])
def test_influence_equals_naive_for_every_parameter_set(setup, model_kind, param_set):
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_debug.tracin.influence import lora_model, parameter_set

    step, run, val = setup
    model = step.policy
    if model_kind == "random_gpt2":
        torch.manual_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(vocab_size=len(step.loaded.tokenizer), n_positions=256, n_embd=32, n_layer=2, n_head=2)
        ).eval()
    if param_set == "lora":
        model = lora_model(model)
        with torch.no_grad():  # peft starts B at 0; move it so that A has a gradient too
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
    with parameter_set(model, param_set):
        params = [p for p in model.parameters() if p.requires_grad]
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        assert names and all(("lora_" in n) == (param_set == "lora") for n in names)
        assert (param_set == "all") == any("wte" in n for n in names)
        _, val_grad = validation_gradient(model, val, SPEC, "seqloss-lastadv")
        fast = influence_scores(
            per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, SPEC), val_grad
        )
        naive = naive_per_sample_gradients(model, run, CFG).double() @ _flat(val_grad, params).double()
    assert torch.allclose(fast.double(), naive, rtol=1e-5, atol=1e-5 * naive.abs().max().item())
    assert all(p.requires_grad for p in step.policy.parameters())  # the set is restored afterwards
