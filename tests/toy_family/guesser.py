"""The toy family's guesser and method: two untrained prompt tokens (random real-token embeddings) attached to
every node, the rest PPD's, so the family needs no artefact on disk."""

from __future__ import annotations

from specbench.methods import register
from specbench.methods.ppd import artifact as pt
from specbench.methods.ppd.guesser import PromptTokens
from specbench.methods.tree.method import TreeMethod

UNTRAINED = "untrained:2"


class ToyTokens(PromptTokens):
    family, artifact = "toy", "untrained prompt tokens"

    @classmethod
    def scorer(cls, target, artifact, initial=False):
        return PromptTokens.scorer.__func__(cls, target, artifact or UNTRAINED, initial)

    def load(self, artifact):
        super().load(artifact or UNTRAINED)
        self.description = f"toy prompt tokens {self.prompts.source}"


@register
class Toy(TreeMethod):
    name = "toy"
    summary = "a test family: two untrained prompt tokens guess a dynamic sparse tree"
    guesser_type = ToyTokens
