"""Will a model fit? The memory a model needs (weights in its dtype, the packed copy of float32 CPU linears, a KV
cache, working room) against what this machine has free, checked before anything is built."""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import SpecbenchError
from .cpu_kernels import MAX_PREPACK_PARAMS

RUNTIME_HEADROOM = 512 * 2**20  # activations, logits and allocator slack beyond weights and KV cache
KV_HEADROOM_TOKENS = 4096  # the KV cache a check counts on: profile's longest KV plus a long prompt and reply


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory a new model can take: free memory of the GPU, else MemAvailable from /proc/meminfo (None where
    unknown: no check)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_need(config, dtype: torch.dtype, device: torch.device) -> tuple[int, int]:
    """(parameter count, bytes) a model of `config` takes loaded in `dtype` on `device`: its weights, the packed
    copy of float32 CPU linear weights (models._finish), a KV cache of KV_HEADROOM_TOKENS and RUNTIME_HEADROOM. The
    parameters are counted exactly on the meta device (nothing allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    params = meta.num_parameters()
    size = torch.tensor([], dtype=dtype).element_size()
    need = params * size
    if device.type == "cpu" and dtype == torch.float32 and params <= MAX_PREPACK_PARAMS:
        need += sum(m.weight.numel() for m in meta.modules() if type(m) is torch.nn.Linear) * 4
    text = config.get_text_config(decoder=True)
    heads = getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", 1)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    tokens = min(int(getattr(text, "max_position_embeddings", 2048) or 2048), KV_HEADROOM_TOKENS)
    need += 2 * text.num_hidden_layers * heads * head_dim * tokens * size + RUNTIME_HEADROOM
    return params, need


def check_memory(what: str, config, dtype: torch.dtype, device: torch.device, hint: str = "") -> None:
    """Refuse (SpecbenchError naming the need and what is free) before building a model that cannot fit on one
    device; a model built on CPU and moved to a GPU needs the room on both. (A device map: fit_devices.py.)"""
    try:
        params, need = memory_need(config, dtype, device)
    except Exception:  # an architecture that cannot be built on the meta device: no check rather than no model
        return
    places = [device] if device.type == "cpu" else [torch.device("cpu"), device]
    for place in places:
        free = free_memory_bytes(place)
        if free is None or need <= free:
            continue
        where = "GPU memory free" if place.type == "cuda" else "memory available (MemAvailable)"
        advice = hint or ("use a smaller model" + (", or --dtype bfloat16 (half the memory)"
                                                   if dtype == torch.float32 else ""))
        raise SpecbenchError(f"{what} needs about {need / 2**30:.1f} GiB ({params / 1e9:.2f}B parameters in "
                             f"{str(dtype).removeprefix('torch.')}, plus KV cache and working memory), but only "
                             f"{free / 2**30:.1f} GiB of {where} is free on this machine: {advice}.")
