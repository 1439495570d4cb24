"""Hidden Transfer's projections (Wu et al. 2024, §3.3) and their artefact.

Step j (1-based, j = 1..k) has one linear map W_j [H, H] at transfer layer l_j: the hidden state h of a real
position after l_j layers becomes the pseudo hidden state of the position j after it, h~ = W_j h, which then passes
layers l_j+1 .. L with the context (methods/hidden_transfer/layers.py) and guesses the token j + 1 positions after the real one
(the model's own LM head, frozen). W_j starts as the identity (the pseudo state begins as a copy of its source).

Artefact folder (`specbench train hidden-transfer` writes artifacts/<model>/hidden-transfer):
  projections.safetensors   weight [k, H, H]
  hidden-transfer.yaml      model, model_key, hidden_size, vocab_size, transfer_layers [k], masked, training facts

masked: false (decoding's layout, the paper's "No masked") lets pseudo position j attend to pseudo positions
1..j-1 of its insertion; true (the paper's "Masked" ablation, §4) hides them, so each step guesses from the context
alone. Masked projections are for accuracy comparisons only; `hidden-transfer` decodes with the unmasked layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...core.model.load import LoadedModel
from .layers import LayerTransfer, check_transfer_layers
from ...core import artifact_files as af

WEIGHTS_FILE, META_FILE = "projections.safetensors", "hidden-transfer.yaml"
TRAIN = "specbench train hidden-transfer"


class TransferProjections(torch.nn.Module):
    def __init__(self, hidden: int, layers: list[int], masked: bool = False):
        super().__init__()
        self.layers = list(layers)  # l_1 < ... < l_k: transfer after this many decoder layers
        self.masked = masked  # pseudo positions do not see each other (the "Masked" ablation)
        self.weight = torch.nn.Parameter(torch.eye(hidden).repeat(len(layers), 1, 1))  # [k, H, H]

    @property
    def depth(self) -> int:
        return len(self.layers)

    def project(self, j: int):
        """Step j's (0-based) map [P, H] -> [P, H]."""
        return lambda h: h @ self.weight[j].to(h.device, h.dtype).T  # h: at layer j's device (device maps)

    def transfers(self, slots: list[torch.Tensor], sources: list[torch.Tensor]) -> list[LayerTransfer]:
        """The transfers of one forward: slots[j] [P_j] are the pseudo inputs of transfer j, sources[j] their real
        sources (indices into the same forward, or hidden states [P_j, H] captured at layer l_j)."""
        return [LayerTransfer(self.layers[j], slots[j], sources[j], self.project(j), self.weight[j])
                for j in range(min(self.depth, len(slots)))]


@dataclass
class ProjectionArtifact:
    projections: TransferProjections
    meta: dict = field(default_factory=dict)
    source: str = ""


def save(proj: TransferProjections, out: Path, meta: dict) -> None:
    af.save(out, WEIGHTS_FILE, {"weight": proj.weight}, META_FILE, meta)


def load(path: str | Path, target: LoadedModel) -> ProjectionArtifact:
    path = Path(path)
    meta = af.read_meta(path, META_FILE, {"model": str, "hidden_size": int, "vocab_size": int,
                                          "transfer_layers": list}, optional={"masked": bool})
    af.check_model(meta, path, target, TRAIN)
    layers = check_transfer_layers(meta["transfer_layers"], target.model.config.num_hidden_layers, target.spec)
    h, masked = meta["hidden_size"], meta.get("masked", False)
    t = af.load_weights(path, WEIGHTS_FILE, {"weight": (len(layers), h, h)})
    proj = TransferProjections(h, layers, masked)
    proj.weight.data.copy_(t["weight"])
    proj.requires_grad_(False)
    return ProjectionArtifact(proj, meta, str(path))


def resolve(spec: str | None, target: LoadedModel) -> ProjectionArtifact:
    """--artifact: None = the shipped projections of this model; else a folder written by train hidden-transfer."""
    path = af.locate_dir(spec, target, "hidden-transfer", META_FILE, "Hidden Transfer projections", TRAIN)
    art = load(path, target)
    art.projections.to(target.output_device)
    return art
