"""The vanilla way of batching speculative decoding (EMS-SD §3.1): the engine of `--batching padded`.

It differs from the unpadded engine (core/batch/ragged.py) by padding only, so that the gap between the two modes is
EMS-SD's and not an engine's:
- the same KV storage: per-layer tensors [slots, kv_heads, capacity, head_dim] preallocated (core/batch/cache.preallocated)
  and written in place by the registered attention function (`specbench_padded`), no DynamicCache copy per step;
- the same LM head work: logits are computed only at the rows a caller reads (each segment's last `keep` tokens),
  not at every prompt, padding and draft position;
- the same attention (core/batch/attention.py: one SDPA call with a bool mask, grouped-query heads without copying
  keys; explicit for layers with attention soft-capping or sinks), and the same per-layer sliding windows.

What padding adds: all active rows share one width L (column = cache entry). Prompts are left-padded to the longest;
each forward feeds every row the same width W (the widest sample's new tokens, the others padded on the right) and
writes W new columns at L; after verification the batch keeps the longest accepted length and every other row's
extra entries stay as padding (masked, never attended). A bool mask [R, 1, W, L + W] hides the padding; every
padding token fed through the model is counted (`padding_tokens`), and so are the padded KV entries a sample holds
when it leaves (`kv_padding`, EMS-SD Appendix B's padding length).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from transformers import AttentionInterface

from ...errors import SpecbenchError
from ..machine.forward_clock import clock_of
from .attention import attend, check_batchable, layer_extras
from .cache import preallocated, sliding_windows
from . import decoder
from .ragged import Segment, attention_implementation

PAD_ID = 0  # the token fed at padded positions (masked: its value does not matter)
ATTENTION = "specbench_padded"


class _Step:
    """One padded forward's place in the cache: rows = the slots fed [R] (row r of the inputs is slot slots[r]);
    the W new columns are written at `at`; attention reads columns [lo, at + W) under `allowed` [R, W, L + W] (True =
    attend; no window applied), with the position ids of its queries [R, W] and keys [R, L + W]."""

    def __init__(self, batch: "PaddedBatch", slots: list[int], lo: int, at: int, wide: int, allowed: torch.Tensor,
                 query_pos: torch.Tensor, key_pos: torch.Tensor):
        self.batch, self.lo, self.at, self.need = batch, lo, at, at + wide
        self.count = max(slots) + 1  # store rows needed
        self.contiguous = slots == list(range(len(slots)))  # rows 0..R-1: views, no gather
        self.index = torch.tensor(slots)
        self.allowed, self.query_pos, self.key_pos = allowed, query_pos, key_pos
        self._masks: dict[tuple, torch.Tensor] = {}

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor:
        """[R, 1, W, L + W] bool for a layer with this sliding window (None: full attention), built once per window
        and device per forward (hybrid models, e.g. Gemma 2, alternate windowed and full layers)."""
        if (window, device) not in self._masks:
            allowed = self.allowed
            if window is not None:  # a query at position p sees keys at positions > p - window (transformers' rule)
                allowed = allowed & ((self.query_pos[:, :, None] - self.key_pos[:, None, :]) < window)
                rows, wide = self.query_pos.shape
                itself = torch.cat([torch.zeros(rows, wide, allowed.shape[2] - wide, dtype=torch.bool),
                                    torch.eye(wide, dtype=torch.bool).expand(rows, -1, -1)], 2)  # [R, W, L + W]
                allowed = allowed | (itself & ~allowed.any(-1, keepdim=True))  # never an empty row
            self._masks[(window, device)] = allowed[:, None].to(device)
        return self._masks[(window, device)]


def _attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, padded: _Step | None = None,
            **kwargs):
    """The `specbench_padded` attention: write the W new keys / values of every row at column `at` of its slot's
    store, then attend over columns [lo, at + W) under this layer's mask (its own sliding window; the model's
    `attention_mask` is not read) with the unpadded engine's attention (SDPA, or explicit where the layer has
    softcapping or sinks). query [R, H, W, D], key / value [R, kv, W, D] -> [R, W, H, D]."""
    if padded is None:
        raise SpecbenchError("specbench_padded attention was called outside a padded forward")
    step, layer, rows = padded, module.layer_idx, query.shape[0]
    out = []
    for stores, new in ((step.batch.keys, key), (step.batch.values, value)):
        store = preallocated(stores, layer, new, step.count, step.need)  # [slots, kv, capacity, D]
        if step.contiguous:
            store[:rows, :, step.at:step.need] = new
            out.append(store[:rows, :, step.lo:step.need])  # a view
        else:
            index = step.index.to(store.device)
            store[index, :, step.at:step.need] = new
            out.append(store[index, :, step.lo:step.need])  # [R, kv, need - lo, D] (gathered)
    keys, values = out
    windows = sliding_windows(module)
    mask = step.mask(windows[layer] if layer < len(windows) else None, query.device)
    result = attend(query, keys, values, mask, scaling, *layer_extras(module, kwargs))  # [R, H, W, D]
    return result.transpose(1, 2), None


AttentionInterface.register(ATTENTION, _attend)


class PaddedBatch:
    """Rows of one padded cache, one per active sample (slot), with per-slot counters."""

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [slots, kv_heads, capacity, head_dim], indexed by slot
        self.values: dict[int, torch.Tensor] = {}
        self.rows: list[int] = []  # row -> slot
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [R, L] True = a real entry
        self.key_pos = torch.zeros(0, 0, dtype=torch.long)  # [R, L] position id of each entry
        self.lengths: dict[int, int] = {}  # slot -> real entries
        self.target_tokens: dict[int, int] = {}  # slot -> tokens fed for its row (real + padding)
        self.padding_tokens: dict[int, int] = {}  # slot -> padding tokens fed for its row
        self.aligned: dict[int, int] = {}  # slot -> padded entries from aligning prompts (not acceptance)
        check_batchable(model)

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def kv_padding(self, slot: int) -> int:
        """Padded KV entries the slot's row holds beyond its prompt alignment (Appendix B's padding, summed)."""
        row = self.rows.index(slot)
        return int((~self.valid[row]).sum()) - self.aligned[slot]

    def forward(self, joining: list[Segment], segments: list[Segment], hidden: bool = False, around=None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One padded forward of the active rows' segments, then the newcomers' own padded prefill (a padded batch
        cannot pack a prompt with decode steps); returns (the newcomers' outputs, the segments' outputs): logits
        [keep or w, V], or the decoder's hidden states [keep or w, H] with `hidden`. `around(segments, places)`:
        as core/batch/ragged.py's, entered around each of the two model calls (places index the hidden states [R, W, H]
        flattened to [R * W, H])."""
        out = self.step(segments, hidden, around) if segments else []
        return (self.admit(joining, hidden, around) if joining else []), out

    def admit(self, joining: list[Segment], hidden: bool = False, around=None) -> list[torch.Tensor]:
        """Prefill new samples, left-padded to the longest and right-aligned with the batch's width: when their
        prompts are wider than the batch, the batch's rows are first moved right (left padding, in place)."""
        slots = [s.slot for s in joining]
        for slot in slots:
            self.lengths[slot] = self.target_tokens[slot] = self.padding_tokens[slot] = 0
        wide = max(s.width for s in joining)
        if self.rows and wide > self.width:
            self._pad_left(wide - self.width)
        at = self.width - wide if self.rows else 0  # their W columns end at the batch's width; [0, at): padding
        none = torch.zeros(len(slots), 0, dtype=torch.bool)
        out, valid, key_pos = self._run(joining, slots, none, none.long(), lo=at, at=at, left=True, hidden=hidden,
                                         around=around)
        for slot in slots:
            self.aligned[slot] = self.padding_tokens[slot] + at
        valid = torch.cat([torch.zeros(len(slots), at, dtype=torch.bool), valid], 1)  # [n, L]
        key_pos = torch.cat([torch.zeros(len(slots), at, dtype=torch.long), key_pos], 1)
        if self.rows:
            self.valid, self.key_pos = torch.cat([self.valid, valid]), torch.cat([self.key_pos, key_pos])
        else:
            self.valid, self.key_pos = valid, key_pos
        self.rows += slots
        return out

    def _pad_left(self, grow: int) -> None:
        """Move every active row's L entries `grow` columns right (the new columns on the left are padding)."""
        wide, index = self.width, torch.tensor(self.rows)
        for stores in (self.keys, self.values):
            for layer, store in list(stores.items()):
                store = preallocated(stores, layer, store, store.shape[0], wide + grow)
                at = index.to(store.device)
                store[at, :, grow:grow + wide] = store[at, :, :wide]  # the gather copies first: no overlap
        self.valid = torch.cat([torch.zeros(len(self.rows), grow, dtype=torch.bool), self.valid], 1)
        self.key_pos = torch.cat([torch.zeros(len(self.rows), grow, dtype=torch.long), self.key_pos], 1)
        for slot in self.rows:
            self.aligned[slot] += grow

    def step(self, segments: list[Segment], hidden: bool = False, around=None) -> list[torch.Tensor]:
        """One forward of every row: each segment's tokens, padded on the right to the widest; rows without a
        segment are fed padding only."""
        out, self.valid, self.key_pos = self._run(segments, self.rows, self.valid, self.key_pos, lo=0,
                                                  at=self.width, left=False, hidden=hidden, around=around)
        return out

    def _run(self, segments: list[Segment], rows: list[int], valid, key_pos, lo: int, at: int, left: bool,
             hidden: bool, around=None):
        """Pad the segments into [R, W] inputs (left- or right-aligned), run the model writing W columns at `at` of
        the rows' stores, count tokens; returns (each segment's output, valid and key positions [R, L] grown by the
        W new columns). valid / key_pos describe the columns [lo, at) the rows already hold."""
        by_slot = {s.slot: s for s in segments}
        wide = max(s.width for s in segments)
        n = len(rows)
        ids = torch.full((n, wide), PAD_ID, dtype=torch.long)
        embeds = None
        if any(s.embeds is not None for s in segments):
            table = self.model.get_input_embeddings()
            # a segment's own inputs set the width (a drafter's fused inputs may be wider than a token's embedding)
            width = next(s.embeds.shape[-1] for s in segments if s.embeds is not None)
            embeds = torch.zeros(n, wide, width, dtype=table.weight.dtype, device=self.device)
        new_valid = torch.zeros(n, wide, dtype=torch.bool)
        pos = torch.zeros(n, wide, dtype=torch.long)
        own = torch.zeros(n, wide, wide, dtype=torch.bool)  # [R, W, W] new-token mask
        tails = []  # (row, columns, [w, t] mask over the row's last t real cache entries): see Segment.mask
        cols = {}  # slot -> (row, its columns)
        for r, slot in enumerate(rows):
            seg = by_slot.get(slot)
            w = seg.width if seg else 0
            if w:
                at_cols = slice(wide - w, wide) if left else slice(0, w)
                cols[slot] = (r, at_cols)
                if seg.embeds is not None:
                    embeds[r, at_cols] = seg.embeds.to(embeds.dtype)
                else:
                    ids[r, at_cols] = torch.tensor(seg.tokens)
                    if embeds is not None:
                        embeds[r, at_cols] = self.model.get_input_embeddings()(ids[r, at_cols].to(self.device))
                new_valid[r, at_cols] = True
                start = self.lengths[slot]
                pos[r, at_cols] = (torch.tensor(seg.positions) if seg.positions is not None
                                   else torch.arange(start, start + w))
                mask = torch.ones(w, w, dtype=torch.bool).tril() if seg.mask is None else seg.mask.cpu().bool()
                own[r, at_cols, at_cols] = mask[:, -w:]
                if mask.shape[1] > w:
                    tails.append((r, at_cols, mask[:, :-w]))
            self.lengths[slot] = self.lengths.get(slot, 0) + w
            self.target_tokens[slot] += wide
            self.padding_tokens[slot] += wide - w
        read_rows, read_cols = [], []  # (row, column) of every output a caller reads, segment by segment
        for s in segments:  # outputs in the segments' order: the last `keep` of each segment's columns
            r, at_cols = cols[s.slot]
            read_rows += [r] * (s.keep or s.width)
            read_cols += range(at_cols.stop - (s.keep or s.width), at_cols.stop)
        places = [torch.arange(r * wide + c.start, r * wide + c.stop, device=self.device)
                  for r, c in (cols[s.slot] for s in segments)]  # [w] per segment in the states flattened [R * W]
        allowed = self._mask(valid, new_valid, own, tails)  # [R, W, L + W]
        step = _Step(self, rows, lo, at, wide, allowed, pos, torch.cat([key_pos, pos], 1))
        # the mask the decoder is given (its own mask building wants one); _attend reads each layer's from the step
        clock = clock_of(self.model)  # one span: the decoder on every row and the head on the rows read
        with (attention_implementation(self.model, ATTENTION), (around(segments, places) if around else nullcontext()),
              clock.forward(n * wide)):
            h = decoder.hidden(self.model, ids.to(self.device), pos.to(self.device), None,
                               step.mask(None, self.device), inputs_embeds=embeds, padded=step)  # [R, W, H]
            h = h[torch.tensor(read_rows, device=h.device), torch.tensor(read_cols, device=h.device)]  # [sum keep, H]
            out = h if hidden else decoder.logits(self.model, h)  # [sum keep, V]: the head on the rows read only
        if hidden:
            clock.output(out)
        result = list(out.split([s.keep or s.width for s in segments]))
        return result, torch.cat([valid, new_valid], 1), torch.cat([key_pos, pos], 1)

    def _mask(self, valid, new_valid, own=None, tails=()) -> torch.Tensor:
        """[R, W, L + W] bool, no window: the row's real cache entries (its last t as a tail mask says), then its own
        new tokens (causal or `own`); a padded query row sees only itself (its output is discarded; an empty row
        would give NaN). _Step.mask applies a layer's sliding window."""
        rows, wide = new_valid.shape
        if own is None:
            own = torch.ones(wide, wide, dtype=torch.bool).tril().expand(rows, wide, wide)
        new_part = own & new_valid[:, None, :] & new_valid[:, :, None]  # [R, W, W]
        new_part = new_part | (torch.eye(wide, dtype=torch.bool) & ~new_valid[:, :, None])
        cache_part = valid[:, None, :].expand(rows, wide, valid.shape[1]) & new_valid[:, :, None]  # [R, W, L]
        for r, at_cols, tail in tails:  # tail [w, t]: the row's last t real entries
            real = valid[r].nonzero()[-tail.shape[1]:, 0]
            cache_part[r, at_cols][:, real] = tail
        return torch.cat([cache_part, new_part], 2)  # True = attend

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` real entries; its later entries become padding. Columns that are padding
        in every row are dropped (the batch keeps the longest accepted length; the next step writes over them)."""
        row = self.rows.index(slot)
        real = self.valid[row].nonzero()[:, 0]
        if length < len(real):
            self.valid[row, real[length]:] = False
        self.lengths[slot] = length
        self._crop()

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        """Tree compaction for one row: of its real entries from the `start`-th, keep those at `offsets` (the
        accepted path), moved to the front of that span; the rest become padding."""
        row = self.rows.index(slot)
        real = self.valid[row].nonzero()[:, 0]
        if offsets != list(range(len(offsets))):
            src, dst = real[start + torch.tensor(offsets)], real[start:start + len(offsets)]
            for store in (*self.keys.values(), *self.values.values()):  # [slots, kv_heads, capacity, head_dim]
                store[slot, :, dst.to(store.device)] = store[slot, :, src.to(store.device)]
            self.key_pos[row, dst] = self.key_pos[row, src]
        self.truncate(slot, start + len(offsets))

    def _crop(self) -> None:
        used = self.valid.any(0).nonzero()
        keep = int(used[-1]) + 1 if len(used) else 0
        if keep < self.width:
            self.valid, self.key_pos = self.valid[:, :keep], self.key_pos[:, :keep]

    def release(self, slot: int) -> None:
        """A finished sample leaves the batch (its row leaves the mask; its store row waits for the next sample)."""
        row = self.rows.index(slot)
        keep = [r for r in range(len(self.rows)) if r != row]
        self.valid, self.key_pos = self.valid[keep], self.key_pos[keep]
        self.rows.pop(row)
        self._crop()
