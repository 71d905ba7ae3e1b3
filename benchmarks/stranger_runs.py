"""What `stranger_corpus.py` draws: a user's GRPO run (task, model, GRPOConfig, reward functions) with 0, 1 or 2
planted defects, and the `user_train.py` that trains it. Torch-free: drawing the corpus's 120 specs takes
milliseconds, and a spec is the whole of a run (the model folder and the script are made from it alone).

Everything of run i is drawn from `random.Random(i)`, except how many defects it has and which: a fixed schedule
(`defects_of`) gives every pair of seeds (2j, 2j + 1) the same defect kinds, so that the tuning half (even seeds)
and the held-out half (odd seeds) hold the same kinds, drawn apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from stranger_models import ModelSpec

TASK_KINDS = ("exact", "closeness", "format", "multi")
# a clean run's loss types: TRL's but vespo (it needs vLLM's importance-sampling settings) and dr_grpo, which
# divides by max_completion_length: at 8-24 new tokens that is past 4x a bare answer's 2-4 tokens, where the
# doctor's loss_normaliser speaks (dr_grpo is the loss_normaliser defect's)
CLEAN_LOSS_TYPES = ("grpo", "bnpo", "dapo", "cispo", "sapo", "luspo")
LORA_TARGETS = {"gpt2": ["c_attn"], "qwen2": ["q_proj", "v_proj"], "llama": ["q_proj", "v_proj"]}


@dataclass(frozen=True)
class TaskSpec:
    """'What is a+b? ' questions: the answer bare or as <a>N</a>, the numbers' range (0..49: prompts of mixed
    lengths, and right answers mostly longer than a weak model's wrong ones), the pool of questions the model warmed
    up on and GRPO trains on, and whether they come as chat messages."""

    kind: str  # TASK_KINDS
    op: str  # + or -
    top: int  # numbers in 0..top
    pairs: tuple[tuple[int, int], ...]
    chat: bool

    def question(self, a: int, b: int) -> str:
        return f"What is {a}{self.op}{b}? "

    def answer(self, a: int, b: int) -> str:
        value = a + b if self.op == "+" else a - b
        return f"<a>{value}</a>" if self.tagged else str(value)

    @property
    def tagged(self) -> bool:
        return self.kind in ("format", "multi")

    def lines(self) -> list[tuple[str, str]]:
        return [(self.question(a, b), self.answer(a, b)) for a, b in self.pairs]

    def mixed_lengths(self) -> bool:
        """Prompts of different lengths: TRL left-pads the shorter ones."""
        return len({len(q) for q, _ in self.lines()}) > 1

    def answer_tokens(self) -> int:
        """The median answer's tokens with its EOS (one character, one token)."""
        return sorted(len(a) for _, a in self.lines())[len(self.pairs) // 2] + 1


@dataclass(frozen=True)
class Run:
    seed: int
    task: TaskSpec
    model: ModelSpec
    config: tuple[tuple[str, object], ...]  # GRPOConfig arguments the run sets (besides output_dir, use_cpu, report_to)
    rewards: tuple[str, ...]  # REWARD_FUNCS, by name (REWARD_SOURCES)
    trainer: str  # GRPOTrainer | PositionIdsGRPOTrainer
    defects: tuple[str, ...]

    @property
    def settings(self) -> dict:
        return dict(self.config)

    def with_config(self, **changes) -> Run:
        """The run with GRPOConfig arguments changed; None removes one (TRL's default then applies)."""
        merged = {**self.settings, **changes}
        return dataclasses.replace(self, config=tuple(sorted((k, v) for k, v in merged.items() if v is not None)))

    @property
    def name(self) -> str:
        return f"seed-{self.seed:04d}"

    @property
    def half(self) -> str:
        return "tuning" if studied(self.seed) else "held-out"

    @property
    def capture_step(self) -> int:
        return self.settings["max_steps"]


# ---- the user's reward functions, as source: each a function of (prompts, completions) TRL and the doctor call

HELPERS = '''
def text(x) -> str:
    """A prompt or a completion as TRL passes it: a string, or in a chat run a list of messages."""
    return x if isinstance(x, str) else x[-1]["content"]


def truth(prompt) -> int:
    """The answer to 'What is a+b? ' (or a-b)."""
    a, op, b = re.search(r"(\\d+)([+-])(\\d+)", text(prompt)).groups()
    return int(a) + int(b) if op == "+" else int(a) - int(b)


def first_number(s: str):
    found = re.search(r"-?\\d+", s)
    return int(found.group()) if found else None
'''

REWARD_SOURCES = {
    "exact": '''
def exact(prompts, completions, **kwargs):
    """1 for the right number and nothing else, else 0."""
    return [1.0 if text(c).strip() == str(truth(p)) else 0.0 for p, c in zip(prompts, completions)]
''',
    "close": '''
def close(prompts, completions, **kwargs):
    """exp(-|answer - truth| / 10): partly right for a near miss, 0 without a number."""
    out = []
    for p, c in zip(prompts, completions):
        n = first_number(text(c))
        out.append(0.0 if n is None else math.exp(-abs(n - truth(p)) / 10))
    return out
''',
    "wrapped": '''
def wrapped(prompts, completions, **kwargs):
    """The answer as <a>N</a>: 1 right, 0.5 the shape with a wrong number, 0.2 a number without it, else 0."""
    out = []
    for p, c in zip(prompts, completions):
        shaped = re.fullmatch(r"<a>(-?\\d+)</a>", text(c).strip())
        if shaped:
            out.append(1.0 if int(shaped.group(1)) == truth(p) else 0.5)
        else:
            out.append(0.2 if first_number(text(c)) is not None else 0.0)
    return out
''',
    "tagged_exact": '''
def tagged_exact(prompts, completions, **kwargs):
    """1 if the number inside <a></a> is right, else 0."""
    out = []
    for p, c in zip(prompts, completions):
        found = re.search(r"<a>(-?\\d+)</a>", text(c))
        out.append(1.0 if found and int(found.group(1)) == truth(p) else 0.0)
    return out
''',
    "has_tags": '''
def has_tags(completions, **kwargs):
    """1 for a completion that is exactly <a>N</a>, else 0."""
    return [1.0 if re.fullmatch(r"\\s*<a>-?\\d+</a>\\s*", text(c)) else 0.0 for c in completions]
''',
    # the defects' functions
    "thorough": '''
def thorough(completions, **kwargs):
    """A bonus for a full answer: its length, up to 40 characters."""
    return [min(len(text(c)), 40) / 40 for c in completions]
''',
    "polite": '''
def polite(completions, **kwargs):
    """A politeness check every answer to a sum passes."""
    return [1.0 for _ in completions]
''',
    "question_length": '''
def question_length(prompts, completions, **kwargs):
    """Harder (longer) questions pay more."""
    return [len(text(p)) / 20 for p in prompts]
''',
    "inverse_error": '''
def inverse_error(prompts, completions, **kwargs):
    """The closer the better: 1 / |answer - truth| (0 without a number)."""
    out = []
    for p, c in zip(prompts, completions):
        n = first_number(text(c))
        out.append(0.0 if n is None else 1 / abs(n - truth(p)))
    return out
''',
}


DERIVED = {  # suffix -> the derived function's body, F the function it derives from (the user's mistakes)
    "_x1000": ("F, in per-mille.", "return [1000 * r for r in F(prompts, completions)]"),
    "_or_none": ("F, where it applies (None: it does not).",
                 "scores = F(prompts, completions)\n"
                 "    return [None if len(text(c)) % 2 else s for c, s in zip(completions, scores)]"),
    "_judged": ("F as a judge sampled at a temperature scores it: partly chance.",
                "return [s + random.gauss(0.0, 0.3) for s in F(prompts, completions)]"),
    "_shifted": ("F, each completion checked against the next row's question (an off-by-one in the zip).",
                 "return F(prompts[1:] + prompts[:1], completions)"),
    "_counted": ("F, less as the run goes on: a bonus that decays with every call (state kept between calls).",
                 "CALLS[0] += 1\n"
                 "    return [s * 0.9 ** CALLS[0] for s in F(prompts, completions)]"),
    "_first_bonus": ("F, and a bonus to every fourth row of the batch (a position, not the completion).",
                     "return [s + (0.5 if i % 4 == 0 else 0.0) for i, s in enumerate(F(prompts, completions))]"),
    "_role": ("F of the message's role instead of its content (the wrong field of a chat completion).",
              "return F(prompts, [[{'role': 'assistant', 'content': c[0]['role']}] for c in completions])"),
}  # fmt: skip


def derived_source(name: str) -> str:
    """`F<suffix>` for a function F of REWARD_SOURCES and a suffix of DERIVED: `F_x1000` (F in per-mille),
    `F_or_none` (None wherever the completion's length is odd: a parity slip that makes F 'not apply' to about half
    the rows), and the mistakes of the outside kinds (a noisy judge, an off-by-one, state kept, a position, the wrong
    chat field)."""
    suffix = next(x for x in DERIVED if name.endswith(x))
    base = name[: -len(suffix)]
    doc, body = DERIVED[suffix]
    return f'''
def {name}(prompts, completions, **kwargs):
    """{doc.replace("F", base, 1)}"""
    {body.replace("F(", base + "(")}
'''


def reward_source(name: str) -> str:
    return REWARD_SOURCES[name] if name in REWARD_SOURCES else derived_source(name)


def sources_needed(names: tuple[str, ...]) -> list[str]:
    """The functions REWARD_FUNCS names and the ones they call, each once, callees first."""
    needed = []
    for name in names:
        for suffix in DERIVED:
            if name.endswith(suffix):
                needed.append(name[: -len(suffix)])
        needed.append(name)
    return list(dict.fromkeys(needed))


def task_rewards(kind: str, rng: random.Random) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
    """The task's own reward functions and their weights (None: TRL's, all 1)."""
    if kind == "exact":
        return ("exact",), None
    if kind == "closeness":
        return ("close",), None
    if kind == "format":
        return ("wrapped",), None
    return ("tagged_exact", "has_tags"), rng.choice([(1.0, 0.5), (1.0, 0.2), (2.0, 1.0), (1.0, 1.0)])


def binary_reward(task: TaskSpec) -> str:
    return "tagged_exact" if task.tagged else "exact"


# ---- the defects


@dataclass(frozen=True)
class Defect:
    """A planted defect: what it changes (`plant`), the finding ids any one of which names it, what the run must
    be for it to apply (`needs`: task and model fields), and `tags`: two defects sharing a tag are not planted
    together (they change the same thing, or one hides the other by construction). `expects_crash`: the run
    cannot finish (TRL raises), so there is no step to diagnose."""

    name: str
    expects: tuple[str, ...]
    what: str
    plant: Callable[[Run, random.Random], Run]
    needs: tuple[tuple[str, object], ...] = ()
    tags: tuple[str, ...] = ()
    expects_crash: bool = False
    stage: str | None = None  # the stage of the signal's path where it loses the signal (the outside kinds: named
    # right where the doctor's first loud finding speaks of this stage)
    setting: str | None = None  # ...and the words of the setting that did it, in that finding's summary
    only_with_vllm: bool = False  # a defect only where vLLM samples (its log-probs enter the importance ratio): in
    # a run whose trainer samples with its own model it is optional (`stranger_corpus.optional`)


def _replace_first_reward(run: Run, name: str) -> Run:
    return dataclasses.replace(run, rewards=(name, *run.rewards[1:]))


def _add_reward(run: Run, name: str) -> Run:
    weights = run.settings.get("reward_weights")
    run = dataclasses.replace(run, rewards=(*run.rewards, name))
    return run.with_config(reward_weights=None if weights is None else (*weights, 1.0))


def _sampler_truncation(run: Run, rng: random.Random) -> Run:
    if rng.random() < 0.7:
        return run.with_config(top_p=round(rng.uniform(0.8, 0.95), 2))
    return run.with_config(top_k=rng.randint(5, 20))


def _short_completions(run: Run, rng: random.Random) -> Run:
    """Room for 40-70% of the median answer and its EOS, and always less than all of it."""
    tokens = run.task.answer_tokens()
    return run.with_config(max_completion_length=min(tokens - 1, max(1, round(tokens * rng.uniform(0.4, 0.7)))))


def _pairs_of_two(run: Run, rng: random.Random) -> Run:
    """Groups of 2 and a binary reward: a pair agrees whenever both are right or both wrong."""
    batch = rng.choice([16, 20, 24, 28, 32])
    accumulation = run.settings.get("gradient_accumulation_steps", 1)
    run = dataclasses.replace(run, rewards=(binary_reward(run.task),))
    return run.with_config(num_generations=2, per_device_train_batch_size=batch // accumulation, reward_weights=None)


def _dr_grpo_long(run: Run, rng: random.Random) -> Run:
    """dr_grpo with TRL's default max_completion_length (512), or 256."""
    return run.with_config(loss_type="dr_grpo", max_completion_length=rng.choice([None, 256]))


def _position_ids(run: Run, rng: random.Random) -> Run:
    """TRL's own GRPOTrainer on GPT-2, with a pool whose questions come in their lengths in equal parts and at least
    four questions a step, so that the captured batch is left-padded: with two-digit numbers mostly, the two or
    three questions of a step often share one length, and then nothing is padded and nothing is planted."""
    t = run.task
    by_length: dict[int, list[tuple[int, int]]] = {}
    for a in range(t.top + 1):
        for b in range(t.top + 1):
            if t.op == "+" or a >= b:
                by_length.setdefault(len(t.question(a, b)), []).append((a, b))
    share = max(8, len(t.pairs) // len(by_length))
    pairs = tuple(sorted(p for group in by_length.values() for p in rng.sample(group, min(share, len(group)))))
    G = run.settings["num_generations"]
    accumulation = run.settings.get("gradient_accumulation_steps", 1)
    batch = max(run.settings["per_device_train_batch_size"] * accumulation, 4 * G)  # G <= 8: at most 32
    run = dataclasses.replace(run, trainer="GRPOTrainer", task=dataclasses.replace(t, pairs=pairs))
    return run.with_config(per_device_train_batch_size=batch // accumulation)


def _lr_blowup(run: Run, rng: random.Random) -> Run:
    rate = 10 ** rng.uniform(math.log10(0.02), math.log10(0.1))
    return run.with_config(learning_rate=float(f"{rate:.3g}"), beta=0.04, max_steps=3)


CATALOGUE: dict[str, Defect] = {
    d.name: d
    for d in (
        Defect(
            "zero_std_groups",
            ("zero_std_groups",),
            "num_generations=2 with a binary reward",
            _pairs_of_two,
            tags=("first_reward", "signal"),
        ),
        # a truncated sampler biases vLLM's importance ratio (TRL #6789: vLLM's log-probs renormalised over the
        # kept tokens, the trainer's over the vocabulary); the corpus's runs sample with the trainer's own model,
        # whose old and new log-probs are both the full distribution's: there a mild cut may narrow some groups to
        # one text (identical_groups) or change nothing the step learns from, so it is optional (`only_with_vllm`)
        Defect(
            "sampler_truncation",
            ("sampler_truncation", "identical_groups"),
            "top_p 0.8-0.95 or top_k 5-20",
            _sampler_truncation,
            tags=("sampling",),
            only_with_vllm=True,
        ),
        Defect(
            "narrow_top_p",
            ("sampler_truncation", "identical_groups"),
            "top_p 0.3-0.5: groups nearly identical",
            lambda run, rng: run.with_config(top_p=round(rng.uniform(0.3, 0.5), 2)),
            tags=("sampling",),
        ),
        # TRL divides the scoring logits by the temperature, so the catalogue's `temperature` (a scoring mismatch)
        # is not this; a cold sampler leaves groups of one completion and a collapsed entropy (zero_std_groups
        # follows from them: a symptom, not the cause)
        Defect(
            "cold_temperature",
            ("identical_groups", "entropy_collapse"),
            "temperature 0.1-0.3",
            lambda run, rng: run.with_config(temperature=round(rng.uniform(0.1, 0.3), 2)),
            tags=("sampling", "signal"),
        ),
        Defect(
            "dropout",
            ("dropout",),
            "the model's dropout left on (disable_dropout=False, TRL's default)",
            lambda run, rng: run.with_config(disable_dropout=None),
            needs=(("dropout", True),),
            tags=("dropout",),
        ),
        Defect(
            "truncation",
            ("truncation",),
            "max_completion_length shorter than most answers",
            _short_completions,
            tags=("length",),
        ),
        Defect(
            "length_reward",
            ("length_reward",),
            "an extra reward that pays for length",
            lambda run, rng: _add_reward(run, "thorough"),
            tags=("extra_length",),
        ),
        Defect(
            "reward_x1000",
            ("large_advantages", "dominant_reward"),
            "the first reward function in per-mille, scale_rewards='none'",
            lambda run, rng: _replace_first_reward(run, f"{run.rewards[0]}_x1000").with_config(scale_rewards="none"),
            tags=("first_reward", "scale"),
        ),
        Defect(
            "bad_reward",
            ("bad_reward",),
            "the first reward function returns None on about half the rows",
            lambda run, rng: _replace_first_reward(run, f"{run.rewards[0]}_or_none"),
            tags=("first_reward",),
        ),
        Defect(
            "loss_normaliser",
            ("loss_normaliser",),
            "dr_grpo with max_completion_length 256 or 512 (TRL's)",
            _dr_grpo_long,
            tags=("length", "long_generation", "loss"),
        ),
        Defect(
            "position_ids",
            ("position_ids",),
            "GPT-2, left-padded prompts of mixed lengths, dropout off",
            _position_ids,
            needs=(("arch", "gpt2"), ("top", 49), ("chat", False)),
            tags=("dropout",),
        ),
        Defect(
            "constant_reward",
            ("constant_reward",),
            "an extra reward that ignores the completion",
            lambda run, rng: _add_reward(run, rng.choice(["polite", "question_length"])),
            tags=("extra_constant",),
        ),
        Defect(
            "lr_blowup",
            ("kl_blowup", "update_size"),
            "learning_rate 0.02-0.1, beta 0.04, captured at step 3",
            _lr_blowup,
            tags=("learning_rate", "long_generation"),
        ),
        Defect(
            "reward_raises",
            (),
            "the first reward function is 1 / |error|: it divides by zero on every right answer",
            lambda run, rng: _replace_first_reward(run, "inverse_error"),
            tags=("first_reward",),
            expects_crash=True,
        ),
    )
}


# ---- defects outside the catalogue: a user's real mistakes that no catalogued pitfall names, each scored by the
# stage of the signal's path the doctor's first loud finding speaks of (`signal_path.stage_of`, the report's
# "stage"). Half the kinds are studied (the doctor may be changed looking at their even seeds); the other half's
# runs are never looked at one by one, only reported whole.


def _frozen(run: Run, rng: random.Random) -> Run:
    """Everything but the final norm frozen by the user's script before the trainer is built (no adapter)."""
    return dataclasses.replace(run, model=dataclasses.replace(run.model, lora=False), trainer="frozen")


def _first_reward_as(suffix: str):
    return lambda run, rng: _replace_first_reward(run, f"{run.rewards[0]}{suffix}")


def _weight_zero(run: Run, rng: random.Random) -> Run:
    """The task's reward weighted 0 (a weight meant for a logged-only function put on the one that trains)."""
    weights = run.settings.get("reward_weights") or (1.0,) * len(run.rewards)
    return run.with_config(reward_weights=(0.0, *weights[1:]) if len(weights) > 1 else (0.0,))


def _masked_short(run: Run, rng: random.Random) -> Run:
    return _short_completions(run, rng).with_config(mask_truncated_completions=True)


def _kl_swamp(run: Run, rng: random.Random) -> Run:
    """beta 10-30 at a rate that moves the policy, captured at step 6: by then the KL term pulls back harder than the
    rewards push (at step 3 of the first draw, 0.55x: the defect not yet in the step)."""
    return run.with_config(beta=float(f"{10 ** rng.uniform(1, 1.5):.3g}"), max_steps=6,
                           learning_rate=float(f"{10 ** rng.uniform(-2.5, -2):.3g}"))  # fmt: skip


OUTSIDE: dict[str, Defect] = {
    d.name: d
    for d in (
        Defect("tiny_rate", (), "learning_rate 1e-11 to 1e-9",
               lambda run, rng: run.with_config(learning_rate=float(f"{10 ** rng.uniform(-11, -9):.3g}")),
               stage="update", setting="learning_rate"),
        Defect("few_tokens", (), "top_entropy_quantile 0.01-0.05: a few tokens a completion train",
               lambda run, rng: run.with_config(top_entropy_quantile=round(rng.uniform(0.01, 0.05), 3)),
               stage="tokens", setting="top_entropy_quantile"),
        Defect("kl_swamp", (), "beta 10-30 at a rate that moves the policy, captured at step 6", _kl_swamp,
               stage="loss", setting="beta"),
        Defect("noisy_judge", (), "the first reward a judge's score with noise (sd 0.3)", _first_reward_as("_judged"),
               stage="rewards"),
        Defect("weight_zero", (), "reward_weights 0 on the task's one reward", _weight_zero,
               needs=(("kind", "closeness"),), stage="rewards", setting="weight"),
        Defect("frozen", (), "every parameter but the final norm frozen (requires_grad=False)", _frozen,
               needs=(("arch", "qwen2"),), stage="parameters", setting="requires_grad"),
        Defect("off_by_one", (), "the first reward checks each completion against the next row's question",
               _first_reward_as("_shifted"), stage="rewards"),
        Defect("stateful", (), "the first reward decays with every call (a counter kept between calls)",
               _first_reward_as("_counted"), stage="rewards"),
        Defect("position_bonus", (), "a bonus to every fourth row of the batch", _first_reward_as("_first_bonus"),
               stage="rewards"),
        Defect("wrong_field", (), "a chat run's reward reads the message's role, not its content",
               _first_reward_as("_role"), needs=(("chat", True),), stage="rewards"),
        Defect("masked_short", (), "mask_truncated_completions with room for under most answers", _masked_short,
               stage="tokens", setting="mask_truncated_completions"),
        Defect("warmup_forever", (), "warmup_steps 20,000-100,000 in a run of a few steps",
               lambda run, rng: run.with_config(warmup_steps=rng.choice([20000, 50000, 100000])),
               stage="update", setting="learning_rate"),
    )
}  # fmt: skip
OUTSIDE_BASE = 1000  # seeds from here draw one outside kind each
STUDIED_KINDS = ("tiny_rate", "few_tokens", "kl_swamp", "noisy_judge", "weight_zero", "frozen")
HELD_OUT_KINDS = tuple(k for k in OUTSIDE if k not in STUDIED_KINDS)
KINDS = {**CATALOGUE, **OUTSIDE}


def outside_kind(seed: int) -> str:
    """Seeds OUTSIDE_BASE + 2j and + 2j + 1 share the kind j cycles to."""
    return tuple(OUTSIDE)[((seed - OUTSIDE_BASE) // 2) % len(OUTSIDE)]


def studied(seed: int) -> bool:
    """Whether a run may be looked at while changing the doctor: the catalogue's even seeds, and an outside kind's
    even seeds where the kind is a studied one. Every other run is held out (by seed, by kind or both)."""
    if seed < OUTSIDE_BASE:
        return seed % 2 == 0
    return seed % 2 == 0 and outside_kind(seed) in STUDIED_KINDS


def _plantable_together(a: Defect, b: Defect) -> bool:
    return not (a.expects_crash or b.expects_crash or set(a.tags) & set(b.tags))


SINGLE_KINDS = tuple(CATALOGUE)
# every pair that can be planted together, in an order fixed once (not the catalogue's, so that the first
# doubles of a short corpus are not all zero_std_groups + something)
DOUBLE_KINDS = tuple(
    random.Random(0).sample(
        [(a, b) for a, b in itertools.combinations(CATALOGUE, 2) if _plantable_together(CATALOGUE[a], CATALOGUE[b])],
        k=sum(_plantable_together(CATALOGUE[a], CATALOGUE[b]) for a, b in itertools.combinations(CATALOGUE, 2)),
    )
)


def defects_of(seed: int) -> tuple[str, ...]:
    """The schedule: pair p = seed // 2 of seeds is clean, single, single, double by p % 4 (a quarter clean, half
    single, a quarter double, in both halves alike); the singles cycle through the catalogue, the doubles through
    DOUBLE_KINDS, each kind given to both seeds of its pair; from OUTSIDE_BASE on, one outside kind each."""
    if seed >= OUTSIDE_BASE:
        return (outside_kind(seed),)
    pair = seed // 2
    block, slot = divmod(pair, 4)
    if slot == 0:
        return ()
    if slot in (1, 2):
        return (SINGLE_KINDS[(2 * block + slot - 1) % len(SINGLE_KINDS)],)
    return DOUBLE_KINDS[block % len(DOUBLE_KINDS)]


def draw_task(rng: random.Random, needs: dict) -> TaskSpec:
    kind = needs.get("kind", rng.choice(TASK_KINDS))
    top = needs.get("top", rng.choice([9, 49]))
    op = rng.choice(["+", "+", "-"])
    chat = needs.get("chat", rng.random() < 0.3)
    every = [(a, b) for a in range(top + 1) for b in range(top + 1) if op == "+" or a >= b]
    pairs = tuple(sorted(rng.sample(every, k=min(len(every), rng.randint(32, 48)))))
    return TaskSpec(kind, op, top, pairs, chat)


def draw_model(rng: random.Random, needs: dict, chat: bool) -> ModelSpec:
    """Chat runs on the rotary models (the chat builder's shapes); dropout 0.1 in the config or none."""
    arch = needs.get("arch", rng.choice(["qwen2", "llama"] if chat else ["gpt2", "qwen2", "llama"]))
    dropout = 0.1 if needs.get("dropout") else rng.choice([0.0, 0.1])
    return ModelSpec(
        arch=arch,
        hidden=rng.choice([32, 48, 64]),
        heads=rng.choice([2, 4]),
        dropout=dropout,
        lora=rng.random() < 0.25,
        target_accuracy=round(rng.uniform(0.25, 0.6), 2),
    )


def draw_config(rng: random.Random, task: TaskSpec, model: ModelSpec, weights) -> dict:
    """A clean run's GRPOConfig arguments: TRL's defaults but these, from small realistic ranges (None: TRL's)."""
    G = rng.randint(4, 8)
    batch = G * rng.choice([k for k in range(1, 9) if 16 <= G * k <= 32])
    accumulation = 2 if batch % 2 == 0 and rng.random() < 0.2 else 1
    shortest = 12 if task.tagged else 8
    return dict(
        num_generations=G,
        per_device_train_batch_size=batch // accumulation,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
        max_completion_length=rng.randint(shortest, 24),
        # LoRA trains at about ten times full fine-tuning's rate (PEFT's and TRL's LoRA examples: 1e-4 to 2e-4); at
        # 1e-6 a tiny adapter's update left every log-prob unchanged in float32 (seed 646, tuning half, 2026-11-28):
        # a run that cannot learn, which a clean run must not be
        learning_rate=float(f"{10 ** (rng.uniform(-6, -4) + (1 if model.lora else 0)):.3g}"),
        max_steps=rng.randint(2, 4),
        beta=rng.choice([None, 0.04]),
        loss_type=rng.choice(CLEAN_LOSS_TYPES),
        scale_rewards=rng.choice([None, None, None, "batch", "none"]),
        temperature=rng.choice([None, None, round(rng.uniform(0.8, 1.0), 2)]),
        # dropout in the model: the user turned it off (a clean run); none: sometimes said anyway
        disable_dropout=True if model.dropout > 0 or rng.random() < 0.3 else None,
        reward_weights=weights,
    )


def draw_run(seed: int) -> Run:
    """Run `seed`: its defects from the schedule, everything else from random.Random(seed); the defects planted
    on a clean run drawn to meet their needs."""
    rng = random.Random(seed)
    names = defects_of(seed)
    needs = {k: v for name in names for k, v in KINDS[name].needs}
    task = draw_task(rng, needs)
    model = draw_model(rng, needs, task.chat)
    rewards, weights = task_rewards(task.kind, rng)
    # GPT-2's absolute positions under left padding: a clean run fixes them (the suite's documented trainer)
    trainer = "PositionIdsGRPOTrainer" if model.arch == "gpt2" and task.mixed_lengths() else "GRPOTrainer"
    run = Run(seed, task, model, (), rewards, trainer, names)
    run = run.with_config(**draw_config(rng, task, model, weights))
    for name in names:
        run = KINDS[name].plant(run, rng)
    return run


def expected(run: Run) -> dict[str, list[str]]:
    """defect -> the finding ids any one of which names it."""
    return {name: list(KINDS[name].expects) for name in run.defects}


def expects_crash(run: Run) -> bool:
    return any(KINDS[name].expects_crash for name in run.defects)


def spec_json(run: Run) -> dict:
    """The run as data (spec.json): everything drawn, the defects planted and what should name them."""
    return {
        **dataclasses.asdict(run),
        "name": run.name,
        "half": run.half,
        "expected": expected(run),
        "expects_crash": expects_crash(run),
        "what": {name: KINDS[name].what for name in run.defects},
        "stage": {name: KINDS[name].stage for name in run.defects if KINDS[name].stage},
        "studied": studied(run.seed),
        "lines": run.task.lines(),  # what the model warms up on: question -> answer
    }


# ---- the user's script


def _config_lines(run: Run) -> list[str]:
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in run.settings.items()}
    return [f"        {k}={v!r}," for k, v in settings.items()]


def user_script(run: Run) -> str:
    """`user_train.py`: what a user writes (TRL's GRPOConfig, their reward functions, the capture of the last
    step), importable without training (the doctor reads REWARD_FUNCS from it). It does not say what is planted."""
    t = run.task
    title = (
        f"My GRPO run: {'answers in <a></a> to ' if t.tagged else ''}'What is a{t.op}b?' with a, b up to {t.top}"
        f"{', as chat messages' if t.chat else ''}, on my small {run.model.arch} in model/."
    )
    frozen = run.trainer == "frozen"
    imports = ["from datasets import Dataset"]
    if run.model.lora:
        imports.append("from peft import LoraConfig")
    ours = ["from grpo_debug.capture import CaptureCallback"]
    if run.trainer == "PositionIdsGRPOTrainer":
        imports.append("from trl import GRPOConfig")
        ours.insert(0, "from grpo_debug.capture.trl_bridge import PositionIdsGRPOTrainer as GRPOTrainer")
    else:
        imports.append("from trl import GRPOConfig, GRPOTrainer")
    if frozen:
        imports.insert(1, "from transformers import AutoModelForCausalLM")
    prompts = '[[{"role": "user", "content": q}] for q in QUESTIONS]' if t.chat else "QUESTIONS"
    trainer_lines = [
        "model=model" if frozen else 'model="model"',
        "reward_funcs=REWARD_FUNCS",
        "args=args",
        f'train_dataset=Dataset.from_dict({{"prompt": {prompts}}})',
    ]
    if run.model.lora:
        trainer_lines.append(f"peft_config=LoraConfig(r=4, target_modules={LORA_TARGETS[run.model.arch]!r})")
    functions = "\n\n\n".join(reward_source(name).strip() for name in sources_needed(run.rewards))
    questions = "".join(f"    {q!r},\n" for q, _ in t.lines())
    nl = "\n"
    modules = "\n".join(f"import {m}" for m in ("math", "random", "re") if m == "re" or f"{m}." in functions)
    state = "\n\nCALLS = [0]  # the reward's calls so far\n" if "CALLS[0]" in functions else ""
    load = ""
    if frozen:  # the user's own freezing: everything but the final norm, before the trainer is built
        load = ("    model = AutoModelForCausalLM.from_pretrained(\"model\")\n"
                "    for name, param in model.named_parameters():\n"
                "        param.requires_grad = name.endswith((\"norm.weight\", \"ln_f.weight\")) and \".layers.\" "
                "not in name and \".h.\" not in name\n")  # fmt: skip
    return f'''"""{title}

    python user_train.py        (trains; the last step is captured in out/captures/)
"""

{modules}

{nl.join(imports)}

{nl.join(ours)}

QUESTIONS = [
{questions}]{state}


{HELPERS.strip()}


{functions}


REWARD_FUNCS = [{", ".join(run.rewards)}]

if __name__ == "__main__":
{load}    args = GRPOConfig(
        output_dir="out",
{nl.join(_config_lines(run))}
        use_cpu=True,
        report_to="none",
    )
    trainer = GRPOTrainer(
{"".join(f"        {line},{nl}" for line in trainer_lines)}    )
    trainer.add_callback(CaptureCallback("out/captures", steps=[args.max_steps]))
    trainer.train()
'''
