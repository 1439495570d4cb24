"""The one adapter through which a model reaches the batch engines: its decoder (token ids or embeddings at
explicit positions -> normed final hidden states [B, n, H]) and its head (hidden states -> logits [..., V]).

Two kinds of model run on the engines. A transformers causal LM (the target; a drafter loaded from a model spec): its
decoder is its base model (embeddings, decoder layers, final norm) and its head the LM head followed by the model's
own final processing (target_logits). A specbench drafter module (sd's drafter, the feature drafter of EAGLE and
ParallelSpec) subclasses DraftModule and supplies `hidden` and `logits` itself. The engines call `hidden`, `logits`
and `decoder_layers` here and never ask which kind they hold.
"""

from __future__ import annotations

import inspect

import torch

from ..machine.forward_clock import clock_of

def _cache_keyword() -> str:
    """The keyword that hands a KV cache to a transformers model or decoder layer: `cache` where the installed
    transformers names it so (releases that have it warn on `past_key_values` and announce its removal), else
    `past_key_values` (releases without it)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return "cache" if "cache" in inspect.signature(LlamaDecoderLayer.forward).parameters else "past_key_values"


CACHE_KEYWORD = _cache_keyword()


def with_cache(cache) -> dict:
    """{CACHE_KEYWORD: cache}: pass as **with_cache(cache) to a model or decoder layer call."""
    return {CACHE_KEYWORD: cache}


# Model types whose causal-LM forward multiplies the logits by `logits_scaling` (every other family that has the
# field, Granite's, divides by it).
MULTIPLY_LOGITS_SCALING = ("hyperclovax",)


def target_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The target's logits from its decoder's final (normed) hidden states [..., H] -> float [..., V] (final_logits),
    timed as the target's forward when `hidden` is the output an engine just returned (core/machine/forward_clock.py).
    Every method reads the target's logits from hidden states through this function: sampling from a bare head's
    logits is lossy at T > 0 on these models."""
    with clock_of(model).head(hidden):
        return final_logits(model, hidden)


def target_logits_at(model, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The target's logits at `rows` of hidden states [q, H] -> float [len(rows), V], in that order: the head on
    those rows only, timed as the target's forward when `hidden` is the output an engine just returned. For a verify
    step whose head needs only some of its rows (lookahead's root, trie and last window level, not its other levels):
    the gathered copy is still the forward's own head, where target_logits on the copy would count it as host time
    (forward_clock.py; lookahead's head was ~3 ms of a ~16 ms compiled step, booked as host work)."""
    with clock_of(model).head(hidden):
        return final_logits(model, hidden[rows])


def final_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states [..., H] -> float logits [..., V]: the LM head, then the model's own final processing, as its
    causal-LM forward applies it; no clock (the engines call it inside their own span, a compiled step inside its
    graph). Known processing (config fields; None or 0 means none): Cohere's `logit_scale` (logits * s), Granite's
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


class DraftModule(torch.nn.Module):
    """Base of specbench's own drafter modules: the decoder and head the engines run (see the module docstring).
    `hidden`'s attention_kwargs reach the attention function (the batch engines' packed or padded attention,
    core/batch/ragged.py and core/batch/padded.py, whose masks they carry)."""

    layers: torch.nn.ModuleList
    config: object  # its layers' config (a copy of the target's): they read the attention function's name there

    def set_attn_implementation(self, name: str) -> None:
        """The registered attention function the layers call, as a transformers model sets it."""
        self.config._attn_implementation = name

    def hidden(self, input_ids: torch.Tensor | None, position_ids: torch.Tensor, cache=None,
               attention_mask: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               **attention_kwargs) -> torch.Tensor:
        """input_ids [B, n] or inputs_embeds [B, n, H] at position_ids [B, n] -> normed hidden states [B, n, H];
        attention_mask: additive 4-D, or None for causal over the cache."""
        raise NotImplementedError

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states [..., H] -> logits over the full vocabulary [..., V]."""
        raise NotImplementedError


def decoder_module(model) -> torch.nn.Module:
    """The module the hidden states come out of: a causal LM's base model, a drafter module itself."""
    return model if isinstance(model, DraftModule) else getattr(model, "base_model", model)


def decoder_layers(model):
    """The decoder layers of `model` (a causal LM's or a drafter module's own), [] when it has none."""
    return getattr(decoder_module(model), "layers", None) or []


def hidden(model, input_ids: torch.Tensor | None, position_ids: torch.Tensor, cache=None,
           attention_mask: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
           **attention_kwargs) -> torch.Tensor:
    """The decoder's normed final hidden states [B, n, H] of input_ids [B, n] or inputs_embeds [B, n, H] at
    position_ids [B, n], appended to `cache` when one is given (attention_mask: additive 4-D, or None for the
    model's own causal mask)."""
    if isinstance(model, DraftModule):
        return model.hidden(input_ids, position_ids, cache, attention_mask, inputs_embeds=inputs_embeds,
                            **attention_kwargs)
    ids = {"input_ids": input_ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
    out = model.base_model(**ids, attention_mask=attention_mask, position_ids=position_ids, **with_cache(cache),
                           use_cache=cache is not None, **attention_kwargs)
    return out.last_hidden_state


def logits(model, h: torch.Tensor) -> torch.Tensor:
    """Hidden states [..., H] -> logits [..., V]: the target's with its final processing (float), a drafter
    module's own (-inf outside its --vocab-top tokens). No clock: the engines call it inside their span."""
    return model.logits(h) if isinstance(model, DraftModule) else final_logits(model, h)
