"""`ppd` and `ppd-typical`: Parallel Prompt Decoding (Chen et al. 2024, "Hardware-Aware Parallel Prompt Decoding
for Memory-Efficient Acceleration of LLM Inference", §3 and §4, Fig. 2-3).

Each step is one target forward over: the root (the last accepted token), a candidate tree whose tokens are the
top-k guesses of the previously accepted node's prompt tokens, and the prompt tokens attached to every node
(core/tree.py lays the input out and masks it). Verification walks the tree (exact match at T = 0; lossless
multi-candidate speculative sampling at T > 0, or typical acceptance for `ppd-typical`); the cache keeps only the
root and the accepted path; the accepted node's prompt-token logits give the next candidates, and how many prompt
tokens it carried is the next state of the dynamic sparse tree. Extra memory over `ar`: the S x EPT embeddings.
The tree shapes (methods/tree/shapes.py) and the proposer (methods/tree/proposer.py) are the defaults, PPD's; this
file loads the prompt tokens.
"""

from __future__ import annotations

from . import artifact as pt
from .scoring import score_sequence
from ..base import register
from ..tree.method import TreeMethod
from ..tree.guesser import Guesser
from ..tree.pricing import GuessScorer


class PromptTokens(Guesser):
    """Trained prompt tokens (S distances x EPT ensemble copies) attached to every node."""

    family, artifact = "ppd", "prompt tokens"

    @classmethod
    def scorer(cls, target, artifact, initial=False):
        tokens = pt.resolve(artifact, target)  # also takes untrained[:S], random real-token embeddings
        if initial and not tokens.meta.get("untrained"):
            tokens = pt.load(tokens.source, target, initial=True)  # the embeddings training started from
        return GuessScorer(lambda ids, start: score_sequence(target, tokens, ids, start), tokens.count, tokens.source,
                           {"prompt_tokens": tokens.count, "ept": tokens.ept})

    def load(self, artifact):
        self.prompts = pt.resolve(artifact, self.target)
        self.table = self.prompts.table(self.target.dtype, self.target.device)  # [S * E, H]
        self.rows, self.ept, self.source = self.prompts.count, self.prompts.ept, self.prompts.source
        self.description = f"prompt tokens {self.prompts.source}"


@register
class ParallelPromptDecoding(TreeMethod):
    name = "ppd"
    summary = "parallel prompt decoding: trained prompt tokens guess a dynamic sparse tree, tree-verified"
    guesser_type = PromptTokens


@register
class ParallelPromptDecodingTypical(TreeMethod):
    name = "ppd-typical"
    lossless = False
    typical = True
    summary = "ppd with typical acceptance at T > 0 (Medusa's rule, posterior threshold 0.09, alpha 0.3; lossy)"
    guesser_type = PromptTokens
