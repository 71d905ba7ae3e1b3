"""Capture a step of a real TRL GRPOTrainer run and replay it: our recomputation against what TRL logged."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_debug.capture import CaptureCallback, open_capture
from grpo_debug.capture.reading import load_capture
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.step import StepRun

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from arithmetic_task import arithmetic_task, build_tiny_llama, build_tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")


EXACT = ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "grad_norm")


def captured_run(cfg: StepConfig, out: Path, task=None, **overrides) -> Path:
    """A real 2-step GRPOTrainer run on CPU with CaptureCallback(steps=[2]); the capture folder."""
    trainer = trl_trainer(cfg, str(out), task, max_steps=2, **overrides)
    callback = CaptureCallback(out / "captures", steps=[2])
    trainer.add_callback(callback)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == [1, 2]
    (out / "log_history.json").write_text(json.dumps([{"step": h["step"], "kl": h.get("kl")} for h in logged]))
    return out / "captures" / "step-2"


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-7


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, beta=0.04)  # fixed: position_ids passed
    return captured_run(cfg, tmp_path_factory.mktemp("bundled"), disable_dropout=True)


def test_a_capture_is_a_self_contained_folder(bundled):
    names = {p.name for p in bundled.iterdir()}
    assert {"README.md", "capture.json", "batch.pt", "policy"} <= names
    assert "python -m grpo_debug replay" in (bundled / "README.md").read_text()
    size = sum(p.stat().st_size for p in bundled.rglob("*") if p.is_file())
    assert size < 50 * 1024**2, size
    capture = load_capture(bundled)
    meta, batch = capture.meta, capture.batch
    assert meta["step"] == 2 and meta["logged"]["loss"] == meta["logged"]["loss"]  # TRL's logged numbers
    assert meta["grpo_config"]["beta"] == 0.04 and meta["position_ids"] is True
    assert set(meta["rewards"]) == {"rookworld"} and meta["reward_weights"] == {"rookworld": 1.0}
    n = capture.num_samples
    assert (
        n == 8
        and len(meta["completions"]) == n
        and batch["trainer_per_token_logps"].shape == batch["completion_ids"].shape
    )
    assert torch.allclose(torch.tensor(meta["advantages"]), batch["advantages"])
    logged = [(h["step"], h["kl"]) for h in json.loads((bundled.parent.parent / "log_history.json").read_text())]
    assert capture.logged_kl == logged, f"the capture's kl history is not TRL's log: {capture.logged_kl} {logged}"


def test_the_replay_reproduces_what_trl_logged(bundled):
    from grpo_debug.capture.replay import reproduction

    step = open_capture(bundled)
    run = step.run(until="update")
    out = reproduction(run, step.capture, step.policy, step)
    for name in EXACT:
        assert close(out["replayed"][name], out["logged"][name]), (name, out["replayed"][name], out["logged"][name])
    assert out["logps"]["max_abs_difference"] < 1e-4
    assert "positions" not in out["pitfalls"] and out["causes"]["dropout"].startswith("absent")
    assert run.config.preset_name() == "fixed" and run.config.beta == 0.04  # the run was the fixed preset in TRL


@pytest.mark.slow  # `make test-slow`: replay commands in fresh processes
def test_the_cli_writes_logged_and_replayed_and_takes_a_toggle(bundled, tmp_path):
    runs = {}
    for name, extra in (("as_captured", []), ("toggled", ["--set", "position_ids=false"])):
        path = tmp_path / f"{name}.json"
        done = subprocess.run(
            [sys.executable, "-m", "grpo_debug", "replay", str(bundled), "--json", str(path), *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads(path.read_text())
    assert (
        set(runs["as_captured"]["logged"]) >= set(EXACT)
        and runs["as_captured"]["replayed"].keys() == runs["as_captured"]["logged"].keys()
    )
    assert runs["toggled"]["config"]["position_ids"] is False
    # the bundled model has absolute positions and left-padded prompts: without position_ids the scores move
    assert runs["toggled"]["logps"]["max_abs_difference"] > 1.0 > runs["as_captured"]["logps"]["max_abs_difference"]
    bad = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "replay", str(bundled), "--set", "temperature=0.5"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode == 2 and "rollout" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "replay", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert missing.returncode == 2 and "not a capture" in missing.stderr


def test_trls_own_defaults_are_replayed_with_their_pitfalls_named(tmp_path):
    """The trl preset: TRL's GRPOTrainer without position_ids, dropout on. The replay draws the trainer's own
    dropout masks, so it reproduces the step; both pitfalls are named as pitfalls of the run, not as causes."""
    from grpo_debug.capture.replay import reproduction

    cfg = StepConfig.preset("trl", num_prompts=2, num_generations=4, max_new_tokens=32)
    capture = captured_run(cfg, tmp_path)
    step = open_capture(capture)
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    assert set(out["pitfalls"]) == {"positions", "dropout"}
    assert out["causes"]["dropout"].startswith("absent: the trainer's dropout masks are replayed")
    for name in EXACT:
        if name in out["logged"]:
            assert close(out["replayed"][name], out["logged"][name]), (name, out["replayed"][name], out["logged"][name])
    assert out["logps"]["max_abs_difference"] == 0.0


def test_a_tiny_llama_with_two_reward_functions_round_trips(tmp_path):
    from grpo_debug.capture.replay import reproduction
    from grpo_debug.task import register_task

    folder = build_tiny_llama(tmp_path / "llama")
    task = arithmetic_task()
    register_task("arithmetic", lambda: task)
    cfg = StepConfig(
        model=str(folder),
        task="arithmetic",
        num_prompts=2,
        num_generations=4,
        max_new_tokens=4,
        beta=0.04,
        fast=False,
        position_ids=False,
    )  # TRL's own trainer: rotary positions need none
    capture = captured_run(cfg, tmp_path / "run", task, disable_dropout=True)
    meta = load_capture(capture).meta
    assert set(meta["rewards"]) == set(task.reward_names) and list(meta["reward_weights"].values()) == [1.0, 0.5]
    step = open_capture(capture)
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    for name in EXACT:
        assert close(out["replayed"][name], out["logged"][name]), (name, out["replayed"][name], out["logged"][name])
    assert out["pitfalls"] == {}  # rotary positions, no dropout


def test_the_dashboard_acts_on_a_captured_step(bundled):
    import contextlib
    import io

    from grpo_debug.ui.widgets import StepPanel

    step = open_capture(bundled, per_sample_grad_norms=False)
    captured = step.result.rollout
    with contextlib.redirect_stdout(io.StringIO()):
        panel = StepPanel(step)
        result = panel.on_change("beta", 0.1)
    assert result.rerun == ["loss"] and step.result.rollout is captured and step.cfg.beta == 0.1
    assert "loss = " in panel.status.value


def test_conversational_prompts_under_a_chat_template_round_trip(tmp_path):
    """A user's own script: GRPOTrainer on a conversational dataset (message lists), the tokenizer's chat
    template applied by TRL, reward functions that read message lists. The replay scores the templated ids."""
    from arithmetic_task import ExactAnswer, arithmetic_prompts, conversational, format_reward
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from grpo_debug.capture.replay import reproduction
    from grpo_debug.capture.trl_bridge import grpo_config

    folder = build_tiny_llama(tmp_path / "chat", chat=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cfg = StepConfig(
        model=str(folder), num_prompts=2, num_generations=4, max_new_tokens=4, beta=0.04, position_ids=False
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in arithmetic_prompts("train", 2)]})
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=[conversational(ExactAnswer()), conversational(format_reward)],
        args=grpo_config(cfg, str(tmp_path / "run"), max_steps=2, disable_dropout=True, reward_weights=[1.0, 0.5]),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.add_callback(CaptureCallback(tmp_path / "captures", steps=[2]))
    trainer.train()
    capture = load_capture(tmp_path / "captures" / "step-2")
    assert all(p in dataset["prompt"] for p in capture.meta["prompts"])  # TRL logged the message lists
    assert isinstance(capture.meta["completions"][0], list) and capture.meta["completions"][0][0]["role"] == "assistant"
    templated = tokenizer.apply_chat_template(capture.meta["prompts"][0], add_generation_prompt=True, tokenize=False)
    prompt_ids = capture.batch["prompt_ids"][0][capture.batch["prompt_mask"][0].bool()]
    assert tokenizer.decode(prompt_ids) == templated  # the trainer scored the template's tokens, role markers included
    step = open_capture(capture.path)
    assert step.result.rollout.prompts[0] == capture.meta["prompts"][0][0]["content"]  # role markers are special tokens
    yours = open_capture(capture.path, [conversational(ExactAnswer()), conversational(format_reward)])
    anew = yours.cfg.replace(seed=yours.cfg.seed + 1)
    sampled = yours.run(anew, until="rewards", base=StepRun(anew), remember=False).rollout
    for k in range(2):  # new completions start from the trainer's prompt ids, role markers included
        want = capture.batch["prompt_ids"][k * 4][capture.batch["prompt_mask"][k * 4].bool()]
        got = sampled.prompt_ids[k * 4][sampled.prompt_mask[k * 4].bool()]
        assert torch.equal(got, want), f"prompt {k} sampled anew from {tokenizer.decode(got)!r}, not {templated!r}"
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    for name in EXACT:
        assert close(out["replayed"][name], out["logged"][name]), (name, out["replayed"][name], out["logged"][name])
    assert out["logps"]["max_abs_difference"] < 1e-4


LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    # `--cpu --num_processes 2` starts one process here (accelerate's simple launcher: several CPU processes
    # need an mpirun hostfile); `--multi_gpu` starts two through torch.distributed.run, and the trainer's
    # use_cpu=True makes them CPU processes on gloo
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    + ["--mixed_precision", "no", "--dynamo_backend", "no"],
}
TOLERANCE = 1e-4  # relative


def two_process_capture(model: Path, out: Path, launcher: str = "torchrun", *layout: str) -> Path:
    """Step 2 of `tests/capture_two_processes.py` (2 steps, 2 CPU processes) run under `launcher`, with the
    layout given as KEY=VALUE (ga, iterations, dropout, loss_type); the capture folder."""
    done = subprocess.run(
        [sys.executable, *LAUNCHERS[launcher], str(TESTS / "capture_two_processes.py"), str(model), str(out), *layout],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the two-process run under {launcher} failed:\n{done.stderr[-3000:]}"
    return out / "captures" / "step-2"


def relative_gap(ours: float, theirs: float) -> float:
    return abs(ours - theirs) / max(abs(ours), abs(theirs), 1e-30)


@pytest.mark.slow  # `make test-slow`: two processes started with torchrun or accelerate
def test_a_two_process_run_is_gathered_and_written_once(tmp_path):
    """torchrun, 2 CPU processes (gloo), each generating half the batch: the capture holds all B*G rows, and the
    trainer's log-probs of each process's share are put back in place; the replay reproduces the logged step."""
    from grpo_debug.capture.replay import reproduction

    folder = build_tiny_llama(tmp_path / "llama")
    capture = load_capture(two_process_capture(folder, tmp_path / "run"))
    assert capture.meta["processes"] == 2 and capture.num_samples == 8
    widths = capture.batch["prompt_mask"].sum(1)
    assert widths.unique().numel() == 2  # the two processes' prompts differ in length ...
    assert (capture.batch["prompt_mask"][:, -1] == 1).all()  # ... and every row is left-padded to the widest
    assert capture.batch["trainer_per_token_logps"].isfinite().all()  # every row matched on its own process
    step = open_capture(capture.path)
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    for name in EXACT:
        assert close(out["replayed"][name], out["logged"][name]), (name, out["replayed"][name], out["logged"][name])
    assert out["logps"]["rows_compared"] == 8 and out["logps"]["max_abs_difference"] < 1e-4


@pytest.mark.slow  # `make test-slow`: two processes started with torchrun
def test_the_replayed_update_of_a_two_process_step_lands_on_the_next_steps_weights(tmp_path):
    """Two processes, two micro-batches each: the main process writes the optimizer's state once (DDP keeps the
    processes' copies identical); step 2 replayed process by process and stepped with it lands on step 3."""
    from grpo_debug.capture.landing import landing

    folder = build_tiny_llama(tmp_path / "llama")
    step_2 = two_process_capture(folder, tmp_path / "run", "torchrun", "ga=2", "steps=3")
    assert load_capture(step_2).meta["optimizer"]["class"] == "AdamW"
    out = landing(open_capture(step_2), step_2.parent / "step-3")
    assert out["exact"], out["optimizer"]
    assert out["trainer_norm"] > 0 and out["cosine"] >= 0.99 and abs(out["norm_ratio"] - 1) <= 0.02, out
    assert out["max_abs_difference"] < 1e-6, out  # measured 3.7e-09: DDP averages in another order than ours


@pytest.fixture(scope="module")
def dropout_qwen2(tmp_path_factory):
    """A tiny Qwen2 whose attention drops out (0.1): its masks depend on the random state and the shapes."""
    return build_tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "model", attention_dropout=0.1)


@pytest.fixture(scope="module")
def two_micro_batches_each(dropout_qwen2, tmp_path_factory):
    """torchrun, 2 processes, gradient_accumulation_steps = steps_per_generation = 2, dropout on: step 2."""
    return two_process_capture(dropout_qwen2, tmp_path_factory.mktemp("ga2"), "torchrun", "ga=2", "dropout=1")


def assert_replayed_per_process(capture_path: Path, passes: int) -> None:
    """Each process's loss, the logged loss (the mean over processes), the all-reduced grad_norm and every
    metric TRL logged at the step, replayed within 1e-4 relative; the old one-batch replay is not."""
    from grpo_debug.capture.replay import reproduction

    step = open_capture(capture_path)
    ranks = step.capture.schedule["ranks"]
    assert [len(rank["micro_batches"]) for rank in ranks] == [2, 2], "each process did not record 2 micro-batches"
    assert {mb["pass"] for rank in ranks for mb in rank["micro_batches"]} == {passes - 1}, "the pass is not recorded"
    assert tuple(step.capture.batch["rng_states"].shape[:2]) == (2, 2), "not one random state per forward per process"
    run = step.run(until="update")
    out = reproduction(run, step.capture, step.policy, step)
    assert out["causes"]["dropout"].startswith("absent: the trainer's dropout masks are replayed")
    for r, loss in enumerate(out["ranks"]):
        gap = relative_gap(loss["replayed"], loss["logged"])
        assert gap <= TOLERANCE, (
            f"process {r}'s loss: replayed {loss['replayed']}, trainer {loss['logged']} ({gap:.2g})"
        )
    logged = step.capture.meta["logged"]  # what TRL itself logged at step 2 (logging_steps=1)
    for name in [n for n in EXACT if n in logged]:
        gap = relative_gap(out["replayed"][name], logged[name])
        assert gap <= TOLERANCE, f"{name}: replayed {out['replayed'][name]}, TRL logged {logged[name]} ({gap:.2g})"
    assert out["logps"]["max_abs_difference"] < 1e-4, "the replay's log-probs are not the trainer's"
    engine = open_capture(capture_path)
    engine.update_phase = None  # the engine's own update phase: the whole batch as one micro-batch, as before
    one_batch = reproduction(engine.run(until="update"), engine.capture, engine.policy)
    gaps = {name: relative_gap(one_batch["replayed"][name], logged[name]) for name in ("loss", "kl")}
    assert min(gaps.values()) > 10 * TOLERANCE, f"the one-batch replay matches too ({gaps}): the layout tests nothing"


@pytest.mark.slow  # `make test-slow`: two processes started with torchrun or accelerate
def test_two_processes_with_two_micro_batches_each_and_dropout_are_replayed_process_by_process(
    two_micro_batches_each,
):
    assert_replayed_per_process(two_micro_batches_each, passes=1)


@pytest.mark.slow  # `make test-slow`: two processes started with torchrun or accelerate
@pytest.mark.parametrize(
    "launcher, iterations", [("torchrun", 2), ("accelerate", 1)], ids=["torchrun-num_iterations-2", "accelerate"]
)
def test_other_multi_process_layouts_are_replayed_process_by_process(dropout_qwen2, tmp_path, launcher, iterations):
    """num_iterations=2 (step 2 is the second pass over its generation batch, at the weights step 1 left), and
    the same layout as above through `accelerate launch`."""
    layout = ("ga=2", "dropout=1", f"iterations={iterations}")
    assert_replayed_per_process(two_process_capture(dropout_qwen2, tmp_path / "run", launcher, *layout), iterations)


@pytest.mark.slow  # `make test-slow`: two processes started with torchrun or accelerate
@pytest.mark.parametrize(
    "damage, problem",
    [
        ("a row of process 1 in process 0", "process 0's schedule rows are not distinct rows of its share"),
        ("a loss missing", "process 1's losses are not one number per micro-batch"),
        ("a process missing", "schedule.ranks is not one entry per process"),
        ("one process with fewer micro-batches", "the processes have different numbers of micro-batches"),
        ("a width past the batch", "process 0's completion_width = 99 is not a width"),
        ("random states of one process", "rng_states are not CPU random states"),
    ],
)
def test_a_multi_process_schedule_that_does_not_add_up_is_refused(two_micro_batches_each, tmp_path, damage, problem):
    import shutil

    from grpo_debug.capture.reading import CaptureError
    from grpo_debug.checksums import write_checksums

    path = Path(shutil.copytree(two_micro_batches_each, tmp_path / "damaged"))
    meta = json.loads((path / "capture.json").read_text())
    ranks = meta["schedule"]["ranks"]
    if damage == "a row of process 1 in process 0":
        ranks[0]["micro_batches"][0]["rows"][0] = ranks[1]["micro_batches"][0]["rows"][0]
    elif damage == "a loss missing":
        ranks[1]["losses"].pop()
    elif damage == "a process missing":
        ranks.pop()
    elif damage == "one process with fewer micro-batches":
        ranks[1]["micro_batches"].pop()
        ranks[1]["losses"].pop()
    elif damage == "a width past the batch":
        ranks[0]["completion_width"] = 99
    else:
        batch = torch.load(path / "batch.pt", weights_only=True)
        batch["rng_states"] = batch["rng_states"][0]
        torch.save(batch, path / "batch.pt")
    (path / "capture.json").write_text(json.dumps(meta))
    write_checksums(path)
    with pytest.raises(CaptureError, match=problem):
        load_capture(path)


def test_new_completions_need_your_task_and_get_its_rewards(bundled):
    """Stored rewards exist for the captured completions only: an evaluation (new samples on test prompts)
    is refused with what to do, and works once the capture is opened with the run's own task."""
    from grpo_debug.capture.replay import reproduction

    stored = open_capture(bundled, eval_prompts=4, eval_samples=2)
    assert stored.stored_rewards
    with pytest.raises(ValueError, match=r"open_capture\(path, task=NAME\)"):
        stored.run()
    yours = open_capture(bundled, StepConfig().task, eval_prompts=4, eval_samples=2)
    run = yours.run()
    assert not yours.stored_rewards and run.evaluation is not None and len(run.evaluation.after.completions) == 8
    out = reproduction(run, yours.capture, yours.policy, yours)
    assert out["rewards"] == {"rookworld": 0.0}  # the task's functions give the stored rewards back exactly
    with pytest.raises(ValueError, match="not the run's reward functions"):
        from arithmetic_task import arithmetic_task

        open_capture(bundled, arithmetic_task())


def test_identical_rows_in_two_micro_batches_of_a_pass_are_two_rows(tmp_path):
    """Two identical rows (same prompt, completion and advantage) trained in two micro-batches of one pass are
    the generation batch's two copies, not its first copy twice (a capture with a row twice is refused)."""
    from types import SimpleNamespace

    callback = CaptureCallback(tmp_path / "unused", steps=[1])  # a recorder locks its folder: not the cwd
    args = SimpleNamespace(steps_per_generation=2)
    callback.trainer = SimpleNamespace(args=args, num_iterations=1, current_gradient_accumulation_steps=2)
    prompt_ids = torch.tensor([[5, 6], [5, 6], [5, 6], [5, 6]])
    completion_ids = torch.tensor([[1, 2], [3, 4], [1, 4], [1, 2]])  # rows 0 and 3 are identical
    advantages = torch.tensor([0.5, -0.5, 0.0, 0.5])
    local = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "advantages": advantages}
    callback.generation, callback.current = {"local": local, "first_micro_batch": 0}, {"micro_batches": []}
    for micro, rows in enumerate(([0, 2], [3, 1])):  # TRL's shuffled order: row 0's twin comes second
        inputs = {k: v[rows] for k, v in local.items()}
        callback._on_micro_batch(inputs, micro)
    picked = [mb["rows"] for mb in callback.current["micro_batches"]]
    assert sorted(r for rows in picked for r in rows) == [0, 1, 2, 3], f"a row was taken twice: {picked}"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (("format", 99), "format 99: this release reads capture formats 3 to"),
        (("format", "3"), "format '3': this release reads"),
        (("format", None), "format None: this release reads"),
        (("forwards", -1), r"schedule.forwards = -1 is not a positive integer"),
        (("num_iterations", -2), r"schedule.num_iterations = -2 is not a positive integer"),
        (("steps_per_generation", 0), r"schedule.steps_per_generation = 0 is not a positive integer"),
        (("pass", -1), "a schedule micro-batch's pass = -1 is outside 0 to 0"),
        (("pass", 99), "a schedule micro-batch's pass = 99 is outside"),
        (("index", -3), "a schedule micro-batch's index = -3 is outside"),
        (("skip a row", None), r"schedule micro-batches of \[\d+\] rows: each is \d+"),
        (("drop a micro-batch", None), "micro-batches for gradient_accumulation_steps"),
        (("logged_kl", [[1, "high"]]), "logged_kl is not a list of"),
        (("logged_kl", {"1": 0.1}), "logged_kl is not a list of"),
    ],
)
def test_a_capture_of_another_format_or_a_schedule_out_of_bounds_is_refused(bundled, tmp_path, damage, problem):
    """Every field the replay reads is checked: the format this release reads, the schedule's counts positive,
    each micro-batch's pass and index in range, each a full share of the batch (resealed: the checksums pass)."""
    import shutil

    from grpo_debug.capture.reading import CaptureError
    from grpo_debug.checksums import write_checksums

    path = Path(shutil.copytree(bundled, tmp_path / "damaged"))
    meta = json.loads((path / "capture.json").read_text())
    schedule, (key, value) = meta["schedule"], damage
    if key == "format":
        meta.pop("format") if value is None else meta.update(format=value)
    elif key in ("pass", "index"):
        schedule["micro_batches"][0][key] = value
    elif key == "skip a row":
        assert len(schedule["micro_batches"][0]["rows"]) > 1, "the fixture's micro-batches hold one row"
        schedule["micro_batches"][0]["rows"].pop()
    elif key == "drop a micro-batch":
        schedule["gradient_accumulation_steps"] += 1
    elif key == "logged_kl":
        meta["logged_kl"] = value
    else:
        schedule[key] = value
    (path / "capture.json").write_text(json.dumps(meta))
    write_checksums(path)
    with pytest.raises(CaptureError, match=problem):
        load_capture(path)


def test_a_fix_is_followed_over_steps_only_with_reward_functions_for_new_completions(bundled):
    """Without your task, the stored rewards score the captured completions alone: the doctor says it keeps to
    the one-step effects. With it, a continuation samples anew and carries the trainer's optimizer on."""
    from grpo_debug.doctor import diagnose
    from grpo_debug.doctor.horizon import continuations

    report = diagnose(open_capture(bundled), held_out=0, horizon=2)
    assert report.horizon["steps"] == 0 and "one-step effects only" in report.horizon["why"], report.horizon
    assert not any(f.learning for f in report.findings)
    step = open_capture(bundled, task=StepConfig().task)
    step.run(until="update")
    carried = []
    original = step.advance

    def advance():
        original()
        state = next(iter(step.optimizer.state.values()))  # the trainer's moments: stepped before this capture
        carried.append((len(step.optimizer.param_groups), float(state["step"])))

    step.advance = advance
    continued = continuations(step, {}, steps=2, seeds=[0])
    assert len(continued[0].rewards) == 2 and all(math.isfinite(r) for r in continued[0].rewards), continued
    groups = len(load_capture(bundled).meta["optimizer"]["groups"])
    assert carried[0] == (groups, 2.0), f"not the trainer's optimizer carried on (groups, Adam's step): {carried}"


def test_a_reference_named_by_a_hub_id_is_refused_without_the_network_and_a_reseal_points_it_elsewhere(
    bundled, tmp_path, monkeypatch, capsys
):
    """A name read from a capture never makes this machine download what it names: the refusal says how to point
    the capture at a folder, and `python -m grpo_debug reseal` makes the edit one the checksums accept."""
    import shutil

    import grpo_debug.model as model_module
    from grpo_debug.capture.reading import CaptureError
    from grpo_debug.cli.commands import main

    def no_network():
        raise AssertionError("the hub was asked for a name read from a capture")

    monkeypatch.setattr(model_module, "hub_reachable", no_network)
    path = Path(shutil.copytree(bundled, tmp_path / "moved"))
    meta = json.loads((path / "capture.json").read_text())
    folder = meta["reference"]["name_or_path"]
    meta["reference"]["name_or_path"] = "someone/not-a-model-here"
    (path / "capture.json").write_text(json.dumps(meta))
    assert main(["reseal", str(path)]) == 0 and "resealed" in capsys.readouterr().out
    with pytest.raises(CaptureError, match="is not here .*python -m grpo_debug reseal"):
        open_capture(path)
    meta["reference"]["name_or_path"] = folder  # pointed back at the folder that holds it, and resealed
    (path / "capture.json").write_text(json.dumps(meta))
    with pytest.raises(CaptureError, match="checksums"):
        load_capture(path)
    main(["reseal", str(path)])
    assert open_capture(path).capture.meta["reference"]["name_or_path"] == folder


def test_the_course_of_the_run_is_kept_step_by_step_whatever_logging_steps_is():
    """The callback's own record of each step (TRL's default logging_steps=10 logs none of a 3-step run): each step's
    mean of what TRL appended, oldest first, capped; a step without numbers is kept with its step alone."""
    from grpo_debug.capture.course import remember_step
    from grpo_debug.capture.trainer_state import LOGGED_KL_STEPS

    course = []
    for step in range(1, LOGGED_KL_STEPS + 3):
        course = remember_step(course, step, {"kl": [0.1 * step, 0.3 * step], "loss": [1.0], "entropy": []})
    assert len(course) == LOGGED_KL_STEPS and course[0]["step"] == 3, "the course is not the last steps, capped"
    assert course[-1] == {"step": LOGGED_KL_STEPS + 2, "kl": pytest.approx(0.2 * (LOGGED_KL_STEPS + 2))}, course[-1]
    assert remember_step([], 1, {"kl": [float("nan")]}) == [{"step": 1}], "a NaN mean is kept as a number"


def test_the_course_keeps_each_reward_functions_spread():
    """When each reward function went flat is evidence of its own (a function constant from the first step is no
    consequence of a later blow-up): TRL's `rewards/<name>/std` is kept beside the run's, its mean is not."""
    from grpo_debug.capture.course import remember_step
    from grpo_debug.capture.trainer_state import logged_history

    new = {"reward_std": [0.5], "rewards/polite/std": [0.0, 0.0], "rewards/polite/mean": [1.0], "loss": [0.1]}
    assert remember_step([], 1, new) == [{"step": 1, "reward_std": 0.5, "rewards/polite/std": 0.0}]
    logged = [{"step": 1, "loss": 0.1, "rewards/exact/std": 0.4, "rewards/exact/mean": 0.5, "kl": 0.0}]
    assert logged_history(logged) == [{"step": 1, "rewards/exact/std": 0.4, "kl": 0.0}], "TRL's log loses a std"
