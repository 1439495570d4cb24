"""Drafting cost in records and summaries: `draft_forwards` (drafter forward passes) and `draft_s` (seconds inside
drafting) of sd (batch 1 and batched) and pearl (every mode), their sums and ratios in summary.csv, and reports of
older runs whose records lack them."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from specbench.report import run_report as report
from specbench.core.verify import Sampling
from specbench.methods.sd.drafter import layer_drafter
from specbench.methods import get_method
from specbench.methods.batch_loop import generate_batch

from .conftest import prompt_ids
from .test_sd import SAMPLING


def busy(span) -> float:
    return span[1] - span[0]


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLING], ids=["greedy", "sampled"])
def test_sd_counts_one_drafter_forward_per_draft_token(tiny, sampling):
    """gamma fixed: every step drafts k tokens with k drafter forwards (the first also catches the drafter's cache
    up: the prompt's prefill, then the previous step's correction token), so draft_forwards = drafted."""
    sd = get_method("sd")(tiny, {"gamma": 3}, layer_drafter(tiny, [0]))
    gen = sd.generate(prompt_ids(3), 30, sampling, torch.Generator().manual_seed(0))
    steps = gen.timeline
    assert gen.draft_forwards == gen.drafted == sum(s["checked"] for s in steps) > 0
    assert gen.target_forwards - 1 <= gen.draft_forwards <= 3 * gen.target_forwards  # only a last step drafts 0
    assert 0 < gen.draft_s <= steps[-1]["t1"]
    assert gen.draft_s == pytest.approx(sum(busy(s["draft"]) for s in steps), abs=1e-4)


@pytest.mark.parametrize("mode", ["unpadded", "padded"])
def test_batched_sd_counts_each_samples_drafter_forwards(tiny, mode):
    """At batch > 1 a sample takes part in one batched drafter forward per draft position, and gets a share of the
    batched drafting time."""
    sd = get_method("sd")(tiny, {"gamma": 2}, layer_drafter(tiny, [0]))
    prompts = [prompt_ids(seed, length=6 + 3 * seed) for seed in range(3)]
    gens, _ = generate_batch(sd, prompts, 2, mode, True, 20, Sampling(), [None] * 3)
    for gen in gens:
        assert gen.draft_forwards == gen.drafted > 0
        assert gen.draft_forwards >= gen.target_forwards - 2  # a newcomer's prefill and a last step draft nothing
        assert 0 < gen.draft_s < gen.latency_s


@pytest.mark.parametrize("name,mode", [("pearl", "sequential"), ("pearl", "threads"),
                                       ("pearl-no-pre", "sequential"), ("pearl-no-post", "sequential")])
def test_pearl_counts_the_drafters_own_work(tiny, name, mode):
    """gamma 1: one drafter forward in each step the drafter works in (drafts dropped at a rejection included, so
    not `drafted`); draft_s is its busy time, which overlaps the target's in pre/post steps."""
    pearl = get_method(name)(tiny, {"gamma": 1, "pearl_exec": mode}, layer_drafter(tiny, [0]))
    gen = pearl.generate(prompt_ids(2), 24, Sampling(), None)
    drafting = [s for s in gen.timeline if s["draft"]]
    assert gen.draft_forwards == len(drafting) > 0
    assert gen.draft_s == pytest.approx(sum(busy(s["draft"]) for s in drafting), abs=1e-4)
    assert 0 < gen.draft_s <= gen.timeline[-1]["t1"]


def test_pearl_draft_forwards_follow_the_window(tiny):
    pearl = get_method("pearl")(tiny, {"gamma": 3, "pearl_exec": "sequential"}, layer_drafter(tiny, [0]))
    gen = pearl.generate(prompt_ids(2), 30, Sampling(), None)
    drafting = sum(1 for s in gen.timeline if s["draft"])
    assert drafting <= gen.draft_forwards <= 3 * drafting


def records(**draft) -> pd.DataFrame:
    """Two turns of ar and sd; `draft` gives sd's draft_forwards / draft_s columns (absent: an older run)."""
    frame = pd.DataFrame({
        "method": ["ar", "ar", "sd", "sd"], "dataset": "d", "prompt_id": ["0", "1", "0", "1"], "turn": 0,
        "new_tokens": [10, 20, 10, 20], "wall_s": [1.0, 2.0, 0.5, 1.0], "tokens_per_s": [10.0, 10.0, 20.0, 20.0],
        "target_forwards": [10, 20, 4, 6], "drafted": [0, 0, 12, 18], "accepted_drafts": [0, 0, 6, 14],
        "lossless": "", "peak_mem_mb": 100.0})
    for column, values in draft.items():
        frame[column] = values
    return frame


def test_summary_sums_drafting_cost_per_method():
    frame = records(draft_forwards=[0, 0, 12, 18], draft_s=[0.0, 0.0, 0.1, 0.2])
    s = report.summarize(frame).set_index("method")
    assert s.loc["sd", "drafted"] == 30 and s.loc["sd", "draft_forwards"] == 30
    assert s.loc["sd", "draft_s"] == pytest.approx(0.3)
    assert s.loc["sd", "draft_ms_per_token"] == pytest.approx(1e3 * 0.3 / 30)  # per emitted token
    assert s.loc["sd", "draft_forwards_per_step"] == pytest.approx(30 / 10)
    assert s.loc["ar", "draft_forwards"] == 0  # no drafter: sums 0, ratios blank
    assert math.isnan(s.loc["ar", "draft_ms_per_token"]) and math.isnan(s.loc["ar", "draft_forwards_per_step"])
    cols = report.SUMMARY_COLUMNS
    assert cols[cols.index("tau") + 1] == "draft_ms_per_token"


def test_a_mix_of_old_and_new_rows_sums_the_rows_that_carry_the_columns():
    frame = records(draft_forwards=[0, 0, math.nan, 18], draft_s=[0.0, 0.0, math.nan, 0.2])
    s = report.summarize(frame).set_index("method")
    assert s.loc["sd", "draft_forwards"] == 18 and s.loc["sd", "draft_ms_per_token"] == pytest.approx(10.0)
    assert s.loc["sd", "draft_forwards_per_step"] == pytest.approx(3.0)


def test_report_of_records_without_drafting_columns(tmp_path):
    """A records.csv from before draft_forwards / draft_s still gives a summary (those columns blank) and a report."""
    records().to_csv(tmp_path / "records.csv", index=False)
    summary = report.write_run_report(tmp_path)
    written = pd.read_csv(tmp_path / "summary.csv").set_index("method")
    assert written.loc["sd", "drafted"] == 30
    for column in ("draft_forwards", "draft_s", "draft_ms_per_token", "draft_forwards_per_step"):
        assert written[column].isna().all() and summary[column].isna().all()
    text = (tmp_path / "report.md").read_text()
    assert "draft_ms_per_token" in text


def test_report_shows_drafting_ms_per_token_beside_tau(tmp_path):
    records(draft_forwards=[0, 0, 12, 18], draft_s=[0.0, 0.0, 0.1, 0.2]).to_csv(tmp_path / "records.csv",
                                                                               index=False)
    report.write_run_report(tmp_path)
    lines = (tmp_path / "report.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| method | dataset | prompts | turns"))  # the appendix
    cells = [c.strip() for c in header.strip("|").split("|")]
    at = cells.index("draft_ms_per_token")
    assert cells[at - 1] == "tau"
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in lines[lines.index(header) + 2:] if r.startswith("| ar ") or r.startswith("| sd ")}
    assert rows["sd"][at] == "10" and rows["ar"][at] == ""  # blank for a method without a drafter
