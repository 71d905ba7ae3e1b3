"""`python -m grpo_debug COMMAND ...`: the command line (`grpo_debug.cli.commands` says each command)."""

import sys

from .cli.commands import main, run_main

__all__ = ["main", "run_main"]

if __name__ == "__main__":
    sys.exit(run_main())
