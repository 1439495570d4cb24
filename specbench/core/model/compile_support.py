"""Which models `--compile`'s static engine (core/batch/static.py) decodes correctly, read from the config before
the weights load (run/compiled.check_model refuses the rest with the reason)."""

from __future__ import annotations


def unsupported(config) -> str | None:
    """Why the static engine cannot decode a model of this config correctly, or None: it caches and masks full and
    sliding-window attention layers only (chunked attention, linear attention, state-space or convolution mixers
    would compute something else), with one window size (its masks carry one windowed variant beside the full one,
    as transformers' per-layer-kind masks do)."""
    from ..batch.attention import ATTENTION_LAYERS
    from ..batch.cache import read_windows

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    name = getattr(text, "model_type", None) or type(config).__name__
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        kinds = set(get_layer_types_and_kwargs(text)[0])
    except Exception:  # a transformers release without the helper: the config's own field
        kinds = set(getattr(text, "layer_types", None) or ())
    odd = sorted(kinds - ATTENTION_LAYERS - {"dummy"})
    if odd:
        return (f"{name} has {', '.join(odd)} layers; the static engine caches and masks full and sliding-window "
                "attention only")
    sizes = sorted({w for w in read_windows(config) if w is not None})
    if len(sizes) > 1:
        return f"{name} has sliding windows of different sizes {sizes}; the static engine's masks carry one"
    return None
