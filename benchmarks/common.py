"""What the benchmark scripts share: a peak-memory sampler, the 124M GPT-2 shape with random weights, and
the quick mode (`--quick`: tiny sizes, one repeat) in which `make test` runs every script to the end, so
that none of them can rot between two real measurements."""

from __future__ import annotations

import argparse
import copy
import threading
import time

import psutil
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from grpo_debug.model import LoadedModel


class PeakRSS:
    """Highest resident memory seen by a 5 ms sampler while the block runs, minus the memory at its start."""

    def __enter__(self):
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def mb(self) -> float:
        return (self.peak - self.start) / 2**20


# a step small enough to run every code path of a benchmark in seconds; its numbers mean nothing
QUICK_SET = {"num_prompts": 2, "num_generations": 2, "max_new_tokens": 8}


def add_quick(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and one repeat: checks the script runs, measures nothing"
    )


def add_repeats(parser: argparse.ArgumentParser, help: str = "fresh runs (median)") -> None:
    """`--threads`, `--repeats` and `--quick`, which `sizes_and_repeats` reads back."""
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3, help=help)
    add_quick(parser)


def sizes_and_repeats(args: argparse.Namespace) -> tuple[dict, int]:
    """(StepConfig sizes, repeats): QUICK_SET and one run under `--quick`, else the defaults and `--repeats`."""
    return (QUICK_SET, 1) if args.quick else ({}, args.repeats)


def gpt2_124m_shape(tokenizer, quick: bool = False) -> LoadedModel:
    """RookWorld-LM-124M's architecture with random weights (`quick`: 1 layer of 64, the same code path)."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_positions=1024,
        n_embd=64 if quick else 768,
        n_layer=1 if quick else 12,
        n_head=2 if quick else 12,
        vocab_size=50257,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    policy = GPT2LMHeadModel(config).eval()
    # keep sampling inside the bundled tokenizer's vocabulary, so completions can be decoded and scored
    policy.generation_config.suppress_tokens = list(range(len(tokenizer), config.vocab_size))
    reference = copy.deepcopy(policy).requires_grad_(False)
    return LoadedModel(policy, reference, tokenizer, "gpt2-124m-shape (random weights)")
