"""Where a model's layers live: one device, an accelerate device map (layers over GPUs, CPU and disk), or tensor
parallelism over torchrun ranks. Parses --device-map / --max-memory, names the placement for records and profile
files, and answers "on which device does this module compute?" for code that builds tensors by hand.

--device-map   auto | balanced | balanced_low_0 | sequential (accelerate fills the devices; --max-memory caps
               each), or FILE.json: {"model.embed_tokens": 0, "model.layers.0": 0, ..., "lm_head": "cpu"}
               where a value is a GPU index, "cuda:I", "cpu" or "disk" (disk: weights read from an offload
               folder at each forward, accelerate's offload hooks).
--max-memory   DEV=SIZE,... e.g. 0=20GiB,1=20GiB,cpu=64GiB (sizes: B, KB, MB, GB, KiB, MiB, GiB, TB, TiB).
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import SpecbenchError
from ..store import label_slug  # noqa: F401  (a placement label as a file-name part; the store names files)
from ..structured import read_structured

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class Placement:
    """How to place one model: device_map None = the whole model on one device (--device)."""

    device_map: str | dict | None = None
    max_memory: dict = field(default_factory=dict)  # {0: bytes, "cpu": bytes}
    offload_folder: str | None = None
    tp: int = 1

    @property
    def spread(self) -> bool:
        return self.device_map is not None or self.tp > 1

    def load_kwargs(self) -> dict:
        """The from_pretrained keywords this placement adds."""
        if self.tp > 1:
            try:  # tp_plan inside a DistributedConfig where transformers has one (its bare keyword is deprecated)
                from transformers import DistributedConfig

                return {"distributed_config": DistributedConfig(tp_plan="auto")}
            except ImportError:
                return {"tp_plan": "auto"}
        if self.device_map is None:
            return {}
        kwargs = {"device_map": self.device_map}
        if self.max_memory:
            kwargs["max_memory"] = dict(self.max_memory)
        if self.offload_folder:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


SINGLE = Placement()


def parse_size(text: str, option: str) -> int:
    """'20GiB' / '512MB' / '1000000' -> bytes."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = (found.group(2) or "b").lower() if found else ""
    if not found or unit not in _UNITS:
        raise SpecbenchError(f"{option}: bad size {text!r}; use a number with a unit, e.g. 20GiB, 512MiB, 16GB")
    return int(float(found.group(1)) * _UNITS[unit])


def parse_device(text: str, option: str, allow_disk: bool = False) -> int | str:
    """A device name of a map or --max-memory: GPU index (0 or cuda:0), 'cpu' (or 'mps'), or 'disk'."""
    name = str(text).strip().lower()
    if re.fullmatch(r"\d+", name):
        return int(name)
    if re.fullmatch(r"cuda:\d+", name):
        return int(name.split(":")[1])
    if name in ("cpu", "mps") or (allow_disk and name == "disk"):
        return name
    allowed = "a GPU index (0, 1, ...), cuda:I, cpu" + (" or disk" if allow_disk else "")
    raise SpecbenchError(f"{option}: unknown device {text!r}; use {allowed}")


def parse_max_memory(text: str | None, option: str = "--max-memory") -> dict:
    """'0=20GiB,1=20GiB,cpu=64GiB' -> {0: bytes, 1: bytes, 'cpu': bytes}."""
    if not text:
        return {}
    caps = {}
    for part in (p for p in text.split(",") if p.strip()):
        if "=" not in part:
            raise SpecbenchError(f"{option}: expected DEV=SIZE pairs like 0=20GiB,cpu=64GiB, got {part!r}")
        dev, size = part.split("=", 1)
        caps[parse_device(dev, option)] = parse_size(size, option)
    return caps


def parse_device_map(text: str | None, option: str = "--device-map") -> str | dict | None:
    """auto / balanced / balanced_low_0 / sequential, or a JSON file mapping module names to devices."""
    if text is None or text == "":
        return None
    if text in STRATEGIES:
        return text
    path = Path(text).expanduser()
    if not path.suffix == ".json" and not path.exists():
        raise SpecbenchError(f"{option}: {text!r} is neither one of {', '.join(STRATEGIES)} nor a .json file")
    mapping = read_structured(path, f"{option} {text}", "JSON")
    if not isinstance(mapping, dict) or not mapping:
        raise SpecbenchError(f"{option}: {text} must hold a JSON object of module name -> device, e.g. "
                             '{"model.embed_tokens": 0, "model.layers.0": 0, "lm_head": "cpu"}')
    return {str(k): parse_device(v, f"{option} {text} ({k})", allow_disk=True) for k, v in mapping.items()}


def build_placement(device_map: str | None, max_memory: str | None, tp: int = 1, option: str = "--device-map",
                    offload_folder: str | None = None) -> Placement:
    """The Placement of CLI option values (None when the model sits on one device)."""
    mm_option = option.replace("device-map", "max-memory")
    if tp < 1:
        raise SpecbenchError(f"--tp: expected 1 or more processes, got {tp}")
    if tp > 1 and device_map:
        raise SpecbenchError(f"--tp and {option} are exclusive: tensor parallelism splits every layer over the "
                             "ranks, a device map places whole layers")
    dmap, caps = parse_device_map(device_map, option), parse_max_memory(max_memory, mm_option)
    if caps and dmap is None:
        dmap = "auto"  # --max-memory alone: accelerate fills the devices under those caps
    if isinstance(dmap, dict) and caps:
        raise SpecbenchError(f"{mm_option} caps what accelerate places automatically; with a {option} file every "
                             "module's device is already given: drop one of them")
    if dmap is None and tp == 1:
        return SINGLE
    if dmap is not None and offload_folder is None:  # where accelerate writes weights a map sends to disk
        from ..store import user_cache

        offload_folder = str(user_cache() / "offload")
    return Placement(dmap, caps, offload_folder, tp)


def target_placement(device_map: str | None, max_memory: str | None, tp: int = 1) -> Placement:
    """The target's Placement from its options, after checking --tp against the torchrun launch."""
    from .tensor_parallel import check_launch

    check_launch(tp)
    return build_placement(device_map, max_memory, tp)


def drafter_placement(device_map: str | None, max_memory: str | None) -> Placement:
    """A separate --drafter model's Placement (--drafter-device-map / --drafter-max-memory)."""
    return build_placement(device_map, max_memory, option="--drafter-device-map")


# ---- what a loaded model's placement is -------------------------------------------------------------------------

def device_of(module: torch.nn.Module) -> torch.device:
    """The device `module` computes on: its accelerate hook's execution device (offloaded weights are on "meta"
    until the hook loads them), else that of its first parameter or buffer."""
    hook = getattr(module, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is not None:
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type != "meta":
            return tensor.device
    for sub in module.children():
        found = device_of(sub)
        if found.type != "meta":
            return found
    return torch.device("cpu")


def input_device(model) -> torch.device:
    """Where the token embedding computes: prompt tokens and input ids go there."""
    return device_of(model.get_input_embeddings())


def output_device(model) -> torch.device:
    """Where the LM head computes: logits come back there, and heads / drafters reading final states live there."""
    return device_of(model.get_output_embeddings())


def decoder_layers(model):
    """A causal LM's decoder layers (its base model's), [] when it has none."""
    return getattr(getattr(model, "base_model", model), "layers", None) or []


def layer_device(model, index: int) -> torch.device:
    return device_of(decoder_layers(model)[index])


# what this module learns about a model, kept beside it (never on its module object): whether accelerate dispatched
# it (asked every packed forward: decided once per model) and its tensor-parallel degree (set when it is loaded)
_DISPATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_dispatched(model) -> bool:
    """Whether accelerate placed the model: more than one device in its map, or weights offloaded (meta)."""
    try:
        return _DISPATCHED[model]
    except (KeyError, TypeError):  # TypeError: an object that takes no weak reference is decided every time
        pass
    dmap = getattr(model, "hf_device_map", None) or {}
    known = len(set(map(str, dmap.values()))) > 1 or "disk" in dmap.values() or any(
        p.device.type == "meta" for p in model.parameters())
    try:
        _DISPATCHED[model] = known
    except TypeError:
        pass
    return known


def tp_degree(model) -> int:
    """How many tensor-parallel processes share `model` (1 unless it was loaded with --tp)."""
    return _TP.get(model, 1)


def label(model) -> str:
    """The placement as records, run.yaml and profile files name it: 'single:cpu', 'single:cuda:0', 'tp2', or
    'map:0:16,1:14,disk:2' (decoder layers per device, in map order)."""
    tp = tp_degree(model)
    if tp > 1:
        return f"tp{tp}"
    dmap = getattr(model, "hf_device_map", None)
    if not dmap or not is_dispatched(model):
        return f"single:{device_of(model)}"
    counts: Counter = Counter()
    for name, dev in dmap.items():
        if re.search(r"(^|\.)layers\.\d+$", name):
            counts[str(dev)] += 1
        elif re.search(r"(^|\.)layers$", name):
            counts[str(dev)] += len(decoder_layers(model))
    if not counts:
        counts = Counter(str(d) for d in dmap.values())
    return "map:" + ",".join(f"{dev}:{n}" for dev, n in counts.items())


@contextmanager
def materialized(module: torch.nn.Module):
    """Inside: `module`'s offloaded weights (its own and its submodules') are real tensors on their execution
    device (accelerate's align_module_device on every offloaded submodule); a module without offload is untouched."""
    from contextlib import ExitStack

    offloaded = [m for m in module.modules() if getattr(getattr(m, "_hf_hook", None), "offload", False)]
    with ExitStack() as stack:
        if offloaded:
            from accelerate.utils import align_module_device

            for sub in offloaded:
                stack.enter_context(align_module_device(sub))
        yield module


def state_dict_of(module: torch.nn.Module) -> dict:
    """A real (never meta) copy of `module`'s state dict, offloaded or not."""
    with materialized(module):
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


def weight_of(module: torch.nn.Module) -> torch.Tensor:
    """`module.weight` as a real tensor on the module's device (a copy when the weight is offloaded)."""
    if module.weight.device.type != "meta":
        return module.weight
    with materialized(module):
        return module.weight.detach().clone()


def own_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of `module` (a drafter's own norm): real weights, no accelerate hooks."""
    import copy

    twin = copy.deepcopy(module)
    if any(getattr(m, "_hf_hook", None) is not None for m in twin.modules()):
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(twin, recurse=True)
        twin.load_state_dict(state_dict_of(module), assign=True)
    return twin


def resident(module: torch.nn.Module) -> torch.nn.Module:
    """`module` itself, or a resident copy (own_copy) when its weights are offloaded."""
    offloaded = any(getattr(getattr(m, "_hf_hook", None), "offload", False) for m in module.modules())
    return own_copy(module) if offloaded else module


def from_pretrained(auto, where: str, placement: Placement, **kwargs):
    """auto.from_pretrained with the placement's keywords; accelerate's refusals become SpecbenchErrors."""
    try:
        model = auto.from_pretrained(where, **kwargs, **placement.load_kwargs())
    except (ValueError, RuntimeError, KeyError) as exc:
        if not placement.spread:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecbenchError(f"could not place {where} with {placement.device_map or f'--tp {placement.tp}'}: "
                             f"{first}") from exc
    if placement.tp > 1:
        _TP[model] = placement.tp
    return model
