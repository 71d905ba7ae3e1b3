"""The doctor's page (`ui.doctor_page`) and its figures (`ui.report_figures`) on a planted report of 26 checks: the
verdict in one sentence, the chain as a picture, each cause's card with its evidence figure (the one its finding id
picks), its flip as a table and its horizon as a plot; the checks that found nothing folded; every figure inline,
no script, no outside resource; every text of the run escaped (markup, bidi controls, NUL, mathtext's `$`); and
`doctor --png` writes the same figures. No model: the report is planted (the browser test renders a real one)."""

import dataclasses
import re

import matplotlib
import pytest

from grpo_debug.detectors.findings import Finding
from grpo_debug.doctor import Report
from grpo_debug.pitfalls import PITFALLS
from grpo_debug.ui import doctor_page, report_figures

HOSTILE = "<script>alert(1)</script> $x$ gpj.\u202eexe\x00 & 'q\""
G, GROUPS, STEPS, SEEDS = 4, 4, 3, 3


def effect(cosine: float, held: bool = True) -> dict:
    out = {
        "toggle": {"position_ids": True},
        "loss": [0.01, 0.02],
        "grad_norm": [0.55, 0.31],
        "update_cosine": cosine,
        "update_norm": [0.166, 0.12],
        "moved_kl": [0.024, 0.011],
        "dlogp_moved": 0.4,
        "cosmetic": False,
        "removes_gradient": False,
    }
    if held:
        out["held_out_reward"] = {
            "as_run": 0.31,
            "flipped": 0.35,
            "difference": {"mean": 0.04, "ci_low": 0.01, "ci_high": 0.07, "level": 0.975},
            "verdict": "held-out reward with the flip: detected, +0.04 [+0.01, +0.07]",
            "completions_changed": 9,
            "prompts": 16,
            "samples_per_prompt": 4,
        }
    return out


def learning() -> dict:
    as_run = [[0.1 + 0.01 * k + 0.002 * s for k in range(STEPS)] for s in range(SEEDS)]
    fixed = [[0.1 + 0.03 * k + 0.003 * s for k in range(STEPS)] for s in range(SEEDS)]
    kl = [[0.001 * (k + 1) * (s + 1) for k in range(STEPS)] for s in range(SEEDS)]
    return {
        "steps": STEPS,
        "seeds": list(range(SEEDS)),
        "difference": {"mean": 0.03, "ci_low": 0.02, "ci_high": 0.04, "level": 0.975},
        "verdict": "batch reward of steps 2..K with the fix: detected, +0.03 [+0.02, +0.04]",
        "kl_to_start": [0.003, 0.002],
        "update_norm": [0.16, 0.12],
        "rewards_by_seed": {"as_run": as_run, "fixed": fixed},
        "kl_by_seed": {"as_run": kl, "fixed": kl},
    }


def exhibits() -> dict:
    rewards = [[1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, None], [0.2, 0.2, 0.4, 0.2], [0.0, 0.0, 0.0, 0.0]]
    return {
        "num_generations": G,
        "rewards": rewards,
        "advantages": [[0.0] * G, [-1.0, 0.0, 1.0, 0.0], [-0.5, -0.5, 1.5, -0.5], [0.0] * G],
        "reward_functions": {HOSTILE: [v for row in rewards for v in row]},
        "lengths": [5, 9, 16, 16, 3, 7, 16, 12, 4, 4, 8, 16, 2, 5, 6, 7],
        "finished": [
            True,
            True,
            False,
            False,
            True,
            True,
            False,
            True,
            True,
            True,
            True,
            False,
            True,
            True,
            True,
            True,
        ],
        "max_completion_length": 16,
        "token_gap": {
            "position": [0, 1, 2],
            "tokens": [16, 16, 12],
            "median": [0.3, 0.5, 0.9],
            "p90": [0.6, 0.9, 1.2],
            "max": [0.8, 1.1, 2.0],
        },  # fmt: skip
        "logged_history": [{"step": k, "kl": 0.01 * k, "grad_norm": 0.5, "learning_rate": 1e-4} for k in range(1, 4)],
    }


def planted_report(with_exhibits: bool = True) -> Report:
    """26 checks: position_ids (a problem, flipped and followed over steps) clearing sampler_mismatch, truncation
    (a warning), two at info, 21 absent; every summary hostile."""
    loud = [
        Finding(
            "position_ids",
            "problem",
            f"shifted {HOSTILE}",
            {},
            effect(0.41),
            (),
            ("sampler_mismatch",),
            (("position_ids", True),),
            learning(),
        ),  # fmt: skip
        Finding("sampler_mismatch", "warning", f"drift {HOSTILE}", {}, None, ("position_ids",)),
        Finding("truncation", "warning", f"cut {HOSTILE}", {}, None),
        Finding("length_reward", "info", f"longer pays {HOSTILE}", {"probed": {HOSTILE: {"rise_padded": 0.2}}}),
        Finding("clip_inactive", "info", HOSTILE, {}, effect(0.999, held=False)),
    ]
    taken = {f.id for f in loud}
    absent = [Finding(i, "absent", f"nothing {HOSTILE}") for i in PITFALLS if i not in taken][:21]
    horizon = {"steps": STEPS, "seeds": SEEDS, "level": 0.975}
    return Report(tuple(loud + absent), {}, 1.0, horizon=horizon, exhibits=exhibits() if with_exhibits else None)


@pytest.fixture(scope="module")
def html() -> str:
    return doctor_page.page(planted_report(), f"doctor {HOSTILE}")


def test_the_page_reads_top_to_bottom_verdict_chain_cards_then_the_rest_folded(html):
    order = [html.index(s) for s in ("id='verdict'", "<svg class='chain'", "id='position_ids'", "id='truncation'",
                                     "Also found", "<details><summary>21 checks found nothing")]  # fmt: skip
    assert order == sorted(order), order
    verdict = re.search(r"id='verdict'>(.*?)</p>", html).group(1)
    assert verdict.startswith("First cause: position_ids (problem)") and "Fix: train with" in verdict, verdict
    assert "followed 3 steps x 3 seeds" in verdict and "(1 more cause below)" in verdict, verdict
    chain = html[html.index("<svg class='chain'") : html.index("</svg>", html.index("<svg class='chain'"))]
    assert "position_ids (problem)" in chain and "sampler_mismatch (warning)" in chain and "<line" in chain


def test_each_cause_has_its_evidence_figure_its_flip_table_and_its_horizon_plot(html):
    cards = re.findall(r"<div class='card (\w+)' id='(\w+)'>(.*?)</div>", html, flags=re.S)
    assert [c[1] for c in cards] == ["position_ids", "truncation"], [c[1] for c in cards]
    position_ids, truncation = cards[0][2], cards[1][2]
    assert position_ids.count('class="figure"') == 2, "the evidence and the horizon"
    assert "completion token position" in position_ids and "|log-prob gap| (nats)" in position_ids
    assert "step of the horizon" in position_ids and "KL to the start (nats/token)" in position_ids
    table = re.search(r"<table class='flip'>.*?</table>", position_ids).group(0)
    for row in ("grad_norm</th><td>0.55</td><td>0.31</td>", "update norm</th><td>0.166</td><td>0.12</td>",
                "moved KL (nats/token)</th><td>0.024</td><td>0.011</td>", "update cosine</th><td>1</td><td>+0.410",
                "held-out reward (16 prompts x 4)</th><td>0.31</td><td>0.35</td><td>+0.0400 [+0.0100, +0.0700] at 97.50%"):  # fmt: skip
        assert row in table, f"{row!r} not in {table}"
    assert "max_completion_length = 16" in truncation and "completion length (tokens)" in truncation
    assert "<table" not in truncation, "truncation was not flipped: no table"


def test_every_text_of_the_run_is_escaped_and_nothing_runs_or_is_fetched(html):
    assert "<script" not in html.lower() and "&lt;script&gt;" in html
    assert "\u202e" not in html and "\x00" not in html and "\\u202e" in html and "\\x00" in html
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", html), "a figure or link points outside the page"
    assert "@import" not in html and "url(http" not in html and "<?xml" not in html and "<!DOCTYPE svg" not in html
    ids = re.findall(r'<clipPath id="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "two figures share a clip path's id"


def test_a_report_without_a_loud_cause_says_so_and_cards_what_is_worth_knowing():
    quiet = Report(tuple(f for f in planted_report().findings if f.severity in ("info", "absent")), {}, 1.0,
                   exhibits=exhibits())  # fmt: skip
    html = doctor_page.page(quiet)
    assert "No cause at warning or above on this step: 2 findings worth knowing, 21 checks found nothing." in html
    assert "id='length_reward'" in html and "reward against length" in html


def test_a_report_without_exhibits_still_makes_its_page():
    html = doctor_page.page(planted_report(with_exhibits=False))
    assert "id='verdict'" in html and 'class="figure"' in html, "the horizon's plot needs no exhibits"


def test_png_writes_each_figure_of_the_page(tmp_path):
    written = doctor_page.write_pngs(planted_report(), tmp_path / "figures")
    names = sorted(p.name for p in written)
    assert names == ["1-position_ids-evidence.png", "1-position_ids-horizon.png", "2-truncation-evidence.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_each_finding_id_picks_its_figure():
    ex = exhibits()
    picked = {
        i: report_figures.evidence_figure(Finding(i, "warning", ""), ex).axes[0].get_xlabel()
        for i in ("position_ids", "truncation", "length_reward", "kl_blowup", "zero_std_groups")
    }
    assert picked == {
        "position_ids": "completion token position",
        "truncation": "completion length (tokens)",
        "length_reward": "completion length (tokens)",
        "kl_blowup": "step",
        "zero_std_groups": "group (prompt)",
    }, picked
    assert matplotlib.get_backend()  # drawn headless


# ---- the fix in the run's own GRPOConfig terms


def fixed(*changes, **kw) -> Finding:
    return Finding("truncation", "warning", "cut", {}, kw.get("effect"), (), (), tuple(changes), kw.get("learning"))


def test_a_fix_the_doctor_applied_reads_in_the_runs_grpo_config_names():
    """The verdict and the card say the fix as the user writes it: the engine's max_new_tokens is GRPOConfig's
    max_completion_length; a fix that is no GRPOConfig setting (position_ids: a trainer class) keeps its words."""
    report = Report((fixed(("max_new_tokens", 64)),), {}, 1.0)
    html = doctor_page.page(report)
    verdict = re.search(r"id='verdict'>(.*?)</p>", html).group(1)
    assert "Fix: GRPOConfig(..., max_completion_length=64). What the fix did" in verdict, verdict
    card = re.search(r"<div class='card warning' id='truncation'>(.*?)</div>", html, flags=re.S).group(1)
    assert "fix in your config: <code>GRPOConfig(..., max_completion_length=64)</code>" in card, card
    assert "in general: <code>raise max_completion_length" in card, "the pitfall's own words stay below"
    assert "max_new_tokens" not in verdict and "max_new_tokens" not in card
    planted = doctor_page.page(planted_report())
    assert "Fix: train with grpo_debug.capture.trl_bridge.PositionIdsGRPOTrainer" in planted
    assert "fix in your config" not in planted.split("id='truncation'")[0], "position_ids has no GRPOConfig setting"


@pytest.mark.parametrize(
    "changes, said",
    [
        ((("scale_rewards", "group"),), 'GRPOConfig(..., scale_rewards="group")'),
        ((("num_generations", 14),), "GRPOConfig(..., num_generations=14)"),
        ((("dropout", False), ("sample_dropout", False)), "GRPOConfig(..., disable_dropout=True)"),
        ((("kl_estimator", "k3_corrected"),), "GRPOConfig(..., use_bias_correction_kl=True)"),
        ((("learning_rate", 1e-5 * 0.1),), "GRPOConfig(..., learning_rate=1e-06)"),
        ((("top_p", 1.0), ("top_k", 0), ("min_p", None)), "GRPOConfig(..., top_p=1.0, top_k=0, min_p=None)"),
        ((("mask", "keep_first_eos"),), ""),  # TRL's own code since PR #4970: no setting
        ((("kl_estimator", "k1"),), ""),  # no GRPOConfig setting samples k1
        ((("dropout", False), ("sample_dropout", True)), ""),  # TRL's one switch sets both
    ],
)
def test_each_applied_fix_reads_as_grpo_config_or_not_at_all(changes, said):
    from grpo_debug.doctor.report import config_fix

    assert config_fix(fixed(*changes), uses_vllm=False) == said


def test_the_fix_named_is_the_one_the_horizon_followed_else_the_chains_else_the_flips():
    from grpo_debug.doctor.report import applied_fix, config_fix

    followed = {**learning(), "changes": {"max_new_tokens": 32}}
    assert (
        config_fix(fixed(effect=effect(0.5), learning=followed), False) == "GRPOConfig(..., max_completion_length=32)"
    )
    flipped = fixed(effect={**effect(0.5), "toggle": {"mask_truncated_completions": True}})
    assert config_fix(flipped, False) == "GRPOConfig(..., mask_truncated_completions=True)"
    assert report_figures.fix_words(fixed(learning=followed)) == "max_completion_length=32", "the horizon's legend"
    refused = fixed(effect={"toggle": {"mask_truncated_completions": True}, "error": "no"})
    removes = fixed(effect={**effect(0.5), "toggle": {"max_grad_norm": 0.0}, "removes_gradient": True})
    assert applied_fix(refused) == applied_fix(removes) == () and config_fix(refused, False) == ""
    symptom = dataclasses.replace(fixed(("max_new_tokens", 64)), symptom_of=("position_ids",))
    assert config_fix(symptom, False) == "", "a symptom has no fix of its own"


def test_the_grpo_config_names_are_those_the_trl_bridge_writes(tmp_path):
    """The one table (`choices.RENAMED`, SAME_NAME, SAME_NAME_TOO) against `trl_bridge.grpo_config`: each change
    on the trl preset lands on the GRPOConfig setting the page names, with the value it says."""
    from trl import GRPOConfig

    from grpo_debug.capture.trl_bridge import grpo_config
    from grpo_debug.choices import RENAMED, SAME_NAME, SAME_NAME_TOO, grpo_config_changes
    from grpo_debug.config import StepConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    step_fields = {f.name for f in dataclasses.fields(StepConfig)}
    names = {*SAME_NAME, *SAME_NAME_TOO}
    assert names <= trl_fields and names <= step_fields and set(RENAMED) <= step_fields
    assert {name for name, _ in RENAMED.values()} <= trl_fields
    base = StepConfig.preset("trl")
    for changes in ({"max_new_tokens": 64}, {"epsilon_low": 0.3}, {"dropout": False, "sample_dropout": False},
                    {"kl_estimator": "k3_corrected"}, {"temperature": 0.7, "top_p": 0.5, "top_k": 5},
                    {"scale_rewards": "batch", "beta": 0.04, "mask_truncated_completions": True},
                    {"learning_rate": 3e-6, "max_grad_norm": 0.5, "num_generations": 8}):  # fmt: skip
        cfg = base.replace(**changes)
        args = grpo_config(cfg, str(tmp_path))
        for name, value in grpo_config_changes(changes).items():
            assert getattr(args, name) == value, f"{changes} -> {name}={getattr(args, name)!r}, the page says {value!r}"


@pytest.mark.slow  # a headless Chromium (`make test-slow`)
def test_a_3000_character_name_wraps_inside_the_page_width(tmp_path):
    """A user's reward function named with 3,000 characters and no space (in the title, summaries, a flip table and a
    probed function's name): the page a browser lays out is no wider than its window."""
    from playwright.sync_api import sync_playwright

    name = "r" * 3000
    report = planted_report()
    findings = tuple(dataclasses.replace(f, summary=f.summary.replace(HOSTILE, name)) for f in report.findings)
    findings = tuple(
        dataclasses.replace(f, evidence={"probed": {name: {"rise_padded": 0.2}}}) if f.id == "length_reward" else f
        for f in findings
    )
    path = tmp_path / "page.html"
    path.write_text(doctor_page.page(dataclasses.replace(report, findings=findings), f"doctor {name}"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        view = browser.new_page(viewport={"width": 1280, "height": 800})
        view.goto(path.as_uri())
        width = view.evaluate("document.documentElement.scrollWidth")
        shown = view.evaluate("document.body.innerText").count("r" * 100)
        browser.close()
    assert shown >= 3, "the long name is not on the page"
    assert width <= 1280, f"the page is {width} px wide in a 1280 px window"
