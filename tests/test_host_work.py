"""Host work in the price (issue 51, planning/host_work.py): a run files each tree method's and ar's host ms a step
as a ratio of ar's forward, the law fitted over the widths the runs covered prices the next predictions, the tree
search weighs it, and report.md says where it came from."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import yaml

from specbench.planning import host_work
from specbench.planning.host_work import HostLaw, HostPrice
from specbench.report import prediction_split

from .test_auto_tree import PER_RANK, write_profile
from .test_recommend import sb, store  # noqa: F401 (the fixture)


@pytest.fixture
def on(tmp_path, monkeypatch):
    """Host work read and filed, in a fresh user cache (the suite turns it off: conftest.py)."""
    monkeypatch.setenv("SPECBENCH_HOST_WORK", "1")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_the_law_reads_between_the_widths_measured_flat_below_and_never_falling_beyond():
    law = HostLaw.fit([(6, 0.065), (12, 0.08), (36, 0.298), (12.2, 0.09), (12, 0.07)])
    assert law.widths == (6.0, 12.0, 36.0) and law.points == 5  # 12 and 12.2: one width, their median
    assert law.ratio(9) == pytest.approx(0.0725) and law.ratio(24) == pytest.approx(0.189)
    assert law.ratio(2) == pytest.approx(0.065) and law.ratio(48) == pytest.approx(0.298 + 12 * 0.218 / 24)
    one = HostLaw.fit([(5, 0.04), (5, 0.06), (5.2, 0.05)])
    assert one.ratio(1) == one.ratio(100) == pytest.approx(0.05)
    falling = HostLaw.fit([(4, 0.08), (30, 0.06)])  # noise: beyond the widest, never cheaper
    assert falling.ratio(60) == pytest.approx(0.06) and falling.ratio(17) == pytest.approx(0.07)
    assert HostLaw.fit([]) is None and HostLaw.fit([(4, float("nan"))]) is None


def test_a_runs_points_are_filed_replaced_on_a_second_report_and_priced(on):
    k = host_work.key("cpu-x", "tiny", "float32", False, "ppd")
    ar = host_work.key("cpu-x", "tiny", "float32", False, "ar")
    points = {k: [{"width": 6.0, "ratio": 0.04}, {"width": 30.0, "ratio": 0.16}], ar: [{"width": 1.0, "ratio": 0.01}]}
    assert host_work.remember(on / "run1", points) == 3
    assert host_work.remember(on / "run1", points) == 3  # the same run again (`specbench report`): replaced
    data = json.loads(host_work.where().read_text())
    assert len(data[k]) == 2 and len(data[ar]) == 1
    price = host_work.price("cpu-x", "tiny", "float32", False, "ppd")
    assert price.step_ms(18.0, 10.0) == pytest.approx(0.1 * 10.0)  # the ratio at width 18 x the profile's L(1)
    assert price.ar_ms(20.0) == pytest.approx(0.2)
    assert host_work.price("cpu-x", "tiny", "float32", True, "ppd") is None  # compiled: never measured
    assert host_work.price("cpu-x", "tiny", "float32", False, "medusa") is None
    assert "2 figure(s), host ms a step / ar's forward by verify width 6: 0.040, 30: 0.160; ar's 0.010" in price.said()


def test_off_reads_and_files_nothing(on, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOST_WORK", "0")
    k = host_work.key("cpu-x", "tiny", "float32", False, "ar")
    assert host_work.remember(on / "run", {k: [{"width": 1.0, "ratio": 0.01}]}) == 0
    assert not host_work.where().exists() and host_work.price("cpu-x", "tiny", "float32", False, "ar") is None


def test_a_prediction_adds_each_steps_host_work_and_a_dear_host_law_chooses_a_smaller_tree(tmp_path):
    from specbench.core.tree_file import TreeFile
    from specbench.methods import REGISTRY  # noqa: F401 (planning.acceptance imports the methods first)
    from specbench.planning.buildtree import predict, size_curve
    from specbench.planning.candidate_trees import candidate_curve
    from specbench.planning.profile import load_profile

    profile = load_profile(write_profile(tmp_path))
    tree = TreeFile(states={0: [((0,), 0), ((0, 0), 0), ((1,), 0)]}, prompt_tokens=0, method="medusa")
    host = HostPrice(HostLaw(((2.0, 0.04), (6.0, 0.08)), 3), HostLaw(((1.0, 0.01),), 3))
    bare, priced = predict(tree, PER_RANK, profile), predict(tree, PER_RANK, profile, host=host)
    l1 = profile.latency_ms(1, 512)
    assert priced["verify_width"] == 4 and priced["predicted_host_ms"] == pytest.approx(0.06 * l1, abs=1e-3)
    assert priced["predicted_step_ms"] == pytest.approx(bare["predicted_step_ms"] + 0.06 * l1, abs=1e-3)
    assert priced["ar_step_ms"] == pytest.approx(l1 * 1.01, abs=1e-3) and "host_price" in priced
    assert priced["predicted_speedup"] == pytest.approx(
        priced["predicted_tau"] * priced["ar_step_ms"] / priced["predicted_step_ms"], rel=1e-3)
    dear = HostPrice(HostLaw(((4.0, 0.2), (40.0, 2.0)), 3), HostLaw(((1.0, 0.0),), 3))
    free = candidate_curve(PER_RANK, profile, 24, 512)
    assert candidate_curve(PER_RANK, profile, 24, 512, host=dear).best.size < free.best.size
    free = size_curve(PER_RANK, 3, profile, 24, 512)
    assert size_curve(PER_RANK, 3, profile, 24, 512, host=dear).best.size < free.best.size


def summary_and_meta(temperature=0.0):
    """ar at 20 ms a decode step (0.4 of it host work), medusa at 30 (1.5 host); 22 and 20 decode steps."""
    rows = [{"method": "ar", "dataset": "gsm8k", "batch_size": 1, "turns": 2, "new_tokens": 24, "decode_tau": 1.0,
             "decode_step_ms": 20.0, "wall_s": 0.5, "host_overhead": 0.4 * 22 / 500, "timing": "ok"},
            {"method": "medusa", "dataset": "gsm8k", "batch_size": 1, "turns": 2, "new_tokens": 42,
             "decode_tau": 2.0, "decode_step_ms": 30.0, "wall_s": 0.65, "host_overhead": 1.5 * 20 / 650,
             "timing": "ok"},
            {"method": "pld", "dataset": "gsm8k", "batch_size": 1, "turns": 2, "new_tokens": 24, "decode_tau": 1.2,
             "decode_step_ms": 21.0, "wall_s": 0.4, "host_overhead": 0.01, "timing": "ok"}]
    meta = {"settings": {"model": "random:tiny", "temperature": temperature, "compile": False},
            "environment": {"hardware": "cpu-x", "dtype": "float32"},
            "trees": {"medusa": {"family": "medusa", "verify_width": 4}}}
    return pd.DataFrame(rows), meta


def test_a_runs_points_are_its_tree_rows_and_ar_in_units_of_ars_forward():
    summary, meta = summary_and_meta()
    points = prediction_split.host_points(summary, meta)
    assert set(points) == {"cpu-x/tiny/float32/eager/ar", "cpu-x/tiny/float32/eager/medusa"}  # pld: no drafts said
    assert points["cpu-x/tiny/float32/eager/ar"][0]["ratio"] == pytest.approx(0.4 / 19.6, rel=1e-3)
    medusa = points["cpu-x/tiny/float32/eager/medusa"][0]
    assert medusa["width"] == 4 and medusa["ratio"] == pytest.approx(1.5 / 19.6, rel=1e-3)
    assert prediction_split.host_points(*summary_and_meta(temperature=0.7)) == {}  # sampled: not a greedy step's
    summary, meta = summary_and_meta()
    summary.loc[summary.method == "medusa", "timing"] = "disturbed: 40% of its or ar's timed seconds ran disturbed"
    assert list(prediction_split.host_points(summary, meta)) == ["cpu-x/tiny/float32/eager/ar"]


def test_a_second_run_prices_the_host_work_the_first_measured(store, monkeypatch):  # noqa: F811 (the fixture)
    monkeypatch.setenv("SPECBENCH_HOST_WORK", "1")
    # a disturbed row files nothing (its host work ran on shared cores), and the suite runs on every core: the
    # guard's verdict is taken as ok here, since what is tested is the filing and the pricing, not the guard
    monkeypatch.setattr("specbench.run.noise.judge", lambda summary, records, floor=1.0: summary.assign(
        speedup_bound=float("nan"), disturbed_time=0.0, timing="ok"))
    args = ("run", "--model", "random:tiny", "--method", "medusa", "--tree", "auto", "--dataset", "prompts.jsonl",
            "--limit", 2, "--max-new-tokens", 8, "--warmup", 0, "--dtype", "float32")
    said = sb(*args, "--out", "one")
    first = yaml.safe_load((store / "one" / "run.yaml").read_text())["trees"]["medusa"]
    assert "predicted_host_ms" not in first and "figure(s) filed for later predictions" in said
    assert "No price here includes host work" in (store / "one" / "report.md").read_text()
    filed = json.loads((store / "cache" / host_work.FILE).read_text())
    assert {k.rsplit("/", 1)[1] for k in filed} == {"ar", "medusa"}
    sb(*args, "--out", "two")
    second = yaml.safe_load((store / "two" / "run.yaml").read_text())["trees"]["medusa"]
    assert second["predicted_host_ms"] > 0 and second["ar_host_ms"] > 0
    assert "Priced from this machine's earlier runs: medusa: 1 figure(s), host ms a step / ar's forward by" in \
        (store / "two" / "report.md").read_text()
    row = pd.read_csv(store / "two" / "tree_sizes.csv").iloc[0]
    assert row.predicted_host_ms == pytest.approx(second["predicted_host_ms"], abs=1e-3)
    built = sb("build-tree", "--model", "random:tiny", "--method", "medusa", "--gpu", "cpu", "--dtype", "float32",
               "--out", "t.yaml")  # the search prices it too, and says so
    assert "L(n) + host ms" in built and "host work a step priced from this machine's runs (medusa:" in built
    assert "host_price" in yaml.safe_load((store / "t.yaml").read_text())


def test_the_verify_forward_is_set_against_its_price_apart_from_host_work_and_drafting():
    """ar steps at 20 ms (0.4 of it host work); medusa at 30 ms (1.5 drafting, 1.5 host): its verify forward is
    27 ms, 27 / 19.6 = 1.378 ar forwards; priced L(4) / L(1) = 14 / 10 = 1.4 (the profile's L(1) is ar's step priced
    less ar's host work): forward_part 1.4 / 1.378."""
    row = {"decode_step_ms": 30.0, "decode_tau": 2.0, "new_tokens": 42, "turns": 2, "wall_s": 0.65,
           "host_overhead": 1.5 * 20 / 650, "draft_s": 1.5 * 20 / 1000}
    info = {"predicted_tau": 2.2, "predicted_step_ms": 16.0, "predicted_forward_ms": 14.0, "ar_step_ms": 10.2,
            "ar_host_ms": 0.2, "predicted_host_ms": 0.5}
    out = prediction_split.split(row, info, 20.0, 0.4)
    assert out["forward_part"] == pytest.approx(1.4 / (27.0 / 19.6), abs=1e-3)
    assert out["cost_part"] == pytest.approx((16.0 / 10.2) / (30.0 / 20.0), abs=1e-3)
    assert pd.isna(prediction_split.split(row, {k: v for k, v in info.items() if k != "predicted_forward_ms"},
                                          20.0, 0.4)["forward_part"])  # an older run.yaml: not known


def test_step_cost_misses_that_are_the_verify_forwards_say_the_curve_missed():
    frame = pd.DataFrame([{"method": f"ppd@{n}", "dataset": "gsm8k", "cost_part": 0.85, "tau_part": 1.0,
                           "forward_part": forward, "misses": "cost", "step_ms": 20.0, "draft_ms": 0.0,
                           "host_ms": 1.0} for n, forward in ((2, 0.86), (8, 0.84), (32, 0.99))])
    said = " ".join(prediction_split.lines(frame))
    assert "The verify forward misses its price at 2 of the 3 step-cost misses" in said
    assert "its verify forward x0.86 of its price" in said
    frame["forward_part"] = 0.99  # the forward as priced: the miss is elsewhere (host work, drafting)
    assert "The verify forward misses" not in " ".join(prediction_split.lines(frame))


def test_list_host_work_shows_each_familys_law_and_where_it_is_filed(on):
    from specbench.core.machine.hardware import hardware_slug

    from .test_data_files import sb as say

    hardware = hardware_slug(torch.device("cpu"))
    empty = say("list", "host-work", "--model", "random:tiny", "--device", "cpu")
    assert "Nothing filed for tiny here yet" in empty
    host_work.remember(on / "run", {host_work.key(hardware, "tiny", "float32", True, "ppd"):
                                    [{"width": 6.0, "ratio": 0.07, "when": "2026-11-29T14:00:00+00:00"},
                                     {"width": 36.0, "ratio": 0.3, "when": "2026-11-29T14:01:00+00:00"}],
                                    host_work.key(hardware, "tiny", "float32", True, "ar"):
                                    [{"width": 1.0, "ratio": 0.02, "when": "2026-11-29T14:01:00+00:00"}]})
    said = say("list", "host-work", "--model", "random:tiny", "--device", "cpu")
    assert "| float32 | compiled | ar | 1 | 1: 0.020 |" in said.replace("│", "|")
    assert "| float32 | compiled | ppd | 2 | 6: 0.070, 36: 0.300 |" in said.replace("│", "|")
    assert "delete it to start afresh" in said


def test_a_chain_methods_host_work_is_filed_at_its_mean_width_and_priced_into_its_plan(tmp_path):
    from specbench.core.profile_file import LatencyProfile
    from specbench.planning.chain_plan import plan_chain

    summary, meta = summary_and_meta()
    summary.loc[summary.method == "pld", "drafted"] = 66  # over 24 - 2 tokens at decode tau 1.2: 18.33 steps
    pld = prediction_split.host_points(summary, meta)["cpu-x/tiny/float32/eager/pld"][0]
    assert pld["width"] == pytest.approx(1 + 66 / (22 / 1.2), abs=1e-3)
    path = tmp_path / "pld.yaml"
    fields = {"method": "pld", "conditional": [0.6, 0.5, 0.4], "per_rank": [[0.6], [0.5], [0.4]]}
    path.write_text(yaml.safe_dump(fields))
    flat = LatencyProfile("tiny", "float32", "cpu-x", "measured", [1, 2, 4, 8], {512: {"median_ms": [10.0] * 4}})
    bare = plan_chain("pld", path, fields, flat, 512)
    host = HostPrice(HostLaw(((4.0, 0.1),), 2), HostLaw(((1.0, 0.02),), 2))
    priced = plan_chain("pld", path, fields, flat, 512, host=host)
    assert priced.k == bare.k and priced.speedup == pytest.approx(bare.tau * 10.2 / 11.0, abs=1e-3)
