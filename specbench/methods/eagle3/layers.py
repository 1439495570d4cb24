"""The target's layers the EAGLE-3 drafter (drafter.py) reads: its fused features g = [low ; middle ; high] [3H],
the hidden states entering three of the target's decoder layers, recorded by forward pre-hooks during the target's
own forward.

`fused_states` runs one forward of a sequence (training, scoring). `FeatureTap` records them during the tree
step's batched target forward (the guesser's `around` hook, told where each segment's inputs lie: hooks around an
eager forward, or the layer taps a compiled step returns) and hands each sample its rows afterwards: a sample's
rows are found by its final hidden states, which the step gives the guesser (the states of the decoder's final norm
at the same places)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ...errors import SpecbenchError
from ..hidden_transfer.layers import decoder_layers


def feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs are fused: low, middle, high (EAGLE-3's 2, L // 2, L - 3), clamped into the
    model for shallow test models."""
    top = max(num_layers - 1, 0)
    return min(2, top), min(num_layers // 2, top), min(max(num_layers - 3, 0), top)


def _final_norm(model) -> torch.nn.Module:
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None:
        raise SpecbenchError(f"{type(model).__name__}: no final norm (model.get_decoder().norm); EAGLE-3 needs a "
                             "transformers decoder-only model")
    return norm


@contextmanager
def recording(model, with_final: bool = False):
    """Within the block, every forward of `model` records the hidden states entering the three feature layers (and,
    with_final, the final norm's output), each flattened to [B * q, H]: yields the dict (layer index or 'final')."""
    layers = decoder_layers(model)
    seen: dict = {}
    handles = []
    for index in feature_layers(len(layers)):
        def pre(_module, args, kwargs, index=index):
            x = args[0] if args else kwargs["hidden_states"]
            seen[index] = x.detach().reshape(-1, x.shape[-1])

        handles.append(layers[index].register_forward_pre_hook(pre, with_kwargs=True))
    if with_final:
        def post(_module, _args, out):
            seen["final"] = out.detach().reshape(-1, out.shape[-1])

        handles.append(_final_norm(model).register_forward_hook(post))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def fused(seen: dict, num_layers: int, rows=None) -> torch.Tensor:
    """The recorded states [R, 3H] (rows: a subset, in that order), low, middle, high."""
    parts = [seen[i] if rows is None else seen[i][rows.to(seen[i].device)] for i in feature_layers(num_layers)]
    device = parts[-1].device
    return torch.cat([p.to(device) for p in parts], -1)


@torch.inference_mode()
def fused_states(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [1, T] -> (g [T, 3H], the final normed hidden states f [T, H]) of one causal forward."""
    with recording(model) as seen:
        f = model.get_decoder()(input_ids=ids).last_hidden_state[0]
    return fused(seen, len(decoder_layers(model))), f


class FeatureTap:
    """The fused features of every segment of the tree step's target forwards, until each sample takes its own."""

    def __init__(self, model):
        self.model = model
        self.layers = len(decoder_layers(model))
        self.waiting: list[tuple[torch.Tensor, torch.Tensor]] = []  # (final states [w, H], g [w, 3H]) per segment

    def clear(self) -> None:
        self.waiting = []

    def layers_read(self) -> tuple[int, int, int]:
        """The target layers whose inputs are fused (low, middle, high)."""
        return feature_layers(self.layers)

    def around(self, parts) -> "Recording":
        """parts: per segment (layout, prefix, places [w] in the forward's flattened rows)."""
        return Recording(self, parts)

    def take(self, h: torch.Tensor) -> torch.Tensor:
        """The fused features [n, 3H] of the segment whose final states end with h [n, H] (the rows the step gave
        the sample); that segment's entry is used up."""
        for i, (final, g) in enumerate(self.waiting):
            n = h.shape[0]
            if final.shape[0] >= n and torch.equal(final[-n:].to(h.device, h.dtype), h):
                del self.waiting[i]
                return g[-n:]
        raise RuntimeError("EAGLE-3: no recorded target features match this sample's hidden states")


class Recording:
    """FeatureTap.around's context around one target forward: an eager forward is recorded by hooks on the three
    layers and the final norm (entered as a context manager); a compiled step reads the same layers' inputs inside
    its graph instead (core/batch/static.layer_taps: `layer_taps`, then `tapped` with the step's rows)."""

    def __init__(self, tap: FeatureTap, parts):
        self.tap, self.parts = tap, parts
        self._hooks = None

    def layer_taps(self) -> tuple[int, int, int]:
        return self.tap.layers_read()

    def tapped(self, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Per segment, in the order of `parts`: (its final states [w, H], its fused features [w, 3H])."""
        self.tap.waiting.extend(rows)

    def __enter__(self):
        self._hooks = recording(self.tap.model, with_final=True)
        self._seen = self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        if exc[0] is not None:
            return
        seen = self._seen
        for _layout, _prefix, places in self.parts:
            rows = places.to(seen["final"].device)
            self.tap.waiting.append((seen["final"][rows], fused(seen, self.tap.layers, rows)))
