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
from specbench.planning.batch_choice import relative_latency

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


def costs_of(curve, window=None, ngram=None, guesses=None):
    return relative_latency(curve, sizing.widest(window, ngram, guesses))


def shape_of(curve, window=None, ngram=None, guesses=None, rows=None):
    best, why = sizing.choose(costs_of(curve, window, ngram, guesses) if curve else None, window, ngram, guesses,
                              rows=rows, rows_from="test")
    return (best.window, best.ngram, best.guesses), why


def test_the_shape_has_the_highest_predicted_speedup_on_the_curve():
    """Tokens per step (the stated model) over L(width) / L(1): a flat curve takes the paper's configuration, the
    ceiling; a curve flat to 16 inputs the widest shape that fits there; a steep one the least there is."""
    assert shape_of(Curve(knee=1000), ngram=5)[0] == (15, 5, 15)  # a GPU-like curve: the paper's configuration
    (w, n, g), why = shape_of(Curve(knee=16), ngram=5)  # flat to 16, then +1 ms an input on 10 ms
    assert (w + g) * (n - 1) <= 16 and (w, g) == (2, 2) and "L(w)" in why and "stated model" in why
    assert shape_of(Curve(knee=16))[0] == (4, 3, 4)  # N sized too: shorter n-grams, more of them in 16 inputs
    assert shape_of(Curve(knee=16), window=1, ngram=5)[0] == (1, 5, 3)  # the window given, G takes the rest
    assert shape_of(None, guesses=4)[0] == (15, 5, 4)  # no profile: the paper's W and N
    assert shape_of(Curve(knee=1), ngram=5)[0] == (1, 5, 1)  # a steep curve: the least there is
    assert sizing.choose(None, 3, 3, 3)[1] == "given"


def test_measured_tokens_per_step_beat_the_stated_model():
    """Measured rows (estimate --method lookahead) are priced at their mean forward width, and only rows that agree
    with the given values count."""
    rows = [{"window": 2, "ngram": 3, "guesses": 2, "tokens_per_step": 1.3, "mean_width": 6.0},
            {"window": 8, "ngram": 4, "guesses": 8, "tokens_per_step": 2.0, "mean_width": 30.0},
            {"window": 4, "ngram": 5, "guesses": 4, "tokens_per_step": 1.5, "mean_width": 18.0}]
    shape, why = shape_of(Curve(knee=30), rows=rows)
    assert shape == (8, 4, 8) and "measured on validation prompts (test)" in why and "2.00x" in why
    assert shape_of(Curve(knee=10), rows=rows)[0] == (2, 3, 2)  # 8, 4, 8 costs 3x: 2.0 / 3 < 1.3
    assert shape_of(Curve(knee=30), ngram=5, rows=rows)[0] == (4, 5, 4)
    assert "stated model" in shape_of(Curve(knee=30), ngram=6, rows=rows)[1]  # no row agrees: the stated model


def test_the_paper_shape_and_the_latency_curve_made_non_decreasing(tiny, monkeypatch):
    monkeypatch.setattr(lookahead_method, "local_profile", lambda target, use_for=None: Curve(knee=1))
    paper = get_method("lookahead")(tiny, {"lookahead_shape": "paper"})
    assert (paper.shape.window, paper.shape.ngram, paper.shape.guesses) == (15, 5, 15)
    assert "--lookahead-shape paper" in paper.chosen()["lookahead_sized_from"]
    sized = get_method("lookahead")(tiny, {})
    assert (sized.shape.window, sized.shape.ngram, sized.shape.guesses) == (1, 3, 1)  # the steep curve's
    dip = Curve(knee=1000)
    dip.latency_ms = lambda width, kv_length=None: {1: 10.0, 2: 14.0, 3: 11.0}.get(width, 12.0)
    assert relative_latency(dip, 4) == [1.0, 1.1, 1.1, 1.2]  # width 2 measured slower than 3: read as 3's


def test_each_batch_size_sizes_its_shape_from_its_own_curve(tiny, monkeypatch):
    """--batch-size: B's W, N and G from L(B, w) where the profile has it (a steeper curve: smaller), else batch 1's."""
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
    assert method.chosen()["lookahead_per_batch_size"][2] == {"window": 2, "ngram": 3, "guesses": 2,
                                                              "from": method.shapes[2][1]}


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


def test_estimate_measures_every_shape_and_the_run_prices_them(tiny, tmp_path, monkeypatch):
    """`estimate --method lookahead` files tokens per step and mean forward width for each shape of its grid; a run
    on a machine with a profile reads them (said in its choice) and takes the one with the highest predicted
    speedup."""
    import yaml
    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.methods.lookahead import shapes

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shapes, "GRID", ((1, 3, 1), (4, 3, 4)))
    result = CliRunner().invoke(app, ["estimate", "--method", "lookahead", "--model", "random:tiny", "--limit", "2",
                                      "--max-new-tokens", "24"])
    assert result.exit_code == 0, result.output
    rows = yaml.safe_load((tmp_path / "acceptance" / "tiny" / "lookahead.yaml").read_text())["shapes"]
    assert [(r["window"], r["ngram"], r["guesses"]) for r in rows] == [(1, 3, 1), (4, 3, 4)]
    assert all(r["tokens_per_step"] >= 1 for r in rows)
    assert rows[0]["mean_width"] <= 4 < rows[1]["mean_width"] <= 16  # the window's W (N - 1) and the trie's nodes
    filed = yaml.safe_load((tmp_path / "acceptance" / "tiny" / "lookahead.yaml").read_text())
    assert set(filed["per_position_shape"]) == {"window", "ngram", "guesses"}  # what `conditional` was counted with
    monkeypatch.setattr(lookahead_method, "local_profile", lambda target, use_for=None: Curve(knee=1000))
    method = get_method("lookahead")(tiny, {})
    best = max(rows, key=lambda r: r["tokens_per_step"])  # a flat curve: the most tokens per step
    assert (method.shape.window, method.shape.guesses) == (best["window"], best["guesses"])
    assert "measured on validation prompts" in method.chosen()["lookahead_sized_from"]
