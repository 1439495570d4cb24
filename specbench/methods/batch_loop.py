"""The one decode loop of every batchable method (ar, pld, sd and the tree methods): `generate_batch` decodes many
prompts with B samples side by side on a batch engine (core/batch/engine.py), and batch 1 is the same loop with one
slot on the single-sequence engine (`Batchable.generate`). PEARL alone keeps a batch-1 loop of its own
(methods/pearl/method.py): its drafter and target run concurrently, a schedule no batch step models.

Slots: B samples decode side by side. A sample that finishes (stop token or cap) leaves the batch; with `refill` its
slot takes the next waiting prompt at once (continuous batching, which EMS-SD §4.4 names as the remedy for uneven
samples), else the next B prompts start when the whole batch is done.

Each step, per active sample: 1. draft (the method's propose); 2. verify: the last emitted token plus the drafts,
every sample in one target forward (the engine packs, pads or, at batch 1, appends them); 3. accept, per sample,
with the same rule and the same random stream whatever the batch (so each sample keeps its distribution, and greedy
tokens equal batch-1 ar's); 4. roll back each sample's rejected drafts. The target's cache holds a sample's tokens
but the last. Tree methods (methods/tree/method.py) supply their own step over the same engines.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from ..core.batch.engine import MODES, engine  # noqa: F401  (MODES: the run's batching modes)
from ..core.batch.ragged import Segment
from ..core.machine.timing import now, since
from ..core.verify import Sampling, accept, next_token
from .base import Generation
from .timeline import Span, timeline_entry

SINGLE = "single"  # batch 1's engine (core/batch/single.py)
# Generation fields that only mean something beside other samples; batch 1 leaves them at their defaults
BATCH_ONLY = ("target_tokens", "padding_tokens", "kv_padding", "latency_s", "prefill_s", "prefill_tokens")


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
    state: object = None  # a tree method's state between steps: its proposer's dataclass (methods/tree/proposer.py)

    def room(self, max_new_tokens: int) -> int:
        """Drafts that fit before the cap (the verify forward always yields one more token)."""
        return max_new_tokens - len(self.gen.tokens) - 1


class Batchable:
    """Mixin of methods that decode batches. The default step is the chain of draft-model and draft-free methods:
    propose() fills each sample's draft (and q), the step verifies, accepts and rolls back. Tree methods (tree/method.py)
    override decode_step."""

    batchable = True
    timeline_mode: str | None = None  # records per-step draft / verify spans under this mode (report/timeline.py)
    draft_on_join = False  # drafts from the prompt alone: a newcomer's prefill verifies its first drafts

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, sampling: Sampling,
                 generator: torch.Generator | None) -> Generation:
        """input_ids: [1, T] prompt. Batch 1: the batch loop with one slot on the single-sequence engine."""
        gens, _ = generate_batch(self, [input_ids], 1, SINGLE, False, max_new_tokens, sampling, [generator])
        gen = gens[0]
        for name in BATCH_ONLY:
            setattr(gen, name, Generation.__dataclass_fields__[name].default)
        return gen

    def choose_per_batch_size(self, sizes: list[int]) -> None:
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
        """One step: newcomers' prefill and every active sample's verification in one target forward (two when
        padded); returns the samples that finished."""
        stop_ids, device = self.target.tokenizer.stop_ids, self.target.device
        timed = bool(self.timeline_mode)
        # 1. draft: every active sample, and newcomers where the method drafts from the prompt alone (sd: their
        # prefill then verifies the first drafts, as a plain sd loop does)
        for s in joining:
            s.draft, s.q = [], None
        drafting = joining + active if self.draft_on_join else active
        timed_drafts = timed or "drafter" in self.needs  # a drafter model's time is the method's drafting cost
        t0 = now(device) if timed_drafts else 0.0
        if drafting:
            self.propose(drafting, max_new_tokens, sampling)
        d1 = now(device) if timed_drafts else 0.0
        if "drafter" in self.needs:
            share_drafting([s for s in drafting if s.draft], d1 - t0)
        # 2. verify: newcomers' prompts (+ drafts) and every active sample's last token + drafts, in one batched
        # forward (the target's cache holds a newcomer's nothing, an active sample's history but the last token)
        first, logits = target.forward([Segment(s.slot, s.history + s.draft, keep=len(s.draft) + 1) for s in joining],
                                       [Segment(s.slot, [s.history[-1]] + s.draft) for s in active])
        t1 = now(device) if timed else 0.0
        finished: list[Sample] = []
        newcomers = {id(s) for s in joining}
        for s, lg in zip(joining + active, first + logits):
            joined = id(s) in newcomers
            if joined:
                s.scratch["origin"] = t0  # the timeline's zero
            # 3. accept: one rule whatever the batch, on this sample's own random stream (a newcomer without
            # drafts: its first token)
            if self.acceptance_rule is not None and s.draft:  # --synthetic-acceptance: a stated draw
                n, tok = self.acceptance_rule.chain(torch.tensor(s.draft, dtype=torch.long, device=lg.device), lg,
                                                    sampling, s.q, s.generator, gen=s.gen)
            elif s.draft or not joined:
                n, tok = accept(torch.tensor(s.draft, dtype=torch.long, device=lg.device), lg, sampling, s.q,
                                s.generator)
            else:
                n, tok = 0, next_token(lg[-1], sampling, s.generator)
            if s.draft:
                s.gen.count_draft(len(s.draft), n)
            new = s.draft[:n] + [tok]
            # 4. update: keep the accepted drafts in the target's cache (its length: the history so far plus
            # them, the new last token not fed yet)
            if s.draft:
                target.truncate(s.slot, len(s.history) + n)
            s.history += new
            done = s.gen.emit(new, stop_ids, max_new_tokens)
            if timed and (s.draft or not joined):  # the step's spans, shared by the batch's samples
                s.gen.timeline.append(timeline_entry(self.timeline_mode, s.scratch["origin"], t0, now(device),
                                                    Span(t0, d1), Span(d1, t1), len(s.draft), n,
                                                    s.gen.accepted_lengths[-1], True))
            elif timed:  # a prefill without drafts
                s.gen.timeline.append(timeline_entry(self.timeline_mode, t0, t0, now(device), None, Span(d1, t1),
                                                    0, 0, s.gen.accepted_lengths[-1], True))
            if done:
                finished.append(s)
        return finished


def share_drafting(samples: list[Sample], seconds: float) -> None:
    """A batched drafting's time, an equal share to each sample that drafted in it (the rows' draft_s sum to the
    batch's drafting time, as their wall_s sum to the batch's time)."""
    for s in samples:
        s.gen.draft_s += seconds / len(samples)


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
