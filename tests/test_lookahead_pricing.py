"""Lookahead decoding priced by its shapes, not as a chain: `plan` and `recommend` read the measured grid of (W, N,
G) shapes in its acceptance file (tokens per step over L(mean forward width) / L(1)); the stated model's accuracy is
fitted to that grid; the shipped file for the embedded model loads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.profile_file import LatencyProfile
from specbench.errors import SpecbenchError
from specbench.methods.lookahead import shapes as measured_shapes
from specbench.methods.lookahead import sizing
from specbench.planning import shape_pricing
from specbench.planning.chain_plan import plan_chain

from .test_auto_tree import write_profile

FLAT = [10.0, 10.5, 11.0, 12.0, 14.0, 18.0, 26.0]  # test_auto_tree.write_profile's curve at widths 1 .. 64
WIDTHS = [1, 2, 4, 8, 16, 32, 64]
ROWS = [{"window": 1, "ngram": 3, "guesses": 1, "tokens_per_step": 1.10, "mean_width": 3.0},
        {"window": 2, "ngram": 3, "guesses": 2, "tokens_per_step": 1.20, "mean_width": 6.0},
        {"window": 8, "ngram": 4, "guesses": 8, "tokens_per_step": 1.90, "mean_width": 30.0},
        {"window": 15, "ngram": 5, "guesses": 15, "tokens_per_step": 2.20, "mean_width": 90.0}]
# a chain reading of the same file would see three drafts accepted 90% of the time at width 4: far above any shape
CHAIN_LIKE = {"method": "lookahead", "conditional": [0.9, 0.9, 0.9], "per_rank": [[0.9], [0.9], [0.9]]}


def profile(ys=FLAT) -> LatencyProfile:
    return LatencyProfile("tiny", "float32", "test", "measured", WIDTHS, {512: {"median_ms": ys}})


def expected(row: dict, ys=FLAT) -> float:
    prof = profile(ys)
    return row["tokens_per_step"] / (prof.latency_ms(row["mean_width"], 512) / prof.latency_ms(1, 512))


def test_the_best_measured_shape_is_its_tokens_over_the_cost_of_its_mean_width():
    best, speedup = shape_pricing.best_measured(ROWS, profile(), 512)
    assert (best.window, best.ngram, best.guesses) == (8, 4, 8)  # 1.9 / 1.75 beats 1.2 / 1.15 and 2.2 / 4.0
    assert speedup == pytest.approx(expected(ROWS[2]), rel=1e-6)
    steep = [10.0 * w for w in WIDTHS]  # every input costs a full forward: the narrowest shape
    best, speedup = shape_pricing.best_measured(ROWS, profile(steep), 512)
    assert (best.window, best.guesses) == (1, 1) and speedup == pytest.approx(1.1 / 3.0, rel=1e-6)


def test_a_lookahead_file_is_priced_by_its_shapes_never_as_a_chain(tmp_path):
    path = tmp_path / "lookahead.yaml"
    fields = {**CHAIN_LIKE, "shapes": ROWS}
    path.write_text(yaml.safe_dump(fields))
    plan = plan_chain("lookahead", path, fields, profile(), 512)
    assert plan.label == "W 8, N 4, G 8 (forward width 30.0)" and plan.size == 30 and plan.k == 3
    assert plan.tau == 1.9 and plan.speedup == pytest.approx(expected(ROWS[2]), abs=1e-3) and plan.draft_ms == 0
    as_chain = plan_chain("pld", path, fields, profile(), 512)  # what the same numbers would say as a chain
    assert as_chain.speedup > 2 * plan.speedup and as_chain.label == "chain of 3"
    path.write_text(yaml.safe_dump(CHAIN_LIKE))  # no shapes: refused with the command that measures them
    with pytest.raises(SpecbenchError, match="no `shapes`.*not a chain.*estimate --method lookahead"):
        plan_chain("lookahead", path, CHAIN_LIKE, profile(), 512)
    broken = {**CHAIN_LIKE, "shapes": [{"window": 2}]}
    with pytest.raises(SpecbenchError, match="`shapes` must be a list of rows"):
        plan_chain("lookahead", path, broken, profile(), 512)


def test_plan_prices_lookahead_from_its_shapes(tmp_path):
    from specbench.planning.plan import PlanRequest, plan

    folder = tmp_path / "acc"
    folder.mkdir()
    (folder / "lookahead.yaml").write_text(yaml.safe_dump({**CHAIN_LIKE, "shapes": ROWS}))
    (folder / "pld.yaml").write_text(yaml.safe_dump({"method": "pld", "conditional": [0.6, 0.5, 0.4]}))
    result = plan(PlanRequest("random:vicuna-7b", gpu="a100", acceptance=str(folder), methods=("pld", "lookahead"),
                              out=tmp_path / "plan"))
    rows = {r.method: r for r in result.rows}
    assert rows["lookahead"].tree.startswith("W ") and rows["lookahead"].tau in [r["tokens_per_step"] for r in ROWS]
    assert rows["lookahead"].tau < 1 + 3 * 0.9 and rows["pld"].tree.startswith("chain of")
    assert rows["lookahead"].step_ms > rows["lookahead"].ar_ms  # its window's inputs are paid for


def test_recommend_ranks_lookahead_from_its_shapes(tmp_path, monkeypatch):
    """--confirm 0: lookahead's row is its best measured shape's speedup on this hardware's profile, ranked against
    pld's chain; with the better prediction it is the pick."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_profile(tmp_path)
    (tmp_path / "acceptance" / "tiny").mkdir(parents=True)
    (tmp_path / "acceptance" / "tiny" / "lookahead.yaml").write_text(yaml.safe_dump({**CHAIN_LIKE, "shapes": ROWS}))
    (tmp_path / "acceptance" / "tiny" / "pld.yaml").write_text(yaml.safe_dump({"method": "pld",
                                                                                "conditional": [0.1, 0.05]}))
    result = CliRunner().invoke(app, ["recommend", "--model", "random:tiny", "--confirm", "0", "--out", "rec"])
    assert result.exit_code == 0, result.output
    rec = yaml.safe_load((tmp_path / "rec" / "recommendation.yaml").read_text())
    rows = {m["method"]: m for m in rec["methods"]}
    assert rows["lookahead"]["tree"] == "W 8, N 4, G 8 (forward width 30.0)" and rows["lookahead"]["size"] == 30
    assert rows["lookahead"]["predicted"] == pytest.approx(expected(ROWS[2]), abs=1e-3)
    assert rows["pld"]["predicted"] < rows["lookahead"]["predicted"] and rec["method"] == "lookahead"
    assert "lookahead" not in (rec["not_considered"] or [])


def test_the_stated_accuracy_is_fitted_to_the_measured_grid():
    """Rows made by the independent-guesses model at p = 0.2 give back 0.2; a shape off the grid is then priced
    with it, not with the assumed 0.08, and says so."""
    rows = [{"window": g, "ngram": n, "guesses": g, "mean_width": 2.0 * g * (n - 1),
             "tokens_per_step": shape_pricing.independent_tokens_per_step(n, g, 0.2)} for n in (3, 4) for g in (1, 4)]
    assert shape_pricing.fitted_accuracy(rows) == pytest.approx(0.2, abs=1e-3)
    assert shape_pricing.fitted_accuracy([]) is None
    costs = [1.0 + 0.01 * w for w in range(200)]
    best, why = sizing.choose(costs, None, 5, None, rows=rows, rows_from="test")
    assert "accuracy 0.2 a token fitted to the shapes measured" in why
    assert best.tokens_per_step == pytest.approx(sizing.stated_tokens_per_step(5, best.guesses, 0.2))
    assert "an assumed guess accuracy 0.08" in sizing.choose(costs, None, 5, None)[1]


def test_the_shipped_lookahead_file_loads_and_prices():
    """acceptance/smollm2-135m/lookahead.yaml: measured on the validation prompts the other methods' files use, its
    grid read by the method's sizing and priced by plan on a profile."""
    from specbench.core import lookup, store

    found = lookup.find(lookup.ACCEPTANCE, store.acceptance_file("smollm2-135m", "lookahead"))
    assert found is not None
    fields = yaml.safe_load(found.path.read_text())
    assert fields["method"] == "lookahead" and fields["data"] == "alpaca-eval" and fields["dtype"] == "float32"
    rows, said = measured_shapes.filed(SimpleNamespace(spec="smollm2-135m"))
    assert len(rows) == len(measured_shapes.GRID) and "lookahead.yaml" in said
    assert all(r["tokens_per_step"] >= 1 and r["mean_width"] >= (r["ngram"] - 1) * r["window"] for r in rows)
    by_shape = {(r["window"], r["ngram"], r["guesses"]): r["tokens_per_step"] for r in rows}
    assert all(by_shape[(1, n, 1)] < by_shape[(4, n, 4)] for n in (3, 4, 5))  # more guesses, more tokens a step
    assert fields["per_position_shape"]["window"] in (1, 2, 4, 8, 15)
    best, why = sizing.choose([1.0 + 0.01 * w for w in range(130)], None, None, None, rows=rows, rows_from=said)
    assert "measured on validation prompts" in why and best.tokens_per_step in by_shape.values()
    plan = plan_chain("lookahead", found.path, fields, profile(), 512)
    assert plan.label.startswith("W ") and plan.speedup > 0
    assert 0 < shape_pricing.fitted_accuracy(rows) < 1
