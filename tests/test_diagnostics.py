"""torch.compile on the log-prob scoring: the compiled model gives the eager numbers, or a failure is reported."""

import math
import shutil

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.show.diagnostics import compile_comparison
from grpo_debug.step import GRPOStep

ONE_GROUP = StepConfig(num_prompts=1, num_generations=8, max_new_tokens=48, task="policy")


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(ONE_GROUP)
    s.run(until="rollout")
    return s


@pytest.mark.slow  # `make test-slow`: inductor compiles the model (a minute)
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor's CPU backend needs a C++ compiler"
)
def test_compiled_logps_match_eager(step):
    result = compile_comparison(step, rows=8, repeats=1)
    assert result.error == ""
    assert result.rows == 8
    assert result.max_abs_diff < 1e-4, result


def test_a_compile_failure_is_a_result_not_an_exception(step):
    result = compile_comparison(step, rows=8, repeats=1, backend="no-such-backend")
    assert "no-such-backend" in result.error
    assert math.isnan(result.max_abs_diff) and result.eager_seconds > 0


def test_triage_says_why_the_value_is_what_it_is_per_loss_type(step):
    from grpo_debug.show.diagnostics import triage_zero_loss
    from grpo_debug.show.loss_gradients import loss_value_at_ratio_one

    grpo = step.run(ONE_GROUP, until="loss")
    assert triage_zero_loss(grpo).startswith("NORMAL") and "(~0)" in triage_zero_loss(grpo)
    dapo = step.run(ONE_GROUP.replace(loss_type="dapo", beta=0.0), until="loss")
    message = triage_zero_loss(dapo)
    assert message.startswith("NORMAL") and "T_i" in message
    # the value TRL's dapo reports at ratio 1 is the advantage-length covariance, not ~0
    assert dapo.loss.loss.item() == pytest.approx(loss_value_at_ratio_one(dapo), abs=1e-6)


def test_triage_sees_identical_rewards_that_trl_counts_as_varied(step):
    import dataclasses

    from grpo_debug.advantages import summarize_advantages
    from grpo_debug.show.diagnostics import triage_zero_loss

    run = step.run(ONE_GROUP, until="loss")
    rounded = summarize_advantages(torch.full((8,), 0.7314049005508423), 8)  # std 6.4e-8 after rounding
    assert rounded.frac_reward_zero_std == 0.0  # TRL's metric: this group varies
    message = triage_zero_loss(dataclasses.replace(run, advantages=rounded))
    assert message.startswith("FAILURE") and "rounding" in message and "frac_reward_zero_std = 0.00" in message
    exact = summarize_advantages(torch.full((8,), 0.5), 8)
    assert triage_zero_loss(dataclasses.replace(run, advantages=exact)).startswith("FAILURE: every group has identical")
