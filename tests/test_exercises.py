"""Every checker of the student's path accepts the solution and rejects a typical wrong answer with the sentence
that names its mistake (issue 71: exercises checked like CS336's)."""

import pytest
import torch

from grpo_debug.exercises import (
    ExerciseFailed,
    check_advantages,
    check_clipped_objective,
    check_grpo_step,
    check_normaliser,
)


def advantages_solution(rewards, G):
    grouped = rewards.view(-1, G)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()


def objective_solution(logps, old_logps, advantages, ref_logps, epsilon, beta):
    ratio = torch.exp(logps - old_logps)
    policy = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages)
    d = ref_logps - logps
    return policy + beta * (torch.exp(d) - d - 1)


def normaliser_solution(per_token, mask):
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


WRONG = {
    "advantages: the batch's mean": (
        check_advantages,
        lambda r, G: (r - r.mean()) / (r.view(-1, G).std(1).repeat_interleave(G) + 1e-4),
        "not zero-mean within a group: did you subtract each group's own mean",
    ),
    "advantages: no 1e-4": (
        check_advantages,
        lambda r, G: (
            (r.view(-1, G) - r.view(-1, G).mean(1, keepdim=True)) / r.view(-1, G).std(1, keepdim=True)
        ).flatten(),
        "not all finite: a group of equal rewards has std 0",
    ),
    "advantages: the population std": (
        check_advantages,
        lambda r, G: (
            (r.view(-1, G) - r.view(-1, G).mean(1, keepdim=True))
            / (r.view(-1, G).std(1, unbiased=False, keepdim=True) + 1e-4)
        ).flatten(),  # fmt: skip
        "you divided by the population std (n)",
    ),
    "advantages: not scaled": (
        check_advantages,
        lambda r, G: (r.view(-1, G) - r.view(-1, G).mean(1, keepdim=True)).flatten(),
        "centred but not scaled",
    ),
    "objective: not written": (
        check_clipped_objective,
        lambda *a: (_ for _ in ()).throw(NotImplementedError()),
        "not written yet",
    ),  # fmt: skip
    "objective: the sign": (check_clipped_objective, lambda *a: -objective_solution(*a), "the wrong sign"),
    "objective: no clip": (
        check_clipped_objective,
        lambda lp, old, A, ref, eps, beta: objective_solution(lp, old, A, ref, 10.0, beta),
        "not clipped",
    ),
    "objective: no KL": (
        check_clipped_objective,
        lambda lp, old, A, ref, eps, beta: objective_solution(lp, old, A, ref, eps, 0.0),
        "leaves out the KL term",
    ),  # fmt: skip
    "objective: max for min": (
        check_clipped_objective,
        lambda lp, old, A, ref, eps, beta: (
            -torch.max(torch.exp(lp - old) * A, torch.clamp(torch.exp(lp - old), 1 - eps, 1 + eps) * A)
            + beta * (torch.exp(ref - lp) - (ref - lp) - 1)
        ),
        "you took the max of the two terms",
    ),
    "normaliser: every token at once": (
        check_normaliser,
        lambda x, m: (x * m).sum() / m.sum(),
        "that is 'bnpo'/'dapo'",
    ),
    "normaliser: the padding counted": (
        check_normaliser,
        lambda x, m: x.mean(-1).mean(),
        "your mean counts the padding",
    ),
}


@pytest.mark.parametrize("checker, solution", [(check_advantages, advantages_solution),
                                               (check_clipped_objective, objective_solution),
                                               (check_normaliser, normaliser_solution)])  # fmt: skip
def test_each_checker_accepts_the_solution(checker, solution):
    assert checker(solution).endswith(")") and "passed" in checker(solution)


@pytest.mark.parametrize("case", list(WRONG))
def test_each_checker_rejects_a_typical_wrong_answer_with_its_sentence(case):
    checker, wrong, said = WRONG[case]
    with pytest.raises(ExerciseFailed) as failed:
        checker(wrong)
    assert said in str(failed.value) and "\n" not in str(failed.value), str(failed.value)


def test_the_students_copy_empties_each_solution_and_its_checker_says_so(tmp_path):
    """`make exercises`: the notebooks' solution cells emptied (signature and docstring kept, the body raising
    NotImplementedError), every output cleared; the emptied function, run, meets its checker's "not written yet"."""
    import json
    from pathlib import Path

    from grpo_debug.exercises import student_copy

    root = Path(__file__).resolve().parent.parent
    copy = json.loads(Path(student_copy(str(root / "notebooks" / "04_advantages.ipynb"), str(tmp_path))).read_text())
    solutions = [c for c in copy["cells"] if "solution" in c.get("metadata", {}).get("tags", [])]
    assert len(solutions) == 1 and all(not c.get("outputs") for c in copy["cells"] if c["cell_type"] == "code")
    source = "".join(solutions[0]["source"])
    assert "def group_advantages(rewards, G):" in source and "grouped.std" not in source, source
    space = {}
    exec(source, space)
    with pytest.raises(ExerciseFailed, match="not written yet"):
        check_advantages(space["group_advantages"])


def notebook_solution(stem: str, name: str):
    """The function `name` as the stored notebook `stem`'s solution cell writes it (the student's model answer)."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    source = next(
        "".join(c["source"])
        for c in cells
        if "solution" in c.get("metadata", {}).get("tags", []) and f"def {name}(" in "".join(c["source"])
    )
    return source


STEP_WRONG = {  # 06's solution with one line as a student gets it wrong -> the checker's sentence
    "the loss's sign": ("per_token = -torch.exp", "per_token = torch.exp", "the step lowered the log-probability"),
    "no optimizer step": ("    optimizer.step()\n", "    pass\n", "moved no weight: call loss.backward()"),
    "the batch's mean": ("grouped.mean(1, keepdim=True)", "rewards.mean()", "did you subtract each group's own mean"),
    "prompts interleaved": ("[p for p in prompts for _ in range(G)]", "prompts * G", "repeated G times in a row"),
    "token ids scored": ("], texts)", "], ids.tolist())", "got token ids, not texts"),
}


def test_the_step_checker_accepts_06s_solution():
    space = {"torch": torch}  # the notebook's cells above import it
    exec(notebook_solution("06_update", "grpo_step"), space)
    assert "passed" in check_grpo_step(space["grpo_step"])


@pytest.mark.parametrize("case", list(STEP_WRONG))
def test_the_step_checker_rejects_a_typical_wrong_step_with_its_sentence(case):
    old, new, said = STEP_WRONG[case]
    source = notebook_solution("06_update", "grpo_step")
    assert source.count(old) == 1, f"06's solution no longer holds {old!r} once"
    space = {"torch": torch}  # the notebook's cells above import it
    exec(source.replace(old, new), space)
    with pytest.raises(ExerciseFailed) as failed:
        check_grpo_step(space["grpo_step"])
    assert said in str(failed.value) and "\n" not in str(failed.value), str(failed.value)


def test_the_students_copy_of_06_empties_the_step(tmp_path):
    import json
    from pathlib import Path

    from grpo_debug.exercises import student_copy

    root = Path(__file__).resolve().parent.parent
    copy = json.loads(Path(student_copy(str(root / "notebooks" / "06_update.ipynb"), str(tmp_path))).read_text())
    source = next("".join(c["source"]) for c in copy["cells"] if "solution" in c.get("metadata", {}).get("tags", []))
    space = {"torch": torch}  # the notebook's cells above import it
    exec(source, space)
    with pytest.raises(ExerciseFailed, match="not written yet"):
        check_grpo_step(space["grpo_step"])


def test_the_students_loop_pairs_its_draws_and_rejects_a_broken_step():
    """`run_student_loop` on a tiny random GPT-2: a step that moves nothing changes no seed's reward (the same
    draws before and after); 06's solution runs through it; an unwritten step or one that returns the wrong
    number of rewards is refused with its sentence."""
    from types import SimpleNamespace

    from grpo_debug.exercises import STEP_PROMPTS, run_student_loop, summed_reward, tiny_policy
    from grpo_debug.task import Task

    lengths = Task(
        "lengths",
        lambda which, n: list(STEP_PROMPTS[:n]),
        (lambda prompts, completions: [len(c) for c in completions],),
    )
    small = dict(steps=1, seeds=2, prompts=2, samples=3, G=2, max_new_tokens=4, task=lengths, load=lambda: tiny_policy(0),
                 show=False)  # fmt: skip
    idle = run_student_loop(lambda m, t, o, prompts, r, G, T, n: torch.zeros(len(prompts) * G), **small)
    assert idle.change == [0.0, 0.0] and idle.start[0] != idle.start[1], (idle.start, idle.end)
    assert "not above 0" in idle.summary()
    space = {"torch": torch}
    exec(notebook_solution("06_update", "grpo_step"), space)
    loop = run_student_loop(space["grpo_step"], **{**small, "lr": 1e-2})
    assert loop.start == idle.start and loop.end != loop.start, "the same draws before; the step moved the model"
    assert loop.summary().startswith("change over 2 seeds: ")

    def unwritten(*args):
        raise NotImplementedError

    with pytest.raises(ExerciseFailed, match="not written yet"):
        run_student_loop(unwritten, **small)
    with pytest.raises(ExerciseFailed, match="it returns the B x G = 4 rewards"):
        run_student_loop(lambda m, t, o, prompts, r, G, T, n: torch.zeros(len(prompts)), **small)
    task = SimpleNamespace(reward_funcs=(lambda prompts, completions: [1.0, None], lambda prompts, completions: [2.0, 3.0]),
                           weights=(0.5, 2.0))  # fmt: skip
    assert summed_reward(task)(["p", "q"], ["a", "b"]) == [4.5, 6.0], "weights times scores, a None left out"
