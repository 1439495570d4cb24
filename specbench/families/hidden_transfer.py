"""`hidden-transfer`: Hidden Transfer's pseudo positions, projected at transfer layers of the target's own forward
(methods/hidden_transfer/)."""

from .record import Artefact, Family


def drafter_weights(shape, fields: dict) -> float:
    """One H x H projection per transfer layer."""
    return len(fields.get("transfer_layers") or [0, 0, 0]) * shape.hidden ** 2


def train_memory(cfg, hidden: int, layer: int, seq: int, sequences: int) -> tuple[float, float]:
    return len(cfg.transfer_layers or (0, 0, 0)) * hidden * hidden, 0


FAMILY = Family("hidden-transfer", "tree", "specbench.methods.hidden_transfer.guesser",
                artefact=Artefact("hidden-transfer.yaml", "projections.safetensors"),
                train_config="specbench.train.configs:TransferConfig",
                scorer="specbench.methods.hidden_transfer.guesser:TransferProjections.scorer",
                drafter_weights=drafter_weights, train_memory=train_memory, backprop_target=True)
