"""Batch 1's engine: the batch engine protocol (engine.py) for one sample, over the model's own DynamicCache.

Every method decodes through one step over the protocol; at batch 1 this engine makes that step as cheap as a plain
decode loop: a plain segment (tokens appended causally) is the one causal forward every profile times
(forward.py); a segment with its own inputs (a tree: embeddings, positions, a visibility mask) runs the decoder
once with an additive 4-D mask [1, 1, w, past + w] (additive: a bool 4-D mask is added numerically under eager
attention), sliding windows applied to it as transformers would (cache.window_mask). No packing or
padding index work: the cache is the model's own, cropped and compacted in place (cache.py).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ...errors import SpecbenchError
from ..machine.forward_clock import clock_of
from ..model.placement import input_device
from ..tree import additive
from .cache import crop_to, keep_positions, new_cache, window_mask
from . import decoder
from .forward import forward
from .ragged import Segment, packed_embeddings


class SingleSequence:
    """One slot: its cache is a DynamicCache (None until a sample joins)."""

    def __init__(self, model):
        self.model = model
        self.device = input_device(model)  # the embedding's: inputs go there (looked up once, not every step)
        self.cache = None
        self.rows: list[int] = []
        self.target_tokens: dict[int, int] = {}
        self.padding_tokens: dict[int, int] = {}

    @property
    def lengths(self) -> dict[int, int]:
        return {slot: self.cache.get_seq_length() for slot in self.rows}

    def kv_padding(self, slot: int) -> int:
        return 0

    def forward(self, joining: list[Segment], segments: list[Segment], hidden: bool = False, around=None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if len(joining) + len(segments) > 1:
            raise SpecbenchError("the single-sequence engine decodes one sample at a time")
        if not joining and not segments:
            return [], []
        for s in joining:  # a newcomer: a fresh cache
            self.cache = new_cache(self.model)
            self.rows = [s.slot]
            self.target_tokens[s.slot] = self.padding_tokens[s.slot] = 0
        seg = (joining or segments)[0]
        out = self._run(seg, hidden, around)
        self.target_tokens[seg.slot] += seg.width
        return ([out], []) if joining else ([], [out])

    def _run(self, seg: Segment, hidden: bool, around) -> torch.Tensor:
        model, cache = self.model, self.cache
        plain = seg.embeds is None and seg.mask is None and seg.positions is None and not hidden and around is None
        device = self.device
        if plain:  # tokens appended causally: the shared forward, logits of the last `keep` rows only
            return forward(model, torch.tensor([seg.tokens], device=device), cache, logits_to_keep=seg.keep)
        past, w = cache.get_seq_length(), seg.width
        keep = seg.keep or w
        embeds = packed_embeddings(model, [seg], device)  # [1, w, H]
        positions = (torch.tensor([seg.positions], device=device) if seg.positions is not None
                     else torch.arange(past, past + w, device=device)[None])  # [1, w]
        mask = additive(seg.visible(past).to(device), embeds.dtype)  # [1, 1, w, past + w]
        if hasattr(model, "config"):  # a transformers model: its sliding windows (a drafter module has none)
            mask = window_mask(model, mask, positions)
        places = [torch.arange(w, device=device)]  # the segment's inputs are rows 0..w-1 of [w, H]
        clock = clock_of(model)
        # the decoder and the head on the kept rows: one span of the model's clock
        with around([seg], places) if around else nullcontext(), clock.forward(w):
            h = decoder.hidden(model, None, positions, cache, mask, inputs_embeds=embeds)[0, w - keep:]  # [keep, H]
            out = h if hidden else decoder.logits(model, h)
        if hidden:
            clock.output(h)  # a method's head call on these rows is the target's forward too
        return out

    def truncate(self, slot: int, length: int) -> None:
        crop_to(self.cache, length)

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        keep_positions(self.cache, start, offsets)

    def release(self, slot: int) -> None:
        self.rows.remove(slot)
        self.cache = None
