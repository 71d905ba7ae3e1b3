"""The tables notebook 05 reads from `grpo_debug.show.loss_gradients`: the loss types at ratio 1 beside a normaliser
written out, the clip case by case on a per-token loss written out, and one token's terms as the engine computes them."""

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.loss import loss_weights
from grpo_debug.show.loss_gradients import TOKEN_LEVEL, clip_cases, loss_types_at_ratio_one, one_token_from_engine
from grpo_debug.step import GRPOStep

SMALL = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, beta=0.04, task="policy")


def per_token_loss(logp, old, ref, A, beta, eps_low=0.2, eps_high=0.2):
    """Notebook 05's exercise 2: the clipped surrogate plus beta k3, per token."""
    rho = torch.exp(logp - old)
    d = ref - logp
    return -torch.min(rho * A, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * A) + beta * (torch.exp(d) - d - 1)


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(SMALL)
    s.run(until="loss")
    return s


def test_the_clip_cuts_the_gradient_only_past_the_region_in_the_advantages_direction():
    cases = clip_cases(per_token_loss, epsilon=0.2)
    grads = cases.set_index(["A", "rho"])["d l / d log pi"]
    cut = {(1.0, 1.3), (-1.0, 0.7)}
    for (A, rho), grad in grads.items():
        assert grad == (0.0 if (A, rho) in cut else pytest.approx(-rho * A, abs=1e-6)), (A, rho, grad)
    takes_rho_a = cases["the min takes"] == "rho A"
    assert takes_rho_a.tolist() == [(A, rho) not in cut for A, rho in grads.index]
    assert cases["rho is"].tolist() == ["below 1 - eps", "inside", "above 1 + eps"] * 2


def test_the_loss_types_at_ratio_one_match_a_normaliser_written_out(step):
    run = step.run(SMALL, until="loss")
    lp, A = run.logprobs, run.advantages.values
    assert A.abs().max() > 0 and lp.mask.sum(-1).unique().numel() > 1  # a gradient, and lengths that differ
    terms = per_token_loss(lp.policy, lp.policy, lp.reference, A[:, None], SMALL.beta) * lp.mask
    by_hand = lambda lt: (terms * loss_weights(lp.mask, lt, SMALL.max_new_tokens)).sum().item()
    table = loss_types_at_ratio_one(step, SMALL, by_hand)
    token_level = table.loc[list(TOKEN_LEVEL)]
    assert (token_level["loss"] - token_level["by hand"]).abs().max() < 1e-6
    assert (token_level["loss/policy"] - token_level["-sum A_i w_i"]).abs().max() < 1e-6
    assert abs(table.loc["grpo", "loss/policy"]) < 1e-6  # centred advantages, each completion weighted 1/N
    assert table.loc[["reinforce_sum", "reinforce_mean"], ["by hand", "-sum A_i w_i"]].isna().all().all()
    assert (table["|d loss / d logp|"] > 0).all()  # a loss of ~0 with a gradient


def test_a_normaliser_written_for_grpo_only_leaves_the_other_rows_nan(step):
    run = step.run(SMALL, until="loss")
    lp, A = run.logprobs, run.advantages.values
    terms = per_token_loss(lp.policy, lp.policy, lp.reference, A[:, None], SMALL.beta) * lp.mask
    weights = {"grpo": loss_weights(lp.mask, "grpo", SMALL.max_new_tokens)}  # a student's first row: KeyError after
    table = loss_types_at_ratio_one(step, SMALL, lambda lt: (terms * weights[lt]).sum().item())
    assert table["by hand"].notna().tolist() == [True, False, False, False, False, False]
    assert abs(table.loc["grpo", "loss"] - table.loc["grpo", "by hand"]) < 1e-6


def test_one_token_from_the_engine_at_ratio_one_is_minus_its_advantage_times_its_weight(step):
    run = step.run(SMALL, until="loss")
    lp, A = run.logprobs, run.advantages.values
    i, N = int(A.abs().argmax()), lp.mask.shape[0]
    terms = {
        k: v.item()
        for k, v in one_token_from_engine(SMALL, lp, A, {"pass 1": lp.policy}, "grpo", i, 0)["pass 1"].items()
    }
    weight = 1 / (N * lp.mask[i].sum().item())
    assert terms["rho"] == 1 and terms["beta k3"] == 0  # pi_theta is pi_old and the reference
    assert terms["l_it"] == pytest.approx(-A[i].item(), abs=1e-6)
    assert terms["share (grpo)"] == pytest.approx(-A[i].item() * weight, rel=1e-5)
    assert terms["d loss / d logp (grpo)"] == pytest.approx(-A[i].item() * weight, rel=1e-5)
    assert set(terms) == {"rho", "beta k3", "l_it", "share (grpo)", "d loss / d logp (grpo)"}
