"""What shows a step: the text report, the token page, TRL-named metrics, diagnostics and the loss's
gradients (the widgets and plots are in `grpo_debug.ui`)."""
