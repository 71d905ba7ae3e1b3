"""`python -m grpo_debug step [--set key=value ...] [--json out.json] [--html tokens.html]`: one GRPO step,
phase by phase (`--html`: every token of it on one standalone page, `grpo_debug.show.token_page`).
`python -m grpo_debug train --steps K --arm NAME[:key=value,...] ... --seeds S --json out.json`: short
training runs, arms paired by seed (`grpo_debug.runs.train`).
`python -m grpo_debug replay CAPTURE [--task file.py:NAME] [--set ...]`: a step captured from a TRL run, replayed.
`python -m grpo_debug doctor [CAPTURE] [--task ...] [--json out.json] [--html report.html]`: why the step does not
learn, ranked (`grpo_debug.doctor`).
`python -m grpo_debug timeline RUN_DIR --html run.html [--doctor]`: the health of every step of a run that
`FlightRecorder` watched, its captured steps marked and linked (`grpo_debug.show.timeline`).
`python -m grpo_debug landing STEP_K STEP_K+1 [--json out.json]`: where the replayed update of captured step k lands
against the trainer's weights at step k+1 (`grpo_debug.capture.landing`)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..echo import bounded
from ..horizon_bounds import horizon_problem
from ..time_limit import set_reward_timeout
from .arguments import BUDGET
from .capture_commands import (
    add_analyze_and_replay_parsers,
    add_landing_parser,
    add_reseal_parser,
    landing_command,
    replay_command,
    reseal_command,
)
from .doctor_commands import add_doctor_parser, add_timeline_parser, doctor_command, timeline_command
from .step_commands import add_step_parser, add_train_parser, analyze_command, step_command, train_command


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusals once the command line is read (a value a command checks: a --task that
    does not import, a --set a capture cannot take) are one line: the usage answers a command line argparse could
    not read, not a value it read."""

    parsed = False
    echoed: tuple[str, ...] = ()  # the command line's arguments, each cut where a refusal echoes it (`echo.bounded`)

    def error(self, message: str):
        if not self.parsed:
            super().error(message)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None):
        super().exit(status, message and bounded(message, self.echoed))


def command_line() -> Parser:
    """`python -m grpo_debug`'s parser, every command's arguments: read, nothing run."""
    parser = Parser(prog="python -m grpo_debug", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        add_step_parser,
        add_train_parser,
        add_analyze_and_replay_parsers,
        add_doctor_parser,
        add_timeline_parser,
        add_reseal_parser,
        add_landing_parser,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = command_line()
    Parser.echoed = tuple(sys.argv[1:] if argv is None else argv)  # the subcommands' parsers too
    args = parser.parse_args(argv)
    parser.parsed = True
    if getattr(args, "threads", 1) < 1:
        parser.error(f"--threads {args.threads}: at least 1")
    if (getattr(args, "held_out", None) or 0) < 0:
        parser.error(f"--held-out {args.held_out}: at least 0")
    budget = getattr(args, "budget", None)
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        parser.error(f"--budget {budget:g}: a number of seconds above 0")
    if (getattr(args, "horizon", None) or 0) < 0 or getattr(args, "horizon_seeds", 2) < 2:
        parser.error("--horizon must be at least 0 and --horizon-seeds at least 2 (the seed is the unit)")
    if args.command == "doctor":
        said = None if budget is not None else f"the default budget, {BUDGET['cuda']:g} s on a GPU (--budget)"
        problem = horizon_problem(args.horizon or 0, args.horizon_seeds, budget or BUDGET["cuda"], said)
        if problem:
            parser.error(problem)
    if getattr(args, "reward_timeout", None) is not None:
        try:
            set_reward_timeout(args.reward_timeout, "--reward-timeout")
        except ValueError as e:
            parser.error(str(e))
    if args.command == "train" and (args.steps < 1 or args.seeds < 1 or args.eval_every < 1 or args.first_seed < 0):
        parser.error("--steps, --seeds and --eval-every must be at least 1, --first-seed at least 0")
    commands = {
        "step": step_command,
        "train": train_command,
        "analyze": analyze_command,
        "replay": replay_command,
        "doctor": doctor_command,
        "timeline": timeline_command,
        "reseal": reseal_command,
        "landing": landing_command,
    }
    try:
        return commands[args.command](parser, args)
    finally:
        if "grpo_debug.reward_process" in sys.modules:  # the command's reward functions' process, if it started one
            sys.modules["grpo_debug.reward_process"].stop_all()


def run_main() -> int:
    """`main`, quiet when the reader of its output goes away (`analyze FILE | head`): no traceback."""
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own advice: no second error
        return 1
