"""`specbench plan`: trees, predicted tau and speedup, and memory from a model's shape, a latency curve and
published acceptance, before anything is trained; the acceptance files it ships; what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.profile_file import LatencyProfile
from specbench.methods import REGISTRY  # noqa: F401  (first, as the CLI does: the guessers and acceptance.py meet)
from specbench.planning.plan import PlanRequest, memory_gb, plan
from specbench.planning.acceptance import read_per_rank
from specbench.planning.latency_estimate import ModelShape

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = REPO / "acceptance" / "published" / "vicuna-7b"


@pytest.mark.parametrize("method", ["ppd", "medusa", "eagle", "parallelspec"])
def test_each_published_file_reads_as_estimate_writes_it_and_cites_its_source(method):
    data = yaml.safe_load((PUBLISHED / f"{method}.yaml").read_text())
    rows = read_per_rank(PUBLISHED / f"{method}.yaml", len(data["per_rank"]))
    assert all(len(r) == 10 and sum(r) <= 1 and r[0] >= r[1] for r in rows)  # 10 ranks, rank 1 the likeliest
    assert [round(sum(r[:k]), 4) for r in rows for k in (1, 10)] == \
        [round(t[k - 1], 4) for t in data["topk_accuracy"] for k in (1, 10)]
    assert data["source"]["paper"] and data["source"]["table"] and data["source"]["model"]
    assert data["assumed"] and data["published"]["measured"]["speedup"] > 1  # what was filled in, and the check
    if method == "ppd":  # the table's own numbers survive as rows @1 and @2
        assert rows[0][0] == 0.485 and round(sum(rows[1][:5]), 3) == 0.586


def test_memory_of_vicuna_7b_in_float16_at_2048_tokens():
    shape = ModelShape(32, 4096, 11008, 32, 32, 128, 32000)
    mem = memory_gb("medusa", shape, 6_738_415_616, {"heads": 4}, "float16", 2048)
    assert mem["target"] == pytest.approx(13.477, abs=0.001)
    assert mem["kv"] == pytest.approx(2 * 32 * 32 * 128 * 2 * 2048 / 1e9, abs=0.001)  # K and V, every layer
    assert mem["drafter"] == pytest.approx(4 * (4096 ** 2 + 4096 + 32000 * 4096) * 2 / 1e9, abs=0.001)
    eagle = memory_gb("eagle", shape, 6_738_415_616, {}, "float16", 2048)
    assert eagle["kv"] > mem["kv"]  # the drafter's own layer caches keys and values too


def test_the_plan_for_vicuna_7b_on_the_a100_preset_beats_ar_where_the_papers_did(tmp_path):
    """The issue's bar: PPD, Medusa and EAGLE above 1.5x, from the roofline's flat L(n) and the papers' figures."""
    result = plan(PlanRequest("random:vicuna-7b", "a100", methods=("ppd", "medusa", "eagle", "hidden-transfer"),
                              out=tmp_path))
    rows = {r.method: r for r in result.rows}
    assert result.profile.source == "estimated" and result.random_weights
    for method in ("ppd", "medusa", "eagle"):
        row = rows[method]
        assert row.speedup > 1.5 and 1.5 < row.tau < 6 and row.paper["speedup"] > 1
        assert row.speedup < row.tau  # the verify and the drafting cost something: never tau for free
        assert (tmp_path / "trees" / f"{method}-a100-bfloat16.yaml").is_file()
    assert rows["eagle"].draft_ms > rows["medusa"].draft_ms > 0 and rows["ppd"].draft_ms is None
    assert rows["hidden-transfer"].speedup is None and "no " in rows["hidden-transfer"].why_not
    filed = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert filed["kind"] == "plan" and filed["measured"] is None and filed["method"] == result.pick.method
    assert {m["method"] for m in filed["methods"]} == {"ppd", "medusa", "eagle", "hidden-transfer"}


def test_a_compute_bound_curve_plans_no_speedup(tmp_path):
    """Not tuned: where a forward of n tokens costs n times one (a busy CPU's regime), nothing beats ar by much."""
    widths = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    steep = LatencyProfile("vicuna-7b", "bfloat16", "steep", "measured", widths,
                           {512: {"median_ms": [100.0 * w for w in widths]}})
    path = tmp_path / "steep.yaml"
    path.write_text(steep.to_yaml())
    result = plan(PlanRequest("random:vicuna-7b", str(path), methods=("medusa", "eagle"), max_size=32,
                              out=tmp_path / "p"))
    assert all(r.speedup < 1.2 for r in result.rows)


def test_plan_refuses_a_model_without_published_acceptance_and_says_how_to_borrow(tmp_path):
    result = CliRunner().invoke(app, ["plan", "--model", "random:qwen2.5-0.5b", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert "no published acceptance for qwen2.5-0.5b" in said and "published:vicuna-7b" in said
    bad = CliRunner().invoke(app, ["plan", "--methods", "ar,medusa", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "not a tree method" in " ".join(bad.output.split())


def test_borrowed_acceptance_is_labelled_in_the_plan(tmp_path):
    result = CliRunner().invoke(app, ["plan", "--model", "random:llama-3.1-8b", "--gpu", "h100", "--acceptance",
                                      "published:vicuna-7b", "--methods", "medusa", "--max-size", "16", "--out",
                                      str(tmp_path)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "borrowed from vicuna-7b" in said and "medusa" in said
    filed = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert filed["model_key"] == "llama-3.1-8b" and filed["hardware"] == "h100"
    assert filed["methods"][0]["memory_gb"]["target"] == pytest.approx(8_030_261_248 * 2 / 1e9, abs=0.001)


def test_checked_acceptance_ranks_first_and_unchecked_rows_are_marked_in_the_table(tmp_path):
    """EAGLE's and ParallelSpec's published files say verified: false; their rows rank below every checked one and
    the table marks them, whatever their prediction."""
    result = plan(PlanRequest("random:vicuna-7b", "a100", methods=("medusa", "eagle"), max_size=32, out=tmp_path))
    rows = {r.method: r for r in result.rows}
    assert rows["eagle"].unverified and not rows["medusa"].unverified
    assert result.pick.method == "medusa" and [r.method for r in result.ranked] == ["medusa", "eagle"]
    said = CliRunner().invoke(app, ["plan", "--methods", "medusa,eagle", "--max-size", "32", "--out",
                                    str(tmp_path / "cli")], env={"COLUMNS": "300"})
    assert said.exit_code == 0, said.output
    eagle_line = next(line for line in said.output.splitlines() if "eagle" in line and "│" in line)
    assert "UNVERIFIED" in eagle_line and "(?)" in eagle_line and "Best predicted: medusa" in said.output
    only_unchecked = plan(PlanRequest("random:vicuna-7b", "a100", methods=("eagle",), max_size=32, out=tmp_path / "e"))
    assert only_unchecked.pick.method == "eagle"  # nothing checked: the unchecked row is still the best there is


def test_drafting_pays_a_fixed_cost_per_forward_on_a_preset():
    from specbench.core.profile_file import LatencyProfile
    from specbench.planning.latency_estimate import drafting_forward_ms, fixed_forward_ms

    curves = {512: {"median_ms": [18.0, 18.5]}}
    preset = LatencyProfile("m", "float16", "a100", "estimated", [1, 2], curves, {"overhead_ms": 9.0})
    measured = LatencyProfile("m", "float16", "cpu", "measured", [1, 2], curves, {})
    # a one-layer drafter reading 5% of the target's weights: its own launches, then 5% of the 9 ms of reading
    assert drafting_forward_ms(preset, 512, 0.05, 1.0) == pytest.approx(fixed_forward_ms(1) + 0.05 * 9.0)
    assert drafting_forward_ms(preset, 512, 0.05, 1.0) > 0.05 * 18.0 + 0.5  # not a 20th of the target's forward
    assert drafting_forward_ms(measured, 512, 0.05, 1.0) == pytest.approx(0.05 * 18.0)  # L(1) not split: its share


def test_plan_says_when_a_preset_predicts_above_the_papers_measurement(tmp_path):
    result = plan(PlanRequest("random:vicuna-7b", "a100", methods=("eagle",), max_size=32, out=tmp_path))
    eagle = result.rows[0]
    assert eagle.paper["speedup"] == 2.18 and eagle.speedup > 1.1 * 2.18
    note = next(n for n in result.notes if n.startswith("eagle: predicted"))
    assert "flatter" in note and "2.18x the paper measured" in note and "upper bound" in note
    # the drafter's forwards carry their fixed cost: at least one launch cost per drafted depth
    assert eagle.draft_ms >= 1.25


def test_a_chain_drafter_pays_its_fixed_cost_per_forward_on_a_preset(tmp_path):
    from specbench.planning.chain_plan import plan_chain
    from specbench.planning.latency_estimate import fixed_forward_ms

    path = tmp_path / "sd.yaml"
    fields = {"method": "sd", "conditional": [0.9, 0.9, 0.9, 0.9], "drafter_share": 0.05}
    path.write_text(yaml.safe_dump(fields))
    curves = {512: {"median_ms": [18.0, 18.2, 18.4, 18.6, 18.8]}}
    preset = LatencyProfile("m", "float16", "a100", "estimated", [1, 2, 3, 4, 5], curves, {"overhead_ms": 9.0})
    measured = LatencyProfile("m", "float16", "cpu", "measured", [1, 2, 3, 4, 5], curves, {})
    on_preset, on_measured = plan_chain("sd", path, fields, preset, 512, 2.0), plan_chain("sd", path, fields,
                                                                                          measured, 512, 2.0)
    assert on_preset.draft_ms == pytest.approx(on_preset.k * (fixed_forward_ms(2.0) + 0.05 * 9.0), abs=1e-3)
    assert on_measured.draft_ms == pytest.approx(on_measured.k * 0.05 * 18.0, abs=1e-3)
    assert on_preset.speedup < on_measured.speedup  # the launches make each drafted token dearer
