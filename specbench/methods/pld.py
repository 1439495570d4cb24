"""`pld`: prompt lookup decoding (Saxena 2023): copy the tokens that followed the latest earlier occurrence of
the last n-gram, verify them in one target forward. Training-free; lossless (greedy prefix match, or speculative
sampling against a one-hot draft, which preserves the target distribution)."""

from __future__ import annotations

from .base import DecodeMethod, register
from .batch_loop import Batchable
from .options import Option

NGRAM = Option("pld_ngram", int, 3, "longest n-gram looked up (tries n, n-1, ..., 1)", minimum=1)
DRAFT_TOKENS = Option("pld_draft_tokens", int, 10, "tokens copied after a match", minimum=1)


def lookup_draft(history: list[int], max_ngram: int, max_tokens: int) -> list[int]:
    """Tokens following the most recent earlier match of the longest suffix n-gram (n = max_ngram .. 1)."""
    size = len(history)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = history[size - n:]
        # scan right to left for the latest earlier occurrence (not the suffix itself)
        for start in range(size - n - 1, -1, -1):
            if history[start:start + n] == suffix:
                follow = history[start + n:start + n + max_tokens]
                if follow:
                    return follow
    return []


@register
class PromptLookup(Batchable, DecodeMethod):
    name = "pld"
    kind = "draft-free"
    summary = "prompt lookup: n-gram copy from prompt and output, verified in one forward"
    option_specs = (NGRAM, DRAFT_TOKENS)

    def propose(self, samples, max_new_tokens, sampling):
        """Each sample's own lookup (one-hot draft: q = None); the step (batch_loop.py) verifies and accepts."""
        for s in samples:
            s.draft = lookup_draft(s.history, self.options.pld_ngram,
                                   min(self.options.pld_draft_tokens, s.room(max_new_tokens)))
            s.q = None
