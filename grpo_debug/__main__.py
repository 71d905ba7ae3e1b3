"""`python -m grpo_debug COMMAND ...`: the command line (`grpo_debug.cli.commands` says each command)."""

import sys

from .kernels import pin

pin()  # the suite's own runs: AVX2 kernels, before torch runs an op (kernels.py says why)

from .cli.commands import main, run_main  # noqa: E402

__all__ = ["main", "run_main"]

if __name__ == "__main__":
    sys.exit(run_main())
