"""The task is a plug-in: the same step runs a second task with no chess in it (arithmetic on a tiny random GPT-2),
its rewards are its own functions summed with their weights as TRL sums them, and the engine never imports chess."""

import ast
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from arithmetic_task import WEIGHTS, arithmetic_task, build_tiny_model, expected_total, format_reward

import grpo_debug.task as task_module
from grpo_debug.config import StepConfig
from grpo_debug.rewards import compute_rewards
from grpo_debug.task import PROMPT_SETS, Task, load_task, register_task, task_names

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def arithmetic():
    register_task("arithmetic", "arithmetic_task:arithmetic_task")  # an import string, as the chess tasks
    yield load_task("arithmetic")
    task_module._FACTORIES.pop("arithmetic", None)
    task_module._LOADED.pop("arithmetic", None)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"))


def test_rewards_are_the_weighted_nan_skipping_sum_of_the_task_functions(arithmetic):
    prompts = ["What is 3+4? ", "What is 1+1? "]
    completions = ["7", "x7", "", "2"]
    rewards = compute_rewards(prompts, completions, 2, arithmetic)
    assert rewards.per_function["exact_answer"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert rewards.per_function["format_reward"][:2].tolist() == [1.0, 0.5]
    assert math.isnan(rewards.per_function["format_reward"][2])  # None: the function does not apply
    assert rewards.total.tolist() == [1.5, 0.25, 0.0, 1.5]
    assert rewards.total.tolist() == [expected_total(prompts[i // 2], c) for i, c in enumerate(completions)]
    assert list(rewards.components) == ["exact", "length_error", "format_reward"]  # details, else the function
    assert rewards.errors == ["", "exact_answer: not a number", "exact_answer: not a number", ""]


def test_a_component_two_functions_report_is_prefixed_with_the_function_name():
    class Scored:
        def __init__(self, name, value):
            self.__name__, self.value = name, value

        def __call__(self, prompts, completions, **kwargs):
            return [self.value] * len(completions)

        def details(self, prompts, completions):
            n = len(completions)
            return [self.value] * n, {"format": [self.value] * n, self.__name__: [0.0] * n}, ["bad"] * n

    task = Task("two", lambda s, n: [], (Scored("first", 1.0), Scored("second", -1.0)), (0.25, 1.0))
    rewards = compute_rewards(["p"], ["a", "b"], 2, task)
    assert list(rewards.components) == ["first/format", "first", "second/format", "second"]
    assert rewards.total.tolist() == [-0.75, -0.75]
    assert rewards.errors == ["first: bad; second: bad"] * 2


def test_an_infinite_reward_is_refused_naming_the_sample_and_prompt_and_a_none_row_is_unscorable():
    def reward(prompts, completions, **kwargs):
        return [0.0, 1.0, 0.5, bad]

    never = lambda prompts, completions, **kw: [None] * len(completions)  # noqa: E731
    bad = float("inf")
    task = Task("bad", lambda s, n: [], (reward, never))
    with pytest.raises(ValueError, match=r"an infinite reward .*for sample 3 \(prompt 1: 'b'\)"):
        compute_rewards(["a", "b"], ["x"] * 4, 2, task)
    read_as_none = compute_rewards(["a", "b"], ["x"] * 4, 2, task.without_infinite())
    assert read_as_none.infinite == {"reward": [3]} and read_as_none.total[3].isnan(), read_as_none
    bad = None
    rewards = compute_rewards(["a", "b"], ["x"] * 4, 2, task)
    assert rewards.total[3].isnan() and rewards.total[:3].tolist() == [0.0, 1.0, 0.5], rewards.total


def test_task_and_registry_errors_are_named(arithmetic):
    with pytest.raises(ValueError, match="number of reward weights"):
        Task("t", arithmetic_task().prompts, (format_reward,), (1.0, 2.0))
    with pytest.raises(ValueError, match="task must be one of .*arithmetic.*, got 'nope'"):
        load_task("nope")
    with pytest.raises(
        ValueError,
        match=r"StepConfig\.task = 'nope' is not allowed: it must be one of policy, env, "
        r"mixed, arithmetic",
    ):
        StepConfig(task="nope")
    assert StepConfig(task="arithmetic").task == "arithmetic" and "arithmetic" in task_names()
    for prompt_set in PROMPT_SETS:
        assert arithmetic.prompts(prompt_set, 3)[0].startswith("What is ")
    with pytest.raises(ValueError, match="holdout"):
        arithmetic.prompts("holdout", 3)


def test_trl_gets_the_task_functions_and_weights(arithmetic, tiny_model, tmp_path):
    from grpo_debug.capture.trl_bridge import prompt_dataset, trl_trainer

    cfg = StepConfig(model=str(tiny_model), task="arithmetic", num_prompts=2, num_generations=2, max_new_tokens=4)
    trainer = trl_trainer(cfg, str(tmp_path))
    assert trainer.reward_func_names == ["exact_answer", "format_reward"]
    assert trainer.reward_weights.tolist() == list(WEIGHTS)
    assert prompt_dataset(cfg)["prompt"] == arithmetic.prompts("train", 2)


STEP_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from grpo_debug.config import StepConfig
    from grpo_debug.show.metrics import metrics
    from grpo_debug.step import GRPOStep
    from grpo_debug.task import register_task
    register_task("arithmetic", "arithmetic_task:arithmetic_task")
    cfg = StepConfig(model={model!r}, task="arithmetic", num_prompts=3, num_generations=4, max_new_tokens=6,
                     temperature=1.0, learning_rate=1e-2, eval_prompts=3, eval_samples=2, bootstrap=50)
    step = GRPOStep(cfg)
    run = step.run()
    print(json.dumps({{
        "chess_modules": sorted(m for m in sys.modules if m.startswith("grpo_debug.chess")),
        "prompts": run.rollout.prompts, "completions": run.rollout.completions,
        "total": run.rewards.total.tolist(), "components": list(run.rewards.components),
        "per_function": {{k: v.tolist() for k, v in run.rewards.per_function.items()}},
        "eval_completions": run.evaluation.before.completions, "eval_reward": run.evaluation.before.reward,
        "eval_per_prompt": run.evaluation.before.per_prompt.tolist(), "grad_norm": run.update.grad_norm,
        "phases": list(run.timings), "metrics": {{k: v for k, v in metrics(run).items() if not k.startswith("time/")}},
    }}))
""")


def test_the_same_step_runs_the_arithmetic_task_end_to_end_without_importing_chess(arithmetic, tiny_model):
    script = STEP_SCRIPT.format(tests=str(TESTS), model=str(tiny_model))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["chess_modules"] == []
    assert out["phases"] == ["rollout", "logprobs", "rewards", "advantages", "loss", "update", "evaluation"]
    assert out["prompts"] == arithmetic.prompts("train", 3) and len(out["completions"]) == 12
    want = [expected_total(out["prompts"][i // 4], c) for i, c in enumerate(out["completions"])]
    assert out["total"] == pytest.approx(want, abs=1e-6)
    assert set(out["per_function"]) == {"exact_answer", "format_reward"}
    assert out["components"] == ["exact", "length_error", "format_reward"]
    test_prompts = arithmetic.prompts("test", 3)
    eval_want = (
        torch.tensor([expected_total(test_prompts[i // 2], c) for i, c in enumerate(out["eval_completions"])])
        .view(3, 2)
        .mean(1)
    )
    assert out["eval_per_prompt"] == pytest.approx(eval_want.tolist(), abs=1e-6)
    assert math.isfinite(out["grad_norm"]) and "rewards/exact/mean" in out["metrics"]


def _imported_modules(path: Path) -> list[str]:
    """Absolute names of every module `path` imports, at any depth (lazy imports in functions included)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return names


def test_no_engine_module_imports_the_chess_package():
    engine = [p for p in (ROOT / "grpo_debug").rglob("*.py") if "chess" not in p.relative_to(ROOT / "grpo_debug").parts]
    assert len(engine) > 10
    offenders = {
        str(p.relative_to(ROOT)): m
        for p in engine
        for m in _imported_modules(p)
        if m == "grpo_debug.chess" or m.startswith("grpo_debug.chess.")
    }
    assert not offenders
    chess_task = _imported_modules(ROOT / "grpo_debug" / "chess" / "task.py")
    assert "grpo_debug.task" in chess_task and "grpo_debug.chess.rewards" in chess_task  # the resolver works


def test_a_reward_that_fails_on_a_later_row_names_its_file_line_and_the_row():
    def sometimes(prompts, completions, **kwargs):
        return [1.0 / (len(c) - 2) for c in completions]

    task = Task("later", lambda s, n: [], (sometimes,))
    with pytest.raises(ValueError, match=r"'sometimes' \(test_task_seam.py:\d+\) raised ZeroDivisionError.* on row 2"):
        compute_rewards(["p"], ["a", "bbb", "cc", "dddd"], 4, task)
