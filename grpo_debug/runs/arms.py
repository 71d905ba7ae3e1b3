"""Training arms: a config (the `fixed` preset and its changes, or another preset) and, optionally, TracIn
selection; `parse_arm` reads one from the command line. Step t of seed s samples the training prompts t*B..
(cycling through `train_prompts`) with sampling seed `TRAIN_SEED_STRIDE * s + t` in every arm, so the
arms differ only where their configs do (`step_config`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..choices import ARM_NAMES, EVAL_SETS, SELECTIONS, VAL_LOSSES, VAL_SOURCES
from ..config import StepConfig
from ..overrides import INTEGER, parse_bool, parse_overrides
from ..task import check_prompt_counts

TRAIN_SEED_STRIDE = 1000  # step t of seed s samples with seed 1000 * s + t


@dataclass(frozen=True)
class Selection:
    """TracIn-selected GRPO: which samples of each step's batch the update keeps."""

    keep: str = "influence>0"  # SELECTIONS
    source: str = "random"  # VAL_SOURCES: random or top-k fresh samples, or the batch itself (PPO's step_part_I)
    size: int = 64  # random / topk: samples in the validation set (16 to 128)
    kind: str = "seqloss-lastadv"  # VAL_LOSSES: the validation loss
    flip_sign: bool = False  # the TracIn-sign report's sign: the gradient of minus the validation loss
    score: str = "tracin"  # SCORES: "tracin" (the SGD gradient dot product) or "adam" (the step AdamW takes)

    def __post_init__(self):
        for name, allowed in (
            ("keep", SELECTIONS),
            ("source", VAL_SOURCES),
            ("kind", VAL_LOSSES),
            ("score", ("tracin", "adam")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"TracIn {name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 16 <= self.size <= 128:
            raise ValueError(f"TracIn validation size must be 16 to 128, got {self.size}")


SELECTION_KEYS = {
    "select": "keep",
    "val_source": "source",
    "val_size": "size",
    "val_kind": "kind",
    "flip_sign": "flip_sign",
    "score": "score",
}  # arm keys -> Selection fields


@dataclass(frozen=True)
class Arm:
    name: str
    preset: str = "fixed"
    changes: tuple[tuple[str, object], ...] = ()  # StepConfig fields on top of the preset
    selection: Selection | None = None

    def config(self, base: StepConfig) -> StepConfig:
        return base.with_preset(self.preset).replace(**dict(self.changes))

    def describe(self) -> dict:
        return {
            "preset": self.preset,
            "changes": dict(self.changes),
            "selection": dataclasses.asdict(self.selection) if self.selection else None,
        }


# the named arms: the pitfalls that change the gradient, one at a time, and TracIn-selected GRPO as the seeds ran it
ARMS = {
    "fixed": Arm("fixed"),
    "trl": Arm("trl", preset="trl"),
    "no_temperature": Arm("no_temperature", changes=(("logprob_temperature", False),)),
    "eos_dropped": Arm("eos_dropped", changes=(("mask", "drop_eos_and_pad"),)),
    "dropout": Arm("dropout", changes=(("dropout", True),)),
    "no_position_ids": Arm("no_position_ids", changes=(("position_ids", False),)),
    "k1": Arm("k1", changes=(("kl_estimator", "k1"),)),
    "reinforce": Arm("reinforce", changes=(("loss_type", "reinforce_sum"),)),
    "tracin": Arm("tracin", selection=Selection()),  # influence > 0 on a random 64, the right sign
    "tracin_same_batch": Arm("tracin_same_batch", selection=Selection(source="same_batch")),
    "tracin_flipped": Arm("tracin_flipped", selection=Selection(flip_sign=True)),
    "tracin_top16": Arm("tracin_top16", selection=Selection(source="topk", size=16)),
    "tracin_random128": Arm("tracin_random128", selection=Selection(source="random", size=128)),
    "dapo": Arm("dapo", changes=(("loss_type", "dapo"),)),
    "identical_groups": Arm("identical_groups", changes=(("top_p", 1e-6),)),  # nucleus of one token: greedy
}


assert tuple(ARMS) == ARM_NAMES, "choices.ARM_NAMES lists the named arms for the command line's help"


def _selection_value(text: str, key: str, value: str):
    """A TracIn arm value, read by the rules `--set` reads a StepConfig value by."""

    if key == "flip_sign":
        return parse_bool(value, f"arm {text!r}: flip_sign")
    if key == "size":
        if not INTEGER.fullmatch(value):
            raise ValueError(f"arm {text!r}: val_size = {value!r} is not allowed: it must be an integer (ASCII digits)")
        return int(value)
    return value


ARM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")  # an arm names its checkpoint files: no path in it


def parse_arm(text: str) -> Arm:
    """NAME[:key=value,...]: a named arm (`ARMS`; else `fixed`) with StepConfig changes, `preset=`, and the
    TracIn keys select=, val_source=, val_size=, val_kind=, flip_sign=, score= (any of them turns TracIn on)."""
    name, _, rest = text.partition(":")
    if not name:
        raise ValueError(f"arm {text!r} has no name: NAME[:key=value,...]")
    if not ARM_NAME.fullmatch(name):
        raise ValueError(
            f"arm name {name!r} is not allowed: letters, digits, '_' and '-' only, at most 64 (it names files)"
        )
    pairs = [p for p in rest.split(",") if p] if rest else []
    if name not in ARMS and not pairs:
        raise ValueError(
            f"arm {name!r} is not a named arm ({', '.join(ARMS)}); a new arm names its changes: {name}:key=value,..."
        )
    arm = ARMS.get(name, Arm(name))
    if any("=" not in p for p in pairs):
        raise ValueError(f"arm {text!r}: each change is key=value, got {rest!r}")
    raw = dict(p.split("=", 1) for p in pairs)
    owned = sorted(set(raw) & {"seed", "prompt_offset"})
    if owned:
        raise ValueError(
            f"arm {text!r}: {owned} are set by train for every step (paired seeds and prompts), not by an arm"
        )
    preset = raw.pop("preset", arm.preset)
    picked = {SELECTION_KEYS[k]: raw.pop(k) for k in list(raw) if k in SELECTION_KEYS}
    changes = {**dict(arm.changes), **parse_overrides([f"{k}={v}" for k, v in raw.items()])}
    selection = arm.selection
    if picked:
        typed = {k: _selection_value(text, k, v) for k, v in picked.items()}
        try:
            selection = dataclasses.replace(selection or Selection(), **typed)
        except ValueError as e:  # named by the arm's own keys (select=, val_size=, ...), not Selection's fields
            keys = {field: key for key, field in SELECTION_KEYS.items()}
            raise ValueError(f"arm {text!r}: {e} ({', '.join(keys[k] + '=' for k in typed)})") from None
    out = Arm(name, preset, tuple(sorted(changes.items())), selection)
    out.config(StepConfig())  # refuse a bad combination now, not at step 40
    return out


def step_config(base: StepConfig, arm: Arm, seed: int, t: int, train_prompts: int) -> StepConfig:
    """Step t of seed `seed`: the same prompts and sampling seed in every arm; the batches of B cycle
    through the first `train_prompts` training prompts (an epoch every train_prompts // B steps)."""
    B = base.num_prompts
    return arm.config(base).replace(seed=TRAIN_SEED_STRIDE * seed + t, prompt_offset=(t % (train_prompts // B)) * B)


def check_distinct(arms: tuple[Arm, ...] | list[Arm]) -> None:
    """Arms are told apart by name in the results: two of one name are refused."""
    if len({a.name for a in arms}) != len(arms):
        raise ValueError(f"arm names must differ: {[a.name for a in arms]}")


MAX_STEPS, MAX_SEEDS = 100_000, 1_000  # a run of more is a real training run, not a debugging experiment


@dataclass(frozen=True)
class Plan:
    """What a train run asks for: each arm for `steps` steps on `seeds` seeds (first_seed .. first_seed + seeds -
    1), training on the first `train_prompts` training prompts and evaluated every `eval_every` steps on
    `eval_prompts` prompts of `eval_set`. Checked as it is made, before any model loads (and, from the command
    line, before torch does): distinct arms, counts of at least 1, prompt sets that hold the prompts asked for."""

    arms: tuple[Arm, ...]  # a list is taken as a tuple
    steps: int
    seeds: int
    base: StepConfig = dataclasses.field(default_factory=StepConfig)
    eval_every: int = 5
    eval_prompts: int = 32
    train_prompts: int = 128
    first_seed: int = 0
    eval_set: str = "test"

    def __post_init__(self):
        object.__setattr__(self, "arms", tuple(self.arms))
        check_distinct(self.arms)
        if not (
            1 <= self.steps <= MAX_STEPS
            and 1 <= self.seeds <= MAX_SEEDS
            and 1 <= self.eval_every
            and 0 <= self.first_seed <= 2**20
        ):
            raise ValueError(
                f"steps must be 1..{MAX_STEPS}, seeds 1..{MAX_SEEDS}, eval_every >= 1 and first_seed 0..{2**20}, "
                f"got {self.steps}, {self.seeds}, {self.eval_every}, {self.first_seed}"
            )
        if self.train_prompts < self.base.num_prompts:
            raise ValueError(f"train_prompts ({self.train_prompts}) must hold one batch of B={self.base.num_prompts}")
        if self.eval_set not in EVAL_SETS:
            raise ValueError(f"eval_set must be test or validation, got {self.eval_set!r}")
        check_prompt_counts(
            self.base.task,
            [("train", self.train_prompts, "--train-prompts"), (self.eval_set, self.eval_prompts, "--eval-prompts")],
        )

    @property
    def seed_range(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)

    def header(self) -> dict:
        """The plan as a results file's header records it (first_seed and eval_set only where not the default)."""
        default = StepConfig()
        return {
            "base": {k: v for k, v in dataclasses.asdict(self.base).items() if v != getattr(default, k)},
            "arms": {a.name: a.describe() for a in self.arms},
            "eval_every": self.eval_every,
            "eval_prompts": self.eval_prompts,
            "train_prompts": self.train_prompts,
            "seed_stride": TRAIN_SEED_STRIDE,
            **({"first_seed": self.first_seed} if self.first_seed else {}),
            **({"eval_set": self.eval_set} if self.eval_set != "test" else {}),
        }
