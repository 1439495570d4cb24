"""lookahead (lookahead decoding): the one-forward layout gives every input the logits of the causal sequence it
stands for, the window, pool and trie keep what the paper keeps, W and G follow the latency curve, greedy tokens are
ar's with n-grams accepted, and sampling keeps the target's distribution at batch 1 and batched (the registry-wide
tests cover greedy equality at every batch size: test_methods.py, test_batching.py)."""

from __future__ import annotations

import pytest
import torch

from specbench.core.batch.cache import new_cache
from specbench.core.batch.forward import forward
from specbench.core.batch.ragged import Segment
from specbench.core.verify import Sampling, warp_probs
from specbench.errors import SpecbenchError
from specbench.methods import get_method
from specbench.methods.batch_loop import engine, generate_batch
from specbench.methods.lookahead import method as lookahead_method
from specbench.methods.lookahead import sizing
from specbench.methods.lookahead.window import NgramPool, Shape, Window, layout, rank_paths, trie

from .conftest import prompt_ids
from .test_sd import SAMPLING, exact_distribution, tv

SMALL = {"lookahead_window": 3, "lookahead_ngram": 3, "lookahead_guesses": 3}


def causal_last_logits(model, tokens: list[int]) -> torch.Tensor:
    """The logits after `tokens` fed causally from an empty cache [V]."""
    with torch.inference_mode():
        return forward(model, torch.tensor([tokens]), new_cache(model))[-1]


def test_every_input_sees_the_sequence_it_stands_for(tiny):
    """Level l, column i of the window predicts the token after context + (root, level 0's columns 1..i, column i of
    levels 1..l); a trie node the token after context + its path: the mask and positions say exactly that."""
    model = tiny.model
    context = prompt_ids(0)[0, :12].tolist()
    shape = Shape(window=3, ngram=4, guesses=2)
    levels = [[0, 11, 12], [21, 22, 23], [31, 32, 33]]
    root = 5
    tokens, parents, depths = trie([(40, 41, 42), (40, 43), (50,)], 3)
    assert tokens == [40, 41, 42, 43, 50] and parents == [0, 1, 2, 1, 0] and depths == [1, 2, 3, 2, 1]
    ids, offsets, visible = layout(shape, root, levels, tokens, parents, depths)
    batch = engine(model, "single", 1, torch.device("cpu"))
    with torch.inference_mode():
        batch.forward([Segment(0, context, keep=1)], [])
        past = batch.lengths[0]
        _, (hidden,) = batch.forward([], [Segment(0, ids, positions=[past + o for o in offsets], mask=visible)],
                                     hidden=True)
        logits = model.get_output_embeddings()(hidden)  # [q, V]
    row_levels = [root] + levels[0][1:]
    for level in range(shape.ngram - 1):
        for col in range(shape.window):
            seq = row_levels[: col + 1] + [levels[m][col] for m in range(1, level + 1)]
            got = logits[level * shape.window + col]
            assert torch.allclose(got, causal_last_logits(model, context + seq), atol=1e-4), (level, col)
    paths = [[40], [40, 41], [40, 41, 42], [40, 43], [50]]
    for k, path in enumerate(paths):
        assert torch.allclose(logits[shape.branch + k], causal_last_logits(model, context + [root] + path),
                              atol=1e-4), path


def test_trie_nodes_rank_among_their_siblings():
    tokens, parents, _ = trie([(1, 2), (1, 3), (4,)], 2)
    assert tokens == [1, 2, 3, 4] and rank_paths(parents) == [(0,), (0, 0), (0, 1), (1,)]


def test_trie_cuts_to_the_room_left():
    tokens, parents, depths = trie([(1, 2, 3), (1, 4, 5), (6, 7, 8)], 1)
    assert (tokens, parents, depths) == ([1, 6], [0, 0], [1, 1])
    assert trie([], 3) == ([], [], [])


def test_pool_keeps_the_latest_g_ngrams_a_key():
    pool = NgramPool(2)
    for gram in [(1,), (2,), (1,), (3,)]:  # (1,) again moves to the end; (3,) then drops the oldest, (2,)
        pool.add(7, gram)
    assert pool.get(7) == [(1,), (3,)] and pool.get(8) == []


def test_window_keeps_diagonal_ngrams_after_the_warm_up_and_moves_down():
    shape = Shape(window=2, ngram=3, guesses=4)
    window = Window(shape, [9])
    assert window.levels == [[9, 9], [9, 9]]  # drawn from the context
    window.advance(5, [61, 62])  # step 1: level 1 is still the random start: no n-grams yet
    assert window.levels == [[9, 9], [61, 62]] and not window.pool.grams
    window.advance(6, [71, 72])  # step 2: n-grams (level 0[i], level 1[i], new[i]), level 0's column 0 the root
    assert window.pool.get(6) == [(61, 71)] and window.pool.get(9) == [(62, 72)]
    assert window.levels == [[61, 62], [71, 72]]


def test_greedy_equals_ar_and_accepts_ngrams(tiny):
    """On the tiny model's repetitive output the pool's n-grams are accepted: fewer forwards than tokens."""
    ids = prompt_ids(1)
    reference = get_method("ar")(tiny, {}).generate(ids, 48, Sampling(), None).tokens
    for options in ({}, SMALL, {**SMALL, "lookahead_ngram": 2}):
        gen = get_method("lookahead")(tiny, options).generate(ids, 48, Sampling(), None)
        assert gen.tokens == reference, options
        assert gen.accepted_drafts > 0 and gen.target_forwards < len(gen.tokens), options
        assert sum(gen.accepted_lengths) == len(gen.tokens)


def test_options_are_checked_and_recorded(tiny):
    with pytest.raises(SpecbenchError, match="--lookahead-ngram must be at least 2"):
        get_method("lookahead")(tiny, {"lookahead_ngram": 1})
    chosen = get_method("lookahead")(tiny, SMALL).chosen()
    assert chosen["lookahead_window"] == 3 and chosen["lookahead_guesses"] == 3
    assert chosen["lookahead_sized_from"] == "given"


class Curve:
    """A latency curve: L(w) = base for w <= knee, then rising by `slope` ms an input."""

    hardware, meta = "test", {}

    def __init__(self, knee: int, base: float = 10.0, slope: float = 1.0):
        self.knee, self.base, self.slope = knee, base, slope

    def latency_ms(self, width, kv_length=None):
        return self.base + self.slope * max(0, width - self.knee)


def test_w_and_g_sit_where_the_curve_is_flat():
    flat = sizing.sized(Curve(knee=1000), 5, None, None)
    assert flat[:2] == (15, 15)  # a GPU-like curve: the paper's configuration is the ceiling
    w, g, source = sizing.sized(Curve(knee=16), 5, None, None)  # flat to 16, then +1 ms an input on 10 ms
    assert (w + g) * 4 <= 16 + 2 and (w, g) == (2, 2) and "L(w)" in source
    assert sizing.sized(Curve(knee=16), 5, 1, None)[:2] == (1, 3)  # the window given, G takes the rest
    assert sizing.sized(None, 5, None, 4)[:2] == (15, 4)  # no profile: the paper's W
    assert sizing.sized(Curve(knee=1), 5, None, None)[:2] == (1, 1)  # a steep curve: the least there is


def test_each_batch_size_sizes_w_and_g_from_its_own_curve(tiny, monkeypatch):
    """--batch-size: B's W and G from L(B, w) where the profile has it (a steeper curve: smaller), else batch 1's."""
    steep = Curve(knee=8)
    steep.meta = {"batch_size": 2}
    monkeypatch.setattr(lookahead_method, "batch_view", lambda target, b: (steep, "") if b == 2 else (None, "no L(B)"))
    method = get_method("lookahead")(tiny, {"lookahead_ngram": 3})
    method.choose_per_batch_size([1, 2, 4])
    assert method.shapes[1][0].window == 15  # no profile of random:tiny: the paper's
    assert (method.shapes[2][0].window, method.shapes[2][0].guesses) == (2, 2) and "L(B=2, w)" in method.shapes[2][1]
    assert method.shapes[4][0] == method.shapes[1][0] and "no L(B)" in method.shapes[4][1]
    method.start_batch("unpadded", 2)
    assert method.shape.window == 2
    assert method.chosen()["lookahead_per_batch_size"][2] == {"window": 2, "guesses": 2, "from": method.shapes[2][1]}


def fixed_candidates(monkeypatch, grams):
    """Every root's candidates are `grams` (chosen before the step's draws, as the pool's are: still lossless)."""
    monkeypatch.setattr(NgramPool, "get", lambda self, key: list(grams))


def sampled(method, ids, trials: int, batch: int) -> tuple[dict[tuple, float], int]:
    counts: dict[tuple, int] = {}
    accepted = 0
    for b in range(trials // batch):
        gens, _ = generate_batch(method, [ids] * batch, batch, "unpadded" if batch > 1 else "single", False, 3,
                                 SAMPLING, [torch.Generator().manual_seed(b * batch + i) for i in range(batch)])
        for g in gens:
            counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
            accepted += g.accepted_drafts
    return {k: v / trials for k, v in counts.items()}, accepted


@pytest.mark.parametrize("batch", [1, 4])
def test_sampling_preserves_target_distribution(tiny, monkeypatch, batch):
    """T > 0: three tokens (the prefill's, then candidates verified by the paper's multi-candidate rule) follow the
    target's exact distribution, alone and four side by side; the candidates are the target's likely tokens, so
    they are accepted often and rejected often."""
    ids = prompt_ids(0)[:, :20]
    exact = exact_distribution(tiny.model, ids, SAMPLING, 3)
    firsts = sorted({k[1] for k in exact}, key=lambda t: -sum(p for k, p in exact.items() if k[1] == t))
    fixed_candidates(monkeypatch, [(firsts[0], firsts[1]), (firsts[1],), (firsts[0], firsts[2]), (firsts[2],)])
    method = get_method("lookahead")(tiny, SMALL)
    got, accepted = sampled(method, ids, 2000, batch)
    assert accepted > 200
    distance = tv(got, exact)
    assert distance < 0.1, f"TV {distance:.3f} between lookahead samples and the target distribution"


def test_distribution_test_catches_accepting_the_first_candidate(tiny, monkeypatch):
    """Negative control: taking the first candidate without the target's test is caught."""
    ids = prompt_ids(0)[:, :20]
    exact = exact_distribution(tiny.model, ids, SAMPLING, 3)
    firsts = sorted({k[1] for k in exact}, key=lambda t: -sum(p for k, p in exact.items() if k[1] == t))
    fixed_candidates(monkeypatch, [(firsts[1],)])

    def greedy_first(tokens, parents, logits, sampling, generator):
        path = [0, 1] if len(parents) > 1 else [0]
        return path, int(torch.multinomial(warp_probs(logits[path[-1]], sampling), 1, generator=generator))

    monkeypatch.setattr(lookahead_method, "tree_speculative_accept", greedy_first)
    got, _ = sampled(get_method("lookahead")(tiny, SMALL), ids, 600, 1)
    assert tv(got, exact) > 0.2


def test_synthetic_acceptance_keeps_the_drawn_rank_of_the_trie(tiny):
    """--synthetic-acceptance: every depth's rank-0 candidate is kept by a stated rate of 1 (the whole first n-gram
    of the trie, then the target's token), and none by a rate near 0."""
    from specbench.core.acceptance_profile import parse_rates
    from specbench.core.synthetic import SyntheticAcceptance

    ids = prompt_ids(1)
    method = get_method("lookahead")(tiny, SMALL)
    method.acceptance_rule = SyntheticAcceptance(parse_rates("1,1"), seed=0)
    kept = method.generate(ids, 40, Sampling(), None)
    assert kept.accepted_drafts == kept.drafted > 0  # each step's trie depth, all of it
    method.acceptance_rule = SyntheticAcceptance(parse_rates("0.000001,0.000001"), seed=0)
    assert method.generate(ids, 40, Sampling(), None).accepted_drafts == 0
