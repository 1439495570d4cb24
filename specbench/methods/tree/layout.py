"""One tree state laid out for a step: its mask part, positions, the rows attached to its nodes (core/tree.py
builds the tree; this keeps what every step of that state reuses)."""

from __future__ import annotations

import torch

from ...core.tree import Tree

# One LM-head call over every tree input (nodes and all prompt inputs) instead of two (nodes, then the accepted
# node's prompt inputs) while the extra rows are few: on a CPU a large head's fixed cost per call outweighs a few
# extra rows, so a second call wins only once it would save more than about a dozen rows. GPUs are flatter still.
COMBINED_HEAD_MAX_PROMPT_INPUTS = 12


class TreeLayout:
    """One state's tree with everything a step needs precomputed (mask part, positions, prompt rows)."""

    def __init__(self, tree: Tree, table: torch.Tensor | None, device):
        self.tree = tree
        self.parents = tree.parents
        self.visible = tree.visible(device)  # [q, q]
        self.offsets = tree.offsets(device)  # [q]
        self.rows = table[tree.prompt_rows()] if sum(tree.prompt_tokens) else None  # [P * E, H]
        self.max_rank = tree.top_ranks
        self.combined_head = self.visible.shape[0] - tree.nodes <= COMBINED_HEAD_MAX_PROMPT_INPUTS
