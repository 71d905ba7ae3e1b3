"""`replay` (a captured TRL step, replayed), `landing` (step k's replayed update against step k+1's weights) and `reseal`."""

from __future__ import annotations

from pathlib import Path

from .arguments import (
    HTML_HELP,
    TASK_HELP,
    add_device,
    add_reward_timeout,
    add_set,
    cannot_write,
    device_of,
    threads,
    write_json,
    write_token_page,
)
from .checks import (
    ascii_int,
    capture_overrides,
    capture_reads,
    check_capture_folder,
    check_outputs,
    check_task,
    launch_task,
    task_reads,
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


def replay_command(parser, args) -> int:
    overrides = capture_overrides(parser, args)  # the arguments first: --set reads no file, --task its own
    if launch_task(args.task):  # the replay's imports while the worker imports the user's file
        from ..capture import opening, replay  # noqa: F401
    check_task(parser, args.task, args.path)
    check_capture_folder(parser, args.path)
    check_outputs(parser, args, capture_reads(args.path) + task_reads(args.task))
    threads(args.threads)
    from ..capture.opening import open_capture
    from ..capture.replay import reproduction
    from ..capture.sizes import estimate_line, replay_estimate
    from ..model import ModelUnavailable

    where = device_of(parser, args)
    print(estimate_line(replay_estimate(args.path)))
    try:
        step = open_capture(args.path, args.task, **where, **overrides)
        rewards = step.run(until="rewards").rewards
        captured = step.capture.meta["rewards"]
        problem = unscorable(rewards.total.isnan().tolist(), captured, args.task) or function_unscored(
            {name: values.isnan().tolist() for name, values in rewards.per_function.items()}, captured, args.task
        )
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
    None or NaN) where the run scored some. Every reward is then NaN and every advantage 0, as TRL 1.16 makes them, so no
    number of the step could be compared with the trainer's. None: some completion was scored, or the run scored
    none either (the replay then reproduces that step as it was)."""
    run_scored = sum(any(v is not None for v in values) for values in zip(*captured.values()))
    if not all(unscored) or run_scored == 0:
        return None
    return (
        f"--task {task}: no reward function scored any of the {len(unscored)} completions (each returned None or NaN; the "
        f"run scored {run_scored}): every advantage would be 0, so nothing replayed could be compared with the "
        "trainer's step; fix the functions (doctor --task names them under bad_reward), or leave out --task to "
        "replay the captured rewards"
    )


def function_unscored(unscored: dict[str, list[bool]], captured: dict[str, list], task: str | None) -> str | None:
    """Why the replay stops: one of your functions returned None or NaN on every completion where the run's own
    scored some (the others' sum is then not the trainer's: a reward -1.5 where it logged -0.9). None: none did."""
    for name, none in unscored.items():
        run_scored = sum(v is not None for v in captured.get(name, []))
        if none and all(none) and run_scored:
            return (
                f"--task {task}: reward function {name!r} returned None or NaN on all {len(none)} completions, where "
                f"the run's scored {run_scored}: not the function as it ran (doctor --task compares each row under "
                "rewards_not_own), so no reward replayed could be compared with the trainer's"
            )
    return None


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
    threads(args.threads)
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
