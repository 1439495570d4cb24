"""The batch engine protocol every decode step runs on, and the engine of each batching mode.

A step (methods/batch_loop.py for the chain methods, methods/tree/method.py for the tree methods) drives samples
through slots of one engine: newcomers join with their prompt, active samples feed their new tokens (the last token
plus drafts, or a tree with its mask and positions), rejected entries leave by truncate / keep_offsets, a finished
sample is released. Three engines implement it:
- `single` (single.py): one sample over the model's own DynamicCache: batch 1, as fast as a plain decode loop;
  under `--compile` (a model with a core/model/compile.Compiled state) static.py's, over a static cache, compiled;
- `unpadded` (ragged.py): EMS-SD's unpad KV cache and unpad input tokens;
- `padded` (padded.py): the vanilla padded batch EMS-SD compares against.
Under `--compile` both batching modes of a model with a compile state run static_batch.py's engine: every slot at
one static shape a step, compiled (padded to the step's bucket: the modes' comparison is an eager one).
Every engine measures its own model calls: one span of the model's clock (core/machine/forward_clock.py) around
the decoder call and the head on the rows it keeps, counting the tokens it fed; no hook sits on the model.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ...errors import SpecbenchError
from .ragged import Segment

MODES = ("unpadded", "padded")  # the batching modes a user picks (`--batching`); `single` is batch 1's own


class BatchEngine(Protocol):
    """Slots of one model's KV cache that samples join, step, roll back and leave."""

    rows: list[int]  # the active slots
    target_tokens: dict[int, int]  # slot -> tokens fed through the model for it (padding included)
    padding_tokens: dict[int, int]  # slot -> of those, padding

    @property
    def lengths(self) -> dict[int, int]:
        """slot -> entries its cache holds."""

    def kv_padding(self, slot: int) -> int:
        """Padded KV entries the slot holds (EMS-SD Appendix B's padding length; 0 without padding)."""

    def forward(self, joining: list[Segment], segments: list[Segment], hidden: bool = False, around=None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Newcomers' prefill segments and active slots' new tokens -> (newcomers' outputs, segments' outputs):
        logits [keep or w, V], or the decoder's normed hidden states [keep or w, H] with `hidden`. `around(segments,
        places)`: a context manager entered around the model call, told where each segment's inputs lie in the
        hidden states flattened to [N, H] (places: a LongTensor [w] per segment; Hidden Transfer's layer hooks)."""

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` entries."""

    def keep_offsets(self, slot: int, start: int, offsets: list[int]) -> None:
        """Tree compaction: of the slot's entries from `start`, keep those at `offsets` (the accepted path)."""

    def release(self, slot: int) -> None:
        """The slot's sample left."""


def engine(model, mode: str, slots: int, device: torch.device) -> BatchEngine:
    """The engine of a batching mode for `slots` samples of `model`."""
    from .padded import PaddedBatch
    from .ragged import RaggedBatch
    from .single import SingleSequence

    if mode == "single":
        if slots != 1:
            raise ValueError(f"the single-sequence engine holds one sample, not {slots}")
        from ..model.compile import state_of

        compiled = state_of(model)  # --compile: core/model/compile.py
        if compiled is not None:
            from .static import StaticSequence

            return StaticSequence(model, compiled)
        return SingleSequence(model)
    if mode in MODES:
        from ..model.compile import state_of

        compiled = state_of(model)  # --compile: core/model/compile.py
        if compiled is not None:
            from .static_batch import StaticBatch

            return StaticBatch(model, compiled, slots)
    if mode == "unpadded":
        return RaggedBatch(model, slots)
    if mode == "padded":
        return PaddedBatch(model, device)
    raise SpecbenchError(f"--batching {mode!r}: choose unpadded, padded or both")
