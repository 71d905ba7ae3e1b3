"""Every token of a step on one standalone page (`grpo_debug.show.token_page`, `step --html`, `replay --html`): the values
are the run's tensors, tokens are escaped, the CLI writes the page or refuses a path it cannot write. The page in a
real browser (it loads, the selector recolours) is tests/test_browser.py's."""

import math
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.show.loss_gradients import gradient_of_loss_wrt_logps
from grpo_debug.show.token_page import (
    CODES,
    QUANTITIES,
    Quantity,
    TokenPage,
    TokenSample,
    page_body,
    render_page,
    scale_of,
    token_values,
)
from grpo_debug.step import GRPOStep

SMALL = dict(num_prompts=2, num_generations=4, max_new_tokens=32)


class Spans(HTMLParser):
    """Each token span of a page: its text (entities resolved), title and colour codes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.spans, self.open, self.prompts, self.in_prompt = [], None, [], False
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and attrs.get("class") == "gd-tok":
            self.open = {"text": "", **attrs}
        if tag == "div" and attrs.get("class") == "gd-prompt":
            self.in_prompt = True
            self.prompts.append("")
        self.scripts += tag == "script"

    def handle_endtag(self, tag):
        if tag == "span" and self.open is not None:
            self.spans.append(self.open)
            self.open = None
        if tag == "div":
            self.in_prompt = False

    def handle_data(self, data):
        if self.open is not None:
            self.open["text"] += data
        elif self.in_prompt:
            self.prompts[-1] += data


def spans_of(text: str) -> Spans:
    parser = Spans()
    parser.feed(text)
    return parser


@pytest.fixture(scope="module")
def step():
    return GRPOStep(StepConfig(**SMALL))


def test_the_values_are_the_runs_tensors_token_by_token(step):
    run = step.run(until="loss")
    page = token_values(run, step.loaded.tokenizer)
    r, lp = run.rollout, run.logprobs
    assert len(page.samples) == r.num_samples and page.prompts == tuple(r.prompts)
    grad = gradient_of_loss_wrt_logps(run, run.config)  # one micro-batch, no sampler correction: the same loss
    assert grad.abs().sum() > 0
    for i, k in ((0, 0), (1, 3), (5, int(r.completion_lengths[5]) - 1)):
        s = page.samples[i]
        assert len(s.tokens) == int(r.completion_lengths[i]) and s.group == i // r.num_generations
        ids = r.completion_ids[i, : len(s.tokens)].tolist()  # each token decoded on its own (the bundled tokenizer's
        assert list(s.tokens) == [step.loaded.tokenizer.decode([t]) for t in ids]  # decoder joins runs of FEN 1s)
        d = (lp.reference[i, k] - lp.policy[i, k]).item()
        expected = {
            "advantage": run.advantages.values[i].item(),
            "ratio": run.loss.ratio[i, k].item(),
            "mismatch": math.exp(lp.policy[i, k].item() - r.sampler_logps[i, k].item()),
            "kl": math.exp(d) - d - 1,
            "entropy": lp.entropies[i, k].item(),
            "gradient": grad[i, k].item(),
            "mask": lp.mask[i, k].item(),
        }
        for name, value in expected.items():
            assert s.values[name][k] == pytest.approx(value, rel=1e-5, abs=1e-9), (i, k, name)
        assert s.reward == pytest.approx(run.rewards.total[i].item())
    # grpo at ratio 1: d loss / d logp = -A_i / (N T_i) + beta d k3 / d logp on each kept token
    i, k = 2, 1
    T, N = lp.mask[i].sum().item(), r.num_samples
    d = (lp.reference[i, k] - lp.policy[i, k]).item()
    closed = (-run.advantages.values[i].item() + run.config.beta * (1 - math.exp(d))) / (N * T)
    assert run.config.loss_type == "grpo" and page.samples[i].values["gradient"][k] == pytest.approx(closed, rel=1e-4)


def test_the_ratio_is_the_sampler_correction_or_the_last_pass_where_the_step_has_one(step):
    corrected = step.run(StepConfig(**SMALL, vllm_importance_sampling_correction=True, top_p=0.8, beta=0.0), "loss")
    page = token_values(corrected, step.loaded.tokenizer)
    assert page.ratio_label.startswith("sampler IS ratio")
    expected = corrected.loss.sampler_ratio.expand_as(corrected.logprobs.policy)
    assert page.samples[3].values["ratio"][2] == pytest.approx(expected[3, 2].item(), rel=1e-6)
    assert any(abs(v - 1) > 1e-3 for s in page.samples for v in s.values["ratio"])  # top_p 0.8: a biased ratio
    # the step's gradient includes the sampler correction (beta 0: every term of the loss is multiplied by it)
    plain = gradient_of_loss_wrt_logps(corrected, corrected.config.replace(vllm_importance_sampling_correction=False))
    ours = torch.tensor(page.samples[3].values["gradient"], dtype=torch.float64)
    assert torch.allclose(ours, (plain[3] * expected[3])[: len(ours)].double(), atol=1e-9)
    assert not torch.allclose(ours, plain[3][: len(ours)].double(), atol=1e-9)

    twice = step.run(StepConfig(**SMALL, num_iterations=2), until="update")
    page = token_values(twice, step.loaded.tokenizer, groups=1)
    assert page.ratio_label.startswith("pi_theta / pi_old") and len(page.prompts) == 1
    assert len(page.samples) == twice.config.num_generations
    last = twice.update.iterations[-1].ratio
    assert page.samples[1].values["ratio"][4] == pytest.approx(last[1, 4].item(), rel=1e-6)
    assert any(abs(v - 1) > 1e-4 for s in page.samples for v in s.values["ratio"])  # the second pass moved


def test_tokens_prompts_and_titles_are_escaped():
    tokens = ("<b>", "&amp;", "a\nb", "\"q'", "</script>", "")
    values = {q.name: tuple(float(j) for j in range(len(tokens))) for q in QUANTITIES}
    values["mismatch"] = (math.nan,) * len(tokens)
    sample = TokenSample(0, 0, 0.5, -1.0, tokens, values)
    page = TokenPage("<title> & co", "ratio", ("<script>alert(1)</script> & P:",), (sample,))
    text = render_page(page)
    parsed = spans_of(text)
    assert parsed.scripts == 1, "a token or prompt opened a script"
    assert [s["text"] for s in parsed.spans] == ["<b>", "&amp;", "a\u21b5\nb", "\"q'", "</script>", "\u2205"]
    assert "&lt;b&gt;" in text and "a\u21b5\nb" in text
    assert parsed.prompts == ["group 0 · prompt: <script>alert(1)</script> & P:"]
    assert parsed.spans[3]["title"].splitlines()[0] == repr(tokens[3]) + " #3"  # the title attribute survived quotes
    assert "trainer/sampler n/a" in parsed.spans[0]["title"]
    assert all(len(s["data-c"]) == len(QUANTITIES) for s in parsed.spans)
    assert "<title>&lt;title&gt; &amp; co</title>" in text


def test_a_page_needs_no_server_and_colours_every_quantity():
    run_free = TokenPage(
        "t", "ratio", ("p",), (TokenSample(0, 0, 1.0, 0.5, ("x", "y"), {q.name: (0.5, 2.0) for q in QUANTITIES}),)
    )
    text = render_page(run_free, "entropy")
    assert "http://" not in text and "https://" not in text and " src=" not in text and "<link" not in text
    assert text.count('class="gd-legend"') == len(QUANTITIES) and text.count('gd-legend" data-q') == len(QUANTITIES)
    with pytest.raises(ValueError, match="quantity must be one of"):
        page_body(run_free, "nope")


def test_the_colour_scales():
    advantage = scale_of(QUANTITIES[0], [-2.0, 0.5, 1.0])
    assert (advantage.low, advantage.high) == (-2.0, 2.0)  # symmetric about 0
    assert advantage.colour(0.0) == "#ffffff" and advantage.colour(-2.0) != advantage.colour(2.0)
    assert advantage.code(-5.0) == 0 and advantage.code(5.0) == len(advantage.palette()) - 2
    assert advantage.colour(math.nan) == advantage.palette()[-1]
    ratio = scale_of(QUANTITIES[1], [1.0 + 1e-7, 1.0 - 1e-7])  # noise about 1 stays white
    assert ratio.colour(1.0 + 1e-7) == "#ffffff" and ratio.high == pytest.approx(math.exp(0.01))
    wide = scale_of(QUANTITIES[1], [0.5, 1.0, 2.0])
    assert wide.colour(0.5) == wide.palette()[0] and wide.colour(2.0) == wide.palette()[-2] and wide.code(0.0) == 0
    entropy = scale_of(Quantity("e", "e", "e", None), [0.0, 4.0])
    assert entropy.colour(0.0) == "#ffffff" and entropy.code(4.0) == len(entropy.palette()) - 2
    assert max(len(scale_of(q, [0.0, 1.0]).palette()) for q in QUANTITIES) <= len(CODES)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_debug", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # `make test-slow`: step commands in fresh processes
def test_the_step_command_writes_the_page_and_refuses_an_unwritable_path(tmp_path):
    path = tmp_path / "tokens.html"
    sets = ["--set", *(f"{k}={v}" for k, v in SMALL.items())]
    done = run_cli("step", *sets, "--html", str(path))
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and f"every token of the step: {path}" in done.stdout
    parsed = spans_of(text)
    assert len(parsed.prompts) == SMALL["num_prompts"] and len(parsed.spans) > SMALL["num_prompts"] * 4
    assert not list(tmp_path.glob("*.tmp"))
    for bad in (tmp_path / "missing" / "tokens.html", tmp_path):
        refused = run_cli("step", *sets, "--html", str(bad))
        assert refused.returncode == 2 and f"--html {bad}" in refused.stderr, refused.stderr
        assert "not a writable file path" in refused.stderr
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow  # `make test-slow`: a TRL run and a replay command
def test_the_replay_command_writes_the_page_of_a_captured_step(tmp_path):
    from grpo_debug.capture import CaptureCallback
    from grpo_debug.capture.trl_bridge import trl_trainer

    cfg = StepConfig(**SMALL, beta=0.04)
    trainer = trl_trainer(cfg, str(tmp_path / "run"), max_steps=1, disable_dropout=True)
    trainer.add_callback(CaptureCallback(tmp_path / "captures", steps=[1]))
    trainer.train()
    capture, path = tmp_path / "captures" / "step-1", tmp_path / "tokens.html"
    done = run_cli("replay", str(capture), "--html", str(path))
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    parsed = spans_of(text)
    assert f"every token of step 1 of {capture}" in text and len(parsed.prompts) == SMALL["num_prompts"]
    assert len(parsed.spans) >= SMALL["num_prompts"] * SMALL["num_generations"]
    refused = run_cli("replay", str(capture), "--html", str(tmp_path / "no" / "t.html"))
    assert refused.returncode == 2 and f"--html {tmp_path / 'no' / 't.html'}" in refused.stderr


BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
C0 = "".join(chr(c) for c in range(32) if chr(c) not in "\t\n\r")  # tab, newline, return: marks of their own
CONTROLS = BIDI + C0 + "\x7f\x85"


def escape_of(char: str) -> str:
    return repr(char)[1:-1]  # \u202e, \x00: what the page shows


def test_control_and_bidi_characters_are_shown_as_escapes_never_raw():
    tokens = (*CONTROLS, "gpj.\u202eexe", "a\x00b\u2066c", "\r\t\n")
    values = {q.name: tuple(0.5 for _ in tokens) for q in QUANTITIES}
    sample = TokenSample(0, 0, 0.5, -1.0, tokens, values)
    prompt = "P: \u202eevil\u202c \x00 fen"
    text = render_page(TokenPage("t", "ratio", (prompt,), (sample,)))
    assert not [escape_of(c) for c in CONTROLS if c in text]
    parsed = spans_of(text)
    assert [s["text"] for s in parsed.spans][: len(CONTROLS)] == [escape_of(c) for c in CONTROLS]
    assert [s["text"] for s in parsed.spans][len(CONTROLS) :] == [
        "gpj.\\u202eexe",
        "a\\x00b\\u2066c",
        "\u240d\u2192\u21b5\n",
    ]
    assert parsed.prompts == ["group 0 · prompt: P: \\u202eevil\\u202c \\x00 fen"]
    assert text.count('<kbd class="gd-esc"') == len(CONTROLS) + 1 + 2 + 3  # styled: told apart from generated text
    assert [s["title"].splitlines()[0] for s in parsed.spans] == [f"{t!r} #{k}" for k, t in enumerate(tokens)]
