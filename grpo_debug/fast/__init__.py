"""The speed-ups, each beside the readable function it replaces and tested equal to it
(`tests/test_fast_paths.py`); `StepConfig.fast=False` runs the readable functions only.

  shared_prompt  sampling: each prompt's keys and values computed once for its G samples, and decode
                 attention that reads them once per group (readable twin: `rollout.sample`)
  scoring        log-probs: padding columns nothing depends on dropped, a group's prompt computed once
                 (readable twin: `logprobs.per_token_logps`)
  backward       the update's per-sample gradient norms from layer hooks in the one backward, the Conv1D
                 weights' batch gradient summed from their per-sample gradients (readable twin: one
                 backward per sample in `update.per_sample_norms`)
"""
