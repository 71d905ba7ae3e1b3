"""The command line, `python -m grpo_debug`: its commands (`commands`), what it checks before any work starts
(`checks`); `--set key=value` is read into a `StepConfig` by `grpo_debug.overrides`."""
