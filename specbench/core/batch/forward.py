"""The one causal forward every method, profile and timer shares: new tokens appended to a KV cache."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .cache import drop_last
# the cache keyword and the target's logits live with the decoder adapter; importable from here too
from .decoder import CACHE_KEYWORD, decoder_layers, target_logits, with_cache  # noqa: F401
from ..machine.forward_clock import clock_of, measuring
from ..machine.timing import call_ms


def forward(model, input_ids: torch.Tensor, cache, logits_to_keep: int = 0) -> torch.Tensor:
    """Causal forward of input_ids [1, n] appended to `cache`; returns logits [n or logits_to_keep, V] (one span of
    the model's clock: core/machine/forward_clock.py)."""
    past = cache.get_seq_length()
    n = input_ids.shape[1]
    position_ids = torch.arange(past, past + n, device=input_ids.device).unsqueeze(0)  # [1, n]
    with clock_of(model).forward(input_ids.numel()):
        out = model(input_ids=input_ids, position_ids=position_ids, **with_cache(cache), use_cache=True,
                    logits_to_keep=logits_to_keep)
    return out.logits[0]


def timed_forward(model, ids: torch.Tensor, cache, device: torch.device) -> float:
    """Milliseconds of one forward of ids [1, n] on top of the cache (the n new entries are dropped after)."""
    ms = call_ms(lambda: forward(model, ids, cache), device)  # CUDA events on a GPU, perf_counter on a CPU
    drop_last(cache, ids.shape[1])
    return ms


class FedTokens:
    """Tokens fed through a model's decoder while counting (count_fed_tokens), and the seconds spent inside the
    model's forwards (decoder + LM head on its output), set when the counting ends (on a GPU the CUDA event pairs
    are read then, not per forward)."""

    def __init__(self):
        self.tokens = 0
        self.forward_s = 0.0


@contextmanager
def count_fed_tokens(model):
    """Count the tokens every forward of `model` feeds through its decoder (plain, tree and prompt-token forwards
    alike, rows x width as the engines feed them: a drafter's own forwards are not counted), and time those forwards
    (counter.forward_s). The engines and `forward` count their own calls on the model's clock
    (core/machine/forward_clock.py); both numbers are set when the block ends."""
    counter = FedTokens()
    with measuring(model) as clock:
        try:
            yield counter
        finally:
            counter.tokens = clock.tokens
            counter.forward_s = clock.finish()
