"""EAGLE-2's dynamic draft tree (issue 29): the batched expansion drafts what the drafter says along each path
drafted alone, the reranking keeps the m best nodes as a tree, and the drafter's cache is left as it was."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.methods.eagle import artifact as fd
from specbench.core.batch.cache import cache_length, new_cache
from specbench.core.verify import Sampling
from specbench.errors import SpecbenchError
from specbench.methods import get_method
from specbench.methods.eagle.dynamic_tree import _Node, draft_dynamic, select, shape_of
from specbench.core.batch.engine import engine
from specbench.methods.eagle.drafting import FeatureState, Probe

from .conftest import feature_artifact, prompt_ids


def _ar(target, ids, n):
    return get_method("ar")(target).generate(ids, n, Sampling(), None).tokens


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
    """A sample's state with n committed-to-be pairs pending (as after a prefill)."""
    state = FeatureState()
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
    batch = engine(drafter, "single", 1, pairs_f.device)  # batch 1's drafter engine: one slot
    shape, = draft_dynamic(batch, drafter, [Probe(history=[5])], [state], m=20, depth=4, top_k=3)  # 3 + 9 + 9 + 9
    tree = shape.tree  # drafted, so depth >= 3 is kept
    assert tree.nodes - 1 == 20 and 3 <= tree.depth <= 4 and shape.tokens[0] == 5
    assert shape.forwards == 4  # one per depth: the root's feed, then depths 2..4
    assert cache_length(batch.cache) == batch.lengths[0] == len(pairs_t)  # drafted inputs left the cache
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


@pytest.mark.parametrize("tree", ["dynamic=1", "dynamic=5", "dynamic=12"])
def test_eagle_dynamic_tree_equals_ar(deep, tmp_path, tree):
    """eagle --tree dynamic[=M] emits exactly ar's greedy tokens (float32), drafting a different tree per step."""
    art = feature_artifact(deep, tmp_path / "eagle", "eagle")
    method = get_method("eagle")(deep, {"tree": tree, "artifact": str(art)})
    m = int(tree.split("=")[1])
    static_depth = method.tree_file.tree(0).depth  # the same-size tree build-tree's search chose here
    assert method.batch_tree.dynamic[:2] == (m, max(1, min(static_depth, m)))  # no deeper: each depth is a forward
    seen = []
    original = method.proposer.propose

    def watch(samples, states, plan, sampling):
        out = original(samples, states, plan, sampling)
        seen.extend(d.layout.tree.paths for d in out)
        return out

    method.proposer.propose = watch
    for seed in range(3):
        ids = prompt_ids(seed)
        out = method.generate(ids, 40, Sampling(), None)
        assert out.tokens == _ar(deep, ids, 40), f"{tree} prompt {seed}"
        assert sum(out.accepted_lengths) == len(out.tokens) and out.draft_s > 0
    assert all(len(paths) == m and max(len(p) for p in paths) <= method.batch_tree.dynamic[1] for paths in seen)
    if tree == "dynamic=12":
        assert len(set(seen)) > 1  # the tree adapts to the context


@pytest.mark.parametrize("tree", ["dynamic=3", "dynamic=10"])
def test_parallelspec_dynamic_tree_equals_ar(deep, tmp_path, tree):
    """parallelspec --tree dynamic=M: each step's M most probable paths under the drafter's own probabilities."""
    art = feature_artifact(deep, tmp_path / "ps", "parallelspec", 3)
    method = get_method("parallelspec")(deep, {"tree": tree, "artifact": str(art)})
    for seed in range(3):
        ids = prompt_ids(seed)
        out = method.generate(ids, 40, Sampling(), None)
        assert out.tokens == _ar(deep, ids, 40), f"{tree} prompt {seed}"
        assert out.draft_forwards == out.target_forwards - 1  # still one drafter forward per step


@pytest.mark.parametrize("name,masks", [("eagle", 0), ("parallelspec", 2)])
def test_dynamic_tree_sampling_keeps_target_distribution(tiny, tmp_path, name, masks):
    """At T > 0 the shape comes from the drafter's distributions, never from the sampled tokens, and the tokens are
    sampled as a static tree's (Algorithm 1): the target's distribution (the same check the static trees pass)."""
    from .test_sd import check_distribution

    art = feature_artifact(tiny, tmp_path / name, name, masks, scale=0.3)
    method = get_method(name)(tiny, {"artifact": str(art), "tree": "dynamic=6"})
    assert check_distribution(method, tiny, trials=800) < 0.1


def test_dynamic_tree_bad_inputs(deep, tmp_path):
    art = str(feature_artifact(deep, tmp_path / "eagle", "eagle"))
    for tree in ("dynamic=0", "dynamic=x", "dynamicx"):
        with pytest.raises(SpecbenchError, match="dynamic or dynamic=M"):
            get_method("eagle")(deep, {"tree": tree, "artifact": art})
    with pytest.raises(SpecbenchError, match="not both"):
        get_method("eagle")(deep, {"tree": "dynamic", "gamma": 3, "artifact": art})
    with pytest.raises(SpecbenchError, match="only eagle and parallelspec choose their tree per step"):
        get_method("ppd")(deep, {"tree": "dynamic", "artifact": "untrained"})


@pytest.mark.parametrize("name,masks,tree", [("eagle", 0, "dynamic=8"), ("parallelspec", 2, "dynamic=5")])
@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_dynamic_trees_batch_as_they_draft_alone(deep, tmp_path, name, masks, tree, mode):
    """--tree dynamic at batch size 3: every sample drafts its own tree shape on its slot of the drafter's engine,
    the same shapes, tokens and drafter forwards as alone, and ar's greedy tokens."""
    from specbench.methods.batch_loop import generate_batch

    art = feature_artifact(deep, tmp_path / name, name, masks)
    method = get_method(name)(deep, {"tree": tree, "artifact": str(art)})
    prompts = [prompt_ids(seed) for seed in range(4)]
    alone = [method.generate(p, 30, Sampling(), None) for p in prompts]
    gens, _ = generate_batch(method, prompts, 3, mode, True, 30, Sampling(), [None] * 4)
    assert [g.tokens for g in gens] == [g.tokens for g in alone] == [_ar(deep, p, 30) for p in prompts]
    assert [g.accepted_lengths for g in gens] == [g.accepted_lengths for g in alone]
    assert [g.draft_forwards for g in gens] == [g.draft_forwards for g in alone]
