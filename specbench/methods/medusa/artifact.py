"""Medusa-1 heads (Cai et al. 2024, "Medusa", §2.1.1) and their artefact; at a middle layer, the early-exit heads of
Hidden Transfer's Figure 3.

Head k (1-based) reads a position's hidden state h [H] and guesses the token k + 1 positions after it:
    logits_k = LM_head(h + SiLU(W_k h + b_k))      (a residual block each, the target's frozen LM head)
W_k starts at zero, so an untrained head repeats the next-token guess (Medusa's initialisation). `layer` = L (the
model's layer count) reads the last hidden state (Medusa); a smaller `layer` reads the state after that many layers,
passed through the model's final norm first (early exit). `vocab_ids` restricts the head to the K most frequent
tokens of the training data (`--vocab-top`), as the sd drafter can.

Artefact folder (`specbench train medusa` writes artifacts/<model>/medusa; early exit: .../early-exit-l<layer>):
  heads.safetensors   weight [K, H, H], bias [K, H] (+ vocab_ids [V'] when restricted)
  medusa.yaml         model, model_key, hidden_size, vocab_size, heads, layer, training facts
The authors' released heads (released.py) may stack more residual blocks per head (deeper_weight, deeper_bias) and
give each head its own vocabulary projection W2_k (head_weight) in place of the target's LM head:
    logits_k = W2_k(r_L(...r_1(h))),  r_j(s) = s + SiLU(W_kj s + b_kj)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ...core.model.load import LoadedModel
from ...core.machine.timing import median_call_ms
from ...errors import SpecbenchError
from ...core import artifact_files as af
from . import released

WEIGHTS_FILE, META_FILE = "heads.safetensors", "medusa.yaml"
TRAIN = "specbench train medusa"


class MedusaHeads(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, layer: int, vocab_ids: torch.Tensor | None = None,
                 blocks: int = 1, own_vocab: int = 0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(heads, hidden, hidden))  # [K, H, H]
        self.bias = torch.nn.Parameter(torch.zeros(heads, hidden))  # [K, H]
        self.layer = layer
        self.register_buffer("vocab_ids", vocab_ids, persistent=False)  # [V'] or None
        deeper = blocks > 1  # residual blocks 2..L of every head: [L-1, K, H, H], [L-1, K, H]
        self.register_parameter("deeper_weight", torch.nn.Parameter(torch.zeros(blocks - 1, heads, hidden, hidden))
                                if deeper else None)
        self.register_parameter("deeper_bias", torch.nn.Parameter(torch.zeros(blocks - 1, heads, hidden))
                                if deeper else None)
        # each head's own vocabulary projection [K, V, H]; None: the target's LM head
        self.register_parameter("head_weight", torch.nn.Parameter(torch.zeros(heads, own_vocab, hidden))
                                if own_vocab else None)

    @property
    def heads(self) -> int:
        return self.weight.shape[0]

    def states(self, h: torch.Tensor) -> torch.Tensor:
        """h [n, H] -> [K, n, H]: h + SiLU(W_k h + b_k) per head (then the deeper blocks, where there are)."""
        w, b = self.weight.to(h.device, h.dtype), self.bias.to(h.device, h.dtype)  # no-ops on one device
        s = h[None] + F.silu(torch.einsum("nh,koh->kno", h, w) + b[:, None])
        if self.deeper_weight is not None:
            for w, b in zip(self.deeper_weight.to(h.device, h.dtype), self.deeper_bias.to(h.device, h.dtype)):
                s = s + F.silu(torch.einsum("knh,koh->kno", s, w) + b[:, None])  # w [K, H, H], b [K, H]
        return s

    def logits(self, lm_head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        """h [n, H] -> logits [K, n, V] float32 over the full vocabulary (restricted heads: -inf outside it);
        heads with their own projections ignore `lm_head`."""
        s = self.states(h)
        if self.head_weight is not None:
            return (s @ self.head_weight.to(s.device, s.dtype).transpose(1, 2)).float()  # [K, n, H] @ [K, H, V]
        if self.vocab_ids is None:
            return lm_head(s).float()
        from ...core.model.placement import weight_of

        head = weight_of(lm_head)  # [V, H] (a real copy when the head is offloaded)
        small = s.to(head.device) @ head[self.vocab_ids.to(head.device)].T  # [K, n, V']
        full = small.new_full((*small.shape[:2], head.shape[0]), float("-inf"))
        return full.index_copy(2, self.vocab_ids, small).float()


def heads_ms(heads: MedusaHeads, lm_head: torch.nn.Module, dtype: torch.dtype, repeats: int = 20) -> float:
    """Median milliseconds of the heads and their logits [K, 1, V] on one hidden state: what a medusa step costs
    beside the target's forward (build-tree adds it per step; the profile's L(n) does not have it)."""
    device = heads.weight.device
    h = torch.randn(1, heads.weight.shape[-1], device=device, dtype=dtype)
    return median_call_ms(lambda: heads.logits(lm_head, h), device, repeats)


def head_states(model, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One frozen forward of ids [1, T] -> (what heads at `layer` read [T, H], the last hidden state [T, H]).
    Below the last layer the heads read the state entering decoder layer `layer`, through the final norm."""
    from ..hidden_transfer.layers import capture

    last_layer = layer >= model.config.num_hidden_layers
    with capture(model, [] if last_layer else [layer]) as seen:
        last = model.get_decoder()(input_ids=ids).last_hidden_state[0]
    return (last if last_layer else model.get_decoder().norm(seen[layer][0])), last


@dataclass
class HeadsArtifact:
    heads: MedusaHeads
    meta: dict = field(default_factory=dict)
    source: str = ""


def save(heads: MedusaHeads, out: Path, meta: dict) -> None:
    tensors = {"weight": heads.weight, "bias": heads.bias}
    if heads.vocab_ids is not None:
        tensors["vocab_ids"] = heads.vocab_ids.float()
    if heads.head_weight is not None:  # each head's own vocabulary projection [K, V, H], in its own dtype
        tensors["head_weight"] = heads.head_weight
    af.save(out, WEIGHTS_FILE, tensors, META_FILE, meta)


def load(path: str | Path, target: LoadedModel) -> HeadsArtifact:
    path = Path(path)
    meta = af.read_meta(path, META_FILE, {"model": str, "hidden_size": int, "vocab_size": int, "heads": int,
                                          "layer": int})
    af.check_model(meta, path, target, TRAIN)
    layers = target.model.config.num_hidden_layers
    if not 1 <= meta["layer"] <= layers or meta["heads"] < 1:
        raise SpecbenchError(f"{path / META_FILE}: field `layer` must be in 1..{layers} and `heads` at least 1 "
                             f"(found layer {meta['layer']}, heads {meta['heads']})")
    k, h = meta["heads"], meta["hidden_size"]
    shapes = {"weight": (k, h, h), "bias": (k, h)}
    from safetensors import safe_open

    with safe_open(str(path / WEIGHTS_FILE), "pt") as f:
        restricted = "vocab_ids" in f.keys()
        own = f.get_tensor("head_weight") if "head_weight" in f.keys() else None  # [K, V, H] (a synthetic run's)
    if restricted:
        shapes["vocab_ids"] = (None,)
    if own is not None and tuple(own.shape) != (k, meta["vocab_size"], h):
        raise SpecbenchError(f"{path / WEIGHTS_FILE}: tensor `head_weight` should have shape "
                             f"{[k, meta['vocab_size'], h]} (found {list(own.shape)}); retrain the artefact")
    t = af.load_weights(path, WEIGHTS_FILE, shapes)
    ids = t["vocab_ids"].long() if restricted else None
    heads = MedusaHeads(h, k, meta["layer"], ids)
    heads.weight.data.copy_(t["weight"])
    heads.bias.data.copy_(t["bias"])
    if own is not None:  # in the target's dtype, as released heads are (load_released)
        heads.head_weight = torch.nn.Parameter(own.to(target.dtype), requires_grad=False)
    heads.requires_grad_(False)
    return HeadsArtifact(heads, meta, str(path))


def load_released(path: Path, target: LoadedModel) -> HeadsArtifact:
    """Medusa heads as the authors publish them (released.py), in the target's dtype (as the authors' code casts
    them), refused when their shapes are not the target's."""
    release = released.read(path, target)
    with torch.device("meta"):  # no zeros of [K, V, H] first: the release's tensors become the parameters
        heads = MedusaHeads(release.hidden, release.heads, target.model.config.num_hidden_layers, None,
                            release.blocks, release.own_vocab)
    heads.load_state_dict({n: t.to(target.dtype) for n, t in release.tensors.items()}, assign=True)
    return HeadsArtifact(heads.requires_grad_(False), release.meta, release.source)


def resolve(spec: str | None, target: LoadedModel, folder: str = "medusa") -> HeadsArtifact:
    """--artifact: None = the shipped heads of this model; else a folder written by `specbench train medusa`, or
    Medusa heads in the authors' published layout (released.py)."""
    if spec and released.holds(Path(spec)):
        art = load_released(Path(spec), target)
        art.heads.to(target.output_device)
        return art
    path = af.locate_dir(spec, target, folder, META_FILE, "Medusa heads", TRAIN, released.EXPECTED)
    art = load(path, target)
    art.heads.to(target.output_device)  # the heads read the final hidden states
    return art
