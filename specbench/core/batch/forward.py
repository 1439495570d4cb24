"""The one causal forward every method, profile and timer shares: new tokens appended to a KV cache."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .cache import drop_last
# the cache keyword and the target's logits live with the decoder adapter; importable from here too
from .decoder import CACHE_KEYWORD, decoder_layers, target_logits, with_cache  # noqa: F401
from ..machine.timing import call_ms


def forward(model, input_ids: torch.Tensor, cache, logits_to_keep: int = 0) -> torch.Tensor:
    """Causal forward of input_ids [1, n] appended to `cache`; returns logits [n or logits_to_keep, V]."""
    past = cache.get_seq_length()
    n = input_ids.shape[1]
    position_ids = torch.arange(past, past + n, device=input_ids.device).unsqueeze(0)  # [1, n]
    out = model(input_ids=input_ids, position_ids=position_ids, **with_cache(cache), use_cache=True,
                logits_to_keep=logits_to_keep)
    return out.logits[0]


def timed_forward(model, ids: torch.Tensor, cache, device: torch.device) -> float:
    """Milliseconds of one forward of ids [1, n] on top of the cache (the n new entries are dropped after)."""
    ms = call_ms(lambda: forward(model, ids, cache), device)  # CUDA events on a GPU, perf_counter on a CPU
    drop_last(cache, ids.shape[1])
    return ms


class FedTokens:
    """Tokens that entered a model's first decoder layer while counting (count_fed_tokens), and the seconds spent
    inside the model's forwards (core/machine/forward_clock.py: decoder + LM head on its output), set when the
    counting ends (on a GPU the CUDA event pairs are read then, not per forward)."""

    def __init__(self):
        self.tokens = 0
        self.forward_s = 0.0


@contextmanager
def count_fed_tokens(model):
    """Count the tokens every forward of `model` feeds through it (plain, tree and prompt-token forwards alike:
    counted where they enter the first decoder layer [B, n, H] -> B x n; a drafter's own layers are not counted),
    and time those forwards (counter.forward_s, read when the block ends)."""
    counter = FedTokens()
    layers = decoder_layers(model)
    if not layers:
        yield counter
        return

    def hook(_module, args, kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        if hidden is not None:
            counter.tokens += hidden.shape[0] * hidden.shape[1]

    from ..machine.forward_clock import ForwardClock

    clock = ForwardClock(model)
    handles = [layers[0].register_forward_pre_hook(hook, with_kwargs=True), *clock.attach()]
    try:
        yield counter
    finally:
        for handle in handles:
            handle.remove()
        counter.forward_s = clock.finish()
