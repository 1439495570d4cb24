"""`ar`: the autoregressive baseline, one token per target forward, with its own KV-cache loop."""

from __future__ import annotations

import torch

from ..core.batch.cache import new_cache
from ..core.batch.forward import forward
from ..core.verify import next_token
from .base import DecodeMethod, Generation, register
from .batch_loop import Batchable


@register
class Autoregressive(Batchable, DecodeMethod):
    name = "ar"
    kind = "baseline"
    summary = "one token per forward (the reference every speedup is measured against)"

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        model = self.target.model
        gen = Generation()
        cache = new_cache(model)
        logits = forward(model, input_ids, cache, logits_to_keep=1)[-1]  # prefill: [V]
        while True:
            tok = next_token(logits, sampling, generator)
            if gen.emit([tok], self.target.tokenizer.stop_ids, max_new_tokens):
                return gen
            logits = forward(model, torch.tensor([[tok]], device=input_ids.device), cache)[-1]
