"""Whether a finding time marks as the KL jump's consequence was there before the jump (`doctor.at_start`): the
step's prompts are sampled anew from the weights the run began from (TRL's reference), never from the policy as it
is; what is loud there is a cause again, ranked after the causes of its severity the step itself shows; what is
quiet there stays the jump's consequence; without a start at hand nothing changes."""

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.detectors.findings import Finding
from grpo_debug.doctor.at_start import AtStart, before_the_jump, sample_at_start, severity_at_start
from grpo_debug.doctor.chain import order
from grpo_debug.step import GRPOStep
from grpo_debug.task import Task, load_task

pytestmark = pytest.mark.usefixtures("task_registry_restored")


def polite(completions, **kwargs):
    return [1.0 for _ in completions]


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def broken_step() -> tuple[GRPOStep, AtStart]:
    """A step whose policy says one token forever (every completion cut, every group one text), its reference the
    bundled model as loaded; and what the start measured before the policy broke."""
    task = Task("polite_and_length", load_task(StepConfig().task).prompts, (polite, length))
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=48), task=task)
    before = sample_at_start(step)
    wte, eos = step.policy.transformer.wte.weight, step.loaded.tokenizer.eos_token_id
    norms = wte.norm(dim=1).clone()
    norms[eos] = 0
    token = int(norms.argmax())
    with torch.no_grad():
        step.policy.transformer.ln_f.bias += 1000 * wte[token] / wte[token].norm()
    step.start_from_current_weights()  # the broken weights are the step's start; the reference is untouched
    return step, before


def marked(id: str, **evidence) -> Finding:
    onset = {"began_at_step": 3, "after": "update_size", "which_began_at_step": 2}
    return Finding(id, "problem", id, evidence={**evidence, "onset": onset}, symptom_of=("update_size",))


def test_the_start_is_sampled_from_the_reference_and_the_step_is_left_as_it_was():
    step, before = broken_step()
    run = step.run(until="rewards")
    assert (~run.rollout.finished).all(), "the broken policy was meant to cut every completion"
    weights = {k: v.clone() for k, v in step.policy.state_dict().items()}
    start = sample_at_start(step)
    assert start == before, f"the start was sampled from the broken policy: {start} against {before}"
    assert start.cut < 1 and start.flat_functions == ("polite",), start
    assert all(torch.equal(v, step.policy.state_dict()[k]) for k, v in weights.items()), "the policy was changed"
    assert step.result is run and step.loaded.policy is not step.loaded.reference, "the step was left changed"


def test_what_the_start_shows_loud_is_a_cause_again_and_what_it_shows_quiet_stays_a_symptom():
    step, start = broken_step()
    step.run(until="rewards")
    kept = Finding("kl_blowup", "problem", "kl", symptom_of=("update_size",))
    findings = [
        Finding("update_size", "warning", "lr"),
        marked("constant_reward", named=["polite", "length"]),
        marked("truncation"),
        marked("zero_std_groups"),
        kept,
    ]
    out = {f.id: f for f in before_the_jump(step, findings)}
    assert out["kl_blowup"] is kept and out["update_size"] is findings[0], "a finding time did not mark changed"
    constant = out["constant_reward"]
    assert constant.symptom_of == () and constant.severity == "warning", constant
    assert constant.evidence["named"] == ["polite"], f"a function that varies at the start was named: {constant}"
    cut = severity_at_start("truncation", start)[0]
    assert out["truncation"].severity == (cut if cut != "info" else "problem"), out["truncation"]
    assert (out["truncation"].symptom_of == ()) == (cut != "info"), out["truncation"]
    assert "at the weights the run began from" in out["truncation"].summary, out["truncation"].summary
    step.at_reference = True  # beta = 0: TRL keeps no reference, the policy's copy is the captured weights
    assert before_the_jump(step, findings) == findings, "a start that is not at hand was sampled"


@pytest.mark.parametrize(
    ("id", "start", "severity"),
    [
        ("zero_std_groups", AtStart(0.6, 0.0, (), 1, 20), "warning"),  # groups of two on a yes/no reward
        ("zero_std_groups", AtStart(0.1, 0.0, (), 1, 20), "info"),  # the jump's alone
        ("zero_std_groups", AtStart(0.97, 0.0, (), 1, 20), "problem"),
        ("truncation", AtStart(0.0, 1.0, (), 1, 20), "problem"),
        ("truncation", AtStart(0.0, 0.3, (), 1, 20), "warning"),
        ("truncation", AtStart(0.0, 0.02, (), 1, 20), "info"),
        ("constant_reward", AtStart(0.0, 0.0, ("polite",), 2, 20), "warning"),
        ("constant_reward", AtStart(0.0, 0.0, ("polite", "exact"), 2, 20), "problem"),
        ("constant_reward", AtStart(0.0, 0.0, (), 2, 20), "info"),
    ],
)
def test_the_start_is_read_by_the_detectors_own_levels(id, start, severity):
    got, said = severity_at_start(id, start)
    assert got == severity, f"{id} at {start}: {got} ({said})"


def test_a_cause_the_start_shows_ranks_after_the_causes_of_its_severity_the_step_shows():
    at_start = Finding("zero_std_groups", "warning", "z", evidence={"at_start": {"severity": "warning"}})
    shown = Finding("bad_reward", "warning", "b")
    ranked = order([at_start, shown, Finding("update_size", "problem", "u")], [], lambda f: 0.0)
    assert [f.id for f in ranked] == ["update_size", "bad_reward", "zero_std_groups"], ranked


def test_a_collapse_is_measured_on_the_same_completions_at_the_start():
    """The broken policy is sure of its one token, the reference is not: on the step's own completions the
    updates made the collapse (a warning, saying from what). The reference broken alike was as sure before any
    update: info (held-out-3 seed 345: 0.0444 nats at the reference, 0.0442 now, learning_rate 3e-6)."""
    from grpo_debug.detectors.detectors import ENTROPY_COLLAPSE
    from grpo_debug.doctor.at_start import collapse_at_start, entropies_now_and_at_start

    step, _ = broken_step()
    with torch.no_grad():
        step.policy.transformer.ln_f.bias.mul_(10)  # surer still: below the level on every scored token
    step.start_from_current_weights()
    run = step.run(until="logprobs")
    now, start = entropies_now_and_at_start(step, run)
    assert now < ENTROPY_COLLAPSE <= start, f"the broken policy {now:.3g} nats, its reference {start:.3g}"
    loud = [Finding("entropy_collapse", "warning", "mean token entropy near 0")]
    made = collapse_at_start(step, run, loud)[0]
    assert made.severity == "warning" and f"{start:.3g} nats, now {now:.3g}" in made.summary, made
    with torch.no_grad():
        step.loaded.reference.transformer.ln_f.bias.copy_(step.policy.transformer.ln_f.bias)
    own = collapse_at_start(step, run, loud)[0]
    assert own.severity == "info" and "as sure before any update" in own.summary, own
    quiet = [Finding("entropy_collapse", "absent", "mean token entropy 1.2 nats")]
    assert collapse_at_start(step, run, quiet) == quiet, "a quiet finding was measured"


@pytest.mark.parametrize(("max_abs", "severity"), [(800.0, "problem"), (12.0, "warning"), (1.5, "absent")])
def test_advantages_a_step_without_signal_cannot_show_are_read_at_the_start(max_abs, severity):
    """Every advantage 0 after the jump: large_advantages, absent on the step, is read from the start's draws by its
    own levels (stranger tuning seed 598: rewards x1000, scale_rewards='none', max |A| 800 at the start); a finding
    the step itself shows loud is left as it is."""
    from grpo_debug.doctor.at_start import advantages_at_start

    start = AtStart(0.1, 0.0, (), 1, 20, max_abs_advantage=max_abs)
    blind = Finding("large_advantages", "absent", "max |A| 0", evidence={"scale_rewards": "none"})
    got = advantages_at_start(blind, start)
    assert got.severity == severity, f"max |A| {max_abs} at the start: {got.severity}, not {severity}"
    assert (got.evidence.get("at_start") is not None) == (severity != "absent"), got.evidence
    shown = Finding("large_advantages", "warning", "max |A| 40")
    assert advantages_at_start(shown, start) is shown, "a finding the step showed loud was replaced"


def test_the_start_measures_advantages_only_where_the_jump_left_none():
    step, _ = broken_step()
    step.run(until="rewards")
    blind = Finding("large_advantages", "absent", "a", evidence={"scale_rewards": "group"})
    for zero_severity in ("problem", "warning"):
        zero = Finding("zero_std_groups", zero_severity, "z", evidence=marked("zero_std_groups").evidence,
                       symptom_of=("update_size",))  # fmt: skip
        out = {f.id: f for f in before_the_jump(step, [Finding("update_size", "warning", "lr"), zero, blind])}
        assert out["large_advantages"].severity == "absent", f"group-scaled advantages read as large: {out}"
