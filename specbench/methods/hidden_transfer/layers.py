"""The transfer-layer split of Hidden Transfer (Wu et al. 2024, §3.2-3.3), for any transformers decoder.

A transfer step j at layer l turns a real position's hidden state entering decoder layer l (the output of the first
l layers) into the pseudo hidden state of a future position: h~ = W_j h. The pseudo position joins the sequence at
layer l and goes through layers l .. L-1 with the context, and the last layer's state gives its draft distribution.

One HF forward serves every decoder: pseudo positions enter the forward from the start as placeholder inputs (in
the same input row as the real tokens, with their own mask rows and positions), and a pre-hook on decoder layer l
overwrites their hidden states with W_j h. Below layer l a placeholder's keys and values are computed but read only
by placeholders (nothing real attends to a pseudo position, and a pseudo position of step j' > j is itself a
placeholder below its own layer l' > l), so nothing that reaches an output depends on them; callers drop the
pseudo positions from the KV cache after the forward (keep_positions), so they are never kept. The cost of that
generality: each placeholder passes the l layers below its transfer layer (about k x l/L of a token per step).

`capture` records the hidden states entering chosen layers during a plain forward (the sources of a transfer when
the real positions are in the KV cache, not in the same forward: training and accuracy estimates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...errors import SpecbenchError


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (model.get_decoder().layers)."""
    layers = getattr(getattr(model, "get_decoder", lambda: None)(), "layers", None)
    if not layers:
        raise SpecbenchError(f"{type(model).__name__}: no decoder layers found (model.get_decoder().layers); "
                             "transfer layers need a transformers decoder-only model")
    return layers


def check_transfer_layers(layers: Sequence[int], num_layers: int, model: str = "the model") -> list[int]:
    """Transfer layers l_1 < l_2 < ... each in 1 .. L-1 (a pseudo state must pass at least one layer); clear
    errors otherwise. Increasing, because step j's pseudo state reads step j-1's (Hidden Transfer's "No masked"
    setting) and must only read it where it is already a transferred state, not a placeholder."""
    layers = [int(x) for x in layers]
    if not layers:
        raise SpecbenchError("--transfer-layers: give at least one layer")
    bad = [x for x in layers if not 1 <= x <= num_layers - 1]
    if bad:
        raise SpecbenchError(f"--transfer-layers {','.join(map(str, layers))}: {bad} outside {model}'s layers (it has "
                             f"{num_layers}; a transfer layer l is in 1..{num_layers - 1}: the pseudo state enters "
                             "after l layers and passes the rest)")
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise SpecbenchError(f"--transfer-layers {','.join(map(str, layers))}: must be strictly increasing (step j+1 "
                             "reads step j's pseudo state, which exists only from step j's layer on)")
    return layers


@dataclass
class LayerTransfer:
    """One transfer at one layer: inputs `slots` [P] of the forward become project(source) [P, H].

    sources: LongTensor [P] = indices of real inputs of the same forward (their hidden states entering `layer`), or
    a float tensor [P, H] of hidden states given directly (captured earlier, e.g. for positions in the KV cache).
    weight: project's matrix [H, H] where project(h) = h @ weight^T (what a compiled forward applies inside its graph),
    None where the transfer is only a function."""

    layer: int  # decoder layer index (0-based) whose input is replaced: the state after `layer` layers
    slots: torch.Tensor  # [P] long: input indices of the pseudo positions
    sources: torch.Tensor  # [P] long, or [P, H] float
    project: Callable[[torch.Tensor], torch.Tensor]  # [P, H] -> [P, H]
    weight: torch.Tensor | None = None


class transferred:
    """Within this block every forward of `model` applies the transfers (a pre-hook on each transfer layer).
    Slots and sources index the hidden states flattened over batch and sequence ([B, q, H] as [B * q, H]): at batch 1
    the input index itself; in a batched forward, where each sample's inputs lie (core/batch/ragged.py's and
    core/batch/padded.py's `places`).
    `layer_edits()`: the same transfers as data, for a compiled forward that applies them inside its graph (the static
    engines under --compile: core/model/compile_graph.py) instead of entering the block."""

    def __init__(self, model, transfers: Sequence[LayerTransfer]):
        self.model, self.transfers = model, [t for t in transfers if t.slots.numel()]
        self._handles: list = []

    def layer_edits(self) -> tuple | None:
        """((layer, slots [P], sources [P], weight [H, H]), ...): every transfer with in-forward sources and a weight;
        None where one has neither (captured sources, a bare function): such transfers run eagerly only."""
        if any(t.weight is None or t.sources.dtype != torch.long for t in self.transfers):
            return None
        return tuple((t.layer, t.slots, t.sources, t.weight) for t in self.transfers)

    def __enter__(self):
        layers = decoder_layers(self.model)
        for transfer in self.transfers:
            def hook(_module, args, kwargs, transfer=transfer):
                hidden = args[0] if args else kwargs["hidden_states"]  # [B, q, H]
                dev = hidden.device  # under a device map: the previous layer's device (runs before accelerate's)
                flat = hidden.reshape(-1, hidden.shape[-1])  # [B * q, H]
                if transfer.sources.dtype == torch.long:
                    src = flat[transfer.sources.to(dev)]  # [P, H]
                else:
                    src = transfer.sources.to(dev, hidden.dtype)
                moved = transfer.project(src).to(dev, hidden.dtype)
                new = flat.index_copy(0, transfer.slots.to(dev), moved).view_as(hidden)
                if args:
                    return (new, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": new}

            self._handles.append(layers[transfer.layer].register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@contextmanager
def capture(model, layer_ids: Sequence[int]):
    """Record the hidden states entering each decoder layer in `layer_ids` during the block's forwards:
    yields a dict layer -> [1, q, H] tensor of the last forward (detached)."""
    layers = decoder_layers(model)
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for layer in layer_ids:
        def hook(_module, args, kwargs, layer=layer):
            seen[layer] = (args[0] if args else kwargs["hidden_states"]).detach()

        handles.append(layers[layer].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
