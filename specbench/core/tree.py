"""Tree attention for tree-verified decoding (SpecInfer; Medusa §2.1.2) with PPD's prompt tokens attached to
tree nodes (PPD §4, Fig. 3). The trees/*.yaml file format and the `--tree` option: tree_file.py.

A tree is the root (the last accepted token, node 0) plus candidate nodes, each named by its root-to-node path of
top-k ranks: (0,) is the top-1 guess for the next token, (0, 2) the top-3 guess for the token after it, under the
top-1 first guess. Every node may carry prompt tokens (PPD): prompt token j of a node at depth d predicts the token
j + 2 positions after the node (PPD §3.1), and with EPT > 1 each prompt token is E ensemble tokens (PPD §3.2).

One forward's input (width q = nodes + prompt inputs) is laid out as
    [root, candidate nodes in tree order | node 0's prompt tokens | node 1's prompt tokens | ...]
with a node's prompt tokens ordered (prompt token j, ensemble copy e). Visibility (the additive mask):
    a node sees the context, its ancestors and itself;
    prompt input (node i, j, e) sees the context, node i's path (root .. i), and (node i, j' <= j, same e).
Position ids: context length + depth for a node; context length + depth(i) + 1 + j for prompt input (i, j, e).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..errors import SpecbenchError

TreePath = tuple[int, ...]  # a node: the ranks chosen at each depth from the root


@dataclass(frozen=True)
class Tree:
    """Candidate paths (parents before children) and the prompt tokens each node carries (root first)."""

    paths: tuple[TreePath, ...]
    prompt_tokens: tuple[int, ...] = ()  # len(paths) + 1 entries, root first; () = none anywhere
    ept: int = 1  # ensemble tokens per prompt token

    def __post_init__(self):
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        counts = tuple(int(c) for c in self.prompt_tokens) or (0,) * (len(paths) + 1)
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "prompt_tokens", counts)
        if len(counts) != len(paths) + 1:
            raise SpecbenchError(f"tree: {len(counts)} prompt-token counts for {len(paths)} candidates plus the "
                                 "root; give one count per node, root first")
        seen: set[TreePath] = set()
        for p in paths:
            if not p or min(p) < 0:
                raise SpecbenchError(f"tree: path {list(p)} must be a non-empty list of ranks >= 0")
            if p in seen or (len(p) > 1 and p[:-1] not in seen):
                raise SpecbenchError(f"tree: path {list(p)} is repeated or comes before its parent {list(p[:-1])}")
            seen.add(p)
        if min(counts) < 0 or self.ept < 1:
            raise SpecbenchError("tree: prompt-token counts must be >= 0 and ept >= 1")

    @property
    def nodes(self) -> int:
        """Root plus candidates."""
        return len(self.paths) + 1

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def width(self) -> int:
        """Tokens in one forward: nodes plus every prompt input."""
        return self.nodes + sum(self.prompt_tokens) * self.ept

    @cached_property
    def top_ranks(self) -> int:
        """Guesses per depth the candidates take (the highest rank + 1; 0 without candidates): a top-k's k."""
        return max((p[-1] for p in self.paths), default=-1) + 1

    @cached_property
    def parents(self) -> list[int]:
        """Parent node index of every node (root: -1)."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return [-1] + [index[p[:-1]] if len(p) > 1 else 0 for p in self.paths]

    @cached_property
    def children(self) -> list[list[int]]:
        """Each node's children, in node order."""
        out: list[list[int]] = [[] for _ in range(self.nodes)]
        for i in range(1, self.nodes):
            out[self.parents[i]].append(i)
        return out

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def ancestors(self) -> list[list[int]]:
        """Node indices from the root to each node, inclusive."""
        out: list[list[int]] = [[0]]
        for i in range(1, self.nodes):
            out.append(out[self.parents[i]] + [i])
        return out

    @cached_property
    def prompt_slots(self) -> list[list[list[int]]]:
        """slots[i][j][e] = input index of node i's prompt token j, ensemble copy e."""
        slots, nxt = [], self.nodes
        for count in self.prompt_tokens:
            node = []
            for _ in range(count):
                node.append(list(range(nxt, nxt + self.ept)))
                nxt += self.ept
            slots.append(node)
        return slots

    def visible(self, device=None) -> torch.Tensor:
        """[q, q] bool: input a may attend to input b (the tree part of the mask; the context is always visible)."""
        q = self.width
        vis = torch.zeros(q, q, dtype=torch.bool)
        for i, path in enumerate(self.ancestors):
            vis[i, path] = True
            for j, copies in enumerate(self.prompt_slots[i]):
                for e, slot in enumerate(copies):
                    vis[slot, path] = True
                    vis[slot, [self.prompt_slots[i][jj][e] for jj in range(j + 1)]] = True
        return vis.to(device)

    def offsets(self, device=None) -> torch.Tensor:
        """[q] position of each input relative to the context length."""
        pos = list(self.depths)
        for i, node in enumerate(self.prompt_slots):
            for j, copies in enumerate(node):
                pos += [self.depths[i] + 1 + j] * len(copies)
        return torch.tensor(pos, dtype=torch.long, device=device)

    def prompt_rows(self) -> list[int]:
        """For every prompt input (in input order), the row j * ept + e of the [S * ept, H] embedding table."""
        return [j * self.ept + e for node in self.prompt_slots for j, copies in enumerate(node)
                for e in range(len(copies))]

    def retrieve_indices(self) -> torch.Tensor:
        """[leaves, depth + 1] node indices along every root-to-leaf path, padded with -1 (Medusa's layout)."""
        has_child = set(self.parents[1:])
        leaves = [i for i in range(self.nodes) if i not in has_child]
        rows = torch.full((len(leaves), self.depth + 1), -1, dtype=torch.long)
        for r, leaf in enumerate(leaves):
            path = self.ancestors[leaf]
            rows[r, : len(path)] = torch.tensor(path)
        return rows

    def candidate_tokens(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """topk_ids [D, K] (rank-ordered guesses per depth) -> token of every candidate node [N - 1]."""
        if not self.paths:
            return topk_ids.new_zeros(0)
        depth = torch.tensor([len(p) - 1 for p in self.paths], device=topk_ids.device)
        rank = torch.tensor([p[-1] for p in self.paths], device=topk_ids.device)
        return topk_ids[depth, rank]


def additive(vis: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool visibility [n, kv] -> additive mask [1, 1, n, kv] (0 where visible, the dtype's min elsewhere): the form
    a 4-D mask must take under eager attention, which adds a bool mask numerically."""
    return torch.zeros(vis.shape, dtype=dtype, device=vis.device).masked_fill(~vis, torch.finfo(dtype).min)[None, None]


def attention_mask(vis: torch.Tensor, past: int, dtype: torch.dtype, prefix: int = 0) -> torch.Tensor:
    """Additive mask [1, 1, prefix + q, past + prefix + q] (0 = attend, dtype min = masked) of visibility()."""
    return additive(visibility(vis, past, prefix), dtype)


def visibility(vis: torch.Tensor, past: int, prefix: int = 0) -> torch.Tensor:
    """Bool [prefix + q, past + prefix + q], True = may attend. vis [q, q] is Tree.visible(). `prefix` causal
    tokens may come before the tree in the same forward (a prefill whose last token is the root): they see the
    context and each other causally; the tree sees all of them."""
    q = vis.shape[0]
    n = prefix + q
    allowed = torch.zeros(n, past + n, dtype=torch.bool, device=vis.device)
    allowed[:, :past] = True
    if prefix:
        allowed[:prefix, past:past + prefix] = torch.ones(prefix, prefix, dtype=torch.bool,
                                                           device=vis.device).tril()
        allowed[prefix:, past:past + prefix] = True
    allowed[prefix:, past + prefix:] = vis
    return allowed


def position_ids(offsets: torch.Tensor, past: int, prefix: int = 0) -> torch.Tensor:
    """[1, prefix + q] positions: the prefix counts up from `past`, tree inputs sit at past + prefix + offset."""
    head = torch.arange(past, past + prefix, device=offsets.device)
    return torch.cat([head, offsets + past + prefix]).unsqueeze(0)
