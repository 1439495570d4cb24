"""The runner's batch > 1 schedule (EMS-SD): which prompts go into which batch, timing a batch, and its per-sample rows.

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

from ..core.machine import contention
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..methods.batch_loop import MODES, generate_batch
from . import compiled as compile_run
from .work import BatchJob, BatchLabel, IndexedPrompt, LoadedDataset

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


def batch_labels(methods: tuple[str, ...], modes: tuple[str, ...]) -> list[BatchLabel]:
    """Every label of a batch job: ar once (in ar_mode, the baseline), each other method in each mode."""
    return [BatchLabel("ar", ar_mode(modes))] + [BatchLabel(m, mode) for m in methods if m != "ar" for mode in modes]


def jobs(datasets: list[LoadedDataset], batch_sizes: list[int], labels: list[BatchLabel],
         refill: bool) -> list[BatchJob]:
    """Jobs for every batch size > 1, smallest first; each job's label order rotated by its group number."""
    out = []
    for size in sorted(b for b in batch_sizes if b > 1):
        group = size * REFILL_GROUP if refill else size
        for dataset in datasets:
            indexed = [IndexedPrompt(i, p) for i, p in enumerate(dataset.prompts)]
            for g, start in enumerate(range(0, len(indexed), group)):
                k = g % len(labels)
                out.append(BatchJob(dataset.name, size, g, indexed[start:start + group], labels[k:] + labels[:k]))
    return out


@dataclass(frozen=True)
class TurnInput:
    """One prompt turn going into a batch: the prompt's index in its dataset and its rendered ids."""

    index: int
    prompt: ds.Prompt
    ids: torch.Tensor  # [1, T]


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
    prefill_share_s: float  # the batch's prefill-only time x this sample's share of its new tokens (as share_s)
    mem: float
    noise: dict


def run_label(runner, job: BatchJob, method_name: str, mode: str, refill: bool) -> list[BatchTurn]:
    """Decode every prompt turn of the job with one label; returns its rows (turn by turn, batch by batch)."""
    backend = runner.backend  # own_methods.OwnMethods: the one backend that decodes batches
    method = backend.methods[method_name]
    cfg = runner.cfg
    answers: dict[str, list[str]] = {p.prompt.id: [] for p in job.prompts}
    live = {p.index: p.prompt for p in job.prompts}  # index -> prompt still going (a skipped turn ends its prompt)
    rows: list[BatchTurn] = []
    for turn in range(max(len(p.prompt.turns) for p in job.prompts)):
        batch = []
        for index, prompt in list(live.items()):
            if turn >= len(prompt.turns):
                continue
            ids = runner.prompt_ids(ds.conversation(prompt, turn, answers[prompt.id]), prompt)
            if ids is None:
                del live[index]
                continue
            batch.append(TurnInput(index, prompt, ids))
        if not batch:
            break

        def once():
            generators = [torch.Generator(device=backend.target.device).manual_seed(runner.seed(entry.index, turn))
                          for entry in batch]
            states = compile_run.states_of(backend.target, backend.drafter)  # --compile: count compiled / eager
            before = compile_run.snapshot(states)
            gens, steps = generate_batch(method, [entry.ids for entry in batch], job.batch_size, mode, refill,
                                         cfg.max_new_tokens, cfg.sampling, generators)
            if states:
                compile_run.batch_forwards(states, before, gens, method)
            return gens, steps

        before = contention.snapshot()
        (gens, steps), seconds, mem = backend.timed(once)
        load = contention.between(before, contention.snapshot())
        total = max(sum(len(g.tokens) for g in gens), 1)
        # the prefill-only steps' time (of the last repeat; the median's run when --repeats is 1), capped by the
        # batch's median time so that a row's decoding time is never negative
        prefill = min(sum(g.prefill_s for g in gens), seconds)
        batch_id = f"{job.batch_size}-{job.group}-{turn}"
        for entry, gen in zip(batch, gens):
            share = len(gen.tokens) / total
            rows.append(BatchTurn(entry.index, entry.prompt, turn, entry.ids, gen, batch_id, seconds,
                                  seconds * share, seconds * 1e3 / max(steps, 1), prefill * share, mem, load))
            answers[entry.prompt.id].append(backend.decode(gen.tokens))
    return rows
