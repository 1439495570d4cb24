"""The vanilla way of batching speculative decoding (EMS-SD §3.1): the engine of `--batching padded`.

One transformers DynamicCache [B, kv_heads, L, head_dim] whose rows all have the same length L, and a mask of which
entries are real. Prompts are left-padded to the longest; each forward feeds every row the same width W (the widest
sample's new tokens, the others padded); after verification the cache keeps the longest accepted length of the batch
and every other row's extra entries stay as padding (masked, never attended). A 4-D additive attention mask
[B, 1, W, L + W] hides the padding; every padding token fed through the model is counted (`padding_tokens`), and so
are the padded KV entries a sample holds when it leaves (`kv_padding`, EMS-SD Appendix B's padding length).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from ..errors import SpecbenchError
from .cache import append_rows, drop_last, new_cache, pad_left, select_rows, sliding_windows
from .forward import with_cache
from .ragged import Segment, attention_implementation

PAD_ID = 0  # the token fed at padded positions (masked: its value does not matter)
ATTENTION = "specbench_padded"


def _attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA over the padded batch as the unpadded engine runs it (bool mask, grouped-query heads without copying
    keys), so that the two modes differ by padding and cache layout only: transformers' own SDPA path repeats the
    keys and values of every KV head for a masked multi-token query (a B = 8, w = 3 step over KV 768 took 203 ms
    that way against 151 ms here, on this project's AMX Xeon).
    query [B, H, W, D], key / value [B, kv, L + W, D] -> [B, W, H, D]."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2), None


AttentionInterface.register(ATTENTION, _attend)


class PaddedBatch:
    """Rows of one padded cache, one per active sample (slot), with per-slot counters."""

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.cache = new_cache(model)
        self.rows: list[int] = []  # row -> slot
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [B, L] True = a real entry
        self.key_pos = torch.zeros(0, 0, dtype=torch.long)  # [B, L] position id of each entry
        self.lengths: dict[int, int] = {}  # slot -> real entries
        self.target_tokens: dict[int, int] = {}  # slot -> tokens fed for its row (real + padding)
        self.padding_tokens: dict[int, int] = {}  # slot -> padding tokens fed for its row
        self.aligned: dict[int, int] = {}  # slot -> padded entries from aligning prompts (not acceptance)
        layers = sliding_windows(model)
        windows = set(layers)
        if len(windows) > 1:  # one mask serves every layer here; core/ragged.py masks per layer
            raise SpecbenchError(f"{type(model).__name__} mixes attention windows ({sorted(map(str, windows))}): "
                                 "padded batching applies one mask to every layer; use --batching unpadded")
        self.window = layers[0] if layers else None

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
        as core/ragged.py's, entered around each of the two model calls (places index the hidden states [R, W, H]
        flattened to [R * W, H])."""
        out = self.step(segments, hidden, around) if segments else []
        return (self.admit(joining, hidden, around) if joining else []), out

    def admit(self, joining: list[Segment], hidden: bool = False, around=None) -> list[torch.Tensor]:
        """Prefill new samples, left-padded to the longest, in a cache of their own; then align it with the batch's
        on the left and stack it under."""
        cache = new_cache(self.model)
        for s in joining:
            self.lengths[s.slot] = 0
            self.target_tokens[s.slot] = self.padding_tokens[s.slot] = self.aligned[s.slot] = 0
        slots = [s.slot for s in joining]
        valid = torch.zeros(len(joining), 0, dtype=torch.bool)
        key_pos = torch.zeros(len(joining), 0, dtype=torch.long)
        out, new_valid, pos = self._run(joining, slots, cache, valid, key_pos, left=True, hidden=hidden,
                                        around=around)
        valid, key_pos = new_valid, pos
        for s in joining:
            self.aligned[s.slot] = self.padding_tokens[s.slot]
        if self.rows and self.width != valid.shape[1]:
            grow = abs(self.width - valid.shape[1])
            if self.width < valid.shape[1]:  # the batch's rows get left padding
                pad_left(self.cache, grow)
                self.valid = torch.cat([torch.zeros(len(self.rows), grow, dtype=torch.bool), self.valid], 1)
                self.key_pos = torch.cat([torch.zeros(len(self.rows), grow, dtype=torch.long), self.key_pos], 1)
                moved = self.rows
            else:  # the newcomers' rows do
                pad_left(cache, grow)
                valid = torch.cat([torch.zeros(len(slots), grow, dtype=torch.bool), valid], 1)
                key_pos = torch.cat([torch.zeros(len(slots), grow, dtype=torch.long), key_pos], 1)
                moved = slots
            for slot in moved:
                self.aligned[slot] += grow
        if self.rows:
            append_rows(self.cache, cache)
            self.valid, self.key_pos = torch.cat([self.valid, valid]), torch.cat([self.key_pos, key_pos])
        else:
            self.cache, self.valid, self.key_pos = cache, valid, key_pos
        self.rows += slots
        return out

    def step(self, segments: list[Segment], hidden: bool = False, around=None) -> list[torch.Tensor]:
        """One forward of every row: each segment's tokens, padded on the right to the widest; rows without a
        segment are fed padding only."""
        out, self.valid, self.key_pos = self._run(segments, self.rows, self.cache, self.valid, self.key_pos,
                                                  left=False, hidden=hidden, around=around)
        return out

    def _run(self, segments: list[Segment], rows: list[int], cache, valid, key_pos, left: bool, hidden: bool,
             around=None):
        """Pad the segments into [R, W] inputs (left- or right-aligned), run the model on `cache`, count tokens;
        returns (each segment's output, valid and key positions grown by the W new columns)."""
        by_slot = {s.slot: s for s in segments}
        wide = max(s.width for s in segments)
        n = len(rows)
        ids = torch.full((n, wide), PAD_ID, dtype=torch.long)
        embeds = None
        if any(s.embeds is not None for s in segments):
            table = self.model.get_input_embeddings()
            embeds = torch.zeros(n, wide, table.weight.shape[1], dtype=table.weight.dtype, device=self.device)
        new_valid = torch.zeros(n, wide, dtype=torch.bool)
        pos = torch.zeros(n, wide, dtype=torch.long)
        own = torch.zeros(n, wide, wide, dtype=torch.bool)  # [R, W, W] new-token mask
        tails = []  # (row, columns, [w, t] mask over the row's last t real cache entries): see Segment.mask
        cols = {}
        for r, slot in enumerate(rows):
            seg = by_slot.get(slot)
            w = seg.width if seg else 0
            if w:
                at = slice(wide - w, wide) if left else slice(0, w)
                cols[slot] = (r, at)
                if seg.embeds is not None:
                    embeds[r, at] = seg.embeds.to(embeds.dtype)
                else:
                    ids[r, at] = torch.tensor(seg.tokens)
                    if embeds is not None:
                        embeds[r, at] = self.model.get_input_embeddings()(ids[r, at].to(self.device))
                new_valid[r, at] = True
                start = self.lengths[slot]
                pos[r, at] = torch.tensor(seg.positions) if seg.positions is not None else torch.arange(start,
                                                                                                          start + w)
                mask = torch.ones(w, w, dtype=torch.bool).tril() if seg.mask is None else seg.mask.cpu().bool()
                own[r, at, at] = mask[:, -w:]
                if mask.shape[1] > w:
                    tails.append((r, at, mask[:, :-w]))
            self.lengths[slot] = self.lengths.get(slot, 0) + w
            self.target_tokens[slot] += wide
            self.padding_tokens[slot] += wide - w
        mask = self._mask(valid, new_valid, key_pos, pos, own, tails)
        args = dict(position_ids=pos.to(self.device), attention_mask=mask, **with_cache(cache), use_cache=True)
        places = [torch.arange(cols[s.slot][0] * wide + cols[s.slot][1].start, cols[s.slot][0] * wide
                               + cols[s.slot][1].stop, device=self.device) for s in segments]  # [w] in [R * W]
        with attention_implementation(self.model, ATTENTION), (around(segments, places) if around else nullcontext()):
            if hidden or embeds is not None:
                if embeds is None:
                    embeds = self.model.get_input_embeddings()(ids.to(self.device))
                h = self.model.get_decoder()(inputs_embeds=embeds, **args).last_hidden_state  # [R, W, H]
                out = h if hidden else self.model.get_output_embeddings()(h)
            else:
                out = self.model(input_ids=ids.to(self.device), **args).logits  # [R, W, V]
        result = []
        for s in segments:
            r, at = cols[s.slot]
            result.append(out[r, at][-(s.keep or s.width):])
        return result, torch.cat([valid, new_valid], 1), torch.cat([key_pos, pos], 1)

    def _mask(self, valid, new_valid, key_pos, pos, own=None, tails=()) -> torch.Tensor:
        """[B, 1, W, L + W] bool: the row's real cache entries (its last t as a tail mask says), then its own new
        tokens (causal or `own`); a padded query row sees only itself (its output is discarded; an empty row would
        give NaN)."""
        rows, wide = new_valid.shape
        if own is None:
            own = torch.ones(wide, wide, dtype=torch.bool).tril().expand(rows, wide, wide)
        new_part = own & new_valid[:, None, :] & new_valid[:, :, None]  # [B, W, W]
        new_part = new_part | (torch.eye(wide, dtype=torch.bool) & ~new_valid[:, :, None])
        cache_part = valid[:, None, :].expand(rows, wide, valid.shape[1]) & new_valid[:, :, None]  # [B, W, L]
        for r, at, tail in tails:  # tail [w, t]: the row's last t real entries
            real = valid[r].nonzero()[-tail.shape[1]:, 0]
            cache_part[r, at][:, real] = tail
        allowed = torch.cat([cache_part, new_part], 2)
        if self.window is not None:
            keys = torch.cat([key_pos, pos], 1)  # [B, L + W]
            allowed = allowed & ((pos[:, :, None] - keys[:, None, :]) < self.window)
            allowed |= torch.cat([torch.zeros_like(cache_part), torch.eye(wide, dtype=torch.bool).expand(rows, -1, -1)
                                  ], 2) & ~allowed.any(-1, keepdim=True)
        return allowed[:, None].to(self.device)  # bool, True = attend (read by _attend's SDPA call)

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` real entries; its later entries become padding. Columns that are padding
        in every row are dropped from the cache (the batch keeps the longest accepted length)."""
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
            for layer in self.cache.layers:
                for states in (layer.keys, layer.values):  # [B, kv_heads, T, head_dim]
                    states[row, :, dst.to(states.device)] = states[row, :, src.to(states.device)]
            self.key_pos[row, dst] = self.key_pos[row, src]
        self.truncate(slot, start + len(offsets))

    def _crop(self) -> None:
        used = self.valid.any(0).nonzero()
        keep = int(used[-1]) + 1 if len(used) else 0
        if keep < self.width:
            drop_last(self.cache, self.width - keep)
            self.valid, self.key_pos = self.valid[:, :keep], self.key_pos[:, :keep]

    def release(self, slot: int) -> None:
        """A finished sample leaves the batch (its row is removed from the cache)."""
        row = self.rows.index(slot)
        keep = [r for r in range(len(self.rows)) if r != row]
        select_rows(self.cache, keep)
        self.valid, self.key_pos = self.valid[keep], self.key_pos[keep]
        self.rows.pop(row)
        self._crop()
