"""The acceptance rule a tree step verifies with, passed to the step as a small callable: rule(tokens [N] root
first, parents, logits [N, V] the target's at every node, q [N, V] the draft distributions or None, sampling,
generator) -> (the longest accepted path of node indices from the root, the target's next token). The rules are
core/verify.py's; a method picks one (its proposer's, or Medusa's typical rule for a `-typical` twin), and anything
with this call (a seeded synthetic rule) can stand in for it."""

from __future__ import annotations

from typing import Protocol

import torch

from ...core.verify import Sampling, tree_greedy_accept, tree_sampled_accept, tree_speculative_accept, \
    tree_typical_accept


class AcceptRule(Protocol):
    def __call__(self, tokens: torch.Tensor, parents: list[int], logits: torch.Tensor, q: torch.Tensor | None,
                 sampling: Sampling, generator: torch.Generator | None) -> tuple[list[int], int]: ...


def speculative(tokens, parents, logits, q, sampling, generator):
    """Lossless multi-candidate speculative sampling over deterministic drafts (exact match at T = 0)."""
    return tree_speculative_accept(tokens, parents, logits, sampling, generator)


def typical(tokens, parents, logits, q, sampling, generator):
    """Medusa's typical acceptance at T > 0 (lossy; exact match at T = 0)."""
    return tree_typical_accept(tokens, parents, logits, sampling, generator)


def with_draft_q(tokens, parents, logits, q, sampling, generator):
    """Exact match at T = 0; at T > 0 multi-candidate speculative sampling with the draft q the candidates were
    drawn from (ParallelSpec Algorithm 1): lossless."""
    if sampling.greedy:
        return tree_greedy_accept(tokens, parents, logits)
    return tree_sampled_accept(tokens, parents, logits, q, sampling, generator)
