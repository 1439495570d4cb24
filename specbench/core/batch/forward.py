"""The one causal forward every method, profile and timer shares: new tokens appended to a KV cache."""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch

from .cache import drop_last
from ..machine.timing import call_ms


def _cache_keyword() -> str:
    """The keyword that hands a KV cache to a transformers model or decoder layer: `cache` where the installed
    transformers names it so (5.24 warns on `past_key_values` and announces its removal in 5.40), else
    `past_key_values` (earlier 5.x, e.g. the GPU machine's 5.17)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return "cache" if "cache" in inspect.signature(LlamaDecoderLayer.forward).parameters else "past_key_values"


CACHE_KEYWORD = _cache_keyword()


def with_cache(cache) -> dict:
    """{CACHE_KEYWORD: cache}: pass as **with_cache(cache) to a model or decoder layer call."""
    return {CACHE_KEYWORD: cache}


def forward(model, input_ids: torch.Tensor, cache, logits_to_keep: int = 0) -> torch.Tensor:
    """Causal forward of input_ids [1, n] appended to `cache`; returns logits [n or logits_to_keep, V]."""
    past = cache.get_seq_length()
    n = input_ids.shape[1]
    position_ids = torch.arange(past, past + n, device=input_ids.device).unsqueeze(0)  # [1, n]
    out = model(input_ids=input_ids, position_ids=position_ids, **with_cache(cache), use_cache=True,
                logits_to_keep=logits_to_keep)
    return out.logits[0]


# Model types whose causal-LM forward multiplies the logits by `logits_scaling` (every other family that has the
# field, Granite's, divides by it).
MULTIPLY_LOGITS_SCALING = ("hyperclovax",)


def target_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The target's logits from its decoder's final (normed) hidden states [..., H] -> float [..., V]: the LM head,
    then the model's own final processing, as its causal-LM forward applies it. Every method reads the target's
    logits from hidden states through this function: sampling from a bare head's logits is lossy at T > 0 on these
    models. Known processing (config fields; None or 0 means none): Cohere's `logit_scale` (logits * s), Granite's
    `logits_scaling` (logits / s), HyperCLOVAX's `logits_scaling` (logits * s), Gemma 2/3's
    `final_logit_softcapping` (cap * tanh(logits / cap)). check_final_logits proves the match once per loaded model."""
    logits = model.get_output_embeddings()(hidden).float()  # [..., V]
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "") or ""
    scale = getattr(config, "logit_scale", None)
    if scale and model_type.startswith("cohere"):  # (a CLIP-like logit_scale is no LM's)
        logits = logits * scale
    scaling = getattr(config, "logits_scaling", None)
    if scaling:
        logits = logits * scaling if model_type.startswith(MULTIPLY_LOGITS_SCALING) else logits / scaling
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def check_final_logits(model, name: str, device: torch.device) -> None:
    """Refuse a model whose causal-LM forward processes its logits in a way target_logits does not reproduce: the
    tree and batched steps read logits through target_logits, so a mismatch would make them sample (T > 0) or pick
    (near ties) from another distribution than `ar`. One forward of four tokens, at load."""
    from ...errors import SpecbenchError

    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab < 8:
        return
    ids = torch.tensor([[1, 2, 3, 4]], device=device) % vocab  # [1, 4]
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        if not out.hidden_states:
            return  # a model that does not return hidden states is never read through target_logits
        want = out.logits.float()  # [1, 4, V]
        got = target_logits(model, out.hidden_states[-1]).to(want.device)
    tol = 1e-3 if out.logits.dtype == torch.float32 else 5e-2  # 16-bit heads round differently in the two paths
    worst = float((got - want).abs().max())
    if not torch.isfinite(torch.tensor(worst)) or worst > tol * max(1.0, float(want.abs().max())):
        raise SpecbenchError(
            f"{name}: its forward's final logits differ from the LM head's by up to {worst:.3g} after the "
            f"processing specbench knows (model type {getattr(model.config, 'model_type', '?')}): the methods' steps "
            "would decode another distribution. This architecture's logit processing is not supported yet.")


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
    layers = getattr(getattr(model, "get_decoder", lambda: None)(), "layers", None)
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
