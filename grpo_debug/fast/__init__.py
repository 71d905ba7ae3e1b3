"""The speed-ups, each tested equal to the readable function it replaces (`tests/test_fast_paths.py`); which
one runs is decided in one place, `speed.kernels` (`StepConfig.fast=False`: the readable functions only).

  shared_prompt  sampling: each prompt's keys and values computed once for its G samples, and decode
                 attention that reads them once per group (readable twin: `rollout.generate_repeated`)
  scoring        log-probs: padding columns nothing depends on dropped, a group's prompt computed once
                 (readable twin: `scoring.per_token_logps`)
  backward       the update's per-sample gradient norms from layer hooks in the one backward, the Conv1D
                 weights' batch gradient summed from their per-sample gradients (readable twin:
                 `update.backward`, one backward per sample in `update.per_sample_norms`)
"""
