"""`eagle`: the feature drafter, one decoder layer over the target's features, one drafting forward per depth
(methods/eagle/); EAGLE-2's dynamic tree drafts its tree each step."""

from .record import Artefact, Family


def drafter_read(shape, fields: dict) -> float:
    """One decoder layer, the 2H -> H input projection, the target's LM head."""
    return shape.weights_per_layer + 2 * shape.hidden ** 2 + shape.vocab * shape.hidden


def drafter_weights(shape, fields: dict) -> float:
    """Its own weights: the layer and the input projection (embeddings and LM head are the target's)."""
    return shape.weights_per_layer + 2 * shape.hidden ** 2


def train_memory(cfg, hidden: int, layer: int, seq: int, sequences: int) -> tuple[float, float]:
    """The layer, the input projection and the vocabulary-restricted head; one state [T, H] cached in float32."""
    top = getattr(cfg, "vocab_top", None) or 0
    return layer + 2 * hidden * hidden + top * hidden, sequences * seq * hidden * 4


FAMILY = Family("eagle", "tree", "specbench.methods.eagle.guesser", one_state=True, dynamic_trees=True,
                draft_cost="depth", artefact=Artefact("eagle.yaml", "feature-drafter.safetensors"),
                train_config="specbench.train.configs:EagleConfig",
                scorer="specbench.methods.eagle.guesser:EagleDrafts.scorer",
                drafter_read=drafter_read, drafter_weights=drafter_weights, drafter_kv_layers=1,
                train_memory=train_memory)
