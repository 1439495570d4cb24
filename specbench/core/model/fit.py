"""Will a model fit? What a command needs (memory_need.py: weights in its dtype, KV cache at its context and batch,
activations, drafter or training state, working memory) against what this machine has free, checked before anything
is built; a refusal says the numbers part by part and flags that would fit."""

from __future__ import annotations

from dataclasses import replace

import torch

from ...errors import SpecbenchError
from ..machine.memory import available_bytes
from .memory_need import GIB, KV_HEADROOM_TOKENS, RUNTIME_HEADROOM, Need, current, need  # noqa: F401  (re-exported)

SUGGEST_SHARE = 0.9  # a suggested --max-memory: this share of what the device has free


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory a new model can take: free memory of the GPU, else MemAvailable from /proc/meminfo (None where
    unknown: no check)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_bytes()


def memory_need(config, dtype: torch.dtype, device: torch.device) -> tuple[int, int]:
    """(parameter count, bytes) a model of `config` takes loaded in `dtype` on `device` for the planned workload
    (memory_need.need; without one: weights, the packed oneDNN copy, KV_HEADROOM_TOKENS of KV, RUNTIME_HEADROOM)."""
    found = need("", config, dtype, device)
    return found.params, found.total


def check_memory(what: str, config, dtype: torch.dtype, device: torch.device, hint: str = "") -> None:
    """Refuse (SpecbenchError: the need part by part, what is free, flags that fit) before building a model that
    cannot fit on one device; a model built on CPU and moved to a GPU needs the room on both. (A device map:
    fit_devices.py.)"""
    try:
        found = need(what, config, dtype, device)
    except Exception:  # an architecture that cannot be built on the meta device: no check rather than no model
        return
    places = [device] if device.type == "cpu" else [torch.device("cpu"), device]
    for place in places:
        free = free_memory_bytes(place)
        if free is None or found.total <= free:
            continue
        where = "GPU memory free" if place.type == "cuda" else "memory available (MemAvailable)"
        raise SpecbenchError(f"{what} {found.said()}, but only {free / GIB:.1f} GiB of {where} is free on this "
                             f"machine. {fitting_flags(found, config, device, free, hint)}")


def fitting_flags(found: Need, config, device: torch.device, free: int, hint: str = "") -> str:
    """What would fit, in the order a user would try it: a 16-bit dtype, a smaller batch, a device map that spills
    to disk, then the caller's hint (a smaller preset)."""
    said = []
    if found.dtype == torch.float32:
        half = need(found.what, config, torch.bfloat16, device, found.workload)
        said.append(f"--dtype bfloat16 (needs {half.total / GIB:.1f} GiB"
                    + (")" if half.total <= free else ", still too much)"))
    work = found.workload
    if work.batch > 1:
        smaller = work.at_batch or (lambda b: replace(work, batch=b))
        fits = [b for b in range(work.batch - 1, 0, -1)
                if need(found.what, config, found.dtype, device, smaller(b)).total <= free]
        if fits:
            said.append(f"--batch-size {fits[0]} (the KV cache and activations grow with it)")
    cap = max(1, int(free * SUGGEST_SHARE / GIB))
    where = "cpu" if device.type == "cpu" else f"{device.index or 0}"
    if not found.what.startswith("random:"):  # random weights are built whole before a map could place them
        said.append(f"--device-map auto --max-memory {where}={cap}GiB (the other "
                    f"{max(0.0, (found.parts['weights'] - cap * GIB) / GIB):.0f} GiB of weights offloaded to disk: "
                    "slow, but it runs)")
    preset = largest_preset(found, free) if found.what.startswith("random:") else None
    if preset:
        said.append(f"the largest preset that fits here: --model random:{preset}")
    elif hint:
        said.append(hint)
    return "Try " + "; or ".join(said) + "."


def largest_preset(found: Need, free: int) -> str | None:
    """The random-weight preset with the most parameters whose weights in the same dtype, with the same share of
    everything else, fit in `free` (counted from the presets' fields: no model built)."""
    try:
        from .naming import RANDOM_PRESETS
        from .presets import parameter_count
    except ImportError:
        return None
    per_param = (found.total - RUNTIME_HEADROOM) / max(found.params, 1)
    sizes = {}
    for name, cfg in RANDOM_PRESETS.items():
        try:
            sizes[name] = parameter_count(cfg)
        except (KeyError, TypeError):
            continue
    fits = [n for n, p in sizes.items() if p * per_param + RUNTIME_HEADROOM <= free and f"random:{n}" != found.what]
    return max(fits, key=sizes.get) if fits else None
