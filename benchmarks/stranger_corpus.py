"""The doctor scored on runs nobody tuned it on: a generated corpus of user-style TRL GRPO runs, each with 0, 1 or
2 planted defects (`stranger_runs.CATALOGUE`: defect -> the finding ids that name it), split by seed into a
tuning half (even seeds) and a held-out half (odd seeds).

    python benchmarks/stranger_corpus.py train [--dir D] [--runs 120] [--jobs 2] [--seeds S ...]
    python benchmarks/stranger_corpus.py diagnose --half tuning [--dir D] [--jobs 2] [--horizon K]
    python benchmarks/stranger_corpus.py report --half tuning [--dir D] [--doctor doctor-FOLDER]
    python benchmarks/stranger_corpus.py --quick       (3 tiny runs, every stage, in a temporary folder)

Each run is a folder `seed-NNNN/` under `--dir` (default /tmp/stranger-corpus): `spec.json` (all it drew),
`model/` (a 2-layer GPT-2, Qwen2 or Llama with a character-level tokenizer, warmed up on the task's question ->
answer lines until it answers right about as often as drawn, 25% to 60%), `user_train.py` (a plain GRPOConfig, the
user's reward functions, `CaptureCallback` on the last step), run there as a user runs it; `train.json` (seconds,
return code, the warm-up's accuracy, the capture, the stderr's tail). `diagnose` runs the doctor's command line in
the run's folder on that capture, with the run's own reward functions (`--task user_train.py:REWARD_FUNCS`), into
`doctor-<grpo_debug's commit>/`: a new doctor diagnoses afresh beside the old one's files. Both stages skip what is
already there. `report` scores one half: per run, the planted defects against the doctor's causes ranked (findings
at warning or above that are no symptom of another, in the report's order); the top-1 rate of single defects, the
share of doubles with both named in the top 2, the share of clean runs with nothing at warning or above, a
confusion table (planted -> first-ranked cause) and the doctor's seconds per run. JSON first, then markdown.

The held-out half is for the final word on a doctor: diagnose and report it once the doctor is frozen, never run by
run while tuning it.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common import add_quick
from stranger_runs import CATALOGUE, KINDS, OUTSIDE, STUDIED_KINDS, Run, draw_run, spec_json, studied, user_script

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_DIR = Path("/tmp/stranger-corpus")
LOUD = ("problem", "warning")
BASE_ACCURACY_BAND = (0.1, 0.8)
QUICK_SEEDS = (0, 2, 6)  # clean, single (zero_std_groups), double: the schedule's first of each
TRAIN_TIMEOUT, DOCTOR_TIMEOUT = 1800, 3600


@dataclass(frozen=True)
class Corpus:
    """Where the runs live and how they are made: `quick` shrinks every run (one step, a short warm-up)."""

    root: Path
    jobs: int = 2
    quick: bool = False
    probe: int = 0  # `doctor --probe K` on every run (its table: `probe_scores`)

    def folder(self, run: Run) -> Path:
        return self.root / run.name


def child_env() -> dict:
    """One thread per child (two children share the two cores), torch's kernels at AVX2 width as `make` runs."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", "avx2"),
        "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX2"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def tail(text: str, n: int = 3000) -> str:
    return text[-n:]


def tiny(run: Run) -> Run:
    """The quick mode's run: one step of two groups, at most 16 new tokens, hidden 32 (same code paths)."""
    G = run.settings["num_generations"]
    small = run.with_config(
        max_steps=1,
        per_device_train_batch_size=2 * G,
        gradient_accumulation_steps=None,
        max_completion_length=min(run.settings.get("max_completion_length", 512), 16),
    )
    return dataclasses.replace(small, model=dataclasses.replace(run.model, hidden=32, heads=2))


def runs_of(seeds: list[int], quick: bool) -> list[Run]:
    return [tiny(draw_run(s)) if quick else draw_run(s) for s in seeds]


# ---- train


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def build(corpus: Corpus, run: Run) -> dict:
    """spec.json, user_train.py and model/ (warmed up in a child process): what the run's user brings."""
    folder = corpus.folder(run)
    if folder.exists():  # an interrupted build or training: begin it again
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_json(folder / "spec.json", spec_json(run))
    (folder / "user_train.py").write_text(user_script(run))
    command = [sys.executable, str(HERE / "stranger_models.py"), str(folder)] + (["100"] if corpus.quick else [])
    done = run_child(command, TRAIN_TIMEOUT, capture_output=True)
    if done.returncode:
        return {"failed": "model warm-up", "stderr_tail": tail(done.stderr)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def captures(folder: Path) -> list[str]:
    """What the run's CaptureCallback wrote under out/captures/: step-K folders, and where a reward function raised,
    the crash-step-K/ it leaves (none where the callback never got to write)."""
    where = folder / "out" / "captures"
    return sorted(p.name for p in where.iterdir() if not p.name.startswith(".")) if where.exists() else []


def health_lines(folder: Path) -> int:
    """The lines of the callback's out/captures/health.jsonl (one per step it saw end, where it keeps one)."""
    health = folder / "out" / "captures" / "health.jsonl"
    return len(health.read_text().splitlines()) if health.exists() else 0


def run_child(command: list[str], timeout: int, **kwargs) -> subprocess.CompletedProcess:
    """A child process; one that outlives `timeout` is killed and reads as failed (return code -9, its stderr's
    end), so that one stuck run does not end a stage of a hundred."""
    try:
        return subprocess.run(command, text=True, env=kwargs.pop("env", child_env()), timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        return subprocess.CompletedProcess(command, -9, "", f"{stderr}\nkilled after {timeout} s")


def train_one(corpus: Corpus, run: Run) -> dict:
    """Build the run and train it as its user would (`python user_train.py` in its folder); train.json says how it
    went. A run planted to crash records whether anything was written before it did."""
    folder = corpus.folder(run)
    start = time.perf_counter()
    warmup = build(corpus, run)
    built = time.perf_counter() - start
    result = {"name": run.name, "seed": run.seed, "warmup": warmup, "build_seconds": built}
    if "failed" in warmup:
        result.update(returncode=None, failed=warmup["failed"], stderr_tail=warmup["stderr_tail"])
    else:
        start = time.perf_counter()
        with open(folder / "train.log", "w") as log:
            done = run_child([sys.executable, "user_train.py"], TRAIN_TIMEOUT, cwd=folder, stdout=log,
                             stderr=subprocess.PIPE)  # fmt: skip
            log.write(done.stderr)
        wanted = f"step-{run.capture_step}"
        written = captures(folder)
        result.update(
            returncode=done.returncode,
            train_seconds=time.perf_counter() - start,
            capture=f"out/captures/{wanted}" if wanted in written else None,
            captures_written=written,
            captures_folder=(folder / "out" / "captures").exists(),
            stderr_tail=tail(done.stderr) if done.returncode else "",
        )
        if done.returncode == 0 and wanted not in written:
            result["failed"] = f"trained, but no {wanted} was captured"
        elif done.returncode:
            result["failed"] = "training"
    result["expects_crash"] = spec_json(run)["expects_crash"]
    write_json(folder / "train.json", result)
    return result


def trained(corpus: Corpus, run: Run) -> dict | None:
    path = corpus.folder(run) / "train.json"
    return json.loads(path.read_text()) if path.exists() else None


def in_parallel(jobs: int, work, items: list) -> list:
    """`work(item)` for every item, `jobs` at a time (each item's work is subprocesses: threads suffice)."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(work, items))


def train(corpus: Corpus, runs: list[Run], retry_failed: bool = False) -> list[dict]:
    """Train every run not trained yet (a failed one again with `retry_failed`), logging one line per run."""

    def one(run: Run) -> dict:
        done = trained(corpus, run)
        if done is not None and not (retry_failed and done.get("failed")):
            return done
        result = train_one(corpus, run)
        seconds = result["build_seconds"] + result.get("train_seconds", 0)
        print(f"{run.name} {'+'.join(run.defects) or 'clean'}: {result.get('failed', 'trained')} in {seconds:.0f} s"
              f" (warm-up accuracy {result['warmup'].get('accuracy')})", file=sys.stderr, flush=True)  # fmt: skip
        return result

    return in_parallel(corpus.jobs, one, runs)


# ---- diagnose


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def tree_digest(folder: Path) -> str:
    """A digest of every file under `folder` (its relative path and bytes)."""
    digest = hashlib.sha1()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            digest.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:8]


def snapshot_doctor(root: Path) -> tuple[str, Path]:
    """grpo_debug as it is now, copied to root/doctor-code/<version>/ for every doctor of one diagnose stage (the
    package is edited while a stage runs for an hour); <version> is grpo_debug's last commit, with a digest of the
    copy where the working tree has uncommitted changes to it. A changed doctor gets a version of its own, and so
    diagnoses every run afresh."""
    commit = git("log", "-1", "--format=%h", "--", "grpo_debug").strip()
    (root / "doctor-code").mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root / "doctor-code"))
    shutil.copytree(REPO / "grpo_debug", staging / "grpo_debug", ignore=shutil.ignore_patterns("__pycache__"))
    dirty = git("status", "--porcelain", "--", "grpo_debug").strip()
    version = f"{commit}+{tree_digest(staging / 'grpo_debug')}" if dirty else commit
    where = root / "doctor-code" / version
    if not where.exists():
        compileall.compile_dir(staging, quiet=1)  # as pip installs a package: where PYTHONDONTWRITEBYTECODE is set,
        try:  # nothing else would, and every doctor would compile grpo_debug anew (1.4 s a run)
            staging.rename(where)
        except OSError:  # another diagnose stage, started at the same moment, made the same snapshot first
            if not where.exists():
                raise
    if staging.exists():
        shutil.rmtree(staging)
    return version, where


def doctor_folder(version: str, horizon: int | None, probe: int = 0) -> str:
    return (
        f"doctor-{version}" + ("" if horizon is None else f"-horizon-{horizon}") + (f"-probe-{probe}" if probe else "")
    )


def latest_file(root: Path, half: str) -> Path:
    return root / f"doctor-latest-{half}.txt"


def diagnose_one(corpus: Corpus, run: Run, sub: str, code: Path, horizon: int | None) -> dict | None:
    """The doctor's command line in the run's folder, on its capture, with its reward functions; timed. `code`: the
    grpo_debug snapshot it imports (first on PYTHONPATH)."""
    folder, done_train = corpus.folder(run), trained(corpus, run)
    if not done_train or not done_train.get("capture"):
        return None
    out = folder / sub
    if (out / "diagnose.json").exists():
        return json.loads((out / "diagnose.json").read_text())
    out.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "grpo_debug", "doctor", done_train["capture"], "--task", "user_train.py:REWARD_FUNCS",
               "--json", f"{sub}/doctor.json", "--held-out", "0", "--threads", "1"]  # fmt: skip
    if horizon is not None:
        command += ["--horizon", str(horizon)]
    if corpus.probe:
        command += ["--probe", str(corpus.probe)]
    env = {**child_env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    done = run_child(command, DOCTOR_TIMEOUT, cwd=folder, capture_output=True, env=env)
    result = {
        "name": run.name,
        "command": command[1:],
        "seconds": time.perf_counter() - start,
        "returncode": done.returncode,
        "stderr_tail": tail(done.stderr) if done.returncode else "",
    }
    (out / "stdout.txt").write_text(done.stdout)
    write_json(out / "diagnose.json", result)
    print(f"{run.name}: doctor {'ok' if done.returncode == 0 else 'FAILED'} in {result['seconds']:.0f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return result


def diagnose(corpus: Corpus, runs: list[Run], horizon: int | None, half: str) -> str:
    """Every trained run of `runs` diagnosed by today's doctor (a snapshot of it); its folder's name, also written
    to doctor-latest-<half>.txt, where `report` looks first."""
    version, code = snapshot_doctor(corpus.root)
    sub = doctor_folder(version, horizon, corpus.probe)
    in_parallel(corpus.jobs, lambda run: diagnose_one(corpus, run, sub, code, horizon), runs)
    latest_file(corpus.root, half).write_text(sub)
    return sub


# ---- report


def causes(findings: list[dict]) -> list[str]:
    """The doctor's causes, ranked: findings at warning or above that are no symptom of another, in report order
    (the report's findings are ranked: causes by severity then by how far their flip moves the update)."""
    return [f["id"] for f in findings if f["severity"] in LOUD and not f["symptom_of"]]


def named_at(ranked: list[str], ids: list[str]) -> tuple[int | None, str | None]:
    """(1-based rank, id) of the first cause among `ids`; (None, None) where none is."""
    return next(((k, c) for k, c in enumerate(ranked, start=1) if c in ids), (None, None))


def both_in_top_two(ranked: list[str], expected: dict[str, list[str]]) -> bool:
    """Two defects, each named by its own one of the first two causes."""
    (a, ids_a), (b, ids_b) = expected.items()
    top = ranked[:2]
    return len(top) == 2 and ((top[0] in ids_a and top[1] in ids_b) or (top[0] in ids_b and top[1] in ids_a))


def optional(spec: dict) -> list[str]:
    """The planted defects that are defects only where vLLM samples (`Defect.only_with_vllm`), in a run whose trainer
    samples with its own model: what they do there depends on the run (a truncating sampler may narrow some groups
    to one text, or change nothing the step learns from), so naming them is right and not naming them no miss. Their
    ids, and the findings that are only their symptoms, are taken out before the run is scored on the rest (a single:
    as a clean run)."""
    vllm = bool(dict(spec["config"]).get("use_vllm"))
    return [d for d in spec["defects"] if KINDS[d].only_with_vllm and not vllm]


def expected_ids(spec: dict) -> dict[str, list[str]]:
    """defect -> the ids that name it, from the catalogue as it is now (spec.json's `expected` is the catalogue's
    when the run was drawn: a mended catalogue scores the runs drawn before it); the optional defects left out."""
    idle = optional(spec)
    return {d: list(KINDS[d].expects) for d in spec["defects"] if d not in idle}


def score_outside(spec: dict, findings: list[dict]) -> dict:
    """An outside kind's row: right where the doctor's first loud finding speaks of the stage where the kind loses
    the signal (the report's `stage`), the setting traced where its summary names it; silent where nothing is loud."""
    (kind,) = spec["defects"]
    defect = OUTSIDE[kind]
    loud = [f for f in findings if f["severity"] in LOUD and not f["symptom_of"]]
    first = loud[0] if loud else None
    row = {
        "name": spec["name"],
        "planted": [kind],
        "outside": kind,
        "kind_held_out": kind not in STUDIED_KINDS,
        "stage_expected": defect.stage,
        "first": first and first["id"],
        "first_stage": first and first.get("stage"),
        "loud": [f["id"] for f in loud],
        "silent": first is None,
        "right": bool(first) and first.get("stage") == defect.stage,
    }
    if defect.setting:
        said = (first or {}).get("summary", "") + " " + str((first or {}).get("evidence", {}).get("lost_to", ""))
        row["setting_traced"] = row["right"] and defect.setting in said
    return row


def score_run(spec: dict, findings: list[dict]) -> dict:
    """One run's row: what was planted, what the doctor ranked, and whether it counts as named."""
    if any(d in OUTSIDE for d in spec["defects"]):
        return score_outside(spec, findings)
    idle_defects = optional(spec)
    idle = {i for d in idle_defects for i in KINDS[d].expects}
    findings = [f for f in findings if f["id"] not in idle and not (f["symptom_of"] and set(f["symptom_of"]) <= idle)]
    ranked = causes(findings)
    expected = expected_ids(spec)
    row = {
        "name": spec["name"],
        "planted": list(expected) or ["clean"],
        "expected": expected,
        "causes": ranked,
        "loud": [f["id"] for f in findings if f["severity"] in LOUD],
        "named": {d: dict(zip(("rank", "as"), named_at(ranked, ids))) for d, ids in expected.items()},
        "optional": idle_defects,
    }
    if not expected:
        row["quiet"] = not row["loud"]
    elif len(expected) == 1:
        row["top1"] = bool(ranked) and ranked[0] in next(iter(expected.values()))
    else:
        row["both_top2"] = both_in_top_two(ranked, expected)
    return row


def rate(rows: list[dict], key: str) -> float | None:
    hits = [r[key] for r in rows if key in r]
    return sum(hits) / len(hits) if hits else None


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "max": max(values), "n": len(values)} if values else {}


def confusion(rows: list[dict]) -> dict[str, dict[str, int]]:
    """planted (a single defect, or clean) -> first-ranked cause ('-': none at warning or above) -> runs."""
    table: dict[str, dict[str, int]] = {}
    for r in rows:
        if len(r["planted"]) == 1 and "causes" in r:  # an outside kind's row is scored by its stage instead
            first = r["causes"][0] if r["causes"] else "-"
            cell = table.setdefault(r["planted"][0], {})
            cell[first] = cell.get(first, 0) + 1
    return table


def by_defect(rows: list[dict]) -> dict[str, dict]:
    """Per defect kind, over every run it was planted in: named first (singles), named in the top 2, and by which
    id."""
    out: dict[str, dict] = {}
    for r in rows:
        for d, where in r.get("named", {}).items():
            e = out.setdefault(d, {"runs": 0, "first_in_single": 0, "singles": 0, "in_top2": 0, "named_as": {}})
            e["runs"] += 1
            e["singles"] += len(r["named"]) == 1
            e["first_in_single"] += len(r["named"]) == 1 and where["rank"] == 1
            e["in_top2"] += where["rank"] is not None and where["rank"] <= 2
            if where["as"]:
                e["named_as"][where["as"]] = e["named_as"].get(where["as"], 0) + 1
    return out


def absent_from_step(spec: dict, capture: Path) -> list[str]:
    """The planted defects the captured step does not hold, so that no doctor could name them there: position_ids
    where every prompt of the captured batch has one length (nothing left-padded: the batch's few prompts can all
    be two-digit sums); reward_x1000 where the per-mille function's rewards vary within no group (every completion
    cut at the same length, or all right: a scale on no variance makes no advantage). Such a run is left out of the
    rates and listed."""
    captured = json.loads((capture / "capture.json").read_text())
    gone = []
    if "position_ids" in spec["defects"] and len({len(p) for p in captured["prompts"]}) == 1:
        gone.append("position_ids")
    if "reward_x1000" in spec["defects"]:
        G = captured["grpo_config"]["num_generations"]
        (name,) = [n for n in captured["rewards"] if n.endswith("_x1000")]
        values = captured["rewards"][name]
        groups = [[v for v in values[i : i + G] if v is not None] for i in range(0, len(values), G)]
        if all(len(set(g)) <= 1 for g in groups):
            gone.append("reward_x1000")
    return gone


def report(corpus: Corpus, runs: list[Run], sub: str, half: str) -> dict:
    """The half's scores from the files the stages wrote (nothing is run here)."""
    rows, crashes, missing, failed, train_seconds, doctor_seconds, accuracies = [], {}, [], {}, [], [], {}
    reported: set[str] = set()
    not_present: dict[str, list[str]] = {}
    for run in runs:
        folder, t = corpus.folder(run), trained(corpus, run)
        spec = json.loads((folder / "spec.json").read_text()) if t else None
        if t is None:
            missing.append(run.name)
            continue
        accuracies[run.name] = t["warmup"].get("accuracy")
        train_seconds.append(t["build_seconds"] + t.get("train_seconds", 0))
        if spec["expects_crash"]:
            written = captures(folder)  # read again: train.json of an older version listed step-K folders only
            crashes[run.name] = {
                "crashed": t["returncode"] not in (0, None),
                "captures_written": written,
                "crash_record": [
                    f"{w}/crash.json" for w in written if (folder / "out/captures" / w / "crash.json").exists()
                ],
                "health_lines": health_lines(folder),
            }
            continue
        if t.get("failed"):
            failed[run.name] = f"{t['failed']}: {t['stderr_tail'][-300:]}"
            continue
        d_path = folder / sub / "diagnose.json"
        if not d_path.exists():
            missing.append(run.name)
            continue
        d = json.loads(d_path.read_text())
        if d["returncode"]:
            failed[run.name] = f"doctor: {d['stderr_tail'][-300:]}"
            continue
        doctor_seconds.append(d["seconds"])
        gone = absent_from_step(spec, folder / t["capture"])
        if gone:
            not_present[run.name] = gone
            continue
        doctor = json.loads((folder / sub / "doctor.json").read_text())
        findings = doctor["findings"]
        reported |= {f["id"] for f in findings}
        rows.append({**score_run(spec, findings), **probe_row(spec, doctor.get("probe"))})
    low, high = BASE_ACCURACY_BAND
    known = {k: v for k, v in accuracies.items() if v is not None}
    return {
        "half": half,
        "doctor": sub,
        "runs": len(runs),
        "scored": {
            "clean": sum("quiet" in r for r in rows),
            "single": sum("top1" in r for r in rows),
            "double": sum("both_top2" in r for r in rows),
        },
        "top1_rate_single": rate(rows, "top1"),
        "outside": outside_scores(rows),
        "probe": probe_scores(rows),
        "both_in_top2_rate_double": rate(rows, "both_top2"),
        "quiet_rate_clean": rate(rows, "quiet"),
        "by_defect": by_defect(rows),
        "confusion": confusion(rows),
        "doctor_seconds": spread(doctor_seconds),
        "train_seconds": spread(train_seconds),
        "base_accuracy": {
            **spread(list(known.values())),
            "outside_band": {k: v for k, v in known.items() if not low <= v <= high},
        },
        "crash_runs": crashes,
        "failed": failed,
        "missing": missing,
        "planted_but_not_in_the_step": not_present,
        "planted_optional": {r["name"]: r["optional"] for r in rows if r.get("optional")},
        # an expected id the doctor does not report (its catalogue lost or renamed it) is never named: mend CATALOGUE
        "expected_ids_the_doctor_lacks": sorted({i for d in CATALOGUE.values() for i in d.expects} - reported),
        "per_run": rows,
    }


PIPELINE_STAGES = ("tokens", "loss", "parameters", "update")  # the optimizer's side of the signal's path


def probe_row(spec: dict, probe: dict | None) -> dict:
    """What the doctor's probe said on a run whose side is known: an outside kind's (the pipeline where its stage is
    one of PIPELINE_STAGES, else the reward) or a clean run's (the reward: nothing planted in the pipeline). Its
    verdict: carries (the reward's side), slow or turned away (the pipeline's), None (no probe). Nothing for a
    catalogue defect (its side is not one) or a doctor that ran no probe."""
    if probe is None or (spec["defects"] and spec["defects"][0] not in OUTSIDE):
        return {}
    side = "pipeline" if spec["defects"] and OUTSIDE[spec["defects"][0]].stage in PIPELINE_STAGES else "reward"
    verdict = probe.get("verdict")
    said = {"carries": "reward", "lost": "pipeline", "slow": "pipeline", "turned away": "pipeline"}.get(verdict)
    return {"probe": {"side": side, "verdict": verdict, "said": said, "right": said == side, "stage": probe.get("stage"),
                      "rise": (probe.get("rise") or {}).get("mean"), "kl_moved": probe.get("kl_moved"),
                      "learning_rate": dict(spec.get("config", [])).get("learning_rate"), "seconds": probe.get("seconds")}}  # fmt: skip


VERDICTS = ("carries", "lost", "slow", "turned away", None)  # lost: the probe's path (slow, turned away: before it)


def probe_scores(rows: list[dict]) -> dict:
    """The probe's verdicts against each run's side: per side, the runs, each verdict's count and how many it put
    on their side; the held-out kinds apart."""

    def scores(kept: list[dict]) -> dict:
        out = {}
        for side in ("pipeline", "reward"):
            on = [r["probe"] for r in kept if r["probe"]["side"] == side]
            out[side] = {"runs": len(on), "right": sum(p["right"] for p in on),
                         **{str(v): sum(p["verdict"] == v for p in on) for v in VERDICTS}}  # fmt: skip
        return out

    probed = [r for r in rows if "probe" in r]
    seconds = [r["probe"]["seconds"] for r in probed if r["probe"]["seconds"] is not None]
    return {**scores(probed), "held_out_kinds": scores([r for r in probed if r.get("kind_held_out")]),
            "seconds": spread(seconds) if seconds else None}  # fmt: skip


def outside_scores(rows: list[dict]) -> dict:
    """The outside kinds' runs: right (the first loud finding's stage is the kind's), silent, the setting traced,
    and per kind."""
    rows = [r for r in rows if "outside" in r]
    kinds: dict[str, dict] = {}
    for r in rows:
        k = kinds.setdefault(r["outside"], {"runs": 0, "right": 0, "silent": 0, "first": {}})
        k["runs"] += 1
        k["right"] += r["right"]
        k["silent"] += r["silent"]
        k["first"][f"{r['first']}:{r['first_stage']}"] = k["first"].get(f"{r['first']}:{r['first_stage']}", 0) + 1
    unseen = [r for r in rows if r["kind_held_out"]]
    return {"runs": len(rows), "right_rate": rate(rows, "right"), "silent_rate": rate(rows, "silent"),
            "setting_traced_rate": rate(rows, "setting_traced"), "by_kind": kinds,
            "held_out_kinds": {"runs": len(unseen), "right_rate": rate(unseen, "right"),
                               "silent_rate": rate(unseen, "silent")}}  # fmt: skip


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def probe_lines(pr: dict) -> list[str]:
    """The probe's table (`probe_scores`): per side, each verdict's count, how many on their side, the held-out
    kinds' share; nothing where no run was probed."""
    if not (pr.get("pipeline", {}).get("runs") or pr.get("reward", {}).get("runs")):
        return []
    path = "lost" in pr["pipeline"]  # the probe's path decides (a report of a doctor before it: slow, turned away)
    middle = "lost at a stage after the rewards" if path else "slow | turned away"
    lines = ["", f"| the probe, on runs of a known side | runs | carries | {middle} | no probe | on their side "
             "| held-out kinds: on their side / runs |", "|---|---|---|---|---|---|---|" + "---|" * (not path)]  # fmt: skip
    for side, what in (("pipeline", "outside kinds of the pipeline's stages"),
                       ("reward", "outside kinds of the reward's stages, and clean runs")):  # fmt: skip
        p, h = pr[side], pr["held_out_kinds"][side]
        counts = f"{p['lost']}" if path else f"{p['slow']} | {p['turned away']}"
        lines.append(f"| {what} | {p['runs']} | {p['carries']} | {counts} | {p['None']} | "
                     f"{p['right']} | {h['right']} / {h['runs']} |")  # fmt: skip
    return lines


def markdown(scores: dict) -> str:
    """The scores as the README's tables: the rates, per defect, and the confusion table."""
    n = scores["scored"]
    s = scores["doctor_seconds"]
    lines = [
        f"### {scores['half']} half, doctor {scores['doctor']}",
        "",
        "| measure | value | runs |",
        "|---|---|---|",
        f"| top-1 rate, single defects | {percent(scores['top1_rate_single'])} | {n['single']} |",
        f"| both in top 2, double defects | {percent(scores['both_in_top2_rate_double'])} | {n['double']} |",
        f"| clean runs with nothing at warning or above | {percent(scores['quiet_rate_clean'])} | {n['clean']} |",
        f"| doctor seconds per run (median, max) | {s.get('median', 0):.1f}, {s.get('max', 0):.1f} | {s.get('n', 0)} |",
        f"| left out: planted defect not in the captured step | | {len(scores['planted_but_not_in_the_step'])} |",
        f"| scored on the rest: a defect only where vLLM samples, optional | | {len(scores['planted_optional'])} |",
        f"| left out: training or the doctor failed | | {len(scores['failed'])} |",
        f"| left out: not trained or not diagnosed yet | | {len(scores['missing'])} |",
        "",
        "| defect | expected ids | runs | first (singles) | in top 2 | named as |",
        "|---|---|---|---|---|---|",
    ]
    o = scores.get("outside", {})
    if o.get("runs"):
        lines[6:6] = [
            f"| outside kinds: first loud finding at the stage that lost the signal | {percent(o['right_rate'])} | "
            f"{o['runs']} |",
            f"| outside kinds: nothing at warning or above | {percent(o['silent_rate'])} | {o['runs']} |",
            f"| outside kinds: the setting traced | {percent(o['setting_traced_rate'])} | |",
            f"| held-out kinds only: right | {percent(o['held_out_kinds']['right_rate'])} | "
            f"{o['held_out_kinds']['runs']} |",
            f"| held-out kinds only: nothing at warning or above | {percent(o['held_out_kinds']['silent_rate'])} | "
            f"{o['held_out_kinds']['runs']} |",
        ]
        lines += [""]
    for d, e in sorted(scores["by_defect"].items()):
        named = ", ".join(f"{k} {v}" for k, v in e["named_as"].items())
        lines.append(f"| {d} | {', '.join(CATALOGUE[d].expects)} | {e['runs']} | {e['first_in_single']}/{e['singles']} "
                     f"| {e['in_top2']}/{e['runs']} | {named} |")  # fmt: skip
    columns = sorted({c for row in scores["confusion"].values() for c in row})
    if o.get("runs"):
        lines += [
            "",
            "| outside kind | stage | runs | right | silent | first loud finding:stage |",
            "|---|---|---|---|---|---|",
        ]
        for kind, k in sorted(o["by_kind"].items()):
            firsts = ", ".join(f"{f} {n}" for f, n in k["first"].items())
            lines.append(f"| {kind} | {OUTSIDE[kind].stage} | {k['runs']} | {k['right']} | {k['silent']} | {firsts} |")
    lines += probe_lines(scores.get("probe") or {})
    lines += ["", "| planted \\ first cause | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for planted, row in sorted(scores["confusion"].items()):
        lines.append(f"| {planted} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


# ---- the command line


def seeds_of(args) -> list[int]:
    """--seeds, or 0..--runs - 1; of --half's parity where it names a half."""
    seeds = args.seeds if args.seeds else range(args.runs)
    return [s for s in seeds if args.half in (None, "all") or studied(s) == (args.half == "tuning")]


def quick(args) -> dict:
    """Three tiny runs through every stage (clean, single, double), in a temporary folder unless --dir."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Corpus(Path(args.dir) if args.dir else Path(tmp), jobs=args.jobs, quick=True)
        runs = runs_of(list(QUICK_SEEDS), quick=True)
        trained_runs = train(corpus, runs)
        sub = diagnose(corpus, runs, horizon=0, half="all")
        scores = report(corpus, runs, sub, "all (quick)")
        return {"quick": True, "trained": trained_runs, **scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", nargs="?", choices=["train", "diagnose", "report"])
    parser.add_argument("--dir", default=None, help=f"the corpus's folder (default {DEFAULT_DIR})")
    parser.add_argument("--runs", type=int, default=120, help="seeds 0..RUNS-1 (default 120)")
    parser.add_argument("--seeds", type=int, nargs="*", help="these seeds only")
    parser.add_argument("--half", choices=["tuning", "held-out", "all"], default=None,
                        help="the studied runs (tuning: the catalogue's even seeds, the studied outside kinds' even seeds) or the "
             "rest (held-out); required by diagnose and report")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--horizon", type=int, default=None, help="the doctor's --horizon (default: its own)")
    parser.add_argument("--probe", type=int, default=0, help="the doctor's --probe K on every run (default 0: off)")
    parser.add_argument("--retry-failed", action="store_true", help="train: train failed runs again")
    parser.add_argument("--doctor", default=None,
                        help="report: this doctor-* folder (default: the half's latest diagnose)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="ignored: every child runs on one thread")
    add_quick(parser)
    args = parser.parse_args()
    if args.quick:
        scores = quick(args)
        print(json.dumps(scores, indent=1))
        print(markdown(scores))
        return
    if args.stage is None:
        parser.error("a stage (train, diagnose, report) or --quick")
    if args.stage in ("diagnose", "report") and args.half not in ("tuning", "held-out"):
        parser.error(f"{args.stage} needs --half tuning or --half held-out (the halves are scored apart)")
    corpus = Corpus(Path(args.dir) if args.dir else DEFAULT_DIR, jobs=args.jobs, probe=args.probe)
    runs = runs_of(seeds_of(args), quick=False)
    if args.stage == "train":
        results = train(corpus, runs, args.retry_failed)
        print(json.dumps({"trained": len(results), "failed": [r["name"] for r in results if r.get("failed")]}))
    elif args.stage == "diagnose":
        print(json.dumps({"doctor": diagnose(corpus, runs, args.horizon, args.half)}))
    else:
        latest = latest_file(corpus.root, args.half)
        if args.doctor is None and not latest.exists():
            parser.error(
                f"no doctor has diagnosed the {args.half} half under {corpus.root} yet (or name one: --doctor)"
            )
        scores = report(corpus, runs, args.doctor or latest.read_text().strip(), args.half)
        print(json.dumps(scores, indent=1))
        print(markdown(scores))


if __name__ == "__main__":
    main()
