"""Batch > 1 (EMS-SD): many prompts decoded at once, padded (the vanilla way) or unpadded (EMS-SD), by one loop that
every batchable method shares; a method supplies only its drafts (`Batchable.propose`).

Slots: B samples decode side by side. A sample that finishes (stop token or cap) leaves the batch; with `refill` its
slot takes the next waiting prompt at once (continuous batching, which EMS-SD §4.4 names as the remedy for uneven
samples), else the next B prompts start when the whole batch is done.

Each step, per active sample: 1. draft (the method's propose); 2. verify: the last emitted token plus the drafts,
every sample in one target forward (core/batch/ragged.py packs them, core/batch/padded.py pads them); 3. accept, per sample, with
the same rule and the same random stream as batch 1 (so each sample keeps its distribution, and greedy tokens equal
batch-1 ar's); 4. roll back each sample's rejected drafts. The target's cache holds a sample's tokens but the last.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from ..core.batch.padded import PaddedBatch
from ..core.batch.ragged import RaggedBatch, Segment
from ..core.verify import Sampling, accept, next_token
from ..core.machine.timing import now, since
from ..errors import SpecbenchError
from .base import Generation

MODES = ("unpadded", "padded")


def engine(model, mode: str, slots: int, device: torch.device):
    """The batch engine of a mode: RaggedBatch (EMS-SD's unpad KV cache + unpad input tokens) or PaddedBatch."""
    if mode == "unpadded":
        return RaggedBatch(model, slots)
    if mode == "padded":
        return PaddedBatch(model, device)
    raise SpecbenchError(f"--batching {mode!r}: choose unpadded, padded or both")


@dataclass
class Sample:
    """One prompt's state while it is in the batch."""

    index: int  # which prompt
    slot: int
    history: list[int]  # prompt + emitted tokens (the target's cache holds all but the last)
    generator: torch.Generator | None
    gen: Generation = field(default_factory=Generation)
    joined_s: float = 0.0
    draft: list[int] = field(default_factory=list)  # this step's drafts
    q: torch.Tensor | None = None  # their draft probabilities [k, V] (None: greedy or one-hot)
    scratch: dict = field(default_factory=dict)  # per-method state (sd: the tokens its drafter cache holds)

    def room(self, max_new_tokens: int) -> int:
        """Drafts that fit before the cap (the verify forward always yields one more token)."""
        return max_new_tokens - len(self.gen.tokens) - 1


class Batchable:
    """Mixin of methods that decode batches. The default step is the chain of draft-model and draft-free methods:
    propose() fills each sample's draft (and q), the step verifies, accepts and rolls back. Tree methods (tree/engine.py)
    override decode_step."""

    batchable = True

    def plan_batches(self, sizes: list[int]) -> None:
        """Choose per batch size what the method would otherwise choose once (sd: gamma, tree methods: the tree),
        from this hardware's L(B, w); called once by the runner with the run's batch sizes."""

    def start_batch(self, mode: str, slots: int) -> None:
        """Make per-batch state (sd: its drafter's batch engine; the batch size's own gamma or tree)."""

    def propose(self, samples: list[Sample], max_new_tokens: int, sampling: Sampling) -> None:
        for s in samples:
            s.draft, s.q = [], None

    def leave(self, sample: Sample) -> None:
        """A sample left the batch (sd: its drafter row goes too)."""

    def decode_step(self, target, joining: list[Sample], active: list[Sample], max_new_tokens: int,
                    sampling: Sampling) -> list[Sample]:
        """One batched step: newcomers' prefill and every active sample's verification in one target forward (two
        when padded); returns the samples that finished."""
        stop_ids = self.target.tokenizer.stop_ids
        # 1. draft
        self.propose(active, max_new_tokens, sampling)
        # 2. verify: newcomers' prompts and every active sample's last token + drafts, in one batched forward
        segments = [Segment(s.slot, [s.history[-1]] + s.draft) for s in active]
        first, logits = target.forward([Segment(s.slot, s.history, keep=1) for s in joining], segments)
        finished: list[Sample] = []
        for s, lg in zip(joining, first):  # prefill: the first token
            tok = next_token(lg[-1], sampling, s.generator)
            s.history.append(tok)
            if s.gen.emit([tok], stop_ids, max_new_tokens):
                finished.append(s)
        for s, lg in zip(active, logits):
            # 3. accept: the batch-1 rule, on this sample's own random stream
            n, tok = accept(torch.tensor(s.draft, dtype=torch.long, device=lg.device), lg, sampling, s.q,
                            s.generator)
            if s.draft:
                s.gen.count_draft(len(s.draft), n)
            new = s.draft[:n] + [tok]
            # 4. update: keep the accepted drafts in the target's cache (its length: the history so far, minus
            # the new last token)
            target.truncate(s.slot, len(s.history) + n)
            s.history += new
            if s.gen.emit(new, stop_ids, max_new_tokens):
                finished.append(s)
        return finished


@torch.inference_mode()
def generate_batch(method, prompts: list[torch.Tensor], slots: int, mode: str, refill: bool, max_new_tokens: int,
                   sampling: Sampling, generators: list[torch.Generator | None]) -> tuple[list[Generation], int]:
    """Decode every prompt ([1, T] each) with `slots` samples side by side; returns one Generation per prompt (with
    its share of the target's tokens: target_tokens, padding_tokens, kv_padding; and its latency) and the number of
    batched steps (each one target forward over the batch; padded batching adds a prefill forward for newcomers)."""
    target = engine(method.target.model, mode, slots, method.target.device)
    method.start_batch(mode, slots)
    waiting = deque(range(len(prompts)))
    free = list(range(slots))
    active: list[Sample] = []
    done: dict[int, Generation] = {}
    origin = now()
    steps = 0
    while waiting or active:
        steps += 1
        joining: list[Sample] = []
        if refill or not active:
            while free and waiting:
                i = waiting.popleft()
                joining.append(Sample(i, free.pop(0), prompts[i][0].tolist(), generators[i],
                                      joined_s=since(origin)))
        start = now(method.target.device) if not active else None  # no sample decoding yet: a prefill-only step
        finished = method.decode_step(target, joining, active, max_new_tokens, sampling)
        if start is not None and joining:
            share = since(start, method.target.device) / len(joining)
            for s in joining:
                s.gen.prefill_s, s.gen.prefill_tokens = s.gen.prefill_s + share, len(s.gen.tokens)
        active += joining
        for s in finished:
            s.gen.target_tokens = target.target_tokens[s.slot]
            s.gen.padding_tokens = target.padding_tokens[s.slot]
            s.gen.kv_padding = target.kv_padding(s.slot)
            s.gen.latency_s = since(origin) - s.joined_s
            target.release(s.slot)
            method.leave(s)
            active.remove(s)
            free.append(s.slot)
            done[s.index] = s.gen
    return [done[i] for i in range(len(prompts))], steps
