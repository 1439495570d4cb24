"""Batch > 1's engine under `--compile`: the batch engine protocol (engine.py) for `slots` samples side by side over
one static cache [slots, kv_heads, capacity, head_dim] per layer, every decode forward at one static shape [slots,
bucket] through the compile state's step (core/model/compile.py; core/batch/static.py's step and masks).

As gpt-fast batches: every slot's row is in every decode forward, each sample's new tokens padded to the bucket
that holds the widest of them (the chain buckets, or the tree's exact width), each row written at its own slot's
length (write_at [slots, bucket]) and masked to its own entries (causal from its write rows, or its tree's
visibility), so one compiled graph serves a batch whatever its samples' lengths. A slot with no sample this step
(not joined yet, or finished) runs a dummy row into its stale entries. Padding rows sit after a sample's real
rows, write beyond its new length and are never seen. This is the padded batch's cost (EMS-SD's padding) paid for
one graph a step; the unpadded / padded comparison of `--batching` is an eager one.

A newcomer's prompt runs eagerly, uncompiled, into its own slot (the static step over that slot's view), the LM
head on the rows it keeps only, as batch 1's prefill does. A forward with a hook around it (`around`) that offers what
it does as data runs compiled with it inside the graph (core/model/compile_graph.py: Hidden Transfer's transfer steps
as layer edits, EAGLE-3's layer states as layer taps); one that offers neither runs the same padded step eagerly,
counted as an eager step.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..machine.forward_clock import clock_of
from ..model.placement import input_device
from .ragged import Segment, packed_embeddings
from .static import TAPS, head_logits, layer_edits, layer_taps, split_taps, visibility


class StaticBatch:
    """`slots` samples over a compile state's static batch cache (core/model/compile.Compiled.batch_cache)."""

    def __init__(self, model, state, slots: int):
        self.model, self.state, self.slots = model, state, slots
        self.kv = state.batch_cache(slots)
        self.device = input_device(model)
        self.rows: list[int] = []
        self.target_tokens: dict[int, int] = {}
        self.padding_tokens: dict[int, int] = {}

    @property
    def lengths(self) -> dict[int, int]:
        return {slot: self.kv.lengths[slot] for slot in self.rows}

    def kv_padding(self, slot: int) -> int:
        return 0

    def forward(self, joining: list[Segment], segments: list[Segment], hidden: bool = False, around=None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        first = [self._prefill(s, hidden, around) for s in joining]
        return first, (self._step(segments, hidden, around) if segments else [])

    def _prefill(self, seg: Segment, hidden: bool, around) -> torch.Tensor:
        """A newcomer's prompt into its slot, eagerly (any length): its outputs [keep or w, .]."""
        self.kv = self.state.batch_cache(self.slots)  # a growth may have replaced it
        self.kv.lengths[seg.slot] = 0
        self.rows.append(seg.slot)
        self.target_tokens[seg.slot] = self.padding_tokens[seg.slot] = 0
        w, keep = seg.width, seg.keep or seg.width
        self.state.make_room(w, self.kv)
        self.kv = self.state.batch_cache(self.slots)
        inputs = self._inputs([seg], w)
        at = torch.arange(w, device=self.device)[None]  # [1, w]
        own = torch.tensor([seg.positions], device=self.device) if seg.positions is not None else at
        allowed = visibility(seg, 0, w, self.kv.capacity)[None].to(self.device) if seg.mask is not None else None
        context = around([seg], [torch.arange(w, device=self.device)]) if around else nullcontext()
        clock = clock_of(self.model)  # one span: the decoder and the head on the kept rows
        with context, clock.forward(w):
            out = self.state.call(inputs, own, at, allowed, embeds=inputs.is_floating_point(), hidden=True,
                                  compiled=False, kv=self.kv, slot=seg.slot)[0, w - keep:w]
            out = out if hidden else head_logits(self.model, out)
        if hidden:
            clock.output(out)
        self.kv.lengths[seg.slot] = w
        self.target_tokens[seg.slot] += w
        return out

    def _inputs(self, segments: list[Segment], width: int, rows: list[int] | None = None) -> torch.Tensor:
        """Token ids [R, width] (0 as padding), or embeddings [R, width, H] when any segment brings its own;
        `rows`: the row of each segment (default: 0, 1, ...), R = slots then, else len(segments)."""
        count = self.slots if rows is not None else len(segments)
        rows = rows if rows is not None else list(range(len(segments)))
        if all(s.embeds is None for s in segments):
            ids = torch.zeros(count, width, dtype=torch.long)
            for r, s in zip(rows, segments):
                ids[r, :s.width] = torch.tensor(s.tokens)
            return ids.to(self.device)
        parts = [packed_embeddings(self.model, [s], self.device)[0] for s in segments]  # [w, E] each
        out = parts[0].new_zeros(count, width, parts[0].shape[-1])  # E: the drafter's input width (2H: EAGLE-3's)
        for r, s, part in zip(rows, segments, parts):
            out[r, :s.width] = part
        return out

    def _step(self, segments: list[Segment], hidden: bool, around) -> list[torch.Tensor]:
        """Every slot's row in one forward at [slots, bucket]: the segments' outputs [keep or w, .] each."""
        state, device = self.state, self.device
        by_slot = {s.slot: s for s in segments}
        widest = max(s.width for s in segments)

        def hook(width):  # the method's hook, told where each segment's rows lie at this width
            places = [torch.arange(s.slot * width, s.slot * width + s.width, device=device) for s in segments]
            return around(segments, places) if around else nullcontext()

        context = hook(widest)
        # what the compiled step applies in its graph in place of the hooks (or None)
        edits = layer_edits(context) if state.accepts_edits() else None
        taps = state.taps_for(layer_taps(context)) if hidden else None  # the layers whose inputs it reads (or None)
        # a hook inside the forward that offers neither layer edits nor taps: eager
        hooked = not isinstance(context, nullcontext) and edits is None and taps is None
        kind = (any(s.embeds is not None for s in segments), any(s.mask is not None for s in segments),
                TAPS if taps else hidden)
        bucket = None if hooked else state.bucket(widest, kind, self.slots)
        if bucket is None and state.frozen:
            state.eager_steps += hooked  # (a width no bucket holds was counted by bucket())
        width = bucket or widest  # (eager: `widest`, the rows its places assume)
        if edits is not None and bucket is not None and bucket != widest:
            edits = layer_edits(hook(bucket))  # each slot's rows start at slot x bucket in the compiled forward
        lengths = self.kv.lengths
        # where each row writes: a sample's length on (a sample without new tokens this step too: beyond its live
        # entries); a free slot from 0 (its entries are stale)
        pasts = [lengths[slot] if slot in by_slot or slot in self.rows else 0 for slot in range(self.slots)]
        state.make_room(max(pasts) + width, self.kv)
        self.kv = state.batch_cache(self.slots)
        inputs = self._inputs(segments, width, rows=[s.slot for s in segments])
        write_at = torch.tensor([list(range(p, p + width)) for p in pasts], device=device)  # [S, width]
        positions = write_at.clone()
        for s in segments:
            if s.positions is not None:
                positions[s.slot, :s.width] = torch.tensor(s.positions, device=device)
        allowed = None
        if kind[1]:  # tree masks: each slot's visibility, padded to [S, width, capacity]
            allowed = torch.stack([visibility(by_slot[slot], pasts[slot], width, self.kv.capacity) if slot in by_slot
                                   else visibility(Segment(slot, [0] * width), 0, width, self.kv.capacity)
                                   for slot in range(self.slots)]).to(device)
        embeds = inputs.is_floating_point()
        clock = clock_of(self.model)  # one span, opened around the call (a graph must not read the host's clock)
        with context if bucket is None else nullcontext(), clock.forward(inputs.shape[0] * inputs.shape[1]):
            compiled = bucket is not None
            out = state.call(inputs, positions, write_at, allowed, embeds, hidden=kind[2] if compiled else hidden,
                             compiled=compiled, kv=self.kv, edits=edits if compiled else None)
            if compiled and device.type == "cuda":
                out = out.clone()  # a CUDA graph's output buffer is rewritten by its next replay (a CPU graph's: fresh)
        if compiled and taps:  # each segment's rows, final states and tapped inputs, to the method's hook
            out, tapped = split_taps(out, self.model.config.hidden_size)
            context.tapped([(out[s.slot, :s.width], tapped[s.slot, :s.width]) for s in segments])
        if hidden:
            clock.output(out)
        results = []
        for s in segments:
            keep = s.keep or s.width
            results.append(out[s.slot, s.width - keep:s.width])
            lengths[s.slot] += s.width
            self.target_tokens[s.slot] += width
            self.padding_tokens[s.slot] += width - s.width
        return results

    def truncate(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.kv.lengths[slot]:
            raise ValueError(f"slot {slot}: cannot keep {length} of {self.kv.lengths[slot]} entries")
        self.kv.lengths[slot] = length

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        self.kv.keep_offsets(start, offsets, slot)

    def release(self, slot: int) -> None:
        self.rows.remove(slot)
