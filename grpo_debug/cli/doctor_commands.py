"""`doctor` (why a step does not learn, ranked) and `timeline` (a FlightRecorder run's every step)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from ..config import StepConfig
from ..horizon_bounds import most
from ..overrides import parse_overrides
from .arguments import (
    BUDGET,
    TASK_HELP,
    add_device,
    add_reward_timeout,
    add_set,
    cannot_write,
    device_of,
    threads,
    write_json,
)
from .checks import (
    ascii_int,
    capture_overrides,
    capture_reads,
    check_capture_folder,
    check_outputs,
    check_prompts,
    check_task,
    launch_task,
    model_reads,
    run_reads,
    task_reads,
)
from .png_folder import check_png_folder


def add_probe_flag(dr) -> None:
    probe = dr.add_mutually_exclusive_group()
    probe.add_argument(
        "--probe",
        type=ascii_int,
        metavar="K",
        help="is it the reward or the pipeline (on by default): a probe reward the model can learn (tokens it "
        "samples 20-80%% of the time) in place of yours, one update through your run's pipeline, where the "
        "signal's path says whether the pipeline lets it through; K > 0 also trains it K steps, 6 seeds, for its "
        "curve, within --budget",
    )
    probe.add_argument("--no-probe", action="store_true", help="no probe (see --probe)")


def add_doctor_parser(sub) -> None:
    dr = sub.add_parser(
        "doctor",
        help="why a step does not learn: every detector on the step, each cause flipped on it, ranked",
    )
    dr.add_argument("path", nargs="?", help="a capture folder, e.g. captures/step-2 (none: the bundled step)")
    dr.add_argument("--task", help=TASK_HELP)
    add_reward_timeout(dr)
    add_set(dr, "StepConfig changes (on a capture: not rollout fields)")
    dr.add_argument("--json", help="write {findings: [{id, severity, evidence, fix, effect, ...}], ...} to this file")
    dr.add_argument("--html", help="write the report as one standalone page, its figures inline")
    dr.add_argument("--png", metavar="DIR", help="write the page's figures as PNG files to this folder")
    dr.add_argument("--no-flip", action="store_true", help="detect only: no counterfactual update per finding")
    dr.add_argument(
        "--held-out",
        type=ascii_int,
        metavar="N",
        help="score each flip's update on N held-out test prompts, paired with the update as run (default: 16, "
        "at most the config's eval_prompts, where the task has a held-out set; 0: skip)",
    )
    dr.add_argument(
        "--horizon",
        type=ascii_int,
        metavar="K",
        help="follow each cause's fix for K steps against the run continued alike, same seeds (default: 8 with "
        "--task, whose reward functions score the new completions; 0: the one-step effect only; at most what "
        f"--budget holds at the fastest a step could be: {most(BUDGET['cpu horizon'])} at {BUDGET['cpu horizon']:g} s, "
        "grpo_debug/horizon_bounds.py)",
    )
    dr.add_argument(
        "--horizon-seeds",
        type=ascii_int,
        default=3,
        metavar="N",
        help="seeds per arm (default 3; bounded as --horizon)",
    )
    dr.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="the whole command's seconds, loading included: the step and its detectors always run; the flips, the "
        "probe and the horizon take what is left (the horizon times one continuation step, then cuts causes, steps "
        "and seeds to fit, the least likely causes first), and the report says what was cut and where the seconds "
        f"went (default on a CPU {BUDGET['cpu']:g} s at --horizon 0, {BUDGET['cpu horizon']:g} s with a horizon; "
        f"{BUDGET['cuda']:g} s on a GPU)",
    )
    dr.add_argument(
        "--no-model",
        action="store_true",
        help="a capture's own tensors only (rewards, advantages, truncation, the trainer's log-probs and logged "
        "numbers): no model built, seconds at any size; the detectors that need the model are listed as not run",
    )
    dr.add_argument("--threads", type=ascii_int, default=1)
    add_probe_flag(dr)
    add_device(dr)


def diagnosed(args, where: dict | None, cfg, overrides: dict, started: float):
    """The report: of the capture's own tensors (`--no-model`), else of the step built (a capture opened, or the
    bundled step) with the horizon, budget and probe the arguments ask or their defaults."""
    from ..capture.opening import open_capture
    from ..doctor import diagnose, diagnose_without_model
    from ..doctor.horizon import HORIZON
    from ..step import GRPOStep

    if args.no_model:
        return diagnose_without_model(args.path, args.task)
    step = open_capture(args.path, args.task, **where, **overrides) if args.path else GRPOStep(cfg, **where)
    horizon = args.horizon if args.horizon is not None else (HORIZON if args.task else 0)
    default = "cuda" if where["device"] != "cpu" else "cpu horizon" if horizon else "cpu"
    budget = args.budget if args.budget is not None else BUDGET[default]
    probe = None if args.no_probe else (args.probe or 0)
    return diagnose(step, not args.no_flip, args.held_out, horizon, args.horizon_seeds, budget, True, probe, started)


def doctor_command(parser, args) -> int:
    """Every detector on the step (a capture, or the bundled step), each cause flipped on it, ranked."""
    start = time.perf_counter()
    try:
        overrides = capture_overrides(parser, args) if args.path else parse_overrides(args.set)
        cfg = None if args.path else StepConfig(**overrides)
        if cfg:
            check_prompts(cfg)
    except ValueError as e:
        parser.error(str(e))
    if args.no_model and not args.path:
        parser.error("--no-model reads a capture's own tensors: give the capture's folder")
    if args.no_model and (args.horizon or args.probe or args.set or args.held_out or args.device or args.dtype):
        parser.error(
            "--no-model runs no step: --horizon, --probe, --held-out, --set, --device and --dtype need the model"
        )
    if launch_task(args.task) and not args.no_model:  # the diagnosis's imports while the worker imports the file
        from ..capture import opening, replay  # noqa: F401
        from ..doctor import diagnose  # noqa: F401
    check_task(parser, args.task, args.path)
    if args.path:
        check_capture_folder(parser, args.path)
    reads = capture_reads(args.path) if args.path else model_reads([cfg])
    check_outputs(parser, args, reads + task_reads(args.task))
    check_png_folder(parser, args.png, reads + task_reads(args.task), {"--json": args.json, "--html": args.html})
    threads(args.threads)
    from ..capture.sizes import estimate_line, replay_estimate
    from ..doctor.present import text
    from ..files import write_text_atomically
    from ..model import ModelUnavailable

    if args.path:
        print(estimate_line(replay_estimate(args.path)))
    where = None if args.no_model else device_of(parser, args)
    if where:
        print(f"on {where['device']}, weights {where['weights_dtype'] or 'as saved'}")
    try:
        report = diagnosed(args, where, cfg, overrides, start)
    except (ValueError, ModelUnavailable, OSError) as e:
        parser.error(str(e))
    report = dataclasses.replace(report, seconds=time.perf_counter() - start)  # the command's, loading included
    print(text(report))
    try:
        if args.json:
            write_json(args.json, report.to_json())
        if args.html or args.png is not None:  # the page's figures need matplotlib: imported only to draw them
            from ..ui.doctor_page import page, write_pngs
        if args.html:
            write_text_atomically(args.html, page(report, f"grpo-debug doctor: {args.path or 'the bundled step'}"))
        if args.png is not None:
            print(f"{len(write_pngs(report, args.png))} figures of the report: {args.png}")
    except OSError as e:
        cannot_write(parser, e)
    return 0


def add_timeline_parser(sub) -> None:
    tl = sub.add_parser(
        "timeline",
        help="the health of every step of a run that FlightRecorder watched, as one standalone HTML page",
    )
    tl.add_argument("path", help="FlightRecorder's out_dir (it holds health.jsonl and the step-<k>/ captures)")
    tl.add_argument("--html", required=True, help="write the page here")
    tl.add_argument(
        "--doctor",
        action="store_true",
        help="first run the doctor on each captured step without a report (RUN_DIR/reports/step-<k>.html)",
    )
    tl.add_argument("--task", help=TASK_HELP + " (with --doctor)")
    add_reward_timeout(tl)
    tl.add_argument("--no-flip", action="store_true", help="with --doctor: detect only, no counterfactual flips")
    tl.add_argument("--threads", type=ascii_int, default=1)
    add_device(tl)


def timeline_command(parser, args) -> int:
    """The run page of a FlightRecorder folder; `--doctor`: first the doctor's report on each captured step
    that has none (RUN_DIR/reports/step-<k>.html), which the page links to."""
    if (args.task or args.no_flip) and not args.doctor:
        parser.error("--task and --no-flip are the doctor's: add --doctor")
    check_outputs(parser, args, run_reads(args.path, args.doctor) + task_reads(args.task))
    check_task(parser, args.task, None)
    from ..files import write_text_atomically
    from ..show.timeline import page, read_run, report_path

    try:
        run = read_run(args.path)
    except ValueError as e:
        parser.error(str(e))
    if args.doctor:
        threads(args.threads)
        where = device_of(parser, args)
        for step in sorted(run.captures):
            if not report_path(run, step).is_file():
                write_doctor_page(run.captures[step]["folder"], report_path(run, step), args, where)
        for step, entry in sorted(run.unopenable.items()):
            print(f"no doctor's report on step {step}: {entry['problem']}", file=sys.stderr)
    try:
        write_text_atomically(args.html, page(run, Path(args.html)))
    except OSError as e:
        cannot_write(parser, e)
    print(f"{len(run.lines)} steps, {len(run.captures)} captured: {args.html}")
    return 0


def write_doctor_page(capture, path, args, where: dict) -> None:
    """The doctor's page on one capture, as `python -m grpo_debug doctor CAPTURE --html PATH` writes it; where it
    cannot be made (a capture without weights, a --task that does not load), said on stderr."""
    from ..capture.opening import open_capture
    from ..doctor import diagnose
    from ..files import write_text_atomically
    from ..model import ModelUnavailable
    from ..ui.doctor_page import page

    try:
        report = diagnose(open_capture(str(capture), args.task, **where), flip=not args.no_flip)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, page(report, f"grpo-debug doctor: {capture}"))
    except (ValueError, ModelUnavailable, OSError) as e:  # one capture the doctor cannot open: the page still comes
        print(f"no doctor's report on {capture}: {e}", file=sys.stderr)
        return
    print(f"the doctor on {capture}: {path}")
