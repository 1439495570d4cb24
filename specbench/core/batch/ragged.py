"""EMS-SD's two components (EMS-SD §3.2) in pure PyTorch on transformers decoders: the engine of `--batching unpadded`.

Unpad KV cache: every decoder layer keeps one preallocated tensor [slots, kv_heads, capacity, head_dim] for keys and
one for values, and each slot (sample) its own length. A sample's new keys are written at its own length, and
dropping its rejected drafts is a change of its length: no sample's cache is padded to another's.

Unpad input tokens: the new tokens of all samples (a prompt for a sample that joins, one token for `ar`, the last
token plus the drafts for `pld` / `sd`) are concatenated into one row [1, N], N = the sum of the samples' widths,
with each token's own position id. Embeddings, projections, MLPs and the LM head see exactly these N tokens: no
padding token enters a linear layer.

Attention is the registered attention function `specbench_ragged` (transformers' AttentionInterface, selected only
for the duration of a ragged forward): it writes each token's key / value at its sample's slot and position, then
runs one attention call (core/batch/attention.py: SDPA, or explicit for a layer with attention soft-capping or sinks)
in which every sample's queries [S, heads, w_max, head_dim] attend to its own cache [S, kv_heads, K_max, head_dim]
under a bool mask (its cache, then its own earlier new tokens: causal, or a tree mask; the layer's sliding window).
Gathering the queries to w_max rows and the keys to K_max columns is the only padding left, and it lives inside
attention, never in a linear layer. A varlen attention kernel (flash-attn's flash_attn_varlen_func with
cu_seqlens_q / cu_seqlens_k over a paged or per-slot cache, or FlexAttention with a block mask) removes that too on a
GPU: it would replace `_attend` below and nothing else.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from ...errors import SpecbenchError
# UnsupportedAttention: train/selfdistill.py catches it from here
from .attention import UnsupportedAttention, attend, check_batchable, layer_extras  # noqa: F401
from .cache import preallocated, sliding_windows
from . import decoder
from ..machine.forward_clock import clock_of
from ..model.placement import input_device, is_dispatched

NAME = "specbench_ragged"


@dataclass
class Segment:
    """One sample's new tokens in a packed forward."""

    slot: int
    tokens: list[int]
    keep: int = 0  # logits returned for the last `keep` tokens (0: all of them)
    positions: list[int] | None = None  # position ids (default: the slot's length onward)
    # [w, w] bool, True = may attend (default: causal; a tree's ancestor mask); or [w, t + w]: the last t cached
    # entries of the slot, then its own tokens (a tree drafted one depth per forward: EAGLE's drafter, whose
    # earlier depths are in the cache but visible to their descendants only). Entries before those t: visible.
    mask: torch.Tensor | None = None
    embeds: torch.Tensor | None = None  # [w, H] input embeddings in place of the tokens' (ppd's prompt tokens)

    @property
    def width(self) -> int:
        return len(self.tokens) if self.embeds is None else self.embeds.shape[0]

    def visible(self, past: int) -> torch.Tensor:
        """[w, past + w] bool on the CPU, True = may attend: the slot's `past` cached entries (the last t as `mask`
        says, the earlier ones all), then its own tokens (causal by default). Every engine masks a segment so."""
        w = self.width
        own = torch.ones(w, w, dtype=torch.bool).tril() if self.mask is None else self.mask.cpu().bool()
        tail = own.shape[1] - w  # cached entries the mask covers (0: the whole cache is visible)
        allowed = torch.ones(w, past + w, dtype=torch.bool)
        allowed[:, past - tail:] = own
        return allowed


class RaggedCache:
    """Per-slot KV lengths over preallocated per-layer tensors [slots, kv_heads, capacity, head_dim]."""

    def __init__(self, slots: int):
        self.lengths = [0] * slots
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [slots, kv_heads, capacity, head_dim]
        self.values: dict[int, torch.Tensor] = {}

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first `length` entries of a slot (rejected drafts leave by a length change, nothing moves)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot}: cannot keep {length} of {self.lengths[slot]} entries")
        self.lengths[slot] = length

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        """Tree compaction for one slot: of its entries from `start`, keep those at `offsets` (the accepted path)."""
        if offsets != list(range(len(offsets))):
            index = torch.tensor(offsets, dtype=torch.long) + start
            for store in (*self.keys.values(), *self.values.values()):
                store[slot, :, start:start + len(offsets)] = store[slot, :, index.to(store.device)]
        self.truncate(slot, start + len(offsets))

    def storage(self, layer: int, key: torch.Tensor, value: torch.Tensor,
                need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's key and value tensors, allocated on first use and grown (doubled) to hold `need` entries."""
        slots = len(self.lengths)
        preallocated(self.keys, layer, key, slots, need)
        preallocated(self.values, layer, value, slots, need)
        return self.keys[layer], self.values[layer]


class _Step:
    """Index tensors of one packed forward, shared by every layer (built once per forward)."""

    def __init__(self, cache: RaggedCache, segments: list[Segment], device: torch.device):
        self.cache = cache
        widths = [s.width for s in segments]
        starts = [cache.lengths[s.slot] for s in segments]
        self.need = max(a + w for a, w in zip(starts, widths))  # K_max: longest cache after this step's writes
        w_max = max(widths)
        seg = torch.repeat_interleave(torch.arange(len(segments)), torch.tensor(widths))  # [N] segment of token
        row = torch.cat([torch.arange(w) for w in widths])  # [N] row of token within its segment
        slots = torch.tensor([s.slot for s in segments])  # [S]
        start = torch.tensor(starts)  # [S]
        self.tok_seg, self.tok_row = seg.to(device), row.to(device)
        self.tok_slot = slots[seg].to(device)
        self.tok_pos = (start[seg] + row).to(device)  # [N] where each token's key is written
        self.slots = slots.to(device)
        self.contiguous = [s.slot for s in segments] == list(range(len(segments)))
        # positions of every key each segment can see [S, K_max]: cached entries hold positions 0..start-1 (the
        # cache keeps a sample's accepted sequence in order); new entries carry the segments' own position ids
        key_pos = torch.arange(self.need).repeat(len(segments), 1)
        allowed = torch.zeros(len(segments), w_max, self.need, dtype=torch.bool)  # [S, w_max, K_max]
        query_pos = torch.zeros(len(segments), w_max, dtype=torch.long)
        positions = []
        for i, (s, a, w) in enumerate(zip(segments, starts, widths)):
            pos = torch.tensor(s.positions) if s.positions is not None else torch.arange(a, a + w)
            positions.append(pos)
            key_pos[i, a:a + w] = pos
            query_pos[i, :w] = pos
            allowed[i, :w, :a + w] = s.visible(a)
            allowed[i, w:, 0] = True  # gather rows beyond the segment: one key, so softmax has no empty row
        self.positions = torch.cat(positions)  # [N] every token's position id, packed
        self._allowed, self._key_pos, self._query_pos = allowed, key_pos, query_pos
        self._masks: dict[tuple, torch.Tensor] = {}
        self._moved: dict[torch.device, _Step] = {device: self}
        self.device = device
        self.w_max = w_max

    def on(self, device: torch.device) -> _Step:
        """This step's index tensors on `device` (a layer on another device of a device map reads them there)."""
        if device not in self._moved:
            twin = _Step.__new__(_Step)
            twin.__dict__.update(self.__dict__)
            for name in ("tok_seg", "tok_row", "tok_slot", "tok_pos", "slots"):
                setattr(twin, name, getattr(self, name).to(device))
            twin.device = device
            self._moved[device] = twin
        return self._moved[device]

    def mask(self, window: int | None) -> torch.Tensor:
        """[S, 1, w_max, K_max] bool for a layer with this sliding window (None: full attention)."""
        if (window, self.device) not in self._masks:
            allowed = self._allowed
            if window is not None:
                allowed = allowed & ((self._query_pos[:, :, None] - self._key_pos[:, None, :]) < window)
                allowed[:, :, 0] |= ~allowed.any(-1)  # never an empty row
            self._masks[(window, self.device)] = allowed[:, None].to(self.device)
        return self._masks[(window, self.device)]


def _attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, ragged: _Step | None = None,
            **kwargs):
    """The `specbench_ragged` attention: query [1, H, N, D], key / value [1, kv, N, D] (packed) -> [1, N, H, D]."""
    if ragged is None:
        raise SpecbenchError("specbench_ragged attention was called outside a ragged forward")
    step, layer = ragged.on(key.device), module.layer_idx  # indices where this layer's keys live
    k_store, v_store = step.cache.storage(layer, key, value, step.need)
    k_store[step.tok_slot, :, step.tok_pos] = key[0].transpose(0, 1)  # [N, kv, D] at each sample's own position
    v_store[step.tok_slot, :, step.tok_pos] = value[0].transpose(0, 1)
    if step.contiguous:  # segments are slots 0..S-1: a view, no copy
        keys, values = k_store[:len(step.slots), :, :step.need], v_store[:len(step.slots), :, :step.need]
    else:
        keys, values = k_store[step.slots, :, :step.need], v_store[step.slots, :, :step.need]  # [S, kv, K_max, D]
    heads, dim = query.shape[1], query.shape[-1]
    q = query.new_zeros(len(step.slots), heads, step.w_max, dim)  # [S, H, w_max, D]
    q[step.tok_seg, :, step.tok_row] = query[0].transpose(0, 1)
    windows = sliding_windows(module)
    mask = step.mask(windows[layer] if layer < len(windows) else None)
    out = attend(q, keys, values, mask, scaling, *layer_extras(module, kwargs))  # [S, H, w_max, D]
    return out[step.tok_seg, :, step.tok_row].unsqueeze(0), None  # [1, N, H, D]


AttentionInterface.register(NAME, _attend)


@contextmanager
def attention_implementation(model, name: str):
    """Select a registered attention function for the duration of one forward (set_attn_implementation is
    cheap); the model's own choice is restored after."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)  # a transformers model's, or a drafter module's (core/batch/decoder.py)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def ragged_forward(model, cache: RaggedCache, segments: list[Segment], hidden: bool = False,
                   around=None) -> list[torch.Tensor]:
    """One packed forward of every segment's new tokens; returns each segment's logits [keep or w, V] (hidden: the
    decoder's normed hidden states [keep or w, H] instead, for callers that apply the head to some rows only).
    `around(segments, places)`: a context manager entered around the model call, given where each segment's
    inputs lie in the decoder's hidden states flattened to [N, H] (places: one LongTensor [w] per segment; Hidden
    Transfer's layer hooks address its pseudo positions by them).

    The cache grows by each segment's width; roll back with cache.truncate / keep_offsets.
    """
    if not segments:
        return []
    check_batchable(model)
    device = input_device(model)  # the embedding's (offloaded weights sit on "meta" until their hook runs)
    step = _Step(cache, segments, device)
    widths = [s.width for s in segments]
    keeps = [s.keep or w for s, w in zip(segments, widths)]
    ends = torch.tensor(widths).cumsum(0).tolist()
    rows = torch.cat([torch.arange(e - k, e) for e, k in zip(ends, keeps)])  # rows whose output we need
    # on the device of the final states; CPU indices index any device's tensor, so a device map keeps them there
    rows = rows if is_dispatched(model) else rows.to(device)
    positions = step.positions.unsqueeze(0).to(device)  # [1, N]
    starts = [e - w for e, w in zip(ends, widths)]
    places = [torch.arange(a, a + w, device=device) for a, w in zip(starts, widths)]  # [w] per segment, packed
    clock = clock_of(model)  # one span: the packed decoder call and the head on the kept rows
    with (attention_implementation(model, NAME), (around(segments, places) if around else nullcontext()),
          clock.forward(positions.shape[1])):
        if hidden or any(s.embeds is not None for s in segments):
            embeds = packed_embeddings(model, segments, device)  # [1, N, H]
            h = decoder.hidden(model, None, positions, inputs_embeds=embeds, ragged=step)[0, rows]  # [sum keep, H]
            out = h if hidden else decoder.logits(model, h)  # [sum keep, V] (the model's final processing too)
        else:
            ids = torch.tensor([[t for s in segments for t in s.tokens]], device=device)  # [1, N]
            out = model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=rows,
                        ragged=step).logits[0]
    if hidden:
        clock.output(out)
    for s, w in zip(segments, widths):
        cache.lengths[s.slot] += w
    return list(out.split(keeps))


def packed_embeddings(model, segments: list[Segment], device) -> torch.Tensor:
    """inputs_embeds [1, N, H]: each segment's own embeddings, or its tokens' (tokens of the target's table)."""
    table = model.get_input_embeddings()
    parts = [s.embeds.to(device) if s.embeds is not None else table(torch.tensor(s.tokens, device=device))
             for s in segments]
    dtype = parts[0].dtype if segments[0].embeds is None else table.weight.dtype
    return torch.cat([p.to(dtype) for p in parts]).unsqueeze(0)


class RaggedBatch:
    """The unpadded engine behind the same calls as core/batch/padded.PaddedBatch: samples join, step, roll back, leave."""

    def __init__(self, model, slots: int):
        self.model = model
        self.cache = RaggedCache(slots)
        self.rows: list[int] = []  # active slots
        self.target_tokens: dict[int, int] = {}
        self.padding_tokens: dict[int, int] = {}

    @property
    def lengths(self) -> dict[int, int]:
        return {slot: self.cache.lengths[slot] for slot in self.rows}

    def kv_padding(self, slot: int) -> int:
        return 0

    def forward(self, joining: list[Segment], segments: list[Segment], hidden: bool = False, around=None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Newcomers' prefill segments (their slots start empty) and the active samples' new tokens packed into one
        forward, no padding token; returns (the newcomers' outputs, the segments' outputs): logits, or hidden.
        `around`: as ragged_forward's."""
        for s in joining:
            self.cache.lengths[s.slot] = 0
            self.rows.append(s.slot)
            self.target_tokens[s.slot] = self.padding_tokens[s.slot] = 0
        out = ragged_forward(self.model, self.cache, joining + segments, hidden, around)
        for s in joining + segments:
            self.target_tokens[s.slot] += s.width
        return out[:len(joining)], out[len(joining):]

    def truncate(self, slot: int, length: int) -> None:
        self.cache.truncate(slot, length)

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        self.cache.keep_offsets(slot, start, offsets)

    def release(self, slot: int) -> None:
        self.rows.remove(slot)
