"""`sd`: speculative decoding with a drafter model (methods/sd/); `specbench train drafter` trains the drafter."""

from .record import Artefact, Family


def train_memory(cfg, hidden: int, layer: int, seq: int, sequences: int) -> tuple[float, float]:
    """The drafter's layers and its vocabulary-restricted head; the teacher's top-k ids and probabilities cached."""
    top = getattr(cfg, "vocab_top", None) or 0
    return cfg.layers * layer + top * hidden, sequences * seq * cfg.topk * (8 + 4)


FAMILY = Family("sd", "draft-model", "specbench.methods.sd.method", aliases=("drafter",),
                artefact=Artefact("drafter.yaml", "drafter.safetensors"),
                train_config="specbench.train.configs:DrafterConfig", train_memory=train_memory)
