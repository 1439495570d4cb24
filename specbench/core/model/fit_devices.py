"""Will a model fit its device map? Every device of the map (GPUs, CPU, disk) against what that device has free,
checked on the meta device before anything loads; a refusal shows a per-device table and flags that would fit."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ...errors import SpecbenchError
from .fit import KV_HEADROOM_TOKENS, RUNTIME_HEADROOM, check_memory, free_memory_bytes
from .memory_need import current, kv_bytes, text_shape
from .placement import Placement

GIB = 2**30
SUGGEST_SHARE = 0.9  # suggested --max-memory: this share of what a device has free


def _meta_model(config, dtype):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _owner(name: str, dmap: dict) -> object:
    """The device of parameter `name` under a module-name -> device map (the longest matching prefix)."""
    best, device = -1, None
    for prefix, dev in dmap.items():
        if (prefix == "" or name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
            best, device = len(prefix), dev
    return device


def resolved_map(meta, dtype, placement: Placement) -> dict:
    """The module -> device map a placement gives this model: the file's, or accelerate's for a strategy."""
    if isinstance(placement.device_map, dict):
        return placement.device_map
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = getattr(meta, "_no_split_modules", None) or []
    caps = dict(placement.max_memory) or None
    if placement.device_map != "sequential":
        caps = get_balanced_memory(meta, max_memory=caps, no_split_module_classes=no_split, dtype=dtype,
                                   low_zero=placement.device_map == "balanced_low_0")
    return infer_auto_device_map(meta, max_memory=caps, no_split_module_classes=no_split, dtype=dtype)


def device_needs(config, dtype: torch.dtype, placement: Placement) -> dict:
    """Bytes each device of the map needs: its weights, its layers' KV cache (the planned workload's, else
    KV_HEADROOM_TOKENS) and, on every computing device, RUNTIME_HEADROOM."""
    meta = _meta_model(config, dtype)
    dmap = resolved_map(meta, dtype, placement)
    size = torch.tensor([], dtype=dtype).element_size()
    needs: dict = {}
    for name, tensor in (*meta.named_parameters(), *meta.named_buffers()):
        dev = _owner(name, dmap)
        if dev is None:
            raise SpecbenchError(f"--device-map: module {name.rsplit('.', 1)[0]!r} of this model is not in the map; "
                                 "name every module (or a parent of it), e.g. "
                                 '"model.layers.0": 0, or use --device-map auto')
        needs[dev] = needs.get(dev, 0) + tensor.numel() * size
    work = current()
    layers = text_shape(config)[0]
    kv = kv_bytes(config, dtype, work.tokens, work.batch) // layers  # one layer's K and V at the planned workload
    for i in range(layers):
        dev = _owner(f"model.layers.{i}.x", dmap)
        dev = "cpu" if dev in (None, "disk") else dev  # an offloaded layer computes (and keeps KV) on the main device
        needs[dev] = needs.get(dev, 0) + kv
    for dev in [d for d in needs if d != "disk"]:
        needs[dev] += RUNTIME_HEADROOM
    return needs


def free_bytes(device, offload_folder: str | None) -> int | None:
    """What `device` ("cpu", "disk" or a GPU index) has free; None where unknown (no check)."""
    if device == "disk":
        folder = Path(offload_folder or ".").expanduser()
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        return shutil.disk_usage(folder).free
    if isinstance(device, int):
        return torch.cuda.mem_get_info(device)[0]
    return free_memory_bytes(torch.device(device)) if device == "cpu" else None


def check_devices_exist(placement: Placement) -> None:
    """Refuse GPU indices this machine does not have (in the map file or --max-memory)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    named = list(placement.max_memory) + (list(placement.device_map.values())
                                          if isinstance(placement.device_map, dict) else [])
    missing = sorted({d for d in named if isinstance(d, int) and d >= count})
    if missing:
        have = f"GPUs 0..{count - 1}" if count else "no GPU"
        raise SpecbenchError(f"--device-map / --max-memory name GPU {', '.join(map(str, missing))} but this machine "
                             f"has {have}; use cpu or disk, or the GPUs it has")


def check_placement(what: str, config, dtype: torch.dtype, placement: Placement) -> None:
    """Refuse, with a per-device table and flags that would fit, a device map that overfills any device."""
    check_devices_exist(placement)
    if placement.tp > 1:
        return  # every rank holds 1/tp of each layer: torchrun's processes check their own GPUs as they load
    try:
        needs = device_needs(config, dtype, placement)
    except SpecbenchError:
        raise
    except Exception:  # an architecture that cannot be built on the meta device: no check rather than no model
        return
    rows, short = [], False
    for dev, need in needs.items():
        free = free_bytes(dev, placement.offload_folder)
        over = free is not None and need > free
        short |= over
        rows.append((dev, need, free, over))
    if not short:
        return
    table = "\n".join(f"  {str(d):>6}  needs {n / GIB:7.2f} GiB   free {'?' if f is None else f'{f / GIB:7.2f}'} GiB"
                      f"{'   <- does not fit' if o else ''}" for d, n, f, o in rows)
    work = current()
    raise SpecbenchError(f"{what} does not fit this device map ({str(dtype).removeprefix('torch.')}, weights + KV "
                         f"cache of {work.tokens} tokens x batch {work.batch} + working memory per device):\n{table}\n"
                         f"{suggestion(needs, dtype)}")


def suggestion(needs: dict, dtype: torch.dtype) -> str:
    """Flags that would fit: accelerate filling every GPU and the CPU up to what they have free, then disk."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    caps = {i: free_bytes(i, None) for i in range(count)}
    caps["cpu"] = free_bytes("cpu", None) or 0
    total, room = sum(needs.values()), sum(int(v * SUGGEST_SHARE) for v in caps.values() if v)
    flags = ",".join(f"{d}={max(1, int(v * SUGGEST_SHARE / GIB))}GiB" for d, v in caps.items() if v)
    said = f"try --device-map auto --max-memory {flags}"
    if total > room:
        said += " (the rest is offloaded to disk: slow, but it runs)"
    if dtype == torch.float32:
        said += ", or --dtype bfloat16 (half the memory)"
    return said + "."


def check_fit(what: str, config, dtype: torch.dtype, device: torch.device, hint: str = "",
              placement: Placement | None = None) -> None:
    """The memory-fit check before a model loads: device by device for a device map (check_placement), else the
    one device (fit.check_memory). Random weights are built whole on the CPU before a map places them
    (load._placed_copy): with a map they need the room for all of it there first."""
    if placement is not None and placement.spread:
        if what.startswith("random:"):
            check_memory(what, config, dtype, torch.device("cpu"), hint)
        return check_placement(what, config, dtype, placement)
    return check_memory(what, config, dtype, device, hint)
