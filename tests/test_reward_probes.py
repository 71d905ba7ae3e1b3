"""The reward probes (`detectors.probes`): the user's reward functions called again on the step's completions changed
in one respect. A reward that pays for length rises when only the length changes; one that pays for right answers
that happen to be longer does not; a function that ignores the completion gives one value per prompt whatever it
is given; one that every completion passes, or that nothing in the batch earns, is told apart from it."""

import math

from grpo_debug.detectors.probes import probe_rewards
from grpo_debug.task import Task

PROMPTS = ["What is 12+30? ", "What is 3+4? "]
G = 4
# prompt 0's right answer (42) has two digits, its wrong ones one: the correct answers are the longer ones
COMPLETIONS = ["42", "7", "9", "42", "7", "7", "13", "1"]
REPEATED = [PROMPTS[i // G] for i in range(len(COMPLETIONS))]


def truth(prompt: str) -> int:
    a, b = prompt[len("What is ") :].rstrip("? ").split("+")
    return int(a) + int(b)


def exact(prompts, completions, **kwargs):
    return [float(c.strip() == str(truth(p))) for p, c in zip(prompts, completions)]


def closeness(prompts, completions, **kwargs):
    out = []
    for p, c in zip(prompts, completions):
        try:
            out.append(math.exp(-abs(int(c.strip()) - truth(p)) / 10))
        except ValueError:
            out.append(0.0)
    return out


def longer(completions, **kwargs):
    return [len(c) / 40 for c in completions]


def words(completions, **kwargs):
    return [float(len(c.split())) for c in completions]


def question_length(prompts, completions, **kwargs):
    return [len(p) / 20 for p in prompts]


def always_one(completions, **kwargs):
    return [1.0 for _ in completions]


def plain_digits(completions, **kwargs):
    """1 for a bare number, 0 otherwise: every completion here passes; a repeated word fails it."""
    return [float(c.strip().isdigit()) for c in completions]


def probes(*funcs):
    return probe_rewards(Task("probe", lambda s, n: PROMPTS[:n], funcs), REPEATED, COMPLETIONS, G)


def test_a_reward_that_pays_for_length_is_told_from_right_answers_that_are_longer():
    found = probes(exact, closeness, longer, words)
    assert found["longer"].paid_for_length, f"characters paid, not found: {found['longer']}"
    assert found["words"].paid_for_length, f"words paid, not found: {found['words']}"
    for name in ("exact", "closeness"):
        assert not found[name].paid_for_length, f"{name} pays for the right answer, not for length: {found[name]}"


def test_a_function_that_ignores_the_completion_is_told_from_one_every_completion_passes():
    found = probes(question_length, plain_digits, always_one, exact)
    assert found["question_length"].ignores_completion, f"one value per prompt whatever it reads: {found}"
    assert found["plain_digits"].varies_across_completions, "a changed completion fails it: it reads the completion"
    assert found["exact"].varies_across_completions, "exact rewards differ across completions of a prompt"
    assert found["always_one"].varies_across_completions is None, (
        "one value everywhere cannot tell ignoring the completion from nothing earning more: it must say so"
    )


def test_a_reward_that_fails_on_a_changed_completion_is_no_evidence_and_no_crash():
    def strict(prompts, completions, **kwargs):
        if any(c != c.strip() for c in completions):
            raise ValueError("trailing whitespace")
        return exact(prompts, completions)

    found = probes(strict)["strict"]
    assert not found.paid_for_length and found.rise_padded == 0.0, f"a failing probe counted as evidence: {found}"


def exact_or_none_by_parity(prompts, completions, **kwargs):
    """exact where the completion's length is even, None where odd: a parity slip, not 'does not apply'."""
    return [None if len(c) % 2 else r for c, r in zip(completions, exact(prompts, completions))]


def exact_or_none_without_digits(prompts, completions, **kwargs):
    """None where the completion holds no digit (it does not apply): whitespace cannot change that."""
    return [r if any(ch.isdigit() for ch in c) else None for c, r in zip(completions, exact(prompts, completions))]


def test_a_none_that_comes_and_goes_with_a_space_is_told_from_one_that_does_not_apply():
    found = probes(exact_or_none_by_parity, exact_or_none_without_digits, exact)
    assert found["exact_or_none_by_parity"].none_moved == 1.0, found["exact_or_none_by_parity"]
    assert found["exact_or_none_without_digits"].none_moved == 0.0, found["exact_or_none_without_digits"]
    assert found["exact"].none_moved == 0.0, found["exact"]
