"""TracIn influence of each training sample on a validation loss (its per-sample gradients:
`grpo_debug.per_sample`, which the update's fast path uses too).

influence    validation losses and sets, parameter sets, the influence scores, their cache (InfluenceCache;
             InfluenceExplorer: the same, following a GRPOStep, behind the panel)
optimizer    the training gradient through AdamW's update map (an optimizer-aware score)
experiments  first-order checks against real single-sample steps, selection, the sign test
"""
