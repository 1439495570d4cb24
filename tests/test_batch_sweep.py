"""Throughput-latency sweeps over batch sizes (issue 28, item 4): the Pareto front, the points of pareto.csv, the
fastest label per batch size, the tool's choice against a size sweep, tokens/s per sample, and a run's report."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.report import batchbest, choicecheck, pareto
from specbench.report.summary import sample_rate


def test_pareto_front():
    xs = [100.0, 200.0, 150.0, 300.0, 300.0, math.nan, 50.0]
    ys = [90.0, 60.0, 50.0, 30.0, 30.0, 99.0, 90.0]
    # (150, 50) is beaten by (200, 60); (50, 90) by (100, 90); the two equal points are both on it; NaN never
    assert pareto.pareto_front(xs, ys) == [True, True, False, True, True, False, False]
    assert pareto.pareto_front([], []) == []


def summary_rows(rows):
    cols = ["method", "dataset", "batch_size", "batching", "tokens_per_s", "sample_tokens_per_s", "speedup", "timing"]
    return pd.DataFrame(rows, columns=cols)


SUMMARY = summary_rows([
    ("ar", "d", 1, "-", 100.0, 100.0, 1.0, "ok"),
    ("pld", "d", 1, "-", 150.0, 150.0, 1.5, "ok"),
    ("ar", "d", 2, "unpadded", 180.0, 90.0, 1.0, "ok"),
    ("pld", "d", 2, "unpadded", 240.0, 120.0, 240 / 180, "ok"),
    ("pld", "d", 2, "padded", 200.0, 100.0, 200 / 180, "ok"),
    ("ar", "d", 4, "unpadded", 320.0, 80.0, 1.0, "ok"),
    ("pld", "d", 4, "unpadded", 300.0, 75.0, 300 / 320, "disturbed (x)"),
    ("pld", "d", 4, "padded", 260.0, 65.0, 260 / 320, "ok"),
])


def test_points_start_every_mode_at_batch_one_and_mark_the_front():
    pts = pareto.points(SUMMARY)
    pld = pts[pts.method == "pld"]
    assert sorted(zip(pld["mode"], pld.B)) == [("padded", 1), ("padded", 2), ("padded", 4), ("unpadded", 1),
                                               ("unpadded", 2), ("unpadded", 4)]
    assert set(pts[pts.method == "ar"]["mode"]) == {"unpadded"}  # ar has one mode at B > 1
    front = set(zip(pts[pts.pareto].method, pts[pts.pareto].B))
    assert front == {("pld", 1), ("pld", 2), ("ar", 4)}  # ar B=4: the most tokens in all; pld B=1: the fastest each
    assert (pts.per_sample_from == "measured").all()
    old = pareto.points(SUMMARY.drop(columns="sample_tokens_per_s"))  # a summary from before the column
    assert (old.per_sample_from == "total / B").all()
    assert old[(old.method == "ar") & (old.B == 4)].sample_tokens_per_s.iloc[0] == 80.0


def test_fastest_per_batch_size():
    chosen = {"pld": {}, "ppd": {"tree_per_batch_size": {1: {"size": 12, "from": "batch 1"}}}}
    best = batchbest.fastest(pareto.points(SUMMARY), SUMMARY, chosen)
    assert list(best.B) == [1, 2, 4]
    one, two, four = (best[best.B == b].iloc[0] for b in (1, 2, 4))
    assert (one.fastest, one["mode"], one["runner-up"]) == ("pld", "-", "ar")  # batch 1 counted once, not per mode
    assert (two.fastest, two["mode"], two["runner-up"]) == ("pld", "unpadded", "pld padded")
    assert two["speedup vs ar at B"] == pytest.approx(240 / 180) and two["ar tok/s"] == 180.0
    assert (four.fastest, four["runner-up"]) == ("ar", "pld unpadded")
    shown = batchbest.shown(best)
    assert shown["speedup vs ar at B"].iloc[1] == "1.33x"


def test_choice_at_reads_run_yaml():
    chosen = {"ppd": {"tree_per_batch_size": {1: {"size": 12, "from": "batch 1"}, 4: {"size": 5, "from": "L(B, w)"}}},
              "sd": {"gamma": 4, "gamma_per_batch_size": {1: 4, "8": 2}}, "pld": {}}
    assert batchbest.choice_at(chosen, "ppd", 4) == "tree size 5 (L(B, w))"
    assert batchbest.choice_at(chosen, "sd", 8) == "gamma 2" and batchbest.choice_at(chosen, "sd", 2) == "gamma 4"
    assert batchbest.choice_at(chosen, "pld", 2) == "" and batchbest.choice_at({}, "ar", 1) == ""


def test_the_tools_choice_against_a_size_sweep():
    rows = []
    for b, tps in ((1, {"auto": 100, "2": 90, "8": 104}), (2, {"auto": 150, "2": 160, "8": 120})):
        for label, v in tps.items():
            for mode in (("-",) if b == 1 else ("unpadded", "padded")):
                rows.append((f"ppd@{label}", "d", b, mode, float(v), float(v) / b, 1.0, "ok"))
    pts = pareto.points(summary_rows(rows))
    chosen = {"ppd@auto": {"tree_per_batch_size": {1: {"size": 12}, 2: {"size": 4}}}}
    table = choicecheck.check(pts, chosen, {"ppd@auto": {"size": 12}})
    assert list(zip(table.B, table["mode"])) == [(1, "-"), (2, "padded"), (2, "unpadded")]
    one = table.iloc[0]
    assert (one["auto size"], one["best measured"], one.verdict) == (12, "ppd@8", "within 5%")
    two = table.iloc[1]
    assert two["auto size"] == 4 and two["auto / best"] == pytest.approx(150 / 160) and two.verdict == "6% slower"
    assert choicecheck.section(pareto.points(SUMMARY), {}, {})[1] == []  # no @auto: no section


def test_the_choice_is_judged_by_size_when_the_chosen_size_also_ran():
    # ppd@auto and ppd@4 decode the same tree: two measurements of size 4 (144 and 160), averaged against the
    # other sizes; the raw auto label (144) alone would look 10% slower than the best label (ppd@4 itself).
    rows = [(f"ppd@{label}", "d", b, "unpadded", float(v), float(v) / b, 1.0, "ok")
            for b, tps in ((4, {"auto": 144, "4": 160, "2": 155}), (8, {"auto": 150, "4": 170, "2": 155}),
                           (16, {"auto": 100, "4": 110, "2": 150}))
            for label, v in tps.items()]
    chosen = {"ppd@auto": {"tree_per_batch_size": {4: {"size": 4}, 8: {"size": 4}, 16: {"size": 4}}}}
    table = choicecheck.check(pareto.points(summary_rows(rows)), chosen, {})
    four, eight, sixteen = (table[table.B == b].iloc[0] for b in (4, 8, 16))
    assert four["auto / best"] == pytest.approx(144 / 160) and four["same size tok/s"] == 160
    assert four["best size"] == 2 and four["chosen size / best size"] == pytest.approx(152 / 155)
    assert four.verdict == "within 5%"
    assert eight["best size"] == 4 and eight.verdict == "best size"  # (150 + 170) / 2 > 155
    assert sixteen["best size"] == 2 and sixteen.verdict == "30% slower"  # 105 / 150
    lines = "\n".join(choicecheck.section(pareto.points(summary_rows(rows)), chosen, {})[1])
    assert "**1 of 3** choices" in lines and "differed by up to 12%" in lines


def test_sample_rate_pools_each_samples_own_time():
    g = pd.DataFrame({"new_tokens": [10, 30], "latency_s": [1.0, 2.0]})
    assert sample_rate(g) == round(40 / 3, 2)
    assert math.isnan(sample_rate(g.drop(columns="latency_s")))
    assert math.isnan(sample_rate(g.assign(latency_s=["", 1.0])))


def test_batched_run_reports_the_sweep(tmp_path, prompts_file):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--max-new-tokens", "12", "--warmup", "0",
                                      "--dataset", str(prompts_file), "--limit", "4", "--batch-size", "1,2",
                                      "--batching", "unpadded", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = pd.read_csv(out / "summary.csv")
    one = summary[summary.batch_size == 1]
    assert (one.sample_tokens_per_s - one.tokens_per_s).abs().max() < 0.05  # batch 1: per sample = throughput
    two = summary[summary.batch_size == 2]
    assert (two.sample_tokens_per_s < two.tokens_per_s).all()  # two samples share each second
    pts = pd.read_csv(out / "pareto.csv")
    assert set(pts.B) == {1, 2} and pts.pareto.any() and (out / "pareto.png").is_file()
    best = pd.read_csv(out / "batch_fastest.csv")
    assert list(best.B) == [1, 2] and set(best.fastest) <= {"ar", "pld"}
    report = (out / "report.md").read_text()
    assert "![throughput against latency](pareto.png)" in report and "### Fastest at each batch size" in report
    assert "tokens/s per sample" in report
