"""Beyond one step: K GRPO steps per arm, the arms paired, the held-out reward every E steps.

An arm is a config (the `fixed` preset and its changes, or another preset) and, optionally, TracIn
selection. Step t of seed s samples the training prompts t*B.. (cycling through `train_prompts`) with
sampling seed `TRAIN_SEED_STRIDE * s + t` in every arm, so the arms differ only where their configs do.
Each step is the engine's own phases (`GRPOStep.run` up to the update), then `GRPOStep.advance`: the
updated weights become the next step's start, the reference stays the initial model, and one AdamW
carries on from step to step as TRL's does (at a constant learning rate: TRL's default schedule decays
it linearly to 0 over the run). Every `eval_every` steps, and before the first, the policy samples the
task's test prompts (never a training or validation prompt) with fixed seeds, the same in every arm.

TracIn-selected GRPO (the two TracIn reports): each step, every sample's influence on a validation loss
(same batch, or a random or top-k-by-reward set of fresh samples of the validation prompts), then the
update on the selected samples only, their loss normalised over themselves as the seeds' trainers did.

Results go to a JSON-lines progress file as they come, with the weights and AdamW state checkpointed at
every evaluation, so an interrupted comparison resumes where it stopped and gives the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import stats
from .choices import ARM_NAMES
from .config import StepConfig, parse_overrides
from .diagnostics import triage_zero_loss
from .evaluation import eval_prompts, eval_side
from .files import write_atomically
from .step import GRPOStep, StepRun, metrics
from .tracin.experiments import SELECTIONS, scores_for, select
from .tracin.influence import (
    VAL_LOSSES,
    VAL_SOURCES,
    influence_scores,
    per_sample_train_gradients,
    validation_gradient,
    validation_pool,
    validation_set,
)

TRAIN_SEED_STRIDE = 1000  # step t of seed s samples with seed 1000 * s + t
LOGGED = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/region_mean",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "grad_norm",
    "loss",
    "completions/mean_length",
    "completions/clipped_ratio",  # TRL's names, from `step.metrics`; then this suite's
    "logps/max_sampler_gap",
)
COMPARED = ("kl", "entropy", "completions/mean_length")  # step metrics compared with the first arm's at the end


@dataclass(frozen=True)
class Selection:
    """TracIn-selected GRPO: which samples of each step's batch the update keeps."""

    keep: str = "influence>0"  # tracin.experiments.SELECTIONS
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
    from .config import _FALSE, _TRUE

    if key == "flip_sign":
        if value.lower() not in _TRUE + _FALSE:
            raise ValueError(f"arm {text!r}: flip_sign = {value!r} is not allowed: it must be true or false")
        return value.lower() in _TRUE
    if key == "size":
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"arm {text!r}: val_size = {value!r} is not allowed: it must be an integer") from None
    return value


def parse_arm(text: str) -> Arm:
    """NAME[:key=value,...]: a named arm (`ARMS`; else `fixed`) with StepConfig changes, `preset=`, and the
    TracIn keys select=, val_source=, val_size=, val_kind=, flip_sign=, score= (any of them turns TracIn on)."""
    name, _, rest = text.partition(":")
    if not name:
        raise ValueError(f"arm {text!r} has no name: NAME[:key=value,...]")
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
        selection = dataclasses.replace(selection or Selection(), **typed)
    out = Arm(name, preset, tuple(sorted(changes.items())), selection)
    out.config(StepConfig())  # refuse a bad combination now, not at step 40
    return out


def step_config(base: StepConfig, arm: Arm, seed: int, t: int, train_prompts: int) -> StepConfig:
    """Step t of seed `seed`: the same prompts and sampling seed in every arm; the batches of B cycle
    through the first `train_prompts` training prompts (an epoch every train_prompts // B steps)."""
    B = base.num_prompts
    return arm.config(base).replace(seed=TRAIN_SEED_STRIDE * seed + t, prompt_offset=(t % (train_prompts // B)) * B)


def influence(step: GRPOStep, run: StepRun, sel: Selection) -> tuple[torch.Tensor, float]:
    """(N,) each training sample's influence on the validation loss, and that loss."""
    cfg = run.config
    if sel.source == "same_batch":
        val = validation_set(run, "same_batch")
    else:
        pool = validation_pool(step.run, cfg, sel.size * (2 if sel.source == "topk" else 1))
        val = validation_set(run, sel.source, sel.size, pool)
    val_loss, val_grad = validation_gradient(step.policy, val, cfg, sel.kind, sel.flip_sign)
    train = per_sample_train_gradients(step.policy, run.rollout, run.logprobs, run.advantages.values, cfg)
    scores = (
        influence_scores(train, val_grad)
        if sel.score == "tracin"
        else scores_for(train.gradients(), val_grad, cfg, sel.score)
    )
    return scores, val_loss


def train_step(step: GRPOStep, cfg: StepConfig, sel: Selection | None) -> dict:
    """One GRPO step of `step` under `cfg` (TracIn-selected when `sel`), then `advance`; its record."""
    start = time.perf_counter()
    if sel is None:
        run = step.run(cfg, until="update")
        extra = {}
    else:
        run = step.run(cfg, until="loss")
        scores, val_loss = influence(step, run, sel)
        keep = select(scores, sel.keep, cfg.seed)
        if len(keep):
            run = step.update_rows(keep)
        extra = {"selected_fraction": len(keep) / len(scores), "val_loss": val_loss}
    numbers = metrics(run)
    record = {k: numbers[k] for k in LOGGED if k in numbers}
    record.update(extra, triage=triage_zero_loss(run), seconds=time.perf_counter() - start)
    step.advance()
    return record


def held_out(step: GRPOStep, base: StepConfig, prompts: int) -> dict:
    """The policy's mean reward on the first `prompts` test prompts, sampled with the base config's seed."""
    side = eval_side(step.policy, step.loaded.tokenizer, eval_prompts(step.task, prompts), base, step.task)
    return {"reward": side.reward, "per_prompt": side.per_prompt.tolist()}


class Progress:
    """The JSON-lines file of every record so far, and one checkpoint per (arm, seed) at its last evaluation."""

    def __init__(self, path: str | Path, header: dict):
        self.path, self.header = Path(path), header
        self.ckpt_dir = self.path.with_suffix(".ckpt")
        lines = self._read()
        if lines and lines[0] != {"header": header}:
            raise ValueError(f"{self.path} holds another comparison ({lines[0]}); remove it or pick another path")
        if not lines and self.ckpt_dir.exists() and any(self.ckpt_dir.iterdir()):
            raise ValueError(
                f"{self.path} is empty or missing but {self.ckpt_dir} holds checkpoints: the records "
                "they belong to are lost; remove both to start over"
            )
        self.records = lines[1:]
        if not lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite()

    def _read(self) -> list[dict]:
        """The file's lines; a torn last line (a kill while appending) is dropped, any other bad line refused."""
        if not self.path.exists():
            return []
        text = self.path.read_text().splitlines()
        out = []
        for number, line in enumerate(text, start=1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                if number == len(text):
                    break  # the record being appended when the run stopped: it is taken again
                raise ValueError(f"{self.path}, line {number}: not a JSON record ({e})") from None
        return out

    def _rewrite(self) -> None:
        """The whole file written atomically (temporary file, fsync, rename)."""
        text = "".join(json.dumps(x) + "\n" for x in [{"header": self.header}, *self.records])
        write_atomically(self.path, lambda f: f.write(text))

    def remove(self) -> None:
        remove_progress(self.path)

    def checkpoint(self, arm: str, seed: int) -> Path:
        return self.ckpt_dir / f"{arm}-seed{seed}.pt"

    def resume_point(self, arm: str, seed: int) -> int:
        """The step the (arm, seed) checkpoint was taken after (0: none); records after it are dropped, and
        with no checkpoint every record of it is (its step-0 evaluation is taken again)."""
        path = self.checkpoint(arm, seed)
        done = torch.load(path, weights_only=True)["step"] if path.exists() else 0
        if done and not any(
            r["arm"] == arm and r["seed"] == seed and r["step"] == done and "eval" in r for r in self.records
        ):
            raise ValueError(
                f"{path} was taken after step {done}, but {self.path} has no evaluation of {arm} seed "
                f"{seed} at that step: the two do not belong together; remove both to start over"
            )
        stale = lambda r: r["arm"] == arm and r["seed"] == seed and (r["step"] > done or not done)
        if any(stale(r) for r in self.records):
            self.records = [r for r in self.records if not stale(r)]
            self._rewrite()
        return done

    def add(self, record: dict) -> None:
        self.records.append(record)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def save(self, step: GRPOStep, arm: str, seed: int, t: int) -> None:
        self.ckpt_dir.mkdir(exist_ok=True)
        state = {
            "step": t,
            "policy": step.policy.state_dict(),
            "optimizer": step.optimizer.state_dict() if step.optimizer else None,
        }
        write_atomically(self.checkpoint(arm, seed), lambda f: torch.save(state, f), binary=True)

    def load(self, step: GRPOStep, base: StepConfig, arm: str, seed: int) -> None:
        state = torch.load(self.checkpoint(arm, seed), weights_only=True)
        step.policy.load_state_dict(state["policy"])
        step.start_from_current_weights(state["optimizer"])


def run_arm(
    arm: Arm,
    seed: int,
    base: StepConfig,
    steps: int,
    eval_every: int,
    eval_prompts_n: int,
    train_prompts: int,
    progress: Progress,
    bar,
) -> None:
    step = GRPOStep(arm.config(base))
    done = progress.resume_point(arm.name, seed)
    if done:
        progress.load(step, base, arm.name, seed)
    else:
        progress.add({"arm": arm.name, "seed": seed, "step": 0, "eval": held_out(step, base, eval_prompts_n)})
    bar.update(done)
    for t in range(done, steps):
        record = train_step(step, step_config(base, arm, seed, t, train_prompts), arm.selection)
        progress.add({"arm": arm.name, "seed": seed, "step": t + 1, **record})
        if (t + 1) % eval_every == 0 or t + 1 == steps:
            progress.add({"arm": arm.name, "seed": seed, "step": t + 1, "eval": held_out(step, base, eval_prompts_n)})
            progress.save(step, arm.name, seed, t + 1)
        bar.update(1)


def train(
    arms: list[Arm],
    steps: int,
    seeds: int,
    base: StepConfig | None = None,
    eval_every: int = 5,
    eval_prompts_n: int = 32,
    train_prompts: int = 128,
    progress_path: str | Path = "train.progress.jsonl",
    show_progress: bool = True,
    keep_progress: bool = False,
    first_seed: int = 0,
) -> dict:
    """Every arm for `steps` steps and `seeds` seeds, first_seed .. first_seed + seeds - 1 (resuming from
    `progress_path`); the results. Once every arm is done the progress file and its checkpoints are removed,
    unless `keep_progress`. A confirmatory run takes seeds no exploratory run used (`first_seed`)."""
    base = base or StepConfig()
    if len({a.name for a in arms}) != len(arms):
        raise ValueError(f"arm names must differ: {[a.name for a in arms]}")
    if steps < 1 or seeds < 1 or eval_every < 1 or first_seed < 0:
        raise ValueError(
            f"steps, seeds and eval_every must be >= 1 and first_seed >= 0, got {steps}, {seeds}, "
            f"{eval_every}, {first_seed}"
        )
    if train_prompts < base.num_prompts:
        raise ValueError(f"train_prompts ({train_prompts}) must hold one batch of B={base.num_prompts}")
    from .task import load_task

    task = load_task(base.task)  # its prompt sets must hold what the run asks for, before any model loads
    for prompt_set, needed, flag in (
        ("train", train_prompts, "--train-prompts"),
        ("test", eval_prompts_n, "--eval-prompts"),
    ):
        try:
            task.prompts(prompt_set, needed)
        except ValueError as e:
            raise ValueError(f"{flag} {needed}: {e}") from None
    header = {
        "base": {k: v for k, v in dataclasses.asdict(base).items() if v != getattr(StepConfig(), k)},
        "arms": {a.name: a.describe() for a in arms},
        "eval_every": eval_every,
        "eval_prompts": eval_prompts_n,
        "train_prompts": train_prompts,
        "seed_stride": TRAIN_SEED_STRIDE,
        **({"first_seed": first_seed} if first_seed else {}),
    }
    lock = _lock(Path(f"{progress_path}.lock"))
    progress = Progress(progress_path, header)
    for arm in arms:
        for seed in range(first_seed, first_seed + seeds):
            with tqdm(total=steps, desc=f"{arm.name} seed {seed}", disable=not show_progress, leave=False) as bar:
                run_arm(arm, seed, base, steps, eval_every, eval_prompts_n, train_prompts, progress, bar)
    order = {a.name: i for i, a in enumerate(arms)}  # a resumed run appended its records out of order
    records = sorted(
        (r for r in progress.records if r["step"] <= steps),
        key=lambda r: (order[r["arm"]], r["seed"], r["step"], "eval" in r),
    )
    results = {
        **header,
        "steps": steps,
        "seeds": seeds,
        "records": records,
        "summary": summarize(records, [a.name for a in arms], seeds, steps),
    }
    if not keep_progress:
        progress.remove()
    lock.close()
    return results


def remove_progress(progress_path: str | Path) -> None:
    """A finished run's progress file and checkpoints (once its result is written)."""
    path = Path(progress_path)
    ckpt_dir = path.with_suffix(".ckpt")
    if ckpt_dir.exists():
        for file in ckpt_dir.iterdir():
            file.unlink()
        ckpt_dir.rmdir()
    path.unlink(missing_ok=True)


def _lock(path: Path):
    """An exclusive lock on `path` for this process's life (released when it ends, however it ends): a second
    run on the same output is refused instead of interleaving its records with the first's."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(
            f"another train run holds {path}: it writes the same output; wait for it or pick another --json"
        ) from None
    return handle


# ---- intervals (grpo_debug.stats): seeds are the unit, crossed with the test prompts


def eval_table(records: list[dict], arm: str, seeds: int, step: int) -> torch.Tensor | None:
    """(seeds, prompts) the held-out reward per test prompt at `step`, rows in seed order."""
    rows = {
        r["seed"]: r["eval"]["per_prompt"] for r in records if "eval" in r and r["arm"] == arm and r["step"] == step
    }
    return torch.tensor([rows[s] for s in sorted(rows)], dtype=torch.float64) if len(rows) == seeds else None


def last_steps_mean(records: list[dict], arm: str, seeds: int, key: str, first: int, last: int) -> torch.Tensor | None:
    """(seeds,) each seed's mean of a step metric over steps first..last."""
    ids = sorted({r["seed"] for r in records if r["arm"] == arm})
    if len(ids) != seeds:
        return None
    rows = [
        [
            r[key]
            for r in records
            if r["arm"] == arm
            and r["seed"] == s
            and first <= r["step"] <= last
            and "eval" not in r
            and r.get(key) is not None
        ]
        for s in ids
    ]
    return torch.tensor([sum(v) / len(v) for v in rows], dtype=torch.float64) if all(rows) else None


HEAVY_TAILED = ("kl",)  # compared as log ratios per seed (stats.log_ratio_interval)


def metric_difference(mine: torch.Tensor, theirs: torch.Tensor, key: str, level: float = stats.LEVEL) -> stats.Interval:
    """A step metric of two arms, paired by seed: a log ratio for a heavy-tailed positive metric, else the
    difference, Student's t over seeds."""
    if key in HEAVY_TAILED and (mine > 0).all() and (theirs > 0).all():
        return stats.log_ratio_interval(mine, theirs, level)
    return stats.seed_interval(mine - theirs, level)


def family(intervals: dict[str, stats.Interval], what: str) -> dict[str, dict]:
    """A family of verdicts: Holm's adjusted p-values across it, and each verdict in words. The intervals
    are computed at `stats.bonferroni_level` of the family's size by the caller, so a verdict never
    contradicts its interval."""
    adjusted = stats.holm([i.p_value for i in intervals.values()])
    return {
        name: {
            **i.as_dict(),
            "holm_p": p,
            "family": what,
            "family_size": len(intervals),
            "verdict": stats.verdict(i, what, p),
        }
        for (name, i), p in zip(intervals.items(), adjusted)
    }


def summarize(records: list[dict], arms: list[str], seeds: int, steps: int) -> dict:
    """Per arm: the held-out reward at the start and after `steps` (`stats.crossed_interval`: seeds crossed with
    test prompts; a deterministic arm counts once), its change from the start, and its difference from the first
    arm paired by seed and prompt; the step metrics of `COMPARED` over the last quarter of the steps against the
    first arm's (`metric_difference`). Each kind of comparison across the arms is one family: its intervals are
    shown at the Bonferroni level (95% when the family has one member) and its verdicts carry Holm's p."""
    ref, others = arms[0], arms[1:]
    tables = {arm: (eval_table(records, arm, seeds, 0), eval_table(records, arm, seeds, steps)) for arm in arms}
    done = [a for a in arms if tables[a][1] is not None]
    window = (steps - max(1, steps // 4) + 1, steps)
    out = {
        arm: {
            "reward_start": stats.crossed_interval(tables[arm][0]).mean if tables[arm][0] is not None else None,
            "reward_final": stats.crossed_interval(tables[arm][1]).as_dict(),
        }
        for arm in done
    }
    with_start = [a for a in done if tables[a][0] is not None]
    level = stats.bonferroni_level(len(with_start))
    changes = family(
        {a: stats.crossed_interval(tables[a][1] - tables[a][0], level) for a in with_start},
        "change of the held-out reward from step 0",
    )
    compared = [a for a in others if a in done and tables[ref][1] is not None]
    level = stats.bonferroni_level(len(compared))
    minus = family(
        {a: stats.crossed_interval(tables[a][1] - tables[ref][1], level) for a in compared},
        f"held-out reward minus {ref}",
    )
    metrics = {}
    for key in COMPARED:
        pairs = {a: [last_steps_mean(records, x, seeds, key, *window) for x in (a, ref)] for a in compared}
        pairs = {a: p for a, p in pairs.items() if p[0] is not None and p[1] is not None}
        level = stats.bonferroni_level(len(pairs))
        what = f"{key} {'log ratio to' if key in HEAVY_TAILED else 'minus'} {ref}, last quarter"
        metrics[key] = family({a: metric_difference(m, t, key, level) for a, (m, t) in pairs.items()}, what)
    for arm in done:
        row = out[arm]
        if arm in changes:
            row["change_from_start"] = changes[arm]
        if arm in minus:
            row[f"minus_{ref}"] = minus[arm]
            row["verdict"] = minus[arm]["verdict"]
        for key in COMPARED:
            if arm in metrics[key]:
                row[f"{key} minus_{ref}"] = metrics[key][arm]
        selected = last_steps_mean(records, arm, seeds, "selected_fraction", 1, steps)
        if selected is not None:
            row["selected_fraction"] = stats.seed_interval(selected).as_dict()
    return out


def metric_curve(results: dict, arm: str, key: str) -> list[dict]:
    """Per step: the mean over seeds of `key` ("eval/reward": the held-out reward) with its 95% interval
    (the held-out reward: `stats.crossed_interval`; a step metric: Student's t over seeds, none for one
    seed); `seeds` counts the distinct seeds behind it."""
    by_step: dict[int, list] = {}
    for r in results["records"]:
        if r["arm"] != arm:
            continue
        if key == "eval/reward" and "eval" in r:
            by_step.setdefault(r["step"], []).append(r["eval"]["per_prompt"])
        elif r.get(key) is not None:
            by_step.setdefault(r["step"], []).append(r[key])
    rows = []
    for step, values in sorted(by_step.items()):
        x = torch.tensor(values, dtype=torch.float64)
        i = stats.crossed_interval(x) if key == "eval/reward" else stats.seed_interval(x)
        rows.append({"arm": arm, "step": step, "mean": i.mean, "low": i.ci_low, "high": i.ci_high, "seeds": i.n_seeds})
    return rows


def paired_difference(
    results: dict, arm: str, other: str, step: int | None = None, level: float = stats.LEVEL
) -> stats.Interval:
    """The held-out reward of `arm` minus `other` at `step` (default: the last), paired by seed and test
    prompt, with its interval (`stats.crossed_interval`)."""
    step = results["steps"] if step is None else step
    a, b = (eval_table(results["records"], name, results["seeds"], step) for name in (arm, other))
    if a is None or b is None:
        raise ValueError(f"no held-out reward of {arm!r} and {other!r} at step {step} for every seed")
    return stats.crossed_interval(a - b, level)


def difference_curve(results: dict, arm: str, other: str) -> list[dict]:
    """`paired_difference` at every evaluation step, as `metric_curve` rows (arm, step, mean, low, high)."""
    rows = []
    for step in sorted({r["step"] for r in results["records"] if "eval" in r and r["arm"] == arm}):
        d = paired_difference(results, arm, other, step)
        rows.append({"arm": arm, "step": step, "mean": d.mean, "low": d.ci_low, "high": d.ci_high})
    return rows


def claims(results: dict, pairs: list[tuple[str, str, str]], what: str = "held-out reward") -> dict[str, dict]:
    """A family of claims (label, arm, other), each the paired held-out difference arm - other after K steps:
    intervals at the family's Bonferroni level, Holm's p, the verdict in words."""
    level = stats.bonferroni_level(len(pairs))
    return family({label: paired_difference(results, a, b, level=level) for label, a, b in pairs}, what)


def reanalyze(results: dict) -> dict:
    """`results` with its summary recomputed from its records by this module's statistics."""
    arms = list(results["arms"])
    return {**results, "summary": summarize(results["records"], arms, results["seeds"], results["steps"])}


def strict_json(value):
    """`value` with every non-finite float as None: strict JSON (RFC 8259) has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def base_config(results: dict) -> StepConfig:
    """The StepConfig every arm of `results` started from (the header stores its non-default fields)."""
    return StepConfig(**results["base"])


def select_arms(results: dict, arms: list[str]) -> dict:
    """`results` with only `arms` (in that order; the first is the reference of the summary), e.g. to pair
    the fixed arm of one comparison with another comparison's arms through `merge_results`."""
    missing = [a for a in arms if a not in results["arms"]]
    if missing:
        raise ValueError(f"no arm {missing} in these results (arms: {list(results['arms'])})")
    records = [r for r in results["records"] if r["arm"] in arms]
    return {
        **results,
        "arms": {a: results["arms"][a] for a in arms},
        "records": records,
        "summary": summarize(records, arms, results["seeds"], results["steps"]),
    }


def merge_results(first: dict, second: dict) -> dict:
    """Two comparisons run apart (to share a machine) as one, their arms paired: they must have the same
    base config, steps, seeds and evaluation, and their shared arms must have logged the same numbers."""
    same = ("base", "steps", "seeds", "eval_every", "eval_prompts", "train_prompts", "seed_stride", "first_seed")
    if any(first.get(k) != second.get(k) for k in same):
        raise ValueError(f"the two runs differ in {[k for k in same if first.get(k) != second.get(k)]}: not paired")
    strip = lambda rs, arm: [{k: v for k, v in r.items() if k != "seconds"} for r in rs if r["arm"] == arm]
    shared = [a for a in second["arms"] if a in first["arms"]]
    for arm in shared:
        if strip(first["records"], arm) != strip(second["records"], arm):
            raise ValueError(f"arm {arm!r} logged other numbers in the two runs: not the same arm")
    arms = {**first["arms"], **{a: d for a, d in second["arms"].items() if a not in shared}}
    records = first["records"] + [r for r in second["records"] if r["arm"] not in shared]
    return {
        **first,
        "arms": arms,
        "records": records,
        "command": [first.get("command"), second.get("command")],
        "summary": summarize(records, list(arms), first["seeds"], first["steps"]),
    }
