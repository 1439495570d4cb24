"""The runner's batch > 1 jobs (EMS-SD): which prompts go into which batch, timing a batch, and its per-sample rows.

A job is one group of prompts of one dataset at one batch size B: the next B prompts (or, with --refill, the next
REFILL_GROUP x B prompts streaming through B slots). Every label of the job (`ar` in one mode, each other method
in each mode) decodes the whole group as batches, in an order rotated per group like batch 1's methods; a
multi-turn dataset decodes turn 1 of the group's prompts as one batch, then turn 2 with each prompt's own earlier
answer. A label's rows are written as soon as its batch ends (a batch's time is known only then): Ctrl-C keeps every
finished batch and --resume decodes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import contention
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..methods.batch_loop import MODES, generate_batch

REFILL_GROUP = 4  # with --refill, a job streams REFILL_GROUP x B prompts through B slots


def modes_for(batching: str) -> tuple[str, ...]:
    """--batching unpadded | padded | both -> the modes to run at B > 1."""
    if batching == "both":
        return MODES
    if batching in MODES:
        return (batching,)
    raise SpecbenchError(f"--batching {batching!r}: choose unpadded, padded or both")


def ar_mode(modes: tuple[str, ...]) -> str:
    """The mode of batched ar, every speedup's baseline at that B: unpadded (no prompt padding: the strongest ar)
    whenever unpadded runs, else padded."""
    return "unpadded" if "unpadded" in modes else "padded"


@dataclass
class BatchJob:
    dataset: str
    batch_size: int
    group: int
    prompts: list[tuple[int, ds.Prompt]]  # (index in the dataset, prompt)
    labels: list[tuple[str, str]]  # (method, mode), in this job's order


def plan(datasets: list[tuple[str, list[ds.Prompt]]], batch_sizes: list[int], labels: list[tuple[str, str]],
         refill: bool) -> list[BatchJob]:
    """Jobs for every batch size > 1, smallest first; each job's label order rotated by its group number."""
    jobs = []
    for size in sorted(b for b in batch_sizes if b > 1):
        step = size * REFILL_GROUP if refill else size
        for dataset, prompts in datasets:
            indexed = list(enumerate(prompts))
            for g, start in enumerate(range(0, len(indexed), step)):
                k = g % len(labels)
                jobs.append(BatchJob(dataset, size, g, indexed[start:start + step], labels[k:] + labels[:k]))
    return jobs


@dataclass
class BatchTurn:
    """One prompt turn decoded in a batch, before it is checked and written."""

    index: int
    prompt: ds.Prompt
    turn: int
    ids: torch.Tensor  # [1, T]
    gen: object  # methods.base.Generation
    batch_id: str
    batch_wall_s: float
    share_s: float  # the batch's wall time x this sample's share of its new tokens
    forward_ms: float  # the batch's wall time per batched target step
    mem: float
    noise: dict


def run_label(runner, job: BatchJob, method_name: str, mode: str, refill: bool) -> list[BatchTurn]:
    """Decode every prompt turn of the job with one label; returns its rows (turn by turn, batch by batch)."""
    method = runner.methods[method_name]
    cfg = runner.cfg
    answers: dict[str, list[str]] = {p.id: [] for _, p in job.prompts}
    live = dict(job.prompts)  # index -> prompt still going (a skipped turn ends its prompt)
    rows: list[BatchTurn] = []
    for turn in range(max(len(p.turns) for _, p in job.prompts)):
        batch = []
        for index, prompt in list(live.items()):
            if turn >= len(prompt.turns):
                continue
            ids = runner.prompt_ids(ds.conversation(prompt, turn, answers[prompt.id]), prompt)
            if ids is None:
                del live[index]
                continue
            batch.append((index, prompt, ids))
        if not batch:
            break
        def once():
            generators = [torch.Generator(device=runner.target.device).manual_seed(runner.seed(index, turn))
                          for index, _, _ in batch]
            return generate_batch(method, [ids for _, _, ids in batch], job.batch_size, mode, refill,
                                  cfg.max_new_tokens, cfg.sampling, generators)

        before = contention.snapshot()
        (gens, steps), seconds, mem = runner.timed(once)
        load = contention.between(before, contention.snapshot())
        total = max(sum(len(g.tokens) for g in gens), 1)
        batch_id = f"{job.batch_size}-{job.group}-{turn}"
        for (index, prompt, ids), gen in zip(batch, gens):
            rows.append(BatchTurn(index, prompt, turn, ids, gen, batch_id, seconds, seconds * len(gen.tokens) / total,
                                  seconds * 1e3 / max(steps, 1), mem, load))
            answers[prompt.id].append(runner.target.tokenizer.decode(gen.tokens))
    return rows
