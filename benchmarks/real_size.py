"""Real sizes: a Qwen2-0.5B-shaped model captured and replayed on this CPU, full fine-tuning and LoRA.

    python benchmarks/real_size.py [--threads N] [--quick] [--keep DIR] [--device cuda] [--phases capture] [--runs lora]

The model: Qwen2-0.5B's published config (hidden 896, intermediate 4864, 24 layers, 14 heads, 2 key-value heads,
vocabulary 151936, 32768 positions, rope_theta 1e6, tied embeddings, rms_norm_eps 1e-6) with random weights,
float32, and the bundled model's 512-token tokenizer (`data/models/rookworld-tiny`); sampling is kept inside that
tokenizer (`generation_kwargs={"suppress_tokens": ids 512..151935}`, which lands in capture.json's config).
Each of the two runs is the user's plain `GRPOConfig` (TRL's defaults but for: 2 prompts x 2 generations, 8 new
tokens, two optimizer steps, beta 0.04 so that there is a reference) with `CaptureCallback(steps=[2])`, so that the capture holds the optimizer's state; the LoRA
run adds `peft_config=LoraConfig(r=16, target_modules=every attention and MLP projection)`.

Every phase runs in a fresh process of this script, so that its peak resident memory (VmHWM, imports
included) is its own: the TRL run with the capture, then the replay (`open_capture`: the checks, the base's hash,
loading; then `run(until="update")` and `reproduction`: the engine's step and TRL's step replayed).
Prints JSON: per run, the capture's size on disk (and its parts), the callback's own seconds (`callback.seconds`),
TRL's step_time, the replay's seconds, each phase's peak RSS (and above its imports: the replay's over the TRL run's,
the issue-48 target 1.1), the replay's memory as `capture.sizes` estimates it before opening, the replay's largest
|ours - TRL's logged|, `doctor --no-model`'s seconds (target: under 30), and the
parameter counts and the SHA-256 throughput the README's extrapolation reads.
`--quick`: a 2-layer, 64-wide model with the tokenizer's 512 tokens (run by `make test`; no number means anything).
`--device cuda`: the TRL run trains on the GPU (`use_cpu=False`, so TRL's bfloat16 autocast there) and reports its
peak GPU memory (`torch.cuda.max_memory_allocated`); the capture's size does not depend on the device.
`--device cuda` also replays each capture on the GPU (`open_capture(..., device="cuda")`), with its peak GPU memory
and the replay's differences from the trainer's GPU step, then runs the doctor there (every cause flipped).
`--phases capture`: the TRL runs and their captures only. `--runs lora` (or `full`): that run alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "data" / "models" / "rookworld-tiny"
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
QUICK = {**QWEN2_05B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
QUICK["vocab_size"] = 512  # the tokenizer's own: no token to suppress
SMALL = {**QWEN2_05B, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 4}
SHAPES = {"0.5b": QWEN2_05B, "50m": SMALL, "quick": QUICK}  # 50m: Qwen2's vocabulary, 45M parameters
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "P: 8/8/8/4k3/8/8/4K3/8 w - - 0 1"]


def reward(completions, **kwargs):
    """The user's reward: the share of letters in the completion."""
    return [sum(ch.isalpha() for ch in c) / max(len(c), 1) for c in completions]


def build_model(folder: Path, shape: str) -> int:
    """The Qwen2 shape with random weights and the bundled tokenizer saved to `folder`; its parameter count."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    ids = dict(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape], **ids, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def peak_rss_mb() -> float:
    """This process's peak resident memory: Linux's VmHWM (its own, from its exec on: ru_maxrss would carry the
    parent's peak across the fork), else ru_maxrss."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def capture_phase(model: Path, out: Path, lora: bool, device: str = "cpu") -> dict:
    """Two TRL optimizer steps of the user's run with `CaptureCallback(steps=[2])`, from `out`: step 2, so that the
    capture holds the optimizer's state (AdamW has none before its first step)."""
    import contextlib

    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoConfig
    from trl import GRPOConfig, GRPOTrainer

    from grpo_debug.capture import CaptureCallback

    imports = peak_rss_mb()
    vocab = AutoConfig.from_pretrained(model).vocab_size
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        report_to="none",
        use_cpu=device == "cpu",
        logging_steps=1,
        beta=0.04,
        generation_kwargs={"suppress_tokens": list(range(512, vocab))} if vocab > 512 else None,
    )
    peft = LoraConfig(r=16, target_modules=LORA_TARGETS) if lora else None
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    trainer = GRPOTrainer(model=str(model), reward_funcs=[reward], args=args, train_dataset=dataset, peft_config=peft)
    callback = CaptureCallback(out / "captures", steps=[2])
    trainer.add_callback(callback)
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs: stdout is the report's JSON
        trainer.train()
    logged = next(h for h in trainer.state.log_history if h.get("step") == 2 and "loss" in h)
    capture = out / "captures" / "step-2"
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "train_seconds": time.perf_counter() - start,
        "trl_step_time": logged["step_time"],
        "callback_seconds": callback.seconds,
        "capture_mb": folder_mb(capture),
        "capture_parts_mb": {
            p.name: folder_mb(p) if p.is_dir() else p.stat().st_size / 2**20 for p in capture.iterdir()
        },
        "policy_files": sorted(p.name for p in (capture / "policy").iterdir()),
        "weights_mb": sum(p.stat().st_size for p in (capture / "policy").glob("*.safetensors")) / 2**20,
        "optimizer_mb": (capture / "optimizer.safetensors").stat().st_size / 2**20,
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "peak_rss_mb": peak_rss_mb(),
        "imports_rss_mb": imports,
        "logged": {k: logged[k] for k in ("loss", "grad_norm", "kl", "entropy", "reward")},
    }


def replay_phase(capture: Path, device: str = "cpu", doctor: bool = False) -> dict:
    """The capture opened (checked, the base hashed, loaded) on `device`, its step run and TRL's step replayed; on
    a GPU (and in quick mode: `doctor`) then the doctor on that step, every cause flipped (one-step effects)."""
    # the TRL run's imports (trl's are lazy: GRPOTrainer itself loads most): what is above them is the replay's
    from datasets import Dataset  # noqa: F401
    from peft import LoraConfig  # noqa: F401
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401

    from grpo_debug.capture import open_capture
    from grpo_debug.capture.replay import reproduction
    from grpo_debug.capture.sizes import replay_estimate

    imports = peak_rss_mb()
    estimate = replay_estimate(capture)
    start = time.perf_counter()
    step = open_capture(capture, task=[reward], device=device)
    opened = time.perf_counter()
    run = step.run(until="update")
    out = reproduction(run, step.capture, step.policy, step)
    done = time.perf_counter()
    on_gpu = device.startswith("cuda")
    gpu = {"replay_peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20} if on_gpu else {}
    if doctor:
        from grpo_debug.doctor import diagnose

        began = time.perf_counter()
        report = diagnose(step, flip=True, held_out=0, horizon=0)
        gpu["doctor"] = {
            "seconds": time.perf_counter() - began,
            "findings": [f"{f.severity} {f.id}" for f in report.findings if f.severity != "absent"],
        }
        if on_gpu:
            gpu["doctor"]["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return {
        **gpu,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "no_model_doctor": no_model_seconds(capture),
        "open_seconds": opened - start,
        "replay_seconds": done - opened,
        "peak_rss_mb": peak_rss_mb(),
        "imports_rss_mb": imports,
        "estimate": estimate,
        "max_abs_difference": max(abs(v) for v in out["difference"].values()),
        "difference": out["difference"],
        "logps_max_abs_difference": out["logps"]["max_abs_difference"],
    }


def no_model_seconds(capture: Path) -> dict:
    """`python -m grpo_debug doctor CAPTURE --no-model` from a fresh process: its wall seconds and findings."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "doctor.json"
        start = time.perf_counter()
        command = [sys.executable, "-m", "grpo_debug", "doctor", str(capture), "--no-model", "--json", str(report)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"doctor --no-model failed:\n{done.stderr[-2000:]}")
        written = json.loads(report.read_text())
    return {"wall_seconds": wall, "checks": len(written["findings"]), "not_run": len(written["not_run"])}


def in_fresh_process(threads: int, *args: str) -> dict:
    """This script's `--phase ...` in a new process (its own peak memory); its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, __file__, "--threads", str(threads), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def hash_throughput(folder: Path) -> dict:
    """Seconds to hash the base's files as reading a LoRA capture does (`lora.base_digest`), and their size."""
    from grpo_debug.capture.lora import base_digest, base_files

    start = time.perf_counter()
    base_digest(folder)
    seconds = time.perf_counter() - start
    mb = sum((folder / n).stat().st_size for n in base_files(folder)) / 2**20
    return {"base_mb": mb, "hash_seconds": seconds, "mb_per_second": mb / seconds}


def measure(
    workdir: Path, threads: int, shape: str, device: str = "cpu", phases=("capture", "replay"), runs=("full", "lora")
) -> dict:
    model = workdir / f"qwen2-{shape}-shape"
    start = time.perf_counter()
    parameters = build_model(model, shape)
    report = {
        "quick": shape == "quick",
        "shape": shape,
        "threads": threads,
        "device": device,
        "parameters": parameters,
        "build_seconds": time.perf_counter() - start,
    }
    report["base_hash"] = hash_throughput(model)
    quick = ["--quick"] if shape == "quick" else []
    for name in runs:
        out = workdir / name
        captured = in_fresh_process(
            threads, "--phase", "capture", "--model", str(model), "--out", str(out), "--mode", name, "--device", device
        )
        report[name] = {"capture": captured}
        if "replay" in phases:
            capture = out / "captures" / "step-2"
            report[name]["replay"] = in_fresh_process(
                threads, "--phase", "replay", "--capture", str(capture), "--device", device, *quick
            )
    report["load_average_1min"] = os.getloadavg()[0]
    return report


QWEN2_7B = {"parameters": 7_615_616_512, "lora_parameters": 40_370_176}  # meta-device counts, LoRA as LORA_TARGETS


def table(report: dict) -> str:
    """The README's markdown table of a report, and the 7B extrapolation with its arithmetic."""
    rows = ["| | full fine-tuning | LoRA r=16 |", "|---|---|---|"]

    def row(label: str, get) -> None:
        rows.append(f"| {label} | {get(report['full'])} | {get(report['lora'])} |")

    row("trainable parameters", lambda r: f"{r['capture']['trainable_parameters']:,}")
    row("capture on disk (MB)", lambda r: f"{r['capture']['capture_mb']:.1f}")
    row("of which weights in policy/ (MB)", lambda r: f"{r['capture']['weights_mb']:.1f}")
    row("of which the optimizer's state (MB)", lambda r: f"{r['capture']['optimizer_mb']:.1f}")
    row("capture.json (MB)", lambda r: f"{r['capture']['capture_parts_mb']['capture.json']:.2f}")
    row("callback's own time, whole run (s)", lambda r: f"{r['capture']['callback_seconds']:.1f}")
    row("TRL's step_time of the step (s)", lambda r: f"{r['capture']['trl_step_time']:.1f}")
    row("peak RSS, TRL run with the capture (GB)", lambda r: f"{r['capture']['peak_rss_mb'] / 1024:.1f}")
    if report.get("device", "cpu") != "cpu":
        row("peak GPU memory, TRL run with the capture (GB)", lambda r: f"{r['capture']['peak_gpu_mb'] / 1024:.1f}")
    if "replay" not in report["full"]:
        return "\n".join(rows) + "\n\n" + extrapolation(report)
    row("open_capture: checks, hash, load (s)", lambda r: f"{r['replay']['open_seconds']:.1f}")
    row("replay: run(until='update') + TRL's step (s)", lambda r: f"{r['replay']['replay_seconds']:.1f}")
    row("peak RSS, replay (GB)", lambda r: f"{r['replay']['peak_rss_mb'] / 1024:.1f}")
    row("peak RSS above the imports: replay / TRL run (target <= 1.1)", lambda r: f"{memory_ratio(r):.2f}")
    row(
        "replay's peak above the imports: estimated before opening / measured (GB)",
        lambda r: (
            f"{r['replay']['estimate']['replay_peak_mb'] / 1024:.2f} / "
            f"{(r['replay']['peak_rss_mb'] - r['replay']['imports_rss_mb']) / 1024:.2f}"
        ),
    )
    row("largest abs(ours - TRL's) over the compared metrics", lambda r: f"{r['replay']['max_abs_difference']:.2g}")
    row(
        "doctor --no-model, whole command (s; target < 30)",
        lambda r: f"{r['replay']['no_model_doctor']['wall_seconds']:.1f}",
    )
    return "\n".join(rows) + "\n\n" + extrapolation(report)


def memory_ratio(run: dict) -> float:
    """The replay's peak RSS above its imports over the TRL run's (with the capture) above its own."""
    replay, capture = run["replay"], run["capture"]
    return (replay["peak_rss_mb"] - replay["imports_rss_mb"]) / (capture["peak_rss_mb"] - capture["imports_rss_mb"])


def extrapolation(report: dict) -> str:
    """A 7B run's disk and memory from the measured ratios (float32, as measured)."""
    base_gb = report["parameters"] * 4 / 2**30
    big_gb = QWEN2_7B["parameters"] * 4 / 2**30
    full, lora = report["full"], report["lora"]
    full_ratio = full["capture"]["capture_mb"] / 1024 / base_gb
    adapter_mb = lora["capture"]["weights_mb"] + lora["capture"].get("optimizer_mb", 0.0)  # + Adam's moments
    per_adapter = adapter_mb * 2**20 / lora["capture"]["trainable_parameters"]
    lora_rest = lora["capture"]["capture_mb"] - adapter_mb
    lora_mb = QWEN2_7B["lora_parameters"] * per_adapter / 2**20 + lora_rest
    hash_s = big_gb * 1024 / report["base_hash"]["mb_per_second"]
    disk = (
        f"7B (Qwen2-7B: {QWEN2_7B['parameters']:,} parameters, {big_gb:.1f} GB in float32; LoRA r=16 on the same "
        f"projections: {QWEN2_7B['lora_parameters']:,}):\n"
        f"- full capture: {full_ratio:.3f} x the float32 weights here -> {full_ratio:.3f} x {big_gb:.1f} = "
        f"{full_ratio * big_gb:.1f} GB per captured step;\n"
        f"- LoRA capture: {per_adapter:.2f} bytes per adapter parameter here (its weight and Adam's state) -> {QWEN2_7B['lora_parameters']:,} x "
        f"{per_adapter:.2f} B + the rest of the capture ({lora_rest:.1f} MB here) = {lora_mb:.0f} MB per step, "
        f"plus hashing the base once per run and once per read: {big_gb * 1024:.0f} MB / "
        f"{report['base_hash']['mb_per_second']:.0f} MB/s = {hash_s:.0f} s"
    )
    if "replay" not in full:
        return disk + "."
    m_full, m_lora = ((r["replay"]["peak_rss_mb"] - r["replay"].get("imports_rss_mb", 0)) / 1024 / base_gb
                      for r in (full, lora))  # fmt: skip
    return disk + (
        ";\n"
        f"- replay memory: peak RSS above the imports was {m_full:.1f} x the float32 weights (full) and {m_lora:.1f} "
        "x (LoRA) -> "
        f"{m_full:.1f} x {big_gb:.1f} = {m_full * big_gb:.0f} GB and {m_lora:.1f} x {big_gb:.1f} = "
        f"{m_lora * big_gb:.0f} GB (this batch of 4 x 8 tokens: activations add little here, more at real lengths)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="a 2-layer, 64-wide model: checks the script runs")
    parser.add_argument("--shape", choices=list(SHAPES), default="0.5b", help="Qwen2-0.5B's (default), or 45M's")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--table", type=Path, help="print the README's table of a report this script printed")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the TRL runs train")
    parser.add_argument(
        "--phases", default="capture,replay", help="capture,replay (default) or capture: the TRL runs alone"
    )
    parser.add_argument(
        "--runs", default="full,lora", help="full,lora (default), or one of them: the full or the LoRA run alone"
    )
    parser.add_argument("--phase", choices=["capture", "replay"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--capture", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    phases, runs = tuple(args.phases.split(",")), tuple(args.runs.split(","))
    if not runs or set(runs) - {"full", "lora"}:
        parser.error(f"--runs {args.runs!r}: full, lora, or full,lora")
    shape = "quick" if args.quick else args.shape
    if not phases or set(phases) - {"capture", "replay"} or "capture" not in phases:
        parser.error(f"--phases {args.phases!r}: capture, or capture,replay")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here")
    if args.table:
        print(table(json.loads(args.table.read_text())))
    elif args.phase == "capture":
        print(json.dumps(capture_phase(args.model, args.out, args.mode == "lora", args.device)))
    elif args.phase == "replay":
        print(json.dumps(replay_phase(args.capture, args.device, doctor=args.quick or args.device == "cuda")))
    elif args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        print(json.dumps(measure(args.keep, args.threads, shape, args.device, phases, runs), indent=1))
    else:
        workdir = Path(tempfile.mkdtemp(prefix="real_size-"))
        try:
            print(json.dumps(measure(workdir, args.threads, shape, args.device, phases, runs), indent=1))
        finally:
            shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
