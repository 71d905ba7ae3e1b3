"""The sequence-level sampler ratio as a sum (TRL 1.16) or a mean (TRL issue #5814's fix) of its tokens'
log-ratios (`vllm_importance_sampling_aggregation`): each against its formula, the sum against TRL's own
`_generate_and_score_completions`, what the sum does to long completions whose tokens agree, and the doctor's
finding on a step where the sum alone masks sequences."""

import math

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.sampler import sampler_importance_ratio

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.2, 0.0, 0.0]])
SAMPLER = OLD - torch.tensor([[0.2, -0.1, 0.4, 9.0], [-0.3, 0.05, 7.0, 7.0]])  # 9 and 7: padding


@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_each_sequence_ratio_is_its_formula_on_the_scored_tokens(aggregation):
    ratio = sampler_importance_ratio(OLD, SAMPLER, MASK, "sequence_truncate", None, None, aggregation)
    for row in range(2):
        diffs = [(OLD[row, t] - SAMPLER[row, t]).item() for t in range(4) if MASK[row, t]]
        log_ratio = sum(diffs) if aggregation == "sum" else sum(diffs) / len(diffs)
        assert ratio[row, 0].item() == pytest.approx(math.exp(log_ratio), rel=1e-6), f"row {row}, {aggregation}"


def test_the_sum_is_what_trl_computes_and_the_trl_preset_keeps_it():
    """The sum's numbers are checked against TRL's own code in test_offpolicy_parity.py (every mode); here: TRL
    1.16 still sums, so the `trl` preset (from `pitfalls.py`) must too."""
    import inspect

    from trl.trainer import grpo_trainer

    source = inspect.getsource(grpo_trainer.GRPOTrainer._generate_and_score_completions)
    assert "per_token_logps_diff.sum(dim=-1, keepdim=True)" in source, "TRL no longer sums: check the trl preset"
    assert StepConfig.preset("trl").vllm_importance_sampling_aggregation == "sum"
    assert StepConfig().vllm_importance_sampling_aggregation == "mean", "the fixed preset takes the mean"


def test_tokens_that_agree_on_average_are_masked_by_the_sum_as_they_grow_longer():
    """Per-token log-ratios of mean 0 and spread 0.1: the summed ratio's spread grows as sqrt(length), so the
    cap of 3 masks a rising share of long completions; the mean's spread shrinks and masks none."""
    generator = torch.Generator().manual_seed(0)
    masked = {}
    for length in (16, 256, 1024):
        diffs = 0.1 * torch.randn(2000, length, generator=generator)
        mask = torch.ones_like(diffs)
        for aggregation in ("sum", "mean"):
            ratio = sampler_importance_ratio(
                diffs, torch.zeros_like(diffs), mask, "sequence_mask", None, 3.0, aggregation
            )
            masked[length, aggregation] = (ratio == 0).float().mean().item()
    assert masked[16, "sum"] < masked[256, "sum"] < masked[1024, "sum"], masked
    assert masked[1024, "sum"] > 0.1, f"the sum masked {masked[1024, 'sum']:.1%} of 1,024-token completions"
    assert all(masked[length, "mean"] == 0.0 for length in (16, 256, 1024)), masked


def test_an_unknown_aggregation_is_refused_in_one_line():
    with pytest.raises(ValueError, match="aggregation must be 'mean' or 'sum'"):
        sampler_importance_ratio(OLD, SAMPLER, MASK, "sequence_mask", None, 3.0, "max")
    with pytest.raises(ValueError, match="vllm_importance_sampling_aggregation"):
        StepConfig(vllm_importance_sampling_aggregation="max")


def test_the_doctor_names_the_sum_where_it_alone_masks_sequences_and_flips_it():
    """A bfloat16 sampler against the float32 trainer, tight bounds (0.95, 1.05): the summed ratio leaves them
    on completions whose per-token gap is tiny. The mean does not; with it, or with the correction off, the
    finding is absent."""
    from grpo_debug.doctor import diagnose
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(
        num_prompts=2, num_generations=4, max_new_tokens=48, sampler_dtype="bfloat16",
        vllm_importance_sampling_correction=True, vllm_importance_sampling_clip_min=0.95,
        vllm_importance_sampling_clip_max=1.05,
        vllm_importance_sampling_aggregation="sum", per_sample_grad_norms=False,
    )  # fmt: skip
    step = GRPOStep(cfg)
    finding = next(f for f in diagnose(step, held_out=0).findings if f.id == "sequence_ratio_sum")
    assert finding.severity == "warning", finding
    assert finding.evidence["cut_share_sum"] > finding.evidence["cut_share_mean"], finding.evidence
    assert finding.effect is not None and finding.effect["toggle"] == {"vllm_importance_sampling_aggregation": "mean"}
    for change in ({"vllm_importance_sampling_aggregation": "mean"}, {"vllm_importance_sampling_correction": False}):
        step.cfg = cfg.replace(**change)
        quiet = next(f for f in diagnose(step, flip=False).findings if f.id == "sequence_ratio_sum")
        assert quiet.severity == "absent", (change, quiet)
