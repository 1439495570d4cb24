"""The acceptance rule a tree step verifies with, passed to the step as a small callable: rule(tokens [N] root
first, tree (its parents and each candidate's ranks), logits [N, V] the target's at every node, q [N, V] the draft
distributions or None, sampling, generator, gen: the sample's Generation) -> (the longest accepted path of node
indices from the root, the target's next token). The rules are core/verify.py's; a method picks one (its proposer's,
or Medusa's typical rule for a `-typical` twin), and anything with this call can stand in for it: `stated` wraps
--synthetic-acceptance's seeded draw (core/synthetic.py)."""

from __future__ import annotations

from typing import Protocol

import torch

from ...core.tree import Tree
from ...core.verify import Sampling, tree_greedy_accept, tree_sampled_accept, tree_speculative_accept, \
    tree_typical_accept


class AcceptRule(Protocol):
    def __call__(self, tokens: torch.Tensor, tree: Tree, logits: torch.Tensor, q: torch.Tensor | None,
                 sampling: Sampling, generator: torch.Generator | None, gen) -> tuple[list[int], int]: ...


def speculative(tokens, tree, logits, q, sampling, generator, gen=None):
    """Lossless multi-candidate speculative sampling over deterministic drafts (exact match at T = 0)."""
    return tree_speculative_accept(tokens, tree.parents, logits, sampling, generator)


def typical(tokens, tree, logits, q, sampling, generator, gen=None):
    """Medusa's typical acceptance at T > 0 (lossy; exact match at T = 0)."""
    return tree_typical_accept(tokens, tree.parents, logits, sampling, generator)


def with_draft_q(tokens, tree, logits, q, sampling, generator, gen=None):
    """Exact match at T = 0; at T > 0 multi-candidate speculative sampling with the draft q the candidates were
    drawn from (ParallelSpec Algorithm 1): lossless."""
    if sampling.greedy:
        return tree_greedy_accept(tokens, tree.parents, logits)
    return tree_sampled_accept(tokens, tree.parents, logits, q, sampling, generator)


def stated(synthetic) -> AcceptRule:
    """A SyntheticAcceptance (core/synthetic.py) as a tree rule: a seeded draw over the tree's ranks, its expected
    acceptance added to the sample's Generation."""

    def rule(tokens, tree, logits, q, sampling, generator, gen=None):
        return synthetic.tree(tokens, tree.parents, tree.paths, logits, sampling, generator, gen=gen)

    return rule
