"""The lossless check's mismatch explanation (run/lossless.py) and its two rates in the report."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from specbench.report import run_report as report
from specbench.run.lossless import NEAR_TIE, UNEXPLAINED, effective_eps, explain_mismatch, near_tie_tolerance, verdict
from specbench.core.batch.cache import new_cache
from specbench.core.model.cpu_kernels import repack
from specbench.core.batch.forward import forward
from specbench.core.model.load import load_model
from specbench.core.verify import Sampling
from specbench.methods import get_method

from .conftest import prompt_ids

INDEX = 6  # the position of the mismatch in the tests below


@pytest.fixture(scope="module")
def greedy(tiny):
    """ar's greedy tokens on a tiny float32 model, and its logits at INDEX (prompt + the first INDEX tokens)."""
    ids = prompt_ids(0)
    tokens = get_method("ar")(tiny, {}).generate(ids, 16, Sampling(), None).tokens
    assert len(tokens) > INDEX + 1
    with torch.inference_mode():
        prefix = torch.cat([ids, torch.tensor([tokens[:INDEX]])], dim=1)
        logits = forward(tiny.model, prefix, new_cache(tiny.model), logits_to_keep=1)[-1].float()
    assert int(logits.argmax()) == tokens[INDEX]
    return ids, tokens, logits


def with_token(tokens: list[int], index: int, token: int) -> list[int]:
    return tokens[:index] + [token] + tokens[index + 1:]


def test_forced_wrong_token_is_unexplained_in_float32(tiny, greedy):
    ids, tokens, logits = greedy
    wrong = int(logits.argmin())
    gap, said = explain_mismatch(tiny, ids, tokens, with_token(tokens, INDEX, wrong), INDEX)
    assert said == UNEXPLAINED
    assert gap == pytest.approx(float(logits[tokens[INDEX]] - logits[wrong]), abs=1e-4) and gap > 0


def test_runner_up_token_is_unexplained_in_float32(tiny, greedy):
    """The likeliest defect, a method choosing ar's second-best token, is not excused in float32."""
    ids, tokens, logits = greedy
    second = int(logits.topk(2).indices[1])
    gap, said = explain_mismatch(tiny, ids, tokens, with_token(tokens, INDEX, second), INDEX)
    assert gap > near_tie_tolerance(float(logits.abs().max()), torch.float32, 2)
    assert said == UNEXPLAINED


def test_tie_in_the_lm_head_is_a_near_tie():
    """Give another token the same LM-head row as ar's token: the two logits tie (up to kernel rounding), so a
    method choosing it is explained by rounding alone (a model of its own: the shared fixture stays untouched)."""
    tied = load_model("random:tiny", dtype="float32", device="cpu")
    ids = prompt_ids(0)
    tokens = get_method("ar")(tied, {}).generate(ids, 16, Sampling(), None).tokens
    with torch.inference_mode():
        prefix = torch.cat([ids, torch.tensor([tokens[:INDEX]])], dim=1)
        other = int(forward(tied.model, prefix, new_cache(tied.model), logits_to_keep=1)[-1].argmin())
    head = tied.model.get_output_embeddings()
    with torch.no_grad():
        head.weight[other] = head.weight[tokens[INDEX]]
    repack(head)  # the CPU kernels packed the old weight once: pack the new one
    gap, said = explain_mismatch(tied, ids, tokens, with_token(tokens, INDEX, other), INDEX)
    assert said == NEAR_TIE and abs(gap) < 1e-5


def test_length_difference_is_unexplained(tiny, greedy):
    ids, tokens, _ = greedy
    gap, said = explain_mismatch(tiny, ids, tokens, tokens[:INDEX], INDEX)
    assert said == UNEXPLAINED and math.isnan(gap)


def test_tolerance_is_tight_in_float32_and_covers_bf16_rounding():
    bf16, f32 = near_tie_tolerance(27.0, torch.bfloat16), near_tie_tolerance(27.0, torch.float32)
    assert 1.0 < bf16 < 2.5  # 8 bf16 ulps of 27: a few tenths of a logit of bf16 rounding, doubled, passes
    assert f32 < 1e-3  # a float32 defect must pick a token within 1e-3 logits of the argmax to be excused
    assert verdict(0.8, bf16) == NEAR_TIE and verdict(0.8, f32) == UNEXPLAINED
    assert verdict(-0.8, bf16) == NEAR_TIE and verdict(-3.0, bf16) == UNEXPLAINED
    assert verdict(math.nan, bf16) == UNEXPLAINED
    assert near_tie_tolerance(27.0, torch.bfloat16, layers=120) == pytest.approx(2 * bf16)  # sqrt(120 / 30)
    assert near_tie_tolerance(27.0, torch.float16) < bf16  # fp16 keeps 3 more bits


def test_lowered_float32_matmul_precision_loosens_the_tolerance():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: float32 is then not exact
        assert effective_eps(torch.float32) == 2.0 ** -10
    finally:
        torch.set_float32_matmul_precision(before)
    assert effective_eps(torch.float32) == torch.finfo(torch.float32).eps


def records_frame() -> pd.DataFrame:
    """4 turns of pld: a match, a near-tie, an unexplained mismatch, and a mismatch from an older run (no verdict);
    ppd-typical (lossy) with an unexplained mismatch, which is not a failure."""
    rows = []
    for i in range(4):
        rows.append(dict(method="ar", prompt_id=str(i), lossless="", mismatch_explained="", mismatch_logit_gap=""))
    for i, (lossless, explained, gap) in enumerate([("match", "", ""), ("mismatch@3", "near-tie", "0.25"),
                                                    ("mismatch@7", "unexplained", "4.5"), ("mismatch@2", "", "")]):
        rows.append(dict(method="pld", prompt_id=str(i), lossless=lossless, mismatch_explained=explained,
                         mismatch_logit_gap=gap))
    rows.append(dict(method="ppd-typical", prompt_id="0", lossless="mismatch@1", mismatch_explained="unexplained",
                     mismatch_logit_gap="9.0"))
    frame = pd.DataFrame(rows)
    frame["dataset"], frame["turn"], frame["new_tokens"], frame["wall_s"] = "gsm8k", 0, 10, 1.0
    frame["tokens_per_s"], frame["target_forwards"], frame["drafted"], frame["accepted_drafts"] = 10.0, 10, 0, 0
    frame["peak_mem_mb"] = 100.0
    return frame


def test_summary_gives_exact_and_explained_rates():
    summary = report.summarize(records_frame()).set_index("method")
    cols = report.SUMMARY_COLUMNS
    assert cols[cols.index("lossless_rate") + 1] == "lossless_explained_rate"
    assert summary.loc["pld", "lossless_rate"] == 0.25  # 1 exact of 4 checked
    assert summary.loc["pld", "lossless_explained_rate"] == 0.5  # + the near-tie
    assert math.isnan(summary.loc["ar", "lossless_rate"]) and math.isnan(summary.loc["ar", "lossless_explained_rate"])


def test_records_of_older_runs_count_mismatches_as_unexplained():
    old = records_frame().drop(columns=["mismatch_explained", "mismatch_logit_gap"])
    summary = report.summarize(old).set_index("method")
    assert summary.loc["pld", "lossless_explained_rate"] == summary.loc["pld", "lossless_rate"] == 0.25
    bad = report.unexplained_mismatches(old)
    assert list(bad.verdict) == ["no verdict"] * 3 and bad.gap.isna().all()


def test_unexplained_mismatches_list_lossless_methods_only():
    bad = report.unexplained_mismatches(records_frame())
    assert list(bad.columns) == ["method", "dataset", "prompt_id", "turn", "index", "gap", "verdict"]
    assert bad[["method", "prompt_id", "index", "verdict"]].values.tolist() == [
        ["pld", "2", 7, "unexplained"], ["pld", "3", 2, "no verdict"]]
    assert bad.gap.iloc[0] == 4.5
    section = "\n".join(report.lossless_failed_section(records_frame()))
    assert "Lossless check FAILED" in section and "ppd-typical" not in section
    clean = records_frame()
    clean = clean[~clean.prompt_id.isin(["2", "3"]) & (clean.method != "ppd-typical")]
    assert report.unexplained_mismatches(clean).empty and report.lossless_failed_section(clean) == []


def test_run_report_says_what_each_rate_guarantees_and_fails_loudly(tmp_path):
    frame = records_frame()
    frame.to_csv(tmp_path / "records.csv", index=False)
    report.write_run_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## Lossless check FAILED" in text and "lossless_explained_rate" in text and "near-tie" in text
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {"lossless_rate", "lossless_explained_rate"} <= set(summary)
