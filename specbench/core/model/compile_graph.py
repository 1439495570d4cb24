"""The compiled step of core/model/compile.py: how it compiles (`settings`, `compile_step`), and the model it runs,
a twin of the model's module tree that carries what only the compiled graph needs, so that nothing of the model's
own modules is replaced or added to.

The twin: every module a shallow copy of the model's (sharing its parameters, buffers, config, attributes and hook
tables; the same tensors, no second copy of any weight) with children of its own. In it:
- every CPU nn.Linear is a linear_kernels.ChosenLinear around the model's own layer (each width bucket's kernel,
  chosen by measurement); the layers of a module that read one input (q / k / v, gate / up) are
  fused_linears.GroupedLinear, one oneDNN call for the group where a bucket runs oneDNN;
- its decoder layers take layer edits and layer taps (once a run brings some: take_edits): `LAYER_EDITS` and
  `LAYER_TAPS` passed to the decoder (core/batch/static.step's `edits` and `taps`) reach each layer's call, and the
  twin's layer copy (an instance of its class's edited subclass; the model's own layers keep their class), before the
  layer's own forward runs,
  - replaces the rows the edits name: for (layer, slots [P], sources [P], weight [H, H]), rows `slots` of the hidden
    states entering that layer, flattened to [S * w, H], become weight @ (rows `sources`). This is Hidden Transfer's
    transfer step (methods/hidden_transfer/layers.py) as data inside the graph, where the eager forward hooks the
    model's layer;
  - hands the hidden states entering a tapped layer [S, w, H] to the step, which returns them beside its final
    states: EAGLE-3's fused features (methods/eagle3/layers.py), read where the eager forward hooks the layers.
The model's eager forwards (the prefill, an eager step, the lossless reference) run the model itself, untouched.
"""

from __future__ import annotations

import copy
import os
import types

import torch

from ..batch.decoder import decoder_layers
from ..batch.static import LAYER_EDITS, LAYER_TAPS, step  # the decoder keywords carrying edits and taps to layers
from . import fused_linears
from .linear_kernels import ChosenLinear, linears

CPP_WRAPPER = "SPECBENCH_COMPILE_CPP_WRAPPER"  # 0: inductor's Python wrapper on CPU (faster compile, slower calls)
# 1: the C++ wrapper built at -O1 apart from the kernels (inductor's cpp_wrapper_build_separate), not all of it at -O3
# as one file: a new shape of the embedded model compiled in 19-25 s instead of ~51 s, and the forward's fixed cost
# (its thin twin, benchmarks/compiled_ops.py --thin) rose 2-4%, about 0.1 ms (a Zen 5 EPYC; benchmarks/RESULTS-cpu.md,
# stop 70). Off by default: a run is timed many times more often than it compiles (inductor's cache keeps the shapes)
QUICK_BUILD = "SPECBENCH_COMPILE_QUICK_BUILD"


def apply_edits(index: int, hidden: torch.Tensor, edits) -> torch.Tensor:
    """Hidden states [S, w, H] entering decoder layer `index`, with the rows of the edits at that layer replaced."""
    flat = hidden.reshape(-1, hidden.shape[-1])  # [S * w, H]
    changed = False
    for layer, slots, sources, weight in edits:
        if layer != index:
            continue
        src = flat[sources]  # [P, H]
        flat = flat.index_copy(0, slots, (src @ weight.to(src.device, src.dtype).T).to(hidden.dtype))
        changed = True
    return flat.view_as(hidden) if changed else hidden


def padded_rows(rows: int) -> int:
    """An edit's row count as a graph takes it: the next power of two."""
    return 1 << max(0, (rows - 1).bit_length())


def padded(edits: tuple) -> tuple:
    """The edits with each one's rows padded to a power of two by repeating its first row (written twice with the
    same value: the result is the same), so that the edits of a batch's many tree states share a few graphs."""
    out = []
    for layer, slots, sources, weight in edits:
        extra = padded_rows(slots.shape[0]) - slots.shape[0]
        if extra:
            slots = torch.cat([slots, slots[:1].expand(extra)])
            sources = torch.cat([sources, sources[:1].expand(extra)])
        out.append((layer, slots, sources, weight))
    return tuple(out)


def edit_key(edits: tuple) -> tuple:
    """The (layer, rows) pairs that name a graph with these layer edits: each edit's rows as padded() pads them (the
    same for edits padded already)."""
    return tuple((layer, padded_rows(slots.shape[0])) for layer, slots, *_ in edits)


_EDITED: dict[type, type] = {}  # a decoder layer class -> its subclass that takes layer edits


def _edited_class(base: type) -> type:
    """`base` (a decoder layer class) with a forward that takes LAYER_EDITS and LAYER_TAPS: the rows the edits name
    are replaced in the hidden states entering the layer (apply_edits at the layer's own `edit_index`), a tapped
    layer's entering states are put in the taps' dict under its index, then base's forward runs."""
    if base not in _EDITED:
        def forward(self, *args, **kwargs):
            edits = kwargs.pop(LAYER_EDITS, None)  # (every layer's own call: the keywords stop here)
            taps = kwargs.pop(LAYER_TAPS, None)  # (layer indices, dict)
            if edits:
                if args:
                    args = (apply_edits(self.edit_index, args[0], edits), *args[1:])
                else:
                    kwargs["hidden_states"] = apply_edits(self.edit_index, kwargs["hidden_states"], edits)
            if taps is not None and self.edit_index in taps[0]:
                taps[1][self.edit_index] = args[0] if args else kwargs["hidden_states"]
            return base.forward(self, *args, **kwargs)

        _EDITED[base] = type(f"Edited{base.__name__}", (base,), {"forward": forward, "__module__": __name__})
    return _EDITED[base]


def take_edits(graph: torch.nn.Module) -> None:
    """Let the graph model's decoder layers take layer edits and taps: each of the twin's own layer copies becomes an
    instance of its class's edited subclass (_edited_class), knowing its index. A forward without them runs as
    before."""
    for index, layer in enumerate(decoder_layers(graph)):
        if type(layer) not in _EDITED.values():
            layer.__class__ = _edited_class(type(layer))
        layer.edit_index = index


def graph_model(model: torch.nn.Module, choice: dict[int, str] | None = None) -> torch.nn.Module:
    """The twin of `model` (module docstring): its CPU linear layers through `choice` (bucket -> kernel; None: their
    own forward; grouped layers fused where a bucket runs oneDNN: fused_linears); its decoder layers take layer edits
    once take_edits has run."""
    wrapped = {id(m) for m in linears(model)} if choice else set()
    fuse = fused_linears.worth_fusing(model, choice)

    def twin(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) in wrapped:
            return ChosenLinear(module, choice)
        copied = copy.copy(module)  # __dict__ shallow: the same parameter and buffer dicts, config, attributes
        grouped = fused_linears.twins(module, choice) if fuse else {}
        copied.__dict__["_modules"] = {name: None if child is None else grouped.get(name, None) or twin(child)
                                       for name, child in module._modules.items()}
        return copied

    return twin(model)


def settings(device: torch.device) -> dict:
    """How the step compiles on this device (run.yaml's compile block reports it): CUDA graphs on CUDA (gpt-fast's
    "reduce-overhead"), inductor's C++ kernels elsewhere, called from a C++ wrapper (`cpp_wrapper`: the per-kernel
    Python calls of a many-layer forward are a visible share of a CPU decode step, benchmarks/RESULTS-cpu.md; it
    costs a slower first compile, and later runs read inductor's cache;
    $SPECBENCH_COMPILE_CPP_WRAPPER=0 leaves it out; `wrapper_build`: the wrapper built with its kernels at -O3, or apart
    at -O1 with $SPECBENCH_COMPILE_QUICK_BUILD=1, QUICK_BUILD). Shapes are static (dynamic=False): one graph per
    bucket, never a symbolic one."""
    cuda = device.type == "cuda"
    wrapper = not cuda and os.environ.get(CPP_WRAPPER, "1").strip() != "0"
    out = {"backend": "inductor", "mode": "reduce-overhead" if cuda else "default", "dynamic": False,
           "fullgraph": True, "cpp_wrapper": wrapper, "guards": "module attributes skipped"}
    if wrapper:
        out["wrapper_build"] = "apart" if quick_build() else "together"
    return out


def quick_build() -> bool:
    """Whether $SPECBENCH_COMPILE_QUICK_BUILD asks for the C++ wrapper built apart from its kernels (QUICK_BUILD)."""
    return os.environ.get(QUICK_BUILD, "0").strip() == "1"


def compile_function(device: torch.device, function, name: str, module_guards: bool = False):
    """torch.compile of a copy of `function` of its own (its own code object, named `name`: dynamo keeps a function's
    compiled graphs on its code object, so two models' graphs would otherwise share one list, every call checking
    both), at this device's settings. Without `module_guards`, guards on nn.Module attributes are skipped
    (torch.compiler.skip_guard_on_all_nn_modules_unsafe): with one model's weights and buffers as graph inputs
    dynamo's guard check grows with the layers and costs a share of every call, and nothing here changes a module's
    attributes between calls."""
    said = settings(device)
    options = dict(torch._inductor.list_mode_options(said["mode"]))  # reduce-overhead: {"triton.cudagraphs": True}
    if not module_guards:
        options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    if said["cpp_wrapper"]:
        options["cpp_wrapper"] = True
        if said["wrapper_build"] == "apart":
            options["cpp_wrapper_build_separate"] = True
    if device.type == "cpu":  # a fused group's members share one call (fused_linears.py)
        options["post_grad_custom_pre_pass"] = fused_linears.MergeSameCalls()
    code = function.__code__.replace(co_name=name)
    own = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    return torch.compile(own, backend=said["backend"], dynamic=said["dynamic"], fullgraph=said["fullgraph"],
                         options=options)


def compile_step(device: torch.device, name: str):
    """The static step compiled for one model (compile_function, module guards skipped): no hook measures the model
    (the engines time the call from outside, core/machine/forward_clock.py), the twin's layers take edits before a
    run compiles anything that brings some (compile.Compiled.take_edits); the step's own arguments (inputs, cache
    tensors, flags) stay guarded, and the weights are graph inputs read from the model at every call, never baked
    into a graph."""
    return compile_function(device, step, f"step_{name}")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a compile's first call is timed to its end); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
