"""TracIn influence of each training sample on a validation loss.

per_sample   exact per-sample gradients from one backward (layer hooks), kept factored
influence    validation losses and sets, parameter sets, the influence scores, their cache (InfluenceCache;
             InfluenceExplorer: the same, following a GRPOStep, behind the panel)
optimizer    the training gradient through AdamW's update map (an optimizer-aware score)
experiments  first-order checks against real single-sample steps, selection, the sign test
"""
