"""Batch 1's engine under `--compile`: the batch engine protocol (engine.py) for one sample over a
preallocated KV cache written in place, with every decode forward at a static shape so that torch.compile compiles
each shape once (and, on CUDA, records it once as a CUDA graph: core/model/compile.py).

What is static, as gpt-fast makes it:
- the KV cache: per decoder layer one key and one value tensor [1, kv_heads, capacity, head_dim], allocated at the
  first forward and never reallocated (their addresses are fixed: torch._dynamo.mark_static_address, so a CUDA graph
  may write them in place). A forward writes its w new entries at positions `write_at` [w] (index_copy_) and attends
  over all `capacity` keys under a mask; dropping rejected drafts is a change of the Python length, nothing moves.
- the query width: a segment of w tokens runs at the smallest bucket >= w (compile.py's buckets: powers of two up to
  the run's longest draft, and the exact tree widths the run uses), padded with rows no real row can see (they come
  after the real rows, write beyond the new length, and see keys 0..their own write position, so their outputs are
  finite and later steps mask them as stale).
- the mask: a plain segment (ar, pld, sd: tokens appended causally) is causal, built inside the graph from
  `write_at` (key k visible to row r iff k <= write_at[r]); a segment with its own mask (a tree) brings the single
  engine's visibility (Segment.visible) padded to [bucket, capacity] as a bool input. Sliding-window layers see
  only keys within their window of each row's position (attention_masks: per layer kind where full and sliding
  layers mix).
The prompt (a newcomer's prefill, any length) runs the same step eagerly, uncompiled, into the same cache, the LM
head on the rows it keeps only. So does a
segment the compile state does not compile (a width with no bucket after warm-up, or a method whose `around` hooks
the forward without offering what it does as data), counted as an eager step. What methods do inside the target's
layers runs inside the compiled graph as data (core/model/compile_graph.py): Hidden Transfer's transfer steps as
layer edits, EAGLE-3's reading of three layers' input states as layer taps (the step's output then holds them beside
the final hidden states, `TAPS`).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ...errors import SpecbenchError
from ..machine.forward_clock import clock_of
from ..model.placement import input_device
from . import decoder
from .ragged import Segment, packed_embeddings

LAYER_EDITS = "specbench_layer_edits"  # the decoder keyword of layer edits (core/model/compile_graph.py reads it)
LAYER_TAPS = "specbench_layer_taps"  # the decoder keyword of layer taps: (layer indices, the dict their inputs go to)
TAPS = 2  # a step's `hidden` asking for the final hidden states and the tapped layers' inputs (True: the former only)


class StaticKV:
    """Per-layer key / value tensors [batch, kv_heads, capacity, head_dim] at fixed addresses, and each slot's
    length (`length`: slot 0's, the single sample of batch 1)."""

    def __init__(self, capacity: int, windows: tuple[int | None, ...] = (), batch: int = 1):
        self.capacity = capacity
        self.windows = windows  # per decoder layer: its sliding window, None for full attention (cache.sliding_windows)
        self.batch = batch
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = [0] * batch  # entries each slot holds: positions 0..length-1 (later entries are stale)

    @property
    def length(self) -> int:
        return self.lengths[0]

    @length.setter
    def length(self, value: int) -> None:
        self.lengths[0] = value

    def allocate(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """The layer's tensors, shaped like its new keys / values [., kv_heads, ., head_dim] (first forward only)."""
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[layer] is None:
            for store, like in ((self.keys, key), (self.values, value)):
                t = like.new_zeros(self.batch, like.shape[1], self.capacity, like.shape[-1])
                torch._dynamo.mark_static_address(t)  # a CUDA graph writes it in place: its address must not move
                store[layer] = t

    def keep_offsets(self, start: int, offsets: list[int], slot: int = 0) -> None:
        """Tree compaction: of the slot's entries from `start`, keep those at `offsets` (the accepted path), moved
        to start, start+1, ... (in place: the addresses stay)."""
        if offsets != list(range(len(offsets))) and self.keys:
            index = torch.tensor(offsets, dtype=torch.long, device=self.keys[0].device) + start  # one copy over
            for store in (*self.keys, *self.values):
                store[slot, :, start:start + len(offsets)] = store[slot, :, index]
        self.lengths[slot] = start + len(offsets)


class _Writer:
    """The cache a transformers decoder sees during one static forward: each layer's new keys / values [S, kv, w, d]
    go to positions `write_at` [S, w] of the layer's preallocated tensors (of slot `slot` only when one is named: a
    newcomer's prefill into a batch cache), and attention reads all `capacity` keys."""

    def __init__(self, kv: StaticKV, write_at: torch.Tensor, slot: int | None = None):
        self.kv, self.write_at, self.slot = kv, write_at, slot

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        if len(self.kv.keys) <= layer_idx or self.kv.keys[layer_idx] is None:
            self.kv.allocate(layer_idx, key, value)
        keys, values = self.kv.keys[layer_idx], self.kv.values[layer_idx]
        if self.slot is not None:  # one slot of a batch cache: a view, written in place
            keys, values = keys[self.slot:self.slot + 1], values[self.slot:self.slot + 1]
        if keys.shape[0] == 1:
            keys.index_copy_(2, self.write_at[0], key)
            values.index_copy_(2, self.write_at[0], value)
        else:  # every slot at its own rows: [S, w, kv, d] through the (slot, row) index pairs
            slots = torch.arange(keys.shape[0], device=keys.device)[:, None]  # [S, 1]
            keys[slots, :, self.write_at] = key.transpose(1, 2)
            values[slots, :, self.write_at] = value.transpose(1, 2)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv.length


def step(model, kv: StaticKV, inputs: torch.Tensor, positions: torch.Tensor, write_at: torch.Tensor,
         allowed: torch.Tensor | None, embeds: bool, hidden: bool | int, slot: int | None = None,
         edits: tuple | None = None, taps: tuple[int, ...] | None = None) -> torch.Tensor:
    """One forward at a static shape (what compile.py compiles; the prefill and eager steps call it as is), S samples
    side by side (S = 1 at batch 1; a batch cache's slots under core/batch/static_batch.py).
    inputs: token ids [S, w] or embeddings [S, w, H] (`embeds`); positions [S, w] (rotary); write_at [S, w] (cache
    rows); allowed: [S, w, capacity] bool (True = may attend), or None for causal over the cache (key k visible to
    row r iff k <= write_at[r]); slot: the one slot of a batch cache a single row writes (a prefill), else None;
    edits: layer edits, applied by the decoder layers of a compiled state's graph model (core/model/compile_graph.py:
    ((layer, slots [P], sources [P], weight [H, H]), ...), indices into the hidden states flattened to [S * w, H]);
    taps (with hidden == TAPS): the decoder layers whose input states the output carries, read by the same layers.
    Returns the decoder's normed hidden states [S, w, H] (`hidden`), those followed by the tapped layers' inputs in
    the order of `taps` [S, w, (1 + len(taps)) H] (hidden == TAPS: split_taps parts them), or the target's logits
    [S, w, V] (float). Nothing here reads a clock: the engines time the call from outside
    (core/machine/forward_clock.py)."""
    mask = attention_masks(kv, positions, write_at, allowed, model.get_input_embeddings().weight.dtype)
    embedded = inputs if embeds else model.get_input_embeddings()(inputs)  # [S, w, H]
    tapped: dict[int, torch.Tensor] = {}  # layer index -> the hidden states entering it [S, w, H] (filled by taps)
    extra = {LAYER_EDITS: edits} if edits else {}
    if hidden == TAPS:
        extra[LAYER_TAPS] = (taps, tapped)
    h = decoder.hidden(model, None, positions, _Writer(kv, write_at, slot), mask, inputs_embeds=embedded,
                       **extra)  # [S, w, H]
    if hidden == TAPS:
        return torch.cat([h, *(tapped[i].to(h.dtype) for i in taps)], -1)
    return h if hidden else decoder.logits(model, h).float()  # a drafter's: -inf off its --vocab-top tokens


def split_taps(out: torch.Tensor, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A TAPS step's rows [..., (1 + k) H] -> (the final hidden states [..., H], the tapped inputs side by side
    [..., kH])."""
    return out[..., :hidden_size], out[..., hidden_size:]


def attention_masks(kv: StaticKV, positions: torch.Tensor, write_at: torch.Tensor, allowed: torch.Tensor | None,
                    dtype: torch.dtype):
    """The additive mask [S, 1, w, capacity] a static forward attends under (0 where visible, the dtype's min
    elsewhere, as core/tree.additive makes it for the single engine), with the layers' sliding windows applied as
    transformers applies them (a query at position p sees keys at positions > p - window): one windowed mask when
    every layer slides, {"full_attention": ..., "sliding_attention": ...} (what hybrid models such as Gemma 2/3 and
    Qwen2 take in place of a mask) when full and sliding layers mix, the plain mask without windows.
    Each key's position: its cache row for the entries before this forward (compacted caches hold the accepted
    sequence in order), `positions` for the rows it writes (a tree's nodes share depths); stale rows are masked."""
    keys = torch.arange(kv.capacity, device=write_at.device)
    if allowed is None:
        allowed = keys[None, None, :] <= write_at[:, :, None]  # [S, w, capacity]

    def additive(visible):
        return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
            ~visible, torch.finfo(dtype).min)[:, None]  # [S, 1, w, capacity]

    mask = additive(allowed)
    sizes = {w for w in kv.windows if w is not None}
    if not sizes:
        return mask
    window = max(sizes)  # one size: the compile check refuses several (run/compiled.check_model)
    query = positions.to(keys.device)  # [S, w]
    key_pos = keys.expand(write_at.shape[0], -1).scatter(1, write_at, query)  # [S, capacity]
    windowed = additive(allowed & ((query[:, :, None] - key_pos[:, None, :]) < window))
    if all(w is not None for w in kv.windows):
        return windowed
    return {"full_attention": mask, "sliding_attention": windowed}


def visibility(seg: Segment, past: int, width: int, capacity: int) -> torch.Tensor:
    """[width, capacity] bool on the CPU: a segment's rows as every engine masks them (Segment.visible over the
    slot's `past` entries), then its padding rows up to the bucket `width`, each seeing keys 0..its own write
    position (finite outputs, never read)."""
    w = seg.width
    grid = torch.zeros(width, capacity, dtype=torch.bool)
    grid[:w, :past + w] = seg.visible(past)
    for r in range(w, width):
        grid[r, :past + r + 1] = True
    return grid


def layer_edits(context) -> tuple | None:
    """The layer edits a method's hook around the forward offers a compiled step in place of its hooks (Hidden
    Transfer's transfer steps: methods/hidden_transfer/layers.transferred.layer_edits), or None."""
    offer = getattr(context, "layer_edits", None)
    return offer() if offer is not None else None


def layer_taps(context) -> tuple[int, ...] | None:
    """The decoder layers whose input states a method's hook around the forward offers to read from a compiled step's
    output in place of its hooks (EAGLE-3's fused features: methods/eagle3/layers.Recording), or None. The method
    then takes them through `context.tapped([(final [w, H], taps [w, kH]) per segment])`."""
    offer = getattr(context, "layer_taps", None)
    return offer() if offer is not None else None


def head_logits(model, h: torch.Tensor) -> torch.Tensor:
    """Hidden states [n, H] -> the model's logits [n, V] (float), as `step` gives them."""
    return decoder.logits(model, h).float()  # a drafter's: -inf off its --vocab-top tokens


class StaticSequence:
    """One slot over a compile state's static cache (core/model/compile.Compiled: the cache, the compiled step)."""

    def __init__(self, model, state):
        self.model, self.state = model, state
        self.device = input_device(model)
        self.rows: list[int] = []
        self.target_tokens: dict[int, int] = {}
        self.padding_tokens: dict[int, int] = {}

    @property
    def lengths(self) -> dict[int, int]:
        return {slot: self.state.kv.length for slot in self.rows}

    def kv_padding(self, slot: int) -> int:
        return 0

    def forward(self, joining: list[Segment], segments: list[Segment], hidden: bool = False, around=None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if len(joining) + len(segments) > 1:
            raise SpecbenchError("the static (--compile) engine decodes one sample at a time")
        if not joining and not segments:
            return [], []
        for s in joining:  # a newcomer: the cache's earlier sample is stale from here
            self.state.kv.length = 0
            self.rows = [s.slot]
            self.target_tokens[s.slot] = self.padding_tokens[s.slot] = 0
        seg = (joining or segments)[0]
        out, fed = self._run(seg, hidden, around, prefill=bool(joining))
        self.target_tokens[seg.slot] += fed
        self.padding_tokens[seg.slot] += fed - seg.width
        return ([out], []) if joining else ([], [out])

    def _run(self, seg: Segment, hidden: bool, around, prefill: bool) -> tuple[torch.Tensor, int]:
        """The segment's outputs [keep or w, .] and the rows fed (its bucket: padding included)."""
        state, device, w = self.state, self.device, seg.width
        past = state.kv.length
        keep = seg.keep or w
        context = around([seg], [torch.arange(w, device=device)]) if around else nullcontext()
        # what the compiled step applies in its graph in place of the hooks (or None)
        edits = layer_edits(context) if state.accepts_edits() else None
        taps = state.taps_for(layer_taps(context)) if hidden else None  # the layers whose inputs it reads (or None)
        # a hook around the forward that offers neither layer edits nor taps: never compiled
        hooked = not isinstance(context, nullcontext) and edits is None and taps is None
        kind = (seg.embeds is not None, seg.mask is not None, TAPS if taps else hidden)
        bucket = None if prefill or hooked else state.bucket(w, kind)  # None: an eager step at the exact width
        if hooked and state.frozen:
            state.eager_steps += 1
        width = bucket or w
        state.make_room(past + width)
        pad = width - w
        tokens_in = seg.embeds is None
        if tokens_in:
            inputs = torch.tensor([seg.tokens + [0] * pad], device=device)  # [1, width]
        else:
            e = packed_embeddings(self.model, [seg], device)  # [1, w, H]
            inputs = torch.cat([e, e.new_zeros(1, pad, e.shape[-1])], 1) if pad else e
        own = seg.positions if seg.positions is not None else list(range(past, past + w))
        positions = torch.tensor([own + list(range(past + w, past + width))], device=device)  # [1, width]
        write_at = torch.arange(past, past + width, device=device)[None]  # [1, width]
        allowed = None
        if seg.mask is not None:  # the single engine's visibility, padded to [1, width, capacity]
            allowed = visibility(seg, past, width, state.kv.capacity)[None].to(device)
        clock = clock_of(self.model)  # one span, opened around the call (a graph must not read the host's clock)
        with context if bucket is None else nullcontext(), clock.forward(width):
            if bucket is None:  # the LM head on the kept rows only (a prompt's prefill keeps one)
                out = state.call(inputs, positions, write_at, allowed, embeds=not tokens_in, hidden=True,
                                 compiled=False)[0, w - keep:w]
                out = out if hidden else head_logits(self.model, out)
            else:  # (the padding rows after the real ones: the edits' row indices stay those of the real rows)
                out = state.call(inputs, positions, write_at, allowed, embeds=not tokens_in, hidden=kind[2],
                                 compiled=True, edits=edits)
                out = out[0, :w] if taps else out[0, w - keep:w]  # (taps: every real row, for the method's hook)
                if device.type == "cuda":  # a CUDA graph's output buffer is rewritten by its next replay (a CPU
                    out = out.clone()  # graph's outputs are fresh tensors: no copy of [keep, V] logits)
                if taps:  # the segment's final states and tapped inputs to the method's hook; its kept rows on
                    final, tapped = split_taps(out, self.model.config.hidden_size)
                    context.tapped([(final, tapped)])
                    out = final[w - keep:]
        if hidden:
            clock.output(out)  # a method's head call on these rows is the target's forward (the single engine's too)
        state.kv.length = past + w
        return out, width

    def truncate(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.state.kv.length:
            raise ValueError(f"slot {slot}: cannot keep {length} of {self.state.kv.length} entries")
        self.state.kv.length = length

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        self.state.kv.keep_offsets(start, offsets)

    def release(self, slot: int) -> None:
        self.rows.remove(slot)
