"""`suffix` (SuffixDecoding): the suffix index's counts, scores and adaptive length, the per-request and global caches
(cold / warm, never a prompt's own output), drafting on the tiny model, and T > 0 sampling that keeps the target's
distribution with trees of several siblings. Greedy equality with `ar` and batching: test_methods.py,
test_batching.py (parametrised over the registry)."""

from __future__ import annotations

import torch

from specbench.core.verify import Sampling
from specbench.methods import get_method
from specbench.methods.batch_loop import generate_batch
from specbench.methods.suffix.cache import SuffixCache
from specbench.methods.suffix.index import SuffixIndex

from .conftest import prompt_ids
from .test_sd import exact_distribution, tv

SEQ = [1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 5, 9, 1, 2, 3]


def test_the_tree_is_grown_by_empirical_probability_within_alpha_times_the_match():
    """"1 2 3" occurs 4 times (the context's own end included, as a suffix tree counts it): 3 continue with 4 (D =
    3/4); of those, 2 with 5 and 1 with 6 (D = 1/2, 1/4). The match of length 3 allows 3 tokens (alpha = 1)."""
    index = SuffixIndex(64)
    index.extend(0, SEQ)
    draft = index.speculate(SEQ, 16, 1.0, 0.1)
    assert (draft.tokens, draft.parents, draft.match_len) == ([4, 5, 6], [-1, 0, 0], 3)
    assert draft.probs == [0.75, 0.5, 0.25] and draft.score == 1.5
    assert draft.paths() == [(0,), (0, 0), (0, 1)] and draft.depth == 2
    assert index.speculate(SEQ, 16, 0.5, 0.1).tokens == [4]  # alpha 0.5: 1 token at p = 2 and 3
    assert index.speculate(SEQ, 16, 1.0, 0.3).tokens == [4, 5]  # 1/4 < 0.3: pruned
    assert index.speculate(SEQ, 2, 1.0, 0.1).tokens == [4, 5]  # the cap on the tree's tokens
    assert index.speculate(SEQ, 16, 1.0, 0.1, deepest=1).tokens == [4]
    assert SuffixIndex(4).speculate(SEQ, 16, 1.0, 0.1).tokens != [4, 5, 6]  # depth 4: p + continuation <= 4


def test_no_match_drafts_nothing():
    index = SuffixIndex(64)
    index.extend(0, [1, 2, 3])
    assert index.speculate([1, 2, 3, 7], 16, 1.0, 0.1).tokens == []
    assert index.speculate([], 16, 1.0, 0.1).tokens == []


def test_the_global_index_offers_other_prompts_outputs_never_the_prompts_own():
    cache = SuffixCache(64)
    first = cache.start([10, 11, 12])
    assert not first.warm and cache.starts == {"cold": 1, "warm": 0}
    cache.finish(first, [20, 21, 22, 23, 24, 25])
    again = cache.start([10, 11, 12])  # the same prompt (a repeat): its own output is not offered
    assert not again.warm
    assert cache.speculate(again, [10, 11, 12, 20, 21, 22], 16, 1.0, 0.1).tokens == []
    other = cache.start([30, 31])
    assert other.warm and cache.starts == {"cold": 2, "warm": 1}
    draft = cache.speculate(other, [30, 31, 20, 21, 22], 16, 1.0, 0.1)
    assert draft.tokens == [23, 24, 25]
    cache.finish(again, [20, 21, 22, 40])  # a prompt's newer output replaces its older one
    assert cache.speculate(other, [30, 31, 20, 21, 22], 16, 1.0, 0.1).tokens == [40]
    off = SuffixCache(64, use_global=False)
    off.finish(off.start([1]), [5, 6, 7])
    request = off.start([2])
    assert not request.warm and off.speculate(request, [2, 5, 6], 16, 1.0, 0.1).tokens == []


def test_suffix_drafts_trees_and_saves_forwards_on_repetitive_prompts(tiny):
    ids = prompt_ids(0)
    ar = get_method("ar")(tiny, {}).generate(ids, 48, Sampling(), None)
    gen = get_method("suffix")(tiny, {}).generate(ids, 48, Sampling(), None)
    assert gen.tokens == ar.tokens
    assert gen.accepted_drafts > 0 and gen.target_forwards < len(gen.tokens)
    assert gen.draft_s > 0  # choosing the trees is drafting time


def test_the_global_index_helps_a_second_prompt_that_repeats_the_first_ones_output(tiny):
    """Prompt B differs from A in its first token: its output repeats A's, which B's own index lacks and the global
    index holds once A finished. Both settings give ar's tokens; the global index saves forwards."""
    a = prompt_ids(3)
    b = a.clone()
    b[0, 0] = (int(a[0, 0]) + 1) % 256
    ar = get_method("ar")(tiny, {})
    forwards = {}
    for setting in ("on", "off"):
        method = get_method("suffix")(tiny, {"suffix_global": setting})
        method.generate(a, 48, Sampling(), None)
        gen = method.generate(b, 48, Sampling(), None)
        assert gen.tokens == ar.generate(b, 48, Sampling(), None).tokens
        forwards[setting] = gen.target_forwards
        assert method.cache.starts == ({"cold": 1, "warm": 1} if setting == "on" else {"cold": 2, "warm": 0})
    assert forwards["on"] < forwards["off"]


def _covering_prompt(tiny, rounds: int = 4) -> torch.Tensor:
    """A prompt whose likely first tokens each occur in it followed by likely second tokens (several per first
    token), so the step after the first sampled token drafts a tree of several siblings that is sometimes right."""
    base = prompt_ids(0)[0, :20].tolist()
    pairs: set[tuple[int, int]] = set()
    ids = base
    with torch.inference_mode():
        for _ in range(rounds):
            firsts = tiny.model(torch.tensor([ids])).logits[0, -1].topk(3).indices.tolist()
            for t in firsts:
                seconds = tiny.model(torch.tensor([ids + [t]])).logits[0, -1].topk(2).indices.tolist()
                pairs |= {(t, s) for s in seconds}
            ids = [x for pair in sorted(pairs) for x in pair] + base
    return torch.tensor([ids])


def test_sampling_with_sibling_trees_preserves_target_distribution(tiny):
    """T > 0: SpecInfer's multi-candidate speculative sampling over the tree's siblings keeps the target's
    distribution of 3-token continuations (27 outcomes), while trees were drafted, partly accepted and partly
    rejected (a test that never drafts would prove nothing)."""
    sampling = Sampling(temperature=1.0, top_k=3)
    ids = _covering_prompt(tiny)
    exact = exact_distribution(tiny.model, ids, sampling, 3)
    method = get_method("suffix")(tiny, {"suffix_alpha": 4.0})  # a match of 1 token grows up to 4 siblings
    g = torch.Generator().manual_seed(0)
    counts: dict[tuple, int] = {}
    drafted = accepted = 0
    trials = 2000
    siblings = []  # root children of every tree drafted
    drafting = method._draft

    def draft(sample, max_new_tokens):
        tree, tokens = drafting(sample, max_new_tokens)
        siblings.append(len(tree.children[0]))
        return tree, tokens

    method._draft = draft
    for _ in range(trials):
        gen = method.generate(ids, 3, sampling, g)
        counts[tuple(gen.tokens)] = counts.get(tuple(gen.tokens), 0) + 1
        drafted += gen.drafted > 0
        accepted += gen.accepted_drafts > 0
    distance = tv({k: v / trials for k, v in counts.items()}, exact)
    assert distance < 0.1, f"TV {distance:.3f} between suffix samples and the target distribution"
    assert drafted > trials // 2 and trials // 20 < accepted < drafted, (drafted, accepted)
    assert sum(n >= 2 for n in siblings) > trials // 4, "the trees should often have several siblings"


def test_batched_suffix_shares_finished_outputs_and_keeps_ar_tokens(tiny):
    """B = 3, refilled: each sample's tokens are ar's whatever the global index held when it drafted."""
    prompts = [prompt_ids(s, length=6 + 3 * s) for s in range(5)]
    ar = get_method("ar")(tiny, {})
    method = get_method("suffix")(tiny, {})
    for mode in ("unpadded", "padded"):
        gens, _ = generate_batch(method, prompts, 3, mode, True, 32, Sampling(), [None] * 5)
        assert [g.tokens for g in gens] == [ar.generate(p, 32, Sampling(), None).tokens for p in prompts]
    assert method.cache.starts["cold"] == 3 and method.cache.starts["warm"] == 7  # the first batch started cold


def test_a_synthetic_acceptance_run_draws_suffix_trees_at_the_stated_rates(tmp_path, prompts_file, monkeypatch):
    """--synthetic-acceptance: suffix's trees are kept by the stated draw over their ranks, and the run's check finds
    the measured acceptance within sampling error of the stated one."""
    import pandas as pd
    import yaml

    from .test_synthetic_acceptance import _run

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    out, result = _run(tmp_path, prompts_file, "0.8,0.6,0.4", "suffix")
    assert result.exit_code == 0, result.output
    check = yaml.safe_load((out / "run.yaml").read_text())["synthetic_acceptance"]["checks"]["suffix"]
    assert check["agrees"], check
    records = pd.read_csv(out / "records.csv")
    assert records[records.method == "suffix"].drafted.sum() > 0


def test_the_warm_up_leaves_nothing_in_the_global_index(tiny, tmp_path, prompts_file, monkeypatch):
    """The run calls warmed_up() after its untimed warm-up (batch 1 and batched), and suffix then forgets the
    warm-up's outputs: the first timed prompt starts cold."""
    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.methods.suffix.method import SuffixDecoding

    method = get_method("suffix")(tiny, {})
    method.generate(prompt_ids(1), 8, Sampling(), None)  # a warm-up of another prompt
    method.warmed_up()
    method.generate(prompt_ids(2), 8, Sampling(), None)
    assert method.cache.starts == {"cold": 1, "warm": 0}
    calls = []
    monkeypatch.setattr(SuffixDecoding, "warmed_up", lambda self: calls.append(self.cache.starts.copy()))
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "-m", "suffix", "--dataset", str(prompts_file),
                                      "--limit", "2", "--max-new-tokens", "8", "--warmup", "1", "-b", "1,2",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert len(calls) == 1 and sum(calls[0].values()) >= 3  # after batch 1's warm-up and the batched one


def test_estimate_measures_suffix_per_depth_for_plan_and_recommend(tmp_path, monkeypatch):
    """`estimate --method suffix` writes its acceptance per tree depth, which plan and recommend price it with."""
    import yaml
    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["estimate", "--method", "suffix", "--model", "random:tiny", "--limit", "2"])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load((tmp_path / "acceptance" / "tiny" / "suffix.yaml").read_text())
    assert data["marginal"] and 0 < data["marginal"][0] <= 1


def test_the_offset_lets_a_short_match_draft_beyond_alpha_times_its_length():
    """ArcticInference's max_spec_offset: a match of 3 drafts alpha * 3 + offset tokens, best-first (D 1/4 ties go
    to the node pushed first: 6, then 9 under 4 5, the most recent of two places)."""
    index = SuffixIndex(64)
    index.extend(0, SEQ)
    assert index.speculate(SEQ, 16, 1.0, 0.1, offset=1).tokens == [4, 5, 6, 9]
    draft = index.speculate(SEQ, 16, 1.0, 0.1, offset=2)
    assert (draft.tokens, draft.parents, draft.match_len) == ([4, 5, 6, 9, 1], [-1, 0, 0, 1, 1], 3)
    assert index.speculate(SEQ, 4, 1.0, 0.1, offset=2).tokens == [4, 5, 6, 9]  # --suffix-max-spec still caps it


def test_the_cut_keeps_the_nodes_worth_their_forward_on_the_latency_curve():
    """1 + the kept nodes' scores (expected tokens a step) over L(n + 1) / L(1): a flat curve keeps the whole tree,
    a steep one none, a knee the nodes before it; nodes past the curve's widest width are never kept."""
    index = SuffixIndex(64)
    index.extend(0, SEQ)
    draft = index.speculate(SEQ, 16, 1.0, 0.1, offset=2)  # scores 0.75, 0.5, 0.25, 0.25, 0.25
    assert draft.cut([1.0] * 17).tokens == draft.tokens
    assert draft.cut([1.0] + [10.0] * 16).tokens == []
    assert draft.cut([1.0, 1.0, 1.0, 2.0, 2.0, 2.0]).tokens == [4, 5]  # 2.25 / 1 beats 3 / 2
    assert draft.cut([1.0, 1.0, 1.0]).tokens == [4, 5]  # width 3 at most: 2 nodes
    assert draft.cut([1.0] * 17).match_len == 3


def test_a_global_match_is_scored_with_the_contexts_own_end_as_the_request_index_scores_it():
    """The request's index counts the context's own end among a pattern's places (it holds the running text); the
    global index counts it too, so the same evidence scores the same in both and the request's tree wins the tie."""
    cache = SuffixCache(64)
    cache.finish(cache.start([1]), [10, 11, 12, 13])
    request = cache.start([10, 11, 12, 99])
    request.local.extend(0, [10, 11, 12])
    context = [10, 11, 12, 99, 10, 11, 12]
    assert cache.outputs.speculate(context, 1, 1.0, 0.1, unseen=1).probs == [0.5]
    assert cache.speculate(request, context, 1, 1.0, 0.1).tokens == [99]  # 0.5 each: the request's
    cache.own_end = 0
    assert cache.speculate(request, context, 1, 1.0, 0.1).tokens == [13]  # uncounted, the global one scored 1.0


def test_the_latency_curve_cuts_suffix_trees_and_keeps_ar_tokens(tiny):
    """On a curve where any extra input costs a whole forward no tree is worth verifying: nothing is drafted; on a
    flat curve the trees are the scored ones. Either way the tokens are ar's."""
    ids = prompt_ids(0)
    ar = get_method("ar")(tiny, {}).generate(ids, 48, Sampling(), None)
    scored = get_method("suffix")(tiny, {"suffix_width": "scored"})
    assert scored.costs is None and "as scored" in scored.chosen()["suffix_width_from"]
    reference = scored.generate(ids, 48, Sampling(), None)
    for costs, drafts in (([1.0] * 17, reference.drafted), ([float(w) for w in range(1, 18)], 0)):
        method = get_method("suffix")(tiny, {})
        method.widths[1] = (costs, "test")  # each batch starts with its batch size's costs
        gen = method.generate(ids, 48, Sampling(), None)
        assert gen.tokens == ar.tokens and gen.drafted == drafts


def test_suffix_reads_each_batch_sizes_curve(tiny, monkeypatch):
    from specbench.methods.suffix import width

    class Flat:
        hardware, meta = "test", {}

        def latency_ms(self, w, kv_length=None):
            return 10.0 + (w > 8) * (w - 8)

    monkeypatch.setattr(width, "local_profile", lambda target, use_for=None: Flat())
    monkeypatch.setattr(width, "batch_view", lambda target, b: (Flat(), "") if b == 2 else (None, "no L(B)"))
    method = get_method("suffix")(tiny, {})
    assert method.costs[:8] == [1.0] * 8 and method.costs[9] == 1.2  # widths 1-8 flat, 10 costs 1.2x
    assert "profile test" in method.chosen()["suffix_width_from"]
    method.choose_per_batch_size([1, 2, 4])
    assert "L(B=2, w)" in method.widths[2][1] and "no L(B)" in method.widths[4][1]
    method.start_batch("unpadded", 4)
    assert method.costs == method.widths[1][0]


def test_a_compiled_run_prices_each_tree_width_at_its_bucket(tiny, monkeypatch):
    """Under --compile a tree of any width runs at its power-of-two bucket, the compiled profile's widths: a width
    between two measured ones costs the wider one's L, not an interpolation; the profile asked for is the compiled
    one (batch_choice.local_profile reads lookup.compiled_run)."""
    from specbench.core import lookup
    from specbench.methods.suffix import width

    class Curve:
        hardware, meta, widths = "test", {"placement": "compiled"}, [1, 2, 4, 8, 16, 32]

        def latency_ms(self, w, kv_length=None):
            return 10.0 + w  # linear between the measured widths

    asked = []
    monkeypatch.setattr(width, "local_profile", lambda target, use_for=None: asked.append(lookup.compiled_run())
                        or Curve())
    try:
        lookup.compiled_run(True)
        method = get_method("suffix")(tiny, {})
        assert asked == [True] and "each width at its bucket" in method.chosen()["suffix_width_from"]
        assert method.costs[8] == method.costs[15] == 26 / 11  # widths 9 and 16: L(16) / L(1)
        assert method.costs[4] == 18 / 11 and method.costs[16] == 42 / 11  # 5 at L(8); 17 at L(32)
    finally:
        lookup.compiled_run(False)
    eager = get_method("suffix")(tiny, {})
    assert eager.costs[8] == 19 / 11  # eager: each width its own forward, L(9)
