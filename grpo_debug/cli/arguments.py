"""Flags and helpers every command shares: the reward time limit, --set, the device, threads, writing an output."""

from __future__ import annotations

import json

# the doctor's default seconds for the whole command, loading included: on a CPU 60 s at --horizon 0 and 180 s with a
# horizon (the default with --task), 600 s on a GPU (`doctor.deadline`)
BUDGET = {"cpu": 60.0, "cpu horizon": 180.0, "cuda": 600.0}


TASK_HELP = (
    "your reward functions, as open_capture takes them: my_rewards.py:REWARD_FUNCS, or a registered "
    "task; without it the captured rewards are replayed"
)


HTML_HELP = (
    "write every completion token to this standalone HTML page, coloured by advantage, ratio, KL, entropy, "
    "d loss / d logp or the mask (a selector switches), every value on hover"
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


def threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


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


def write_token_page(parser, path: str, run, tokenizer, title: str = "") -> None:
    """`--html`: every token of the run on one standalone page (`grpo_debug.show.token_page`)."""
    from ..files import write_text_atomically
    from ..show.token_page import render_page, token_values

    try:
        write_text_atomically(path, render_page(token_values(run, tokenizer, title)))
    except OSError as e:
        cannot_write(parser, e)
    print(f"every token of the step: {path}")
