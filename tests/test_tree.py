"""Tree engine: one tree-masked forward equals sequential forwards along every path (with and without prompt
tokens), cache compaction, tree files, and tree verification (greedy, typical, lossless sampling)."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from specbench.core.batch.cache import cache_length, keep_positions, new_cache
from specbench.core.tree import Tree, attention_mask, position_ids
from specbench.core.tree_file import TreeFile, read_tree_file
from specbench.core.verify import (
    Sampling,
    tree_greedy_accept,
    tree_speculative_accept,
    tree_typical_accept,
)
from specbench.methods.ppd.artifact import embed, hidden
from specbench.errors import SpecbenchError

PATHS = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0))


def _logits(model, embeds, pos, mask=None, cache=None):
    h = hidden(model, embeds, mask, pos, cache)
    return model.get_output_embeddings()(h)  # [q, V]


def _sequential(model, ctx, path_tokens, prompt=None):
    """Logits of the last input when the context, the path and (optionally) prompt embeddings go in causally."""
    ids = torch.cat([ctx, path_tokens])
    e = embed(model, ids, prompt)
    n = e.shape[1]
    return _logits(model, e, torch.arange(n).unsqueeze(0))[-1]


def _tree_forward(model, ctx, tree, node_tokens, prompt_table):
    cache = new_cache(model)
    _logits(model, embed(model, ctx, None), torch.arange(len(ctx)).unsqueeze(0), cache=cache)
    vis = tree.visible()
    mask = attention_mask(vis, len(ctx), torch.float32)
    assert mask.shape == (1, 1, tree.width, len(ctx) + tree.width)  # last dim == KV length exactly
    rows = prompt_table[tree.prompt_rows()] if sum(tree.prompt_tokens) else None
    out = _logits(model, embed(model, node_tokens, rows), position_ids(tree.offsets(), len(ctx)), mask, cache)
    return out, cache


@pytest.mark.parametrize("prompts, ept", [(None, 1), ((3, 2, 0, 1, 3, 1, 0, 2, 1), 1),
                                          ((2, 1, 2, 0, 0, 1, 2, 1, 0), 2)])
def test_tree_forward_equals_sequential_paths(tiny, prompts, ept):
    model = tiny.model
    torch.manual_seed(0)
    tree = Tree(PATHS, prompts or (), ept)
    ctx = torch.randint(0, 256, (11,))
    node_tokens = torch.randint(0, 256, (tree.nodes,))
    table = torch.randn(3 * ept, model.config.hidden_size) * 0.5  # [S * E, H]
    with torch.no_grad():
        out, _ = _tree_forward(model, ctx, tree, node_tokens, table)
        for i, path in enumerate(tree.ancestors):
            ref = _sequential(model, ctx, node_tokens[path])
            assert torch.allclose(out[i], ref, atol=1e-4), f"node {i}"
            for j, copies in enumerate(tree.prompt_slots[i]):
                for e, slot in enumerate(copies):
                    prompt = table[[jj * ept + e for jj in range(j + 1)]]
                    ref = _sequential(model, ctx, node_tokens[path], prompt)
                    assert torch.allclose(out[slot], ref, atol=1e-4), f"node {i} prompt {j} copy {e}"


def test_layout_retrieve_indices_and_positions():
    tree = Tree(((0,), (1,), (0, 0)), (2, 1, 0, 1), ept=2)
    assert tree.parents == [-1, 0, 0, 1] and tree.depths == [0, 1, 1, 2]
    assert tree.retrieve_indices().tolist() == [[0, 2, -1], [0, 1, 3]]
    assert tree.width == 4 + 4 * 2
    # nodes at their depths; node 0's prompt tokens at 1, 2 (two copies each), node 1's at 2, node 3's at 3
    assert tree.offsets().tolist() == [0, 1, 1, 2, 1, 1, 2, 2, 2, 2, 3, 3]
    assert position_ids(tree.offsets(), 10, prefix=2)[0, :4].tolist() == [10, 11, 12, 13]
    vis = tree.visible()
    first, second = tree.prompt_slots[0]
    assert vis[second[1], first[1]] and not vis[second[1], first[0]]  # ensemble copies see only their own group
    assert not vis[:4, 4:].any()  # no node sees a prompt token
    topk = torch.tensor([[7, 8], [9, 5]])
    assert tree.candidate_tokens(topk).tolist() == [7, 8, 9]


def test_bad_trees_are_refused():
    with pytest.raises(SpecbenchError, match="before its parent"):
        Tree(((0, 0), (0,)))
    with pytest.raises(SpecbenchError, match="counts"):
        Tree(((0,),), (1,))


def test_compaction_keeps_the_accepted_path(tiny):
    """After a tree forward, keeping root .. node equals a cache built by feeding that path causally."""
    model = tiny.model
    tree = Tree(PATHS, (1,) * (len(PATHS) + 1))
    ctx = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(1))
    node_tokens = torch.randint(0, 256, (tree.nodes,), generator=torch.Generator().manual_seed(2))
    table = torch.randn(1, model.config.hidden_size)
    with torch.no_grad():
        _, cache = _tree_forward(model, ctx, tree, node_tokens, table)
        path = tree.ancestors[7]  # root -> (0,) -> (0, 0) -> (0, 0, 0)
        keep_positions(cache, len(ctx), path)
        assert cache_length(cache) == len(ctx) + len(path)
        nxt = torch.tensor([42])
        got = _logits(model, embed(model, nxt, None), torch.tensor([[cache_length(cache)]]), cache=cache)[-1]
        ref = _sequential(model, ctx, torch.cat([node_tokens[path], nxt]))
    assert torch.allclose(got, ref, atol=1e-4)


def test_tree_file_round_trip_and_errors(tmp_path):
    tf = TreeFile({1: [((0,), 1), ((1,), 1)], 2: [((0,), 2), ((0, 0), 1)]}, prompt_tokens=2, model="m",
                  hardware="cpu-x", dtype="bfloat16", built_by="test", predicted_tau=1.5, extra={"curve": [1, 2]})
    path = tmp_path / "t.yaml"
    tf.write(path)
    back = read_tree_file(path)
    assert back.states == tf.states and back.prompt_tokens == 2 and back.size == 5
    assert back.extra == {"curve": [1, 2]} and back.predicted_tau == 1.5 and back.hardware == "cpu-x"
    assert back.tree(2).prompt_tokens == (2, 2, 1)
    text = path.read_text()
    path.write_text(text.replace("- [[0, 0], 1]", "- [[0, 0], 5]"))
    with pytest.raises(SpecbenchError, match="more than prompt_tokens"):
        read_tree_file(path)
    path.write_text(text.replace("  1:\n    - [[0], 1]\n    - [[1], 1]\n", "  1:\n    - [[0, 0], 1]\n"))
    with pytest.raises(SpecbenchError, match="deeper than 1"):
        read_tree_file(path)
    path.write_text("states: 3\n")
    with pytest.raises(SpecbenchError, match="states"):
        read_tree_file(path)


def _onehot_logits(choices, vocab=8):
    logits = torch.full((len(choices), vocab), -5.0)
    for i, c in enumerate(choices):
        logits[i, c] = 5.0
    return logits


def test_tree_greedy_accept_longest_path():
    tree = Tree(PATHS)
    tokens = torch.tensor([0, 3, 4, 5, 6, 7, 1, 2, 2])  # root, (0,) (1,) (2,) (0,0) (0,1) (1,0) (0,0,0) (0,1,0)
    # target argmax: root -> 4, node (1,) -> 1, node (1,0) -> 6: path root, (1,), (1,0), then 6
    choices = [4, 0, 1, 0, 0, 0, 6, 0, 0]
    path, nxt = tree_greedy_accept(tokens, tree.parents, _onehot_logits(choices))
    assert path == [0, 2, 6] and nxt == 6
    path, nxt = tree_greedy_accept(tokens, tree.parents, _onehot_logits([1] * 9))
    assert path == [0] and nxt == 1


def test_typical_acceptance_thresholds():
    tree = Tree(((0,), (1,)))
    logits = torch.tensor([[2.0, 1.9, -9.0, -9.0], [0.0] * 4, [0.0] * 4])
    tokens = torch.tensor([0, 2, 1])  # token 2 is improbable, token 1 probable under the root
    path, _ = tree_typical_accept(tokens, tree.parents, logits, Sampling(1.0), torch.Generator().manual_seed(0))
    assert path == [0, 2]
    assert tree_typical_accept(tokens, tree.parents, logits, Sampling(), None)[0] == [0]  # greedy: exact match


VOCAB = 4


@functools.lru_cache(maxsize=None)
def _target(prefix: tuple[int, ...]) -> torch.Tensor:
    """A synthetic 'model': a fixed random next-token distribution for every prefix."""
    g = torch.Generator().manual_seed(hash(prefix) % (2**31))
    return torch.softmax(torch.randn(VOCAB, generator=g) * 1.5, -1)


def test_multi_candidate_sampling_preserves_the_target_distribution():
    tree = Tree(((0,), (1,), (0, 0), (0, 1), (1, 0)))
    cand = {(0,): 2, (1,): 0, (0, 0): 1, (0, 1): 3, (1, 0): 1}  # deterministic draft tokens per path
    tokens = torch.tensor([0] + [cand[p] for p in tree.paths])
    prefixes = [()] + [tuple(cand[p[:d + 1]] for d in range(len(p))) for p in tree.paths]
    logits = torch.stack([_target(pre).log() for pre in prefixes])  # [N, V]
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(VOCAB, VOCAB)
    trials = 20000
    for _ in range(trials):
        path, nxt = tree_speculative_accept(tokens, tree.parents, logits, Sampling(1.0), g)
        out = tokens[path[1:]].tolist() + [nxt]
        if len(out) < 2:
            out.append(int(torch.multinomial(_target(tuple(out)), 1, generator=g)))
        counts[out[0], out[1]] += 1
    exact = torch.stack([_target(()) [a] * _target((a,)) for a in range(VOCAB)])  # [V, V] joint of 2 tokens
    tv = 0.5 * (counts / trials - exact).abs().sum()
    assert tv < 0.025, f"TV distance {tv:.4f}"
    # negative control: always taking the top-ranked children would be far from the target
    greedy_joint = torch.zeros(VOCAB, VOCAB)
    greedy_joint[2, 1] = 1.0
    assert 0.5 * (greedy_joint - exact).abs().sum() > 0.3


def test_every_tree_node_is_reachable_by_sampling():
    tree = Tree(((0,), (0, 0)))
    tokens = torch.tensor([0, 1, 2])
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]])
    path, nxt = tree_speculative_accept(tokens, tree.parents, logits, Sampling(1.0), torch.Generator().manual_seed(3))
    assert path == [0, 1, 2] and nxt == 0
    assert list(itertools.chain(tree.ancestors)) == [[0], [0, 1], [0, 1, 2]]


def test_tree_option_is_parsed_once_and_refused_before_a_model_loads():
    """--tree has one parser (TreeSpec); run validation refuses a malformed value before anything loads."""
    from specbench.core.tree_file import TreeSpec
    from specbench.run.config import RunConfig
    from specbench.run.validation import validate

    assert (TreeSpec.parse("auto").kind, TreeSpec.parse("size=8").size, TreeSpec.parse("dynamic=5").size) == (
        "auto", 8, 5)
    assert TreeSpec.parse("trees/x.yaml").path == "trees/x.yaml" and str(TreeSpec.parse("dynamic")) == "dynamic"
    bad_values = (("size=0", "size=N"), ("size=x", "size=N"), ("dynamicx", "dynamic=M"), ("dynamic=-1", "dynamic=M"))
    for bad, usage in bad_values:
        with pytest.raises(SpecbenchError, match=usage):
            validate(RunConfig(methods=("ppd",), options={"tree": bad}))


@pytest.mark.parametrize("name", ["ppd", "medusa", "eagle"])
def test_the_step_accepts_with_the_rule_it_is_given(tiny, name):
    """The acceptance rule is a callable the tree step receives: a rule that keeps no draft leaves every step one
    token (the target's own, so still ar's greedy tokens), and it is called once per verified tree with the tree
    the proposer drafted."""
    from specbench.core.verify import Sampling, next_token
    from specbench.methods import get_method

    from .conftest import artifact_options, prompt_ids

    method = get_method(name)(tiny, artifact_options(name, tiny))
    seen = []

    def keep_none(tokens, tree, logits, q, sampling, generator, gen=None):
        seen.append((tokens.shape[0], tree.nodes))
        return [0], next_token(logits[0], sampling, generator)

    method.tree_rule = keep_none
    ids = prompt_ids(2)
    gen = method.generate(ids, 12, Sampling(), None)
    assert gen.tokens == get_method("ar")(tiny).generate(ids, 12, Sampling(), None).tokens
    assert set(gen.accepted_lengths) == {1} and len(seen) == gen.target_forwards - 1  # every step but the prefill
    assert all(n == nodes > 1 for n, nodes in seen)
