"""Every token of a step on one standalone HTML page: each completion's tokens coloured by a chosen quantity.

`token_values(run, tokenizer)` reads the step's tensors into plain data (a frozen `TokenPage`); `render_page`
writes it as one HTML document (inline CSS and a few lines of inline JS, no server, no external URL), and
`page_body` as the fragment a notebook cell shows. Every colour is computed here, in Python, and stored on
its token (`data-c-<quantity>`): the page's script only swaps them when the selector changes, so the first
quantity's colours and every value on hover (the `title`) show even where scripts do not run.

Quantities, per completion token (the generated tokens up to and including the first EOS):
  advantage  the sample's advantage, the same on each of its tokens
  ratio      the sampler importance-sampling ratio pi_old / pi_sampler the loss applied (where the step corrects
             for the sampler); else the last optimizer pass's pi_theta / pi_old (num_iterations > 1); else the
             loss's pi / pi_old (exactly 1 at the weights that scored the rollout)
  mismatch   pi_trainer / pi_sampler before any truncation: the recomputed log-prob against the sampler's
  kl         k3 = exp(d) - d - 1, d = ref_logp - logp: the per-token KL estimate to the reference
  entropy    the policy's next-token entropy (nats, at the scoring temperature)
  gradient   d loss / d logp: what the loss sends back into each token's log-prob (0 where it is masked)
  mask       1 on the tokens the completion mask keeps
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import math
from dataclasses import dataclass

import torch

from ..digits import significant
from ..step import StepRun
from .loss_gradients import gradient_of_loss_wrt_logps
from .text import CONTROL, escape_code


@dataclass(frozen=True)
class Quantity:
    name: str  # the selector's value
    label: str  # what the selector and the legend call it
    short: str  # what the hover calls it
    centre: float | None  # a diverging scale's white point (ratio: 1, on a log scale); None: sequential from 0
    log: bool = False  # coloured by log(value) (ratios)
    least_half_range: float = 0.0  # a diverging scale spans at least this either side (in log for ratios): noise
    # around the centre (a ratio of 1 +- 1e-6) stays white instead of saturating


QUANTITIES = (
    Quantity("advantage", "advantage", "A", 0.0),
    Quantity("ratio", "ratio", "ratio", 1.0, log=True, least_half_range=0.01),
    Quantity("mismatch", "pi_trainer / pi_sampler", "trainer/sampler", 1.0, log=True, least_half_range=0.01),
    Quantity("kl", "k3 KL to the reference", "KL", None),
    Quantity("entropy", "entropy (nats)", "entropy", None),
    Quantity("gradient", "d loss / d logp", "dloss/dlogp", 0.0),
    Quantity("mask", "mask", "mask", None),
)


@dataclass(frozen=True)
class TokenSample:
    index: int  # the sample's row in the rollout
    group: int  # its prompt, index // G
    reward: float
    advantage: float
    tokens: tuple[str, ...]  # (T_i,) decoded completion tokens, the first EOS included
    values: dict[str, tuple[float, ...]]  # quantity name -> (T_i,) values, NaN where not defined


@dataclass(frozen=True)
class TokenPage:
    title: str
    ratio_label: str  # which ratio the `ratio` quantity is
    prompts: tuple[str, ...]  # (B,)
    samples: tuple[TokenSample, ...]  # (B*G,) in rollout order


def step_ratio(run: StepRun) -> tuple[torch.Tensor, str]:
    """((N, C) ratio, its name): see the module's docstring for which ratio."""
    if run.loss.sampler_ratio is not None:
        ratio = run.loss.sampler_ratio.expand_as(run.logprobs.policy)
        return ratio, f"sampler IS ratio pi_old / pi_sampler ({run.config.vllm_importance_sampling_mode})"
    if run.update is not None and len(run.update.iterations) > 1:
        return run.update.iterations[-1].ratio, f"pi_theta / pi_old (pass {len(run.update.iterations)})"
    return run.loss.ratio, "pi / pi_old (1 at the weights that scored the rollout)"


def token_values(run: StepRun, tokenizer, title: str = "", groups: int | None = None) -> TokenPage:
    """The page's data from a run that reached the loss phase; `tokenizer` decodes each token on its own.
    `groups`: the first that many prompts and their completions only (a notebook cell); None: all."""
    if run.loss is None:
        raise ValueError("token_values needs a run up to the loss phase at least (step.run(until='loss'))")
    r, lp = run.rollout, run.logprobs
    ratio, ratio_label = step_ratio(run)
    d = lp.reference - lp.policy
    per_token = {
        "advantage": run.advantages.values.unsqueeze(1).expand_as(lp.policy),
        "ratio": ratio,
        "mismatch": torch.exp(lp.policy - r.sampler_logps),
        "kl": torch.exp(d) - d - 1,
        "entropy": lp.entropies,
        "gradient": gradient_of_loss_wrt_logps(run, run.config),
        "mask": lp.mask,
    }
    B = len(r.prompts) if groups is None else min(groups, len(r.prompts))
    samples = []
    for i in range(B * r.num_generations):
        length = int(r.completion_lengths[i])
        ids = r.completion_ids[i, :length].tolist()
        samples.append(
            TokenSample(
                index=i,
                group=i // r.num_generations,
                reward=run.rewards.total[i].item(),
                advantage=run.advantages.values[i].item(),
                tokens=tuple(tokenizer.decode([t]) for t in ids),
                values={q: tuple(v[i, :length].double().tolist()) for q, v in per_token.items()},
            )
        )
    name = run.config.preset_name()
    title = title or f"every token of a step ({'preset ' + name if name else 'custom config'})"
    return TokenPage(title, ratio_label, tuple(r.prompts[:B]), tuple(samples))


# ---- colours: computed here once per token and quantity, the page's script only swaps them

NOT_DEFINED = "#dddddd"


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))


WHITE, BLUE, RED, ORANGE = (255, 255, 255), (49, 104, 196), (214, 47, 39), (230, 120, 20)


LEVELS = 16  # colour steps on each side of a diverging scale (and along a sequential one)
CODES = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # one character per palette entry


@functools.cache
def _palette(q: Quantity) -> tuple[str, ...]:
    """A quantity's colours (they do not depend on the scale's ends): built once, read for every token."""
    if q.name == "mask":
        steps = ["#eeeeee", "#b7e4b0"]
    elif q.centre is None:
        steps = [_mix(WHITE, ORANGE, 0.85 * k / LEVELS) for k in range(LEVELS + 1)]
    else:
        steps = [_mix(WHITE, BLUE if k < 0 else RED, 0.85 * abs(k) / LEVELS) for k in range(-LEVELS, LEVELS + 1)]
    return (*steps, NOT_DEFINED)


@dataclass(frozen=True)
class Scale:
    quantity: Quantity
    low: float  # the value at the scale's left end (diverging: centre - half range)
    high: float

    def palette(self) -> tuple[str, ...]:
        """Every colour the scale uses, by code; the last one is "not defined" (NaN, a ratio <= 0)."""
        return _palette(self.quantity)

    def code(self, value: float) -> int:
        """A value's index into `palette()`: white at the centre (or at 0), saturating at the scale's ends."""
        q, last = self.quantity, len(self.palette()) - 1
        if not math.isfinite(value):
            return last
        if q.log and value <= 0:  # a ratio truncated to 0: the low end
            return 0
        if q.name == "mask":
            return int(value > 0)
        if q.centre is None:
            t = 0.0 if self.high <= self.low else (value - self.low) / (self.high - self.low)
            return round(min(max(t, 0.0), 1.0) * LEVELS)
        x, centre, end = (math.log(v) for v in (value, q.centre, self.high)) if q.log else (value, q.centre, self.high)
        t = 0.0 if end <= centre else (x - centre) / (end - centre)
        return LEVELS + round(min(max(t, -1.0), 1.0) * LEVELS)

    def colour(self, value: float) -> str:
        return self.palette()[self.code(value)]


def scale_of(quantity: Quantity, values: list[float]) -> Scale:
    """The scale spanning the values (diverging: symmetric about the centre, on a log scale for ratios)."""
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not quantity.log)]
    if quantity.name == "mask":
        return Scale(quantity, 0.0, 1.0)
    if quantity.centre is None:
        return Scale(quantity, 0.0, max(finite, default=0.0))
    if quantity.log:
        half = max((abs(math.log(v / quantity.centre)) for v in finite), default=0.0)
        half = max(half, quantity.least_half_range)
        return Scale(quantity, math.exp(-half) * quantity.centre, math.exp(half) * quantity.centre)
    half = max(max((abs(v - quantity.centre) for v in finite), default=0.0), quantity.least_half_range)
    return Scale(quantity, quantity.centre - half, quantity.centre + half)


def scales(page: TokenPage) -> dict[str, Scale]:
    return {q.name: scale_of(q, [v for s in page.samples for v in s.values[q.name]]) for q in QUANTITIES}


# ---- HTML

CSS = """
.gd-tokens {font: 13px/1.5 system-ui, sans-serif; color: #222; max-width: 100%;}
.gd-tokens .gd-bar {display: flex; flex-wrap: wrap; gap: 1em; align-items: center; margin: 0.3em 0 0.8em;}
.gd-tokens .gd-legend {display: flex; align-items: center; gap: 0.4em;}
.gd-tokens .gd-legend[hidden] {display: none;}
.gd-tokens .gd-ramp {border: 1px solid #999;}
.gd-tokens .gd-group {border-top: 1px solid #ccc; padding: 0.4em 0;}
.gd-tokens .gd-prompt {font-family: monospace; color: #555; overflow-wrap: anywhere;}
.gd-tokens .gd-sample {display: flex; gap: 0.8em; margin: 0.2em 0;}
.gd-tokens .gd-meta {flex: 0 0 auto; min-width: 19em; white-space: nowrap; font-variant-numeric: tabular-nums; color: #444;}
.gd-tokens .gd-text {flex: 1 1 auto; min-width: 0; font-family: monospace; white-space: pre-wrap;
  overflow-wrap: anywhere;}
.gd-tokens .gd-tok {border-radius: 2px; box-shadow: inset 0 0 0 1px rgba(0,0,0,0.08);}
"""

# also inline: a notebook opened untrusted drops the <style> (and the script) but keeps style attributes
TEXT_STYLE = "font-family: monospace; white-space: pre-wrap; overflow-wrap: anywhere"
ESCAPE_STYLE = "font: inherit; color: #a0206f; background: #f6e6f0; border-radius: 2px"  # a control char's escape

SCRIPT = """(function () {
  var root = document.getElementById(%s), palettes = %s, order = %s, codes = %s;
  var select = root.querySelector('select.gd-quantity');
  select.addEventListener('change', function () {
    var q = select.value, at = order.indexOf(q);
    root.querySelectorAll('span.gd-tok').forEach(function (s) {
      s.style.background = palettes[q][codes.indexOf(s.getAttribute('data-c').charAt(at))];
    });
    root.querySelectorAll('.gd-legend').forEach(function (l) { l.hidden = l.getAttribute('data-q') !== q; });
  });
})();"""


def _fmt(value: float) -> str:
    return "n/a" if not math.isfinite(value) else significant(value)  # the digits every CPU computes alike


def _shown(token: str) -> str:
    """A token as it reads on the page: a newline as a visible mark, then the break; an empty one as a mark."""
    return token.replace("\r", "\u240d").replace("\t", "\u2192").replace("\n", "\u21b5\n") or "\u2205"


def _text_html(text: str) -> str:
    """Text the run holds (a token, a prompt) as HTML: markup escaped, each control character (`CONTROL`) shown
    as its escape in a styled `<kbd class="gd-esc">`, so none reaches the page raw."""
    parts = CONTROL.split(text)  # text, control, text, control, ..., text
    return "".join(
        html.escape(part) if i % 2 == 0 else f'<kbd class="gd-esc" style="{ESCAPE_STYLE}">{escape_code(part)}</kbd>'
        for i, part in enumerate(parts)
    )


def _token_span(sample: TokenSample, k: int, colours: dict[str, Scale], first: str) -> str:
    """One token: its first colour inline, every quantity's colour code in `data-c` (QUANTITIES' order), every
    value in the title."""
    hover = "\n".join(
        [f"{sample.tokens[k]!r} #{k}"] + [f"{q.short} {_fmt(sample.values[q.name][k])}" for q in QUANTITIES]
    )
    codes = "".join(CODES[colours[q.name].code(sample.values[q.name][k])] for q in QUANTITIES)
    background = colours[first].colour(sample.values[first][k])
    title = html.escape(hover, quote=True).replace("\n", "&#10;")  # one line of HTML per sample
    return (
        f'<span class="gd-tok" style="background:{background}" data-c="{codes}" '
        f'title="{title}">{_text_html(_shown(sample.tokens[k]))}</span>'
    )


def _legend(scale: Scale, label: str, hidden: bool) -> str:
    """The scale as a row of colour blocks (background-color only: an untrusted notebook keeps that) between its
    end values."""
    q = scale.quantity
    if q.name == "mask":
        colours, ends = [scale.colour(0)] * 4 + [scale.colour(1)] * 4, ("0 (not in the loss)", "1 (in the loss)")
    else:
        steps = [t / 8 for t in range(9)]
        stops = [scale.low + (scale.high - scale.low) * t for t in steps]
        if q.log and scale.low > 0:
            stops = [scale.low * (scale.high / scale.low) ** t for t in steps]
        colours, ends = [scale.colour(v) for v in stops], (_fmt(scale.low), _fmt(scale.high))
    ramp = "".join(f'<span style="background-color: {c}">\u2003</span>' for c in colours)
    hide = ' hidden="hidden"' if hidden else ""
    return (
        f'<div class="gd-legend" data-q="{q.name}"{hide}><b>{html.escape(label)}</b> '
        f'{html.escape(ends[0])} <span class="gd-ramp">{ramp}</span> {html.escape(ends[1])} '
        '<span style="color: #777">(grey: not defined)</span></div>'
    )


def page_body(page: TokenPage, quantity: str = "advantage") -> str:
    """The page's content as one `<div>` with its style and script: what a notebook cell shows and what
    `render_page` wraps in a document. `quantity`: the one coloured first."""
    if quantity not in {q.name for q in QUANTITIES}:
        raise ValueError(f"quantity must be one of {[q.name for q in QUANTITIES]}, got {quantity!r}")
    colours = scales(page)
    key = repr((page.title, [s.tokens for s in page.samples])).encode()
    root = "gd-tokens-" + hashlib.sha1(key).hexdigest()[:10]  # the same page, the same id: outputs stay stable
    labels = {q.name: (page.ratio_label if q.name == "ratio" else q.label) for q in QUANTITIES}
    options = "".join(
        f'<option value="{q.name}"{" selected" if q.name == quantity else ""}>{html.escape(labels[q.name])}</option>'
        for q in QUANTITIES
    )
    legends = "".join(_legend(colours[q.name], labels[q.name], q.name != quantity) for q in QUANTITIES)
    script = SCRIPT % tuple(
        json.dumps(x) for x in (root, {q: c.palette() for q, c in colours.items()}, [q.name for q in QUANTITIES], CODES)
    )
    groups = []
    for b, prompt in enumerate(page.prompts):
        rows = []
        for s in (s for s in page.samples if s.group == b):
            tokens = "".join(_token_span(s, k, colours, quantity) for k in range(len(s.tokens)))
            meta = f"#{s.index} · reward {s.reward:.4g} · A {s.advantage:+.3g} · {len(s.tokens)} tokens"
            rows.append(
                f'<div class="gd-sample" data-sample="{s.index}"><div class="gd-meta">{meta}</div>'
                f'<div class="gd-text" style="{TEXT_STYLE}">{tokens}</div></div>\n'
            )
        groups.append(
            f'<div class="gd-group" data-group="{b}"><div class="gd-prompt">group {b} · prompt: '
            f"{_text_html(prompt)}</div>{''.join(rows)}</div>"
        )
    return (
        f'<div class="gd-tokens" id="{root}"><style>{CSS}</style>'
        f"<div><b>{html.escape(page.title)}</b>: hover a token for every value.</div>"
        f'<div class="gd-bar"><label>colour by <select class="gd-quantity">{options}</select></label>{legends}</div>'
        f"{''.join(groups)}<script>{script}</script></div>"
    )


def render_page(page: TokenPage, quantity: str = "advantage") -> str:
    """One standalone HTML document: no server, no external URL."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(page.title)}</title></head>\n<body>{page_body(page, quantity)}</body></html>\n"
    )


def notebook_view(page: TokenPage, quantity: str = "advantage"):
    """The same view in a notebook cell (an `IPython.display.HTML`)."""
    from IPython.display import HTML

    return HTML(page_body(page, quantity))
