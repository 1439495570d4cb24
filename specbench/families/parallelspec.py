"""`parallelspec`: eagle's feature drafter with k trained [MASK] inputs, every depth drafted in one forward
(methods/parallelspec/; artefact and training are eagle's)."""

from . import eagle
from .record import Artefact, Family


def drafter_read(shape, fields: dict) -> float:
    """One decoder layer (its [MASK] rows ride along in width) and the target's LM head."""
    return shape.weights_per_layer + shape.vocab * shape.hidden


def drafter_weights(shape, fields: dict) -> float:
    return shape.weights_per_layer + (fields.get("mask_tokens") or 4) * shape.hidden


FAMILY = Family("parallelspec", "tree", "specbench.methods.parallelspec.guesser", one_state=True,
                dynamic_trees=True, draft_cost="step", mask_inputs=True,
                artefact=Artefact("parallelspec.yaml", "feature-drafter.safetensors"),
                train_config="specbench.train.configs:ParallelSpecConfig",
                scorer="specbench.methods.parallelspec.guesser:ParallelDrafts.scorer",
                drafter_read=drafter_read, drafter_weights=drafter_weights, drafter_kv_layers=1,
                train_memory=eagle.train_memory)
