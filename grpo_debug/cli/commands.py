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
import dataclasses
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

from ..choices import ARM_NAMES, EVAL_SETS
from ..config import PRESETS, StepConfig
from ..echo import bounded
from ..horizon_bounds import horizon_problem, most
from ..overrides import describe_fields, parse_overrides
from ..time_limit import set_reward_timeout
from .checks import (
    ascii_int,
    capture_overrides,
    capture_reads,
    check_capture_folder,
    check_outputs,
    check_prompts,
    check_task,
    model_reads,
    run_reads,
    task_reads,
)
from .png_folder import check_png_folder

# torch, transformers and the engine are imported by each command once its arguments are checked: a typo is
# answered before they load


BUDGET = {"cpu": 120.0, "cuda": 600.0}  # the horizon's default seconds, by device

TASK_HELP = (
    "your reward functions, as open_capture takes them: my_rewards.py:REWARD_FUNCS, or a registered "
    "task; without it the captured rewards are replayed"
)


def add_reward_timeout(parser) -> None:
    parser.add_argument(
        "--reward-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the time limit of each call of your reward functions (a batch, or one row where the row an error came "
        "from is looked for): past it the command stops in one line naming the function and the rows, and that "
        "function is not called again (default 60; SIGALRM, main thread: grpo_debug/time_limit.py)",
    )


def add_set(parser, help: str) -> None:
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help=help)


DTYPES = ("float32", "bfloat16", "float16")


def add_device(parser) -> None:
    """`--device` and `--dtype`: where the models and the step's tensors live, and the weights' dtype."""
    parser.add_argument(
        "--device",
        help="cpu, cuda or cuda:N (default: the GPU where torch sees one, else the CPU); the models and every "
        "tensor of the step are moved there once",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="the weights' dtype (default: as saved, the run's own); --set dtype=... is the precision it scores at",
    )


def device_of(parser, args) -> dict:
    """{"device", "weights_dtype"} for open_capture and GRPOStep, the device checked before anything loads."""
    from ..model import pick_device

    try:
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    return {"device": str(device), "weights_dtype": args.dtype}


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


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
    _threads(args.threads)
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


def write_token_page(parser, path: str, run, tokenizer, title: str = "") -> None:
    """`--html`: every token of the run on one standalone page (`grpo_debug.show.token_page`)."""
    from ..files import write_text_atomically
    from ..show.token_page import render_page, token_values

    try:
        write_text_atomically(path, render_page(token_values(run, tokenizer, title)))
    except OSError as e:
        cannot_write(parser, e)
    print(f"every token of the step: {path}")


def cannot_write(parser, error: OSError, then: str = ""):
    """An output that was not written in full (a full disk, /dev/full, a folder gone): exit status 1, one line naming
    the path (`files.write_atomically` names it) - an error of the run, not of its arguments (those exit 2)."""
    parser.exit(1, f"{parser.prog}: error: {error.strerror or error}{then}\n")


def write_json(path: str, value) -> None:
    """Strict JSON (RFC 8259: no NaN), written to a temporary file beside `path` and moved over it. A non-finite
    number is written as null, and an object says where: `non_finite_as_null` lists their paths."""
    from ..files import write_atomically
    from ..runs.results import non_finite_paths, strict_json

    where = non_finite_paths(value)
    if where and isinstance(value, dict):
        value = {**value, "non_finite_as_null": where}
    write_atomically(path, lambda f: json.dump(strict_json(value), f, indent=1, allow_nan=False))


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


def replay_command(parser, args) -> int:
    overrides = capture_overrides(parser, args)  # the arguments first: --set reads no file, --task its own
    check_task(parser, args.task, args.path)
    check_capture_folder(parser, args.path)
    check_outputs(parser, args, capture_reads(args.path) + task_reads(args.task))
    _threads(args.threads)
    from ..capture.opening import open_capture
    from ..capture.replay import reproduction
    from ..capture.sizes import estimate_line, replay_estimate
    from ..model import ModelUnavailable

    where = device_of(parser, args)
    print(estimate_line(replay_estimate(args.path)))
    try:
        step = open_capture(args.path, args.task, **where, **overrides)
        scored = step.run(until="rewards").rewards.total
        problem = unscorable(scored.isnan().tolist(), step.capture.meta["rewards"], args.task)
        if problem:
            parser.error(problem)
        run = step.run(until="update")
        out = reproduction(run, step.capture, step.policy, step)
    except (ValueError, ModelUnavailable, OSError) as e:
        parser.error(str(e))
    print(f"step {out['step']} of the captured run, replayed ({', '.join(args.set) or 'as captured'})")
    print(f"{'metric':26s} {out['logged_source']:>22s} {'replayed':>14s} {'difference':>12s}")
    for k in out["logged"]:
        print(f"{k:26s} {out['logged'][k]:22.6g} {out['replayed'][k]:14.6g} {out['difference'][k]:12.3g}")
    if out["logps"]["rows_compared"]:
        print(
            f"per-token log-probs, ours - trainer's: max |diff| {out['logps']['max_abs_difference']:.3g}, "
            f"mean {out['logps']['mean_abs_difference']:.3g}"
        )
    w = out["where"]
    outside = ", ".join(w["outside"]) or "none"
    print(
        f"on {w['device']}, weights {w['dtype']}: stated tolerance |difference| <= {w['tolerance']['relative']:g} x "
        f"|trainer's| + {w['tolerance']['absolute']:g}; outside it: {outside}"
    )
    for name, verdict in out["causes"].items():
        print(f"{name:14s} {verdict}")
    for name, what in out["pitfalls"].items():
        print(f"pitfall: {name:12s} {what}")
    print(f"{'kernels':14s} {out['kernels']['note']}")
    print(f"{'update':14s} {out['optimizer']}")
    if args.json:
        try:
            write_json(args.json, out)
        except OSError as e:
            cannot_write(parser, e)
    if args.html:
        title = f"every token of step {out['step']} of {args.path} ({', '.join(args.set) or 'as captured'})"
        write_token_page(parser, args.html, run, step.loaded.tokenizer, title)
    return 0


def unscorable(unscored: list[bool], captured: dict[str, list], task: str | None) -> str | None:
    """Why the replay stops before its update: your reward functions scored none of the completions (each returned
    None) where the run scored some. Every reward is then NaN and every advantage 0, as TRL 1.16 makes them, so no
    number of the step could be compared with the trainer's. None: some completion was scored, or the run scored
    none either (the replay then reproduces that step as it was)."""
    run_scored = sum(any(v is not None for v in values) for values in zip(*captured.values()))
    if not all(unscored) or run_scored == 0:
        return None
    return (
        f"--task {task}: no reward function scored any of the {len(unscored)} completions (each returned None; the "
        f"run scored {run_scored}): every advantage would be 0, so nothing replayed could be compared with the "
        "trainer's step; fix the functions (doctor --task names them under bad_reward), or leave out --task to "
        "replay the captured rewards"
    )


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
    check_task(parser, args.task, args.path)
    if args.path:
        check_capture_folder(parser, args.path)
    reads = capture_reads(args.path) if args.path else model_reads([cfg])
    check_outputs(parser, args, reads + task_reads(args.task))
    check_png_folder(parser, args.png, reads + task_reads(args.task))
    _threads(args.threads)
    from ..capture.opening import open_capture
    from ..capture.sizes import estimate_line, replay_estimate
    from ..doctor import diagnose, diagnose_without_model
    from ..doctor.horizon import HORIZON
    from ..doctor.present import text
    from ..doctor.probe import PROBE_STEPS
    from ..files import write_text_atomically
    from ..model import ModelUnavailable
    from ..step import GRPOStep
    from ..ui.doctor_page import page, write_pngs

    if args.path:
        print(estimate_line(replay_estimate(args.path)))
    where = None if args.no_model else device_of(parser, args)
    if where:
        print(f"on {where['device']}, weights {where['weights_dtype'] or 'as saved'}")
    try:
        if args.no_model:
            report = diagnose_without_model(args.path, args.task)
        else:
            step = open_capture(args.path, args.task, **where, **overrides) if args.path else GRPOStep(cfg, **where)
            horizon = args.horizon if args.horizon is not None else (HORIZON if args.task else 0)
            budget = args.budget if args.budget is not None else BUDGET["cpu" if where["device"] == "cpu" else "cuda"]
            probe = args.probe if args.probe is not None else (PROBE_STEPS if args.path else 0)
            report = diagnose(
                step, not args.no_flip, args.held_out, horizon, args.horizon_seeds, budget, True, probe
            )
    except (ValueError, ModelUnavailable, OSError) as e:
        parser.error(str(e))
    report = dataclasses.replace(report, seconds=time.perf_counter() - start)  # the command's, loading included
    print(text(report))
    try:
        if args.json:
            write_json(args.json, report.to_json())
        if args.html:
            write_text_atomically(args.html, page(report, f"grpo-debug doctor: {args.path or 'the bundled step'}"))
        if args.png is not None:
            print(f"{len(write_pngs(report, args.png))} figures of the report: {args.png}")
    except OSError as e:
        cannot_write(parser, e)
    return 0


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
        _threads(args.threads)
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


HTML_HELP = (
    "write every completion token to this standalone HTML page, coloured by advantage, ratio, KL, entropy, "
    "d loss / d logp or the mask (a selector switches), every value on hover"
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


def add_analyze_and_replay_parsers(sub) -> None:
    an = sub.add_parser(
        "analyze",
        help="recompute the verdicts of training results (train's --json) from their "
        "records: intervals for seeds crossed with test prompts, each family corrected",
    )
    an.add_argument("paths", nargs="+", help="JSON files written by train")
    an.add_argument("--write", action="store_true", help="write the recomputed summary back (strict JSON)")
    rp = sub.add_parser(
        "replay",
        help="open a step captured from a TRL run (grpo_debug.capture) and compare "
        "our recomputation with what TRL logged",
    )
    rp.add_argument("path", help="a capture folder, e.g. captures/step-2")
    add_set(rp, "StepConfig changes on top of the capture's config (not rollout fields)")
    rp.add_argument("--task", help=TASK_HELP)
    add_reward_timeout(rp)
    rp.add_argument("--json", help="write {logged, replayed, difference, logps, causes} to this file")
    rp.add_argument("--html", help=HTML_HELP)
    rp.add_argument("--threads", type=ascii_int, default=1)
    add_device(rp)


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
        f"--budget holds at the fastest a step could be: {most(BUDGET['cpu'])} at {BUDGET['cpu']:g} s, "
        "grpo_debug/horizon_bounds.py)",
    )
    dr.add_argument(
        "--probe",
        type=ascii_int,
        metavar="K",
        help="is it the reward or the pipeline: a probe reward the model can learn (tokens it samples 20-80%% of "
        "the time) trained K steps on the run's own config and optimizer, 6 seeds, within --budget (default: 8 on a "
        "capture, 0 on the bundled step; 0: off)",
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
        help="the horizon's time: one continuation step is timed, then causes, steps and seeds are cut to fit, the "
        f"least likely causes first, and the report says what was cut (default {BUDGET['cpu']:g} s on a CPU, "
        f"{BUDGET['cuda']:g} s on a GPU)",
    )
    dr.add_argument(
        "--no-model",
        action="store_true",
        help="a capture's own tensors only (rewards, advantages, truncation, the trainer's log-probs and logged "
        "numbers): no model built, seconds at any size; the detectors that need the model are listed as not run",
    )
    dr.add_argument("--threads", type=ascii_int, default=1)
    add_device(dr)


def add_landing_parser(sub) -> None:
    ld = sub.add_parser(
        "landing",
        help="where the replayed update of captured step k lands against the trainer's weights at step k+1: "
        "cosine, norm ratio, largest difference, exact or not, the rate as scheduled",
    )
    ld.add_argument("path", help="step k's capture folder, e.g. captures/step-2")
    ld.add_argument("next", help="step k+1's capture folder of the same run, e.g. captures/step-3")
    ld.add_argument("--task", help=TASK_HELP)
    ld.add_argument("--json", help="write {cosine, norm_ratio, max_abs_difference, bit_equal, ...} to this file")
    ld.add_argument("--threads", type=ascii_int, default=1)
    add_device(ld)


def landing_command(parser, args) -> int:
    """Step k replayed with the trainer's optimizer, against step k+1's captured weights (`capture.landing`)."""
    from .landing import landing_lines, pair_problem, scheduled_rate

    for path in (args.path, args.next):
        check_capture_folder(parser, path)
    problem = pair_problem(args.path, args.next)
    if problem:
        parser.error(problem)
    check_task(parser, args.task, args.path)
    check_outputs(parser, args, capture_reads(args.path) + capture_reads(args.next) + task_reads(args.task))
    _threads(args.threads)
    from ..capture.landing import landing, next_weights, stored_weights
    from ..capture.opening import open_capture
    from ..capture.reading import load_capture
    from ..model import ModelUnavailable

    where = device_of(parser, args)
    try:
        next_weights(load_capture(args.path), args.next, stored_weights(args.path))  # both checked before a model
    except ValueError as e:
        parser.error(str(e))
    try:
        step = open_capture(args.path, args.task, **where)
        out = landing(step, args.next)
    except (ValueError, KeyError, ModelUnavailable, OSError) as e:
        parser.error(str(e).strip("'\""))
    out = {"step": step.capture.meta["step"], **out, "scheduled_learning_rate": scheduled_rate(step.capture.meta)}
    print("\n".join(landing_lines(out, args.path, args.next)))
    if args.json:
        try:
            write_json(args.json, out)
        except OSError as e:
            cannot_write(parser, e)
    return 0


def add_reseal_parser(sub) -> None:
    rs = sub.add_parser(
        "reseal",
        help="record a capture's files as they are now (after you edited capture.json: a moved reference model)",
    )
    rs.add_argument("path", help="a capture folder, e.g. captures/step-2")


def reseal_command(parser, args) -> int:
    """checksums.json written anew: the capture's files, as they are now, are what the readers will trust."""
    from ..checksums import checksum_problem, write_checksums

    folder = Path(args.path)
    if not (folder / "capture.json").is_file():
        parser.error(f"{folder} is not a capture: no capture.json (CaptureCallback writes step-<k>/ folders)")
    before = checksum_problem(folder)
    try:
        write_checksums(folder)
    except OSError as e:
        cannot_write(parser, e)
    print(f"{folder}: resealed; before, {before or 'every file was as recorded'}")
    print("its checksums now trust every file as it is: reseal only a capture whose edits you made yourself")
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


def step_command(parser, args) -> int:
    try:
        cfg = StepConfig.preset(args.preset, **parse_overrides(args.set))
        check_prompts(cfg)
    except ValueError as e:
        parser.error(str(e))
    check_outputs(parser, args, model_reads([cfg]))
    _threads(args.threads)
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


def main(argv: list[str] | None = None) -> int:
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
    return commands[args.command](parser, args)


def run_main() -> int:
    """`main`, quiet when the reader of its output goes away (`analyze FILE | head`): no traceback."""
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own advice: no second error
        return 1
