"""A tree's prediction against its measurement, the error split (issue 44 §2): report.md's trees table shows the
predicted and measured ms per step, and speedup / predicted speedup = tau part x cost part, with which part misses
the 5% goal; predictions carry the step's ms they rest on (buildtree.predict)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from specbench.report import prediction_split
from specbench.report.sections import tree_section

from .test_auto_tree import PER_RANK, write_profile
from .test_recommend import sb, store  # noqa: F401 (the fixture)


def summary(eagle_ms: float) -> pd.DataFrame:
    """ar at 20 ms a step; eagle at tau 2.0 and `eagle_ms` a step (speedup = tau x ar's step / its step)."""
    return pd.DataFrame([
        {"method": "ar", "dataset": "gsm8k", "tau": 1.0, "speedup": 1.0, "forward_ms": 20.0, "batch_size": 1},
        {"method": "eagle", "dataset": "gsm8k", "tau": 2.0, "speedup": 2.0 * 20.0 / eagle_ms,
         "forward_ms": eagle_ms, "batch_size": 1}])


# predicted on a profile twice as fast as the run's machine: L(1) 10 ms, the step 14 ms (1.4 ar steps)
PREDICTED = {"eagle": {"size": 5, "predicted_tau": 2.2, "predicted_speedup": round(2.2 * 10 / 14, 4),
                       "predicted_step_ms": 14.0, "ar_step_ms": 10.0}}


def test_the_speedups_error_is_the_product_of_its_tau_and_step_cost_parts(tmp_path):
    md = "\n".join(tree_section(summary(30.0), PREDICTED, tmp_path))
    row = pd.read_csv(tmp_path / "tree_sizes.csv").iloc[0]
    assert row.predicted_step_ms == 14.0 and row.step_ms == 30.0
    assert row.tau_part == pytest.approx(2.0 / 2.2, abs=1e-3)
    assert row.cost_part == pytest.approx(1.4 / 1.5, abs=1e-3)  # in ar steps: the two clocks cancel
    assert row.tau_part * row.cost_part == pytest.approx(row.speedup / row.predicted_speedup, rel=2e-3)
    assert row.misses == "tau, cost"
    assert all(f"| {c} " in md for c in prediction_split.SPLIT_COLUMNS)
    assert "misses for eagle on gsm8k (x0.93)" in md and "misses for eagle on gsm8k (x0.91)" in md


def test_a_step_priced_within_five_percent_leaves_the_miss_to_tau(tmp_path):
    md = "\n".join(tree_section(summary(28.6), PREDICTED, tmp_path))  # 1.43 ar steps measured, 1.4 predicted
    row = pd.read_csv(tmp_path / "tree_sizes.csv").iloc[0]
    assert abs(row.cost_part - 1) < prediction_split.GOAL and row.misses == "tau"
    assert "Step cost within 5% for 1 of 1 tree row(s); tau within 5% for 0 of 1" in md


def test_an_older_run_yaml_without_step_ms_still_splits_by_the_speedups(tmp_path):
    old = {"eagle": {k: v for k, v in PREDICTED["eagle"].items() if not k.endswith("step_ms")}}
    tree_section(summary(30.0), old, tmp_path)
    row = pd.read_csv(tmp_path / "tree_sizes.csv").iloc[0]
    assert math.isnan(row.predicted_step_ms)
    assert row.tau_part * row.cost_part == pytest.approx(row.speedup / row.predicted_speedup, rel=2e-3)
    none = prediction_split.split({"tau": 2.0}, {"predicted_tau": 2.2}, 20.0)  # no profile: no speedup predicted
    assert math.isnan(none["cost_part"]) and none["misses"] == "-"


def test_the_split_reads_decode_steps_not_the_prefill(tmp_path):
    # ar: 2 turns of 11 tokens in 11 forwards, 110 ms each turn of which 30 ms to the first token (the prefill);
    # eagle: 11 tokens in 6 forwards (1 prefill + 5 decode steps of 2 tokens), 90 ms of which 30 to the first token
    from specbench.report.summary import decode_steps

    ar = pd.DataFrame({"new_tokens": [11, 11], "target_forwards": [11, 11], "wall_s": [0.11, 0.11],
                       "ttft_s": [0.03, 0.03]})
    eagle = ar.assign(target_forwards=[6, 6], wall_s=[0.09, 0.09])
    d_ar, d_eagle = decode_steps(ar), decode_steps(eagle)
    assert d_ar == {"decode_tau": 1.0, "decode_step_ms": pytest.approx(8.0)}
    assert d_eagle["decode_tau"] == 2.0 and d_eagle["decode_step_ms"] == pytest.approx(12.0)  # 60 ms / 5 steps
    assert eagle.new_tokens.sum() / eagle.target_forwards.sum() == pytest.approx(11 / 6)  # prefill counted: lower
    assert math.isnan(decode_steps(eagle.assign(batch_size=4))["decode_step_ms"])  # a batch's share: no own step
    table = pd.DataFrame([
        {"method": "ar", "dataset": "gsm8k", "tau": 1.0, "speedup": 1.0, "forward_ms": 10.0, "batch_size": 1,
         **d_ar},
        {"method": "eagle", "dataset": "gsm8k", "tau": 11 / 6, "speedup": 110 / 90, "forward_ms": 15.0,
         "batch_size": 1, **d_eagle}])
    predicted = {"eagle": {"size": 5, "predicted_tau": 2.0, "predicted_speedup": round(2.0 * 10 / 15, 4),
                           "predicted_step_ms": 15.0, "ar_step_ms": 10.0}}  # 1.5 ar steps a step, tau 2
    tree_section(table, predicted, tmp_path)
    row = pd.read_csv(tmp_path / "tree_sizes.csv").iloc[0]
    assert row.decode_tau == 2.0 and row.tau_part == 1.0  # read with the prefill as a step, tau would miss by 8%
    assert row.step_ms == 12.0 and row.cost_part == pytest.approx(1.5 / 1.5)  # 12 ms over ar's 8: 1.5 ar steps
    assert row.decode_speedup == pytest.approx(2.0 * 8 / 12, abs=1e-3) and row.misses == "neither"
    assert row.tau_part * row.cost_part == pytest.approx(row.decode_speedup / row.predicted_speedup, rel=2e-3)


def test_a_prediction_carries_the_step_it_rests_on_drafting_included(tmp_path):
    from specbench.core.tree_file import TreeFile
    from specbench.methods import REGISTRY  # noqa: F401 (planning.acceptance imports the methods first)
    from specbench.planning.buildtree import predict
    from specbench.planning.profile import load_profile

    path = write_profile(tmp_path)

    profile = load_profile(path)
    tree = TreeFile(states={0: [((0,), 0), ((0, 0), 0), ((1,), 0)]}, prompt_tokens=0, method="medusa")
    bare = predict(tree, PER_RANK, profile)
    drafted = predict(tree, PER_RANK, profile, draft_ms=lambda depth: 4.0 * depth)
    assert bare["ar_step_ms"] == pytest.approx(profile.latency_ms(1, 512))
    assert drafted["predicted_step_ms"] == pytest.approx(bare["predicted_step_ms"] + 8.0, abs=1e-3)  # depth 2
    for said in (bare, drafted):
        assert said["predicted_speedup"] == pytest.approx(
            said["predicted_tau"] * said["ar_step_ms"] / said["predicted_step_ms"], rel=1e-3)


def test_a_run_reports_the_split_for_its_trees(store):  # noqa: F811 (the fixture)
    sb("run", "--model", "random:tiny", "--method", "medusa", "--tree", "auto", "--dataset", "prompts.jsonl",
       "--limit", 2, "--max-new-tokens", 8, "--warmup", 0, "--out", "run")
    meta = yaml.safe_load((store / "run" / "run.yaml").read_text())
    said = meta["trees"]["medusa"]
    assert said["predicted_step_ms"] > said["ar_step_ms"] > 0  # the profile's L(1) and the tree's step, drafting in
    row = pd.read_csv(store / "run" / "tree_sizes.csv").iloc[0]
    assert row.step_ms > 0 and row.predicted_step_ms == pytest.approx(said["predicted_step_ms"], abs=1e-3)
    # the prediction is the decode's (the prefill is not a step): the parts multiply to the decode's speedup
    assert row.tau_part * row.cost_part == pytest.approx(row.decode_speedup / row.predicted_speedup, rel=0.02)
    summary = pd.read_csv(store / "run" / "summary.csv")
    medusa = summary[summary.method == "medusa"].iloc[0]
    assert row.decode_tau == pytest.approx(medusa.decode_tau, abs=1e-3) and medusa.decode_tau >= medusa.tau
    assert row.step_ms == pytest.approx(medusa.decode_step_ms, abs=1e-3)
    assert "`cost_part` = predicted step / measured step" in (store / "run" / "report.md").read_text()


def test_a_run_predicts_at_its_own_context():
    """A run's prediction reads the profile between its KV curves at the run's mean context (planning/
    context_prediction.py): the step and ar's L(1) interpolated linearly, the nearest curve outside them."""
    from specbench.core.profile_file import LatencyProfile
    from specbench.core.tree_file import TreeFile
    from specbench.methods import REGISTRY  # noqa: F401 (planning.acceptance imports the methods first)
    from specbench.planning.buildtree import predict
    from specbench.planning.context_prediction import predict_at_context

    widths = [1, 2, 4, 8]
    curves = {128: {"median_ms": [10.0, 11.0, 12.0, 14.0]}, 512: {"median_ms": [12.0, 15.0, 18.0, 24.0]}}
    profile = LatencyProfile("tiny", "float32", "cpu-test", "measured", widths, curves)
    tree = TreeFile(states={0: [((0,), 0), ((0, 0), 0), ((1,), 0)]}, prompt_tokens=0, method="medusa")
    low, high = predict(tree, PER_RANK, profile, 128), predict(tree, PER_RANK, profile, 512)
    mid = predict_at_context(tree, PER_RANK, profile, 320)  # halfway between the curves
    assert mid["kv_length"] == 320
    assert mid["ar_step_ms"] == pytest.approx(11.0, abs=1e-3)
    assert mid["predicted_step_ms"] == pytest.approx((low["predicted_step_ms"] + high["predicted_step_ms"]) / 2,
                                                     abs=1e-3)
    assert low["predicted_speedup"] > mid["predicted_speedup"] > high["predicted_speedup"]  # width dearer with KV
    for context, like in ((60, low), (2000, high)):  # outside the measured lengths: the nearest curve
        said = predict_at_context(tree, PER_RANK, profile, context)
        assert said["predicted_step_ms"] == like["predicted_step_ms"]
    assert predict_at_context(tree, PER_RANK, profile, None)["predicted_step_ms"] == high["predicted_step_ms"]


def test_a_step_cost_miss_names_the_steps_drafting_and_host_work(tmp_path):
    """The measured step split into drafting, host work and the verify forward (the rest), beside ar's host work,
    from the totals over two turns: ar 12 tokens a turn (22 decode steps in all), eagle 21 at decode tau 2.0 (20)."""
    rows = [{"method": "ar", "dataset": "gsm8k", "tau": 1.0, "speedup": 1.0, "batch_size": 1, "turns": 2,
             "new_tokens": 24, "decode_tau": 1.0, "decode_step_ms": 20.0, "wall_s": 0.5, "host_overhead": 0.022,
             "draft_s": 0.0},
            {"method": "eagle", "dataset": "gsm8k", "tau": 2.0, "speedup": 1.3, "batch_size": 1, "turns": 2,
             "new_tokens": 42, "decode_tau": 2.0, "decode_step_ms": 30.0, "wall_s": 0.65, "host_overhead": 0.0923,
             "draft_s": 0.08}]
    md = "\n".join(tree_section(pd.DataFrame(rows), PREDICTED, tmp_path))
    row = pd.read_csv(tmp_path / "tree_sizes.csv").iloc[0]
    assert row.draft_ms == pytest.approx(4.0) and row.host_ms == pytest.approx(3.0, abs=1e-3)  # 20 decode steps
    assert "| draft_ms | predicted_host_ms | host_ms |" in md
    # ar: 22 decode steps, 0.011 s of host work: 0.5 ms a step
    assert "(x0.93: a step of 30.0 ms = verify 23.0 + drafting 4.00 + host 3.00 (ar's 0.50))" in md
    assert math.isnan(prediction_split.parts({"new_tokens": 10, "decode_tau": 2.0})[1])  # no totals: no parts
