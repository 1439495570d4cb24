"""The vanilla way of batching speculative decoding (EMS-SD §3.1): the engine of `--batching padded`.

One transformers DynamicCache [B, kv_heads, L, head_dim] whose rows all have the same length L, and a mask of which
entries are real. Prompts are left-padded to the longest; each forward feeds every row the same width W (the widest
sample's new tokens, the others padded); after verification the cache keeps the longest accepted length of the batch
and every other row's extra entries stay as padding (masked, never attended). A 4-D additive attention mask
[B, 1, W, L + W] hides the padding; every padding token fed through the model is counted (`padding_tokens`), and so
are the padded KV entries a sample holds when it leaves (`kv_padding`, EMS-SD Appendix B's padding length).
"""

from __future__ import annotations

import torch

from .cache import append_rows, drop_last, new_cache, pad_left, select_rows, sliding_windows
from .ragged import Segment

PAD_ID = 0  # the token fed at padded positions (masked: its value does not matter)


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
        windows = {w for w in sliding_windows(model) if w is not None}
        self.window = min(windows) if windows else None

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def kv_padding(self, slot: int) -> int:
        """Padded KV entries the slot's row holds beyond its prompt alignment (Appendix B's padding, summed)."""
        row = self.rows.index(slot)
        return int((~self.valid[row]).sum()) - self.aligned[slot]

    def admit(self, prompts: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Prefill new samples (left-padded to the longest) and stack them under the batch; returns each slot's
        logits at its last prompt token [V]."""
        slots = list(prompts)
        longest = max(len(p) for p in prompts.values())
        ids = torch.full((len(slots), longest), PAD_ID, dtype=torch.long)
        valid = torch.zeros(len(slots), longest, dtype=torch.bool)
        pos = torch.zeros(len(slots), longest, dtype=torch.long)
        for r, slot in enumerate(slots):
            n = len(prompts[slot])
            ids[r, longest - n:] = torch.tensor(prompts[slot])
            valid[r, longest - n:] = True
            pos[r, longest - n:] = torch.arange(n)
        cache = new_cache(self.model)
        mask = self._mask(torch.zeros(len(slots), 0, dtype=torch.bool), valid, torch.zeros(len(slots), 0,
                                                                                          dtype=torch.long), pos)
        out = self.model(input_ids=ids.to(self.device), position_ids=pos.to(self.device), attention_mask=mask,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        for r, slot in enumerate(slots):
            n = len(prompts[slot])
            self.lengths[slot] = n
            self.target_tokens[slot] = longest
            self.padding_tokens[slot] = longest - n
            self.aligned[slot] = longest - n
        # align the two caches on the left, then stack
        if self.rows and self.width != longest:
            grow = abs(self.width - longest)
            if self.width < longest:
                pad_left(self.cache, grow)
                self.valid = torch.cat([torch.zeros(len(self.rows), grow, dtype=torch.bool), self.valid], 1)
                self.key_pos = torch.cat([torch.zeros(len(self.rows), grow, dtype=torch.long), self.key_pos], 1)
                for slot in self.rows:
                    self.aligned[slot] += grow
            else:
                pad_left(cache, grow)
                valid = torch.cat([torch.zeros(len(slots), grow, dtype=torch.bool), valid], 1)
                pos = torch.cat([torch.zeros(len(slots), grow, dtype=torch.long), pos], 1)
                for slot in slots:
                    self.aligned[slot] += grow
        if self.rows:
            append_rows(self.cache, cache)
            self.valid, self.key_pos = torch.cat([self.valid, valid]), torch.cat([self.key_pos, pos])
        else:
            self.cache, self.valid, self.key_pos = cache, valid, pos
        self.rows += slots
        return {slot: out.logits[r, -1] for r, slot in enumerate(slots)}

    def forward(self, prompts: dict[int, list[int]], segments: list[Segment]
                ) -> tuple[dict[int, torch.Tensor], list[torch.Tensor]]:
        """One padded forward of the active rows' segments, then the newcomers' own padded prefill (a padded batch
        cannot pack a prompt with decode steps); returns (newcomers' last-token logits [V], each segment's logits)."""
        out = self.step(segments) if segments else []
        return (self.admit(prompts) if prompts else {}), out

    def step(self, segments: list[Segment]) -> list[torch.Tensor]:
        """One forward of every row: each segment's tokens, padded to the widest; returns each segment's logits
        [keep or w, V]. Rows without a segment are fed padding only."""
        by_slot = {s.slot: s for s in segments}
        wide = max(len(s.tokens) for s in segments)
        rows = len(self.rows)
        ids = torch.full((rows, wide), PAD_ID, dtype=torch.long)
        new_valid = torch.zeros(rows, wide, dtype=torch.bool)
        pos = torch.zeros(rows, wide, dtype=torch.long)
        own = torch.zeros(rows, wide, wide, dtype=torch.bool)  # [B, W, W] new-token mask
        for r, slot in enumerate(self.rows):
            seg = by_slot.get(slot)
            w = len(seg.tokens) if seg else 0
            if w:
                ids[r, :w] = torch.tensor(seg.tokens)
                new_valid[r, :w] = True
                start = self.lengths[slot]
                pos[r, :w] = torch.tensor(seg.positions) if seg.positions is not None else torch.arange(start,
                                                                                                         start + w)
                own[r, :w, :w] = torch.ones(w, w, dtype=torch.bool).tril() if seg.mask is None else seg.mask.bool()
                pos[r, w:] = pos[r, w - 1]
            self.lengths[slot] = self.lengths.get(slot, 0) + w
            self.target_tokens[slot] += wide
            self.padding_tokens[slot] += wide - w
        mask = self._mask(self.valid, new_valid, self.key_pos, pos, own)
        out = self.model(input_ids=ids.to(self.device), position_ids=pos.to(self.device), attention_mask=mask,
                         past_key_values=self.cache, use_cache=True)
        self.valid = torch.cat([self.valid, new_valid], 1)
        self.key_pos = torch.cat([self.key_pos, pos], 1)
        result = []
        for s in segments:
            w = len(s.tokens)
            result.append(out.logits[self.rows.index(s.slot), :w][-(s.keep or w):])
        return result

    def _mask(self, valid, new_valid, key_pos, pos, own=None) -> torch.Tensor:
        """Additive [B, 1, W, L + W]: the row's real cache entries, then its own new tokens (causal or `own`); a
        padded query row sees only itself (its output is discarded; an empty row would give NaN)."""
        rows, wide = new_valid.shape
        if own is None:
            own = torch.ones(wide, wide, dtype=torch.bool).tril().expand(rows, wide, wide)
        new_part = own & new_valid[:, None, :] & new_valid[:, :, None]  # [B, W, W]
        new_part = new_part | (torch.eye(wide, dtype=torch.bool) & ~new_valid[:, :, None])
        cache_part = valid[:, None, :].expand(rows, wide, valid.shape[1]) & new_valid[:, :, None]  # [B, W, L]
        allowed = torch.cat([cache_part, new_part], 2)
        if self.window is not None:
            keys = torch.cat([key_pos, pos], 1)  # [B, L + W]
            allowed = allowed & ((pos[:, :, None] - keys[:, None, :]) < self.window)
            allowed |= torch.cat([torch.zeros_like(cache_part), torch.eye(wide, dtype=torch.bool).expand(rows, -1, -1)
                                  ], 2) & ~allowed.any(-1, keepdim=True)
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return mask[:, None].to(self.device)

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` real entries; its later entries become padding. Columns that are padding
        in every row are dropped from the cache (the batch keeps the longest accepted length)."""
        row = self.rows.index(slot)
        real = self.valid[row].nonzero()[:, 0]
        if length < len(real):
            self.valid[row, real[length]:] = False
        self.lengths[slot] = length
        self._crop()

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
