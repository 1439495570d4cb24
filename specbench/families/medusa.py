"""`medusa`: Medusa-1 heads on the target's last state, one static tree of candidates (methods/medusa/); heads at a
middle layer (early exit) are the same artefact."""

from .record import Artefact, Family

HEADS = 4  # when the acceptance file does not say (Medusa's published Vicuna-7B tree is 4 deep)


def drafter_read(shape, fields: dict) -> float:
    """Each head: an H x H residual block and its own H x V projection."""
    return (fields.get("heads") or HEADS) * (shape.hidden ** 2 + shape.vocab * shape.hidden)


def drafter_weights(shape, fields: dict) -> float:
    return (fields.get("heads") or HEADS) * (shape.hidden ** 2 + shape.hidden + shape.vocab * shape.hidden)


def train_memory(cfg, hidden: int, layer: int, seq: int, sequences: int) -> tuple[float, float]:
    """The heads' residual blocks; the heads' input and the last state [T, H] cached in float32."""
    return cfg.heads * (hidden * hidden + hidden), sequences * seq * hidden * 4 * 2


FAMILY = Family("medusa", "tree", "specbench.methods.medusa.guesser", one_state=True, draft_cost="step",
                artefact=Artefact("medusa.yaml", "heads.safetensors"), aliases=("early-exit",),
                train_config="specbench.train.configs:MedusaConfig",
                scorer="specbench.methods.medusa.guesser:MedusaHeads.scorer",
                drafter_read=drafter_read, drafter_weights=drafter_weights, train_memory=train_memory)
