"""`step` (one GRPO step, phase by phase), `train` (short training runs, arms paired by seed) and `analyze`."""

from __future__ import annotations

import argparse
import shlex
import sys

from ..choices import ARM_NAMES, EVAL_SETS
from ..config import PRESETS, StepConfig
from ..overrides import describe_fields, parse_overrides
from .arguments import HTML_HELP, add_set, cannot_write, threads, write_json, write_token_page
from .checks import (
    ascii_int,
    check_outputs,
    check_prompts,
    model_reads,
)


def add_step_parser(sub) -> None:
    step = sub.add_parser(
        "step",
        help="run one GRPO step and print a phase-by-phase report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="StepConfig keys for --set (KEY=VALUE):\n" + describe_fields(),
    )
    step.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="fixed",
        help="fixed: every fix on; trl: what TRL 1.16's GRPOTrainer computes with a default GRPOConfig",
    )
    add_set(step, "StepConfig overrides on top of the preset, e.g. --set mask=drop_eos_and_pad beta=0.1")
    step.add_argument("--json", help="write every number to this file")
    step.add_argument("--html", help=HTML_HELP)
    step.add_argument("--threads", type=ascii_int, default=1)


def step_command(parser, args) -> int:
    try:
        cfg = StepConfig.preset(args.preset, **parse_overrides(args.set))
        check_prompts(cfg)
    except ValueError as e:
        parser.error(str(e))
    check_outputs(parser, args, model_reads([cfg]))
    threads(args.threads)
    from ..model import ModelUnavailable
    from ..show.report import report, step_json
    from ..step import GRPOStep

    try:
        step_ = GRPOStep(cfg)
        run = step_.run()
    except (ValueError, ModelUnavailable, OSError) as e:  # what only the model or the task can check
        parser.error(str(e))
    print(report(run))
    if args.json:
        try:
            write_json(args.json, step_json(run))
        except OSError as e:
            cannot_write(parser, e)
    if args.html:
        write_token_page(parser, args.html, run, step_.loaded.tokenizer)
    return 0


def add_train_parser(sub) -> None:
    tr = sub.add_parser(
        "train",
        help="K GRPO steps per arm, arms paired by seed, held-out reward every E steps",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="named arms: " + ", ".join(ARM_NAMES) + "\nStepConfig keys for --set and arm changes "
        "(KEY=VALUE):\n" + describe_fields(),
    )
    tr.add_argument("--steps", type=ascii_int, required=True, help="K, GRPO steps per arm and seed")
    tr.add_argument(
        "--arm",
        action="append",
        required=True,
        metavar="NAME[:key=value,...]",
        help="an arm (repeat): a named arm or fixed, with StepConfig changes, preset=NAME, and the TracIn "
        "keys select=, val_source=, val_size=, val_kind=, flip_sign=, score=",
    )
    tr.add_argument("--seeds", type=ascii_int, default=1, help="S, seeds per arm (paired across arms)")
    tr.add_argument(
        "--first-seed",
        type=ascii_int,
        default=0,
        help="the first seed (seeds first..first+S-1): a confirmatory run takes seeds no other run used",
    )
    add_set(tr, "StepConfig changes for every arm")
    tr.add_argument("--eval-every", type=ascii_int, default=5, help="E: held-out test reward every E steps (and at 0)")
    tr.add_argument("--eval-prompts", type=ascii_int, default=32, help="test prompts per evaluation")
    tr.add_argument(
        "--eval-set",
        choices=EVAL_SETS,
        default="test",
        help="the prompts each evaluation samples: test (a result), or validation (to choose a setting, such "
        "as the learning rate, without looking at the test prompts)",
    )
    tr.add_argument(
        "--train-prompts",
        type=ascii_int,
        default=128,
        help="training prompts cycled through, B per step (the bundled chess tasks have 128)",
    )
    tr.add_argument(
        "--json", required=True, help="the results; the progress file is PATH.progress.jsonl, resumed when it exists"
    )
    tr.add_argument("--threads", type=ascii_int, default=1)
    tr.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    tr.add_argument(
        "--keep-progress",
        action="store_true",
        help="keep the progress file and its checkpoints once done: a later run with a larger --steps "
        "then resumes from them instead of starting over",
    )


def train_command(parser, args) -> int:
    try:
        base = StepConfig(**parse_overrides(args.set))
    except ValueError as e:
        parser.error(str(e))
    from ..runs.arms import Plan, parse_arm  # torch-free: a bad arm or count is answered before torch loads

    try:
        plan = Plan(
            tuple(parse_arm(a) for a in args.arm),
            args.steps,
            args.seeds,
            base,
            eval_every=args.eval_every,
            eval_prompts=args.eval_prompts,
            train_prompts=args.train_prompts,
            first_seed=args.first_seed,
            eval_set=args.eval_set,
        )
    except ValueError as e:
        parser.error(str(e))
    check_outputs(parser, args, model_reads([arm.config(base) for arm in plan.arms]))
    threads(args.threads)
    from ..runs.progress import remove_progress
    from ..runs.train import train

    progress = f"{args.json}.progress.jsonl"
    try:
        results = train(plan, progress, show_progress=not args.no_progress, keep_progress=True)
    except (ValueError, RuntimeError, OSError) as e:  # OSError: a full disk, named by write_atomically
        parser.error(str(e))
    results["command"] = (
        "python -m grpo_debug train " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["train"]
        else None
    )
    try:
        write_json(args.json, results)  # the result is on disk before its progress is removed
    except OSError as e:
        cannot_write(parser, e, f"; the progress file {progress} is kept: run the same command again to write it")
    if not args.keep_progress:
        remove_progress(progress)
    print(summary_table(results))
    return 0


def summary_table(results: dict) -> str:
    """The held-out reward per arm after K steps, then each family of verdicts with its correction."""
    fmt = lambda d: (
        f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
        if d["ci_low"] is not None
        else f"{d['mean']:+.4f} (no interval)"
    )
    summary = results["summary"]
    prompts = f"{results.get('eval_set', 'test')} prompts"
    lines = [
        f"held-out reward after {results['steps']} steps, {results['seeds']} seed(s), {results['eval_prompts']} "
        f"{prompts} (95% intervals: seeds crossed with {prompts}, two-way random effects)"
    ]
    for arm, row in summary.items():
        start = "-" if row["reward_start"] is None else f"{row['reward_start']:.4f}"
        lines.append(
            f"  {arm:18s} start {start}  final {fmt(row['reward_final'])} "
            f"({row['reward_final']['n_seeds']} distinct seed(s))"
        )
    families: dict[str, list[tuple[str, dict]]] = {}
    for arm, row in summary.items():
        for value in row.values():
            if isinstance(value, dict) and "family" in value:
                families.setdefault(value["family"], []).append((arm, value))
    for name, members in families.items():
        size = members[0][1]["family_size"]
        lines.append(
            f"family: {name} ({size} verdict(s); intervals at {100 * members[0][1]['level']:.2f}% "
            "(Bonferroni), Holm's adjusted p)"
        )
        for arm, value in members:
            holm = "-" if value["holm_p"] is None else f"{value['holm_p']:.3g}"
            label = f"{arm} - {value['other']}" if "other" in value else arm
            lines.append(f"  {label:18s} {value['verdict']}  (Holm p {holm})")
    return "\n".join(lines)


def analyze_command(parser, args) -> int:
    """Every verdict of committed training results, recomputed from their records (grpo_debug.stats), in the
    families of the comparison a file belongs to (grpo_debug.runs.comparisons); --write stores them."""
    from ..runs.comparisons import analyze

    for path in args.paths:
        try:
            results, writes = analyze(path)
        except (OSError, ValueError, KeyError) as e:
            parser.error(f"{path}: {e}")
        if "comparison" in results:
            files = ", ".join(results["files"])
            print(f"{path} is read in comparison {results['comparison']!r} ({files}): {results['question']}")
        print(summary_table(results))
        if args.write:
            for file, value in writes.items():
                try:
                    write_json(file, value)
                except OSError as e:
                    cannot_write(parser, e)
    return 0
