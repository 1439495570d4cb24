"""The model a compiled step runs (core/model/compile.py): a twin of the model's module tree that carries what only
the compiled graph needs, so that nothing of the model's own modules is replaced or added to.

The twin: every module a shallow copy of the model's (sharing its parameters, buffers, config and attributes; the
same tensors, no second copy of any weight) with children and forward hooks of its own. In it:
- every CPU nn.Linear is a linear_kernels.ChosenLinear around the model's own layer (each width bucket's kernel,
  chosen by measurement);
- its decoder layers take layer edits (once a forward brings some: take_edits): `LAYER_EDITS` passed to the decoder
  (core/batch/static.step's `edits`) reaches each layer's call, and a pre-hook of the twin's own layer replaces the
  rows it names before the layer runs:
  for (layer, slots [P], sources [P], weight [H, H]), rows `slots` of the hidden states entering that layer, flattened
  to [S * w, H], become weight @ (rows `sources`). This is Hidden Transfer's transfer step
  (methods/hidden_transfer/layers.py) as data inside the graph, where the eager forward hooks the model's layer.
The model's eager forwards (the prefill, an eager step, the lossless reference) run the model itself, untouched.
"""

from __future__ import annotations

import copy

import torch

from ..batch.decoder import decoder_layers
from ..batch.static import LAYER_EDITS  # the decoder keyword carrying the edits of one forward to its layers
from .linear_kernels import ChosenLinear, linears

_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
          "_forward_pre_hooks_with_kwargs")


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


def padded(edits: tuple) -> tuple:
    """The edits with each one's rows padded to a power of two by repeating its first row (written twice with the
    same value: the result is the same), so that the edits of a batch's many tree states share a few graphs."""
    out = []
    for layer, slots, sources, weight in edits:
        extra = (1 << max(0, (slots.shape[0] - 1).bit_length())) - slots.shape[0]
        if extra:
            slots = torch.cat([slots, slots[:1].expand(extra)])
            sources = torch.cat([sources, sources[:1].expand(extra)])
        out.append((layer, slots, sources, weight))
    return tuple(out)


def _edit_hook(index: int):
    def hook(_module, args, kwargs):
        edits = kwargs.pop(LAYER_EDITS, None)  # (every layer's own call: the keyword stops here)
        if not edits:
            return args, kwargs
        if args:
            return (apply_edits(index, args[0], edits), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": apply_edits(index, kwargs["hidden_states"], edits)}

    return hook


def take_edits(graph: torch.nn.Module) -> None:
    """Let the graph model's decoder layers take layer edits: a pre-hook on each of the twin's own layers, added at
    the first forward with edits (graphs traced before it hold no hook and never see edits: the hooks change nothing
    of a forward without them)."""
    for index, layer in enumerate(decoder_layers(graph)):
        layer.register_forward_pre_hook(_edit_hook(index), with_kwargs=True)


def graph_model(model: torch.nn.Module, choice: dict[int, str] | None = None) -> torch.nn.Module:
    """The twin of `model` (module docstring): its CPU linear layers through `choice` (bucket -> kernel; None: their
    own forward); its decoder layers take layer edits once take_edits has run."""
    wrapped = {id(m) for m in linears(model)} if choice else set()

    def twin(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) in wrapped:
            return ChosenLinear(module, choice)
        copied = copy.copy(module)  # __dict__ shallow: the same parameter and buffer dicts, config, attributes
        for name in _HOOKS:
            if isinstance(module.__dict__.get(name), dict):
                copied.__dict__[name] = type(module.__dict__[name])(module.__dict__[name])
        copied.__dict__["_modules"] = {name: None if child is None else twin(child)
                                       for name, child in module._modules.items()}
        return copied

    return twin(model)
