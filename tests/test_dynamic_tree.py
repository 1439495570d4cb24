"""EAGLE-2's dynamic draft tree (issue 29): the batched expansion drafts what the drafter says along each path
drafted alone, the reranking keeps the m best nodes as a tree, and the drafter's cache is left as it was."""

from __future__ import annotations

import math

import torch

from specbench.artifacts import feature_drafter as fd
from specbench.core.cache import cache_length, new_cache
from specbench.methods.tree.dynamic_tree import _Node, draft_dynamic, select, shape_of
from specbench.methods.tree.feature_drafting import DrafterState


def _drafter(deep):
    """A random drafter whose layer is scaled up, so attention is far from uniform and a wrong mask or position
    moves the drafted values by far more than float32 rounding (about 1e-6)."""
    torch.manual_seed(0)
    drafter = fd.FeatureDrafter(deep.model, 0).eval()
    with torch.no_grad():
        for p in drafter.layers.parameters():
            p.mul_(5)
    return drafter


def _state(drafter, n=7):
    """A drafter state with n committed-to-be pairs pending (as after a prefill)."""
    state = DrafterState(drafter)
    g = torch.Generator().manual_seed(1)
    state.commit(torch.randn(n, drafter.norm.weight.shape[0], generator=g), torch.randint(0, 256, (n,), generator=g))
    return state


def _path_logp(drafter, pairs_f, pairs_t, path_tokens):
    """Sequential reference: the log probability of each token of `path_tokens` drafted one at a time (no tree
    mask), from a fresh cache over the same committed pairs."""
    cache = new_cache(drafter)
    out = drafter.run(drafter.fuse(pairs_f, pairs_t)[None], torch.arange(len(pairs_t))[None], cache)
    feature, total, values = out[-1], 0.0, []
    for d, tok in enumerate(path_tokens):
        logp = torch.log_softmax(drafter.logits(feature[None])[0], -1)
        total += float(logp[tok])
        values.append(total)
        x = drafter.fuse(feature[None], torch.tensor([tok]))
        feature = drafter.run(x[None], torch.tensor([[len(pairs_t) + d]]), cache)[-1]
    return values


@torch.inference_mode()
def test_dynamic_tree_matches_sequential_drafting(deep):
    drafter = _drafter(deep)
    state = _state(drafter)
    pairs_f, pairs_t = torch.cat(state.features), torch.cat(state.tokens)
    shape = draft_dynamic(state, root=5, m=20, depth=4, top_k=3)  # 3 + 9 + 9 + 9 drafted, so depth >= 3 is kept
    tree = shape.tree
    assert tree.nodes - 1 == 20 and 3 <= tree.depth <= 4 and shape.tokens[0] == 5
    assert shape.forwards == 4  # one per depth: the root's feed, then depths 2..4
    assert cache_length(state.cache) == state.length == len(pairs_t)  # drafted inputs left the cache
    # every kept node's path value equals the sequential drafter's, and they come out in non-increasing order
    # along every path; the deepest kept node is reachable only through the batched, tree-masked forwards
    for node in range(1, tree.nodes):
        toks = [int(shape.tokens[a]) for a in tree.ancestors[node][1:]]
        ref = _path_logp(drafter, pairs_f, pairs_t, toks)
        assert math.isclose(shape.values[node - 1], ref[-1], abs_tol=2e-5), node
        parent = tree.parents[node]
        if parent > 0:
            assert shape.values[node - 1] <= shape.values[parent - 1] + 1e-6


@torch.inference_mode()
def test_kept_nodes_are_the_best_drafted():
    """select keeps the m highest values (ties in drafting order) and the result is closed under parents."""
    nodes = [_Node(-1, 0, 10, math.log(0.6), 1), _Node(-1, 1, 11, math.log(0.3), 1),
             _Node(0, 0, 12, math.log(0.6 * 0.9), 2), _Node(0, 1, 13, math.log(0.6 * 0.05), 2),
             _Node(1, 0, 14, math.log(0.3 * 0.99), 2), _Node(2, 0, 15, math.log(0.54 * 0.9), 3)]
    kept = select(nodes, 4)
    assert kept == [0, 1, 2, 5]  # 0.6, 0.3, 0.54, 0.486 beat 0.297 and 0.03
    tree, tokens = shape_of(nodes, kept)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 0, 0)) and tokens == [10, 11, 12, 15]
    # equal values: the parent (drafted first) is kept before its child
    tie = [_Node(-1, 0, 1, 0.0, 1), _Node(0, 0, 2, 0.0, 2), _Node(-1, 1, 3, -1.0, 1)]
    assert select(tie, 1) == [0] and select(tie, 2) == [0, 1]
