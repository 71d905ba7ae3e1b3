"""Where the rows of a step go: which optimizer steps a generation batch feeds, which of its rows each micro-batch
holds (TRL shuffles them), which row each log-prob the loss took belongs to, and how the processes' shares of a
multi-process run line up in the gathered generation batch. Pure bookkeeping on tensors a capture callback kept:
nothing here touches the trainer."""

from __future__ import annotations

import torch


def steps_fed(first: int, done_in_step: int, S: int, mu: int, GA: int) -> tuple[list[int], set[int]]:
    """The optimizer steps a new generation batch's S x mu micro-batches train (the first is `first`, of which
    `done_in_step` micro-batches were already taken), and those of them that span two generation batches."""
    micro = [done_in_step + i for i in range(S * mu)]
    fed = sorted({first + m // GA for m in micro})
    spanning = set()
    if done_in_step:
        spanning.add(first)
    if (done_in_step + S * mu) % GA:
        spanning.add(fed[-1])
    return fed, spanning


def micro_batch_rows(generation: dict, inputs: dict, pass_: int) -> list[int]:
    """Which rows of the kept generation batch (its `local` share, this process's) the micro-batch `inputs` holds,
    in its order. Identical rows take the generation's copies in order, across the micro-batches of a pass: a copy
    taken by an earlier micro-batch is not taken again (`generation` keeps what each pass took, and its row index,
    built once per generation batch: a dict look-up per row)."""
    local = generation["local"]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1).detach().cpu()
    advantages = inputs["advantages"].detach().cpu()
    if "row_index" not in generation:
        rows = torch.cat([local["prompt_ids"], local["completion_ids"]], 1)
        generation["row_index"] = row_index(rows, local["advantages"])
    where, picked = generation["row_index"], []
    taken = generation.setdefault("taken", {}).setdefault(pass_, {})
    for key in row_keys(ids, advantages):
        n = taken.get(key, 0)
        if n >= len(where.get(key, ())):
            raise RuntimeError("CaptureCallback: a micro-batch row is not in the kept generation batch")
        taken[key] = n + 1
        picked.append(where[key][n])
    return picked


def row_keys(ids: torch.Tensor, advantages: torch.Tensor) -> list[bytes]:
    """Each row's token ids and advantage as bytes: equal keys, equal rows (both tensors on the CPU)."""
    ids, advantages = ids.contiguous().numpy(), advantages.float().contiguous().numpy()
    return [row.tobytes() + adv.tobytes() for row, adv in zip(ids, advantages)]


def row_index(rows: torch.Tensor, advantages: torch.Tensor) -> dict[bytes, list[int]]:
    """Where each distinct row of the generation batch is, in generation order."""
    where: dict[bytes, list[int]] = {}
    for j, key in enumerate(row_keys(rows, advantages)):
        where.setdefault(key, []).append(j)
    return where


def scored_in_generation_order(local: dict, scored: list[tuple]) -> torch.Tensor:
    """(N, C) the log-probs the loss took (`scored`: (input_ids, logps) of each of its forwards) matched to the
    rows of this process's share of the generation batch (`local`); NaN for a row not trained on."""
    rows = torch.cat([local["prompt_ids"], local["completion_ids"]], dim=1)
    out = torch.full(local["completion_ids"].shape, float("nan"))
    free = list(range(len(rows)))
    for ids, logps in scored:
        for row_ids, row_logps in zip(ids, logps):
            match = next((j for j in free if torch.equal(rows[j], row_ids)), None)
            if match is not None:  # identical rows (same prompt and completion) are interchangeable
                free.remove(match)
                out[match] = row_logps
    return out


def own_share(capture: dict, local: dict) -> dict:
    """This process's share of the step, as `rows_in_generation_order` takes it: its micro-batches (rows of its
    own generation batch), its losses, the random state of each of its training forwards and the widths of its
    own generation batch."""
    return {
        "micro_batches": capture["micro_batches"],
        "losses": capture["losses"],
        "rng": capture["rng"],
        "generation_rows": len(local["completion_ids"]),
        "prompt_width": int(local["prompt_ids"].shape[1]),
        "completion_width": int(local["completion_ids"].shape[1]),
    }


def rows_in_generation_order(shares: list[dict]) -> list[dict]:
    """Each process's share (process order) with its micro-batches' rows made rows of the gathered generation
    batch: process r's local row i is row i + the rows of processes 0..r-1 (the gather concatenates them in
    process order). Each share: micro_batches [{rows, index, pass}], losses [float], rng [M tensors], generation_rows
    (its generation batch's size), prompt_width, completion_width; out: the same with `forwards` (M) added."""
    out, offset = [], 0
    for share in shares:
        micro = [{**mb, "rows": [offset + r for r in mb["rows"]]} for mb in share["micro_batches"]]
        out.append({**share, "micro_batches": micro, "forwards": len(share["rng"])})
        offset += share["generation_rows"]
    return out


def random_states(rng: list[torch.Tensor], ranks: list[dict] | None) -> torch.Tensor | None:
    """batch.pt's `rng_states`: (M, S) uint8, the M training forwards' CPU random states, in one process;
    (P, M, S), process by process, in several (None where no forward was recorded, or where the processes
    recorded different numbers of forwards, which TRL's lock-step training does not do)."""
    if ranks is None:
        return torch.stack(rng) if rng else None
    counts = {len(rank["rng"]) for rank in ranks}
    if len(counts) != 1 or counts == {0}:
        return None
    return torch.stack([torch.stack(rank["rng"]) for rank in ranks])
