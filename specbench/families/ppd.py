"""`ppd`: Parallel Prompt Decoding, trained prompt tokens in the target's forward (methods/ppd/); its dynamic sparse
trees were specbench's first, so their files carry no family prefix."""

from .record import Artefact, Family


def drafter_weights(shape, fields: dict) -> float:
    """The prompt tokens' embeddings: S tokens x E ensemble copies x H."""
    return (fields.get("prompt_tokens") or 3) * (fields.get("ept") or 1) * shape.hidden


def train_memory(cfg, hidden: int, layer: int, seq: int, sequences: int) -> tuple[float, float]:
    return cfg.prompt_tokens * cfg.ept * hidden, 0


FAMILY = Family("ppd", "tree", "specbench.methods.ppd.guesser", tree_prefix="",
                artefact=Artefact("ppd.yaml", "prompt_tokens.safetensors"),
                train_config="specbench.train.configs:PPDConfig",
                scorer="specbench.methods.ppd.guesser:PromptTokens.scorer", has_initial=True,
                drafter_weights=drafter_weights, train_memory=train_memory, backprop_target=True)
