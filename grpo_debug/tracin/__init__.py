"""TracIn influence of each training sample on a validation loss (its per-sample gradients:
`grpo_debug.fast.per_sample`, which the update's fast path uses too).

influence    validation losses and sets, parameter sets, the influence scores (cached behind the panel:
             `ui.influence`)
optimizer    the training gradient through AdamW's update map (an optimizer-aware score)
first_order  first-order checks against real single-sample steps
selection    a step on the samples a strategy selects, the held-out reward, the sign test
specs        the phase arguments and kernels these re-runs take, in one value (`specs_of(cfg)`)
"""
