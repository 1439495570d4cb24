"""Drafting priced as a run pays it (issue 44 §2): a feature drafter's price is its step's own drafting of the tree
(the pending pairs of about tau accepted tokens, the tree's widths), per drafter forward of the cost law; the run's
prediction prices the tree it decodes with."""

from __future__ import annotations

import pytest

from specbench.core.tree import Tree
from specbench.planning.treesearch import f_value

from .test_auto_tree import make, store_dir  # noqa: F401  (store_dir: the fixture)


@pytest.mark.parametrize("name", ["eagle", "parallelspec"])
def test_the_step_drafting_of_the_tree_is_timed(name, tiny, store_dir, monkeypatch):  # noqa: F811
    method, _ = make(name, tiny)
    proposer = method.proposer
    seen = []
    inner = type(proposer).draft_static

    def recorded(self, batch, samples, states, tree, sampling):
        seen.append((tree, sum(f.shape[0] for f in states[0].features), batch.lengths[samples[0].slot]))
        return inner(self, batch, samples, states, tree, sampling)

    monkeypatch.setattr(type(proposer), "draft_static", recorded)
    tree = Tree(((0,), (1,), (0, 0))) if name == "eagle" else Tree(((0,), (0, 0)))
    ms = method.pricing.ms_here(tree)
    assert ms > 0 and method.pricing.ms_here(tree) == ms  # timed once per tree
    pending = max(1, round(1 + f_value(list(tree.paths), method.acceptance)))
    assert seen and all(t == tree and p == pending and length == 256 for t, p, length in seen)


def test_eagle_pays_per_depth_and_the_run_prices_its_own_tree(tiny, store_dir, monkeypatch):  # noqa: F811
    method, _ = make("eagle", tiny)
    times = {}
    monkeypatch.setattr("specbench.methods.eagle.proposer.step_drafting_ms",
                        lambda drafter, draft, pending: times.setdefault("ms", 12.0))
    deep = Tree(((0,), (0, 0), (0, 0, 0)))
    assert method.pricing.ms_here(deep) == pytest.approx(4.0)  # 12 ms over 3 depths: the law multiplies back
    priced = []
    monkeypatch.setattr(method.pricing, "ms_here", lambda tree=None: priced.append(tree) or 1.0)
    from specbench.planning.profile import LatencyProfile
    from specbench.core.machine.hardware import hardware_slug

    here = LatencyProfile("tiny", "float32", hardware_slug(tiny.device), "measured", [1, 2], {512: {"median_ms": [1.0, 1.1]}})
    assert method.draft_cost(here)(2) == pytest.approx(2.0)
    assert priced == [method.batch_tree.tree_file.tree(0)]


def test_the_drafting_is_priced_on_the_profiles_clock(tiny, store_dir, monkeypatch):  # noqa: F811
    """A drafting timed on a machine twice as slow as when it was profiled costs half in the profile's units."""
    from .test_auto_tree import write_profile

    method, _ = make("eagle", tiny)
    assert method.pricing.clock() == 1.0  # no profile of this hardware: the time as measured
    write_profile(store_dir)  # L(1) = 10 ms
    monkeypatch.setattr("specbench.core.batch.forward.timed_forward", lambda *args: 20.0)
    assert method.pricing.clock() == pytest.approx(0.5)
    monkeypatch.setattr("specbench.methods.eagle.proposer.step_drafting_ms", lambda drafter, draft, pending: 6.0)
    assert method.pricing.ms_here(Tree(((0,), (0, 0)))) == pytest.approx(1.5)  # 6 ms, 2 depths, half the clock
