"""`eagle3`: EAGLE-3's drafter, one decoder layer over the target's fused low, middle and high-layer states, its own
head over a reduced draft vocabulary, one drafting forward per depth (methods/eagle3/); EAGLE-2's dynamic tree
drafts its tree each step."""

from .record import Artefact, Family


def drafter_read(shape, fields: dict) -> float:
    """fc [H, 3H], the layer (q, k, v read 2H: about a third more than a target layer's), its draft-vocabulary head
    (counted at the full vocabulary: the published drafters' reduced vocabularies differ)."""
    return 3 * shape.hidden ** 2 + 1.35 * shape.weights_per_layer + shape.vocab * shape.hidden // 4


def drafter_weights(shape, fields: dict) -> float:
    return drafter_read(shape, fields)


def train_memory(cfg, hidden: int, layer: int, seq: int, sequences: int) -> tuple[float, float]:
    """fc, the layer, the head; the fused and final states [T, 4H] cached in bfloat16."""
    top = getattr(cfg, "vocab_top", None) or 0
    return 3 * hidden * hidden + 1.35 * layer + top * hidden, sequences * seq * 4 * hidden * 2


FAMILY = Family("eagle3", "tree", "specbench.methods.eagle3.guesser", one_state=True, dynamic_trees=True,
                draft_cost="depth", artefact=Artefact("eagle3.yaml", "model.safetensors"),
                train_config="specbench.train.configs:Eagle3Config",
                scorer="specbench.methods.eagle3.guesser:Eagle3Drafts.scorer",
                drafter_read=drafter_read, drafter_weights=drafter_weights, drafter_kv_layers=1,
                train_memory=train_memory)
