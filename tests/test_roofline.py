"""The roofline (report/roofline.py): bytes a forward reads, the bound over a row's turns, host overhead's share,
the verdict's rule, and a real run's summary.csv carrying roofline_tok_s, of_roofline and host_overhead."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import yaml

from specbench.core.store import RunFolder
from specbench.report import roofline


def test_weight_bytes_leave_out_an_untied_input_table(tiny):
    model = tiny.model
    every = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    table = model.get_input_embeddings().weight
    tied = table is model.get_output_embeddings().weight
    expected = every if tied else every - table.numel() * table.element_size()
    assert roofline.weight_bytes(model) == expected

    untied = torch.nn.Module()  # an LM head apart from the input table: the table is only gathered from
    untied.embed, untied.head = torch.nn.Embedding(100, 8), torch.nn.Linear(8, 100, bias=False)
    untied.get_input_embeddings, untied.get_output_embeddings = (lambda: untied.embed), (lambda: untied.head)
    assert roofline.weight_bytes(untied) == 100 * 8 * 4


def test_kv_bytes_per_token_from_the_config(tiny):
    c = tiny.model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert roofline.kv_bytes_per_token(c, torch.float32) == c.num_hidden_layers * 2 * c.num_key_value_heads \
        * head_dim * 4
    assert roofline.kv_bytes_per_token(c, torch.bfloat16) * 2 == roofline.kv_bytes_per_token(c, torch.float32)


BLOCK = {"bandwidth_gb_s": 1.0, "weight_bytes": 10**9, "kv_bytes_per_token": 10**6}  # 1 s a forward + 1 ms a token


def test_bound_pools_turns_at_their_mean_context():
    # turn 1: 4 tokens from a 100-token prompt: contexts 100..103 (mean 101.5); turn 2: 1 token at context 0
    records = pd.DataFrame({"prompt_tokens": [100, 0], "new_tokens": [4, 1]})
    seconds = 4 * (1 + 1e-3 * 101.5) + 1 * 1.0
    assert roofline.bound_tok_s(records, BLOCK) == pytest.approx(5 / seconds)
    assert math.isnan(roofline.bound_tok_s(records, None))
    assert roofline.floor_s(BLOCK, 1000) == pytest.approx(2.0)


def test_host_overhead_is_host_over_the_wall_of_measured_turns():
    records = pd.DataFrame({"wall_s": [1.0, 3.0, 5.0], "host_s": [0.1, 0.3, ""]})  # "" : a turn that measured none
    assert roofline.host_overhead(records) == pytest.approx(0.4 / 4.0)
    assert math.isnan(roofline.host_overhead(records.assign(host_s=[""] * 3)))
    assert math.isnan(roofline.host_overhead(records.drop(columns="host_s")))


@pytest.mark.parametrize("l1, lk, bound, kind", [
    (17.0, 17.5, 0.1, "launch-bound"),      # the H200's: flat in width, a hundred times the floor
    (12.0, 13.0, 11.0, "bandwidth-bound"),  # near the floor, flat
    (12.0, 100.0, 2.0, "compute-bound"),    # each token of width costs nearly a whole forward
])
def test_verdict_names_the_largest_share_of_L1(l1, lk, bound, kind):
    block = {**BLOCK, "bound_ms": bound, "profile_l1_ms": l1, "profile_lk_ms": lk, "profile_width": 8}
    parts = roofline.shares(block)
    assert sum(parts.values()) == pytest.approx(l1)
    assert roofline.why(block)[0] == kind


def test_verdict_line_without_a_profile_says_the_distance_only():
    block = {**BLOCK, "bound_ms": 1.0, "kv_bytes": 0, "bandwidth_gb_s": 10.0}
    summary = pd.DataFrame({"method": ["ar", "pld"], "batch_size": [1, 1], "new_tokens": [100, 100],
                            "wall_s": [4.0, 2.0], "tokens_per_s": [25.0, 50.0], "roofline_tok_s": [50.0, 50.0],
                            "host_overhead": [0.1, 0.2]})
    line = roofline.verdict_line(summary, block)
    assert "25.0 tok/s, 0.5 of its roofline (50.0 tok/s" in line and "10.0% of its time" in line
    assert "no latency profile" in line
    assert roofline.verdict_line(summary, None) is None


def test_run_summary_has_finite_roofline_and_host_columns(tmp_path, monkeypatch):
    """A short real run (random tiny model, ar and pld): run.yaml's roofline block and summary.csv's columns."""
    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setenv("SPECBENCH_DATA_DIR", "/work/shared/datasets")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-m", "ar", "-m", "pld", "--model", "random:tiny", "--limit", "1",
                                      "--max-new-tokens", "8", "--warmup", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    block = yaml.safe_load(RunFolder(out).meta.read_text())["roofline"]
    assert block["bandwidth_gb_s"] == 20.0 and block["bandwidth_source"] == "$SPECBENCH_BANDWIDTH_GB_S"  # conftest
    assert block["weight_bytes"] > 0 and block["kv_bytes"] == block["kv_bytes_per_token"] * block["context_tokens"]
    assert block["bound_tok_s"] == pytest.approx(1e3 / block["bound_ms"], rel=1e-3)
    summary = pd.read_csv(RunFolder(out).summary)
    for column in ("roofline_tok_s", "of_roofline", "host_overhead"):
        assert summary[column].map(math.isfinite).all(), column
    assert (summary.of_roofline == (summary.tokens_per_s / summary.roofline_tok_s).round(3)).all()
    assert (summary.host_overhead >= 0).all() and (summary.host_overhead < 1).all()
    records = pd.read_csv(RunFolder(out).records)
    assert (records.forward_s + records.draft_s + records.host_s - records.wall_s).abs().max() < 1e-5
    assert "of its roofline" in RunFolder(out).report.read_text()


def test_a_profile_faster_than_the_floor_blames_the_bandwidth():
    block = {**BLOCK, "bound_ms": 62.0, "profile_l1_ms": 44.0, "profile_lk_ms": 48.0, "profile_width": 16}
    kind, reason = roofline.why(block)
    assert kind == "" and "--measure-bandwidth" in reason


def test_verdict_line_says_the_prefill_share_and_the_decode_only_fraction():
    block = {**BLOCK, "bound_ms": 10.0, "kv_bytes": 0, "bandwidth_gb_s": 10.0}
    summary = pd.DataFrame({"method": ["ar"], "batch_size": [1], "new_tokens": [100], "turns": [2], "wall_s": [4.0],
                            "tokens_per_s": [25.0], "roofline_tok_s": [50.0], "host_overhead": [0.1],
                            "ttft_p50_s": [0.2], "tpot_p50_ms": [20.0]})
    line = roofline.verdict_line(summary, block)
    assert "prefill takes about 10.0% of its time" in line and "20.00 ms a token" in line
    assert "0.5 of the roofline" in line  # 10 ms floor / 20 ms a decoded token


@pytest.mark.parametrize("l1, stale", [(45.46, True), (21.5, False), (10.0, True)])
def test_verdict_line_warns_of_a_profile_whose_L1_is_far_from_ars_step(l1, stale):
    """A profile of another machine state (Zen 5: a shipped eager L(1) of 45.46 ms against 21.05 ms a token decoded)
    is named, both ways, and one within STALE of the measured step is not."""
    block = {**BLOCK, "bound_ms": 10.0, "kv_bytes": 0, "bandwidth_gb_s": 10.0, "profile_l1_ms": l1,
             "profile_lk_ms": l1 * 1.4, "profile_width": 16}
    summary = pd.DataFrame({"method": ["ar", "ar"], "batch_size": [1, 1], "new_tokens": [100, 300], "turns": [2, 2],
                            "wall_s": [4.0, 8.0], "tokens_per_s": [25.0, 37.5], "roofline_tok_s": [50.0, 50.0],
                            "host_overhead": [0.1, 0.1], "ttft_p50_s": [0.2, 0.2], "tpot_p50_ms": [20.0, 21.4]})
    line = roofline.verdict_line(summary, block)
    assert roofline.decode_step_ms(summary) == pytest.approx((20.0 * 100 + 21.4 * 300) / 400)
    assert ("measures it again" in line) == stale
    if stale:
        assert f"L(1), {l1:.2f} ms, is {l1 / 21.05:.2f}x the 21.05 ms a token" in line
        assert "another state of this machine" in line
        other = {**block, "profile_chip": "AMD EPYC (family 25, model 17)", "chip": "AMD EPYC (family 26, model 2)"}
        assert "another chip under the same hardware key (AMD EPYC (family 25, model 17); this one: AMD EPYC " \
            "(family 26, model 2))" in roofline.verdict_line(summary, other)


def test_the_roofline_block_names_the_chip_that_measured_the_profile(tiny):
    from specbench.core.machine import roofline as block_of
    from specbench.core.profile_file import LatencyProfile

    identity = {"kind": "cpu", "name": "AMD EPYC", "family": 25, "model": 17}
    profile = LatencyProfile("m", "float32", "cpu-x", "measured", [1, 4], {128: {"median_ms": [10.0, 12.0]}},
                              meta={"identity": identity})
    bw = type("Bw", (), {"gb_s": 10.0, "source": "given", "measured_at": None, "copy_gb_s": None, "read_gb_s": None,
                         "kernel_gb_s": None})()
    block = block_of.run_block(tiny, bw, 100.0, profile)
    assert block["profile_chip"] == "AMD EPYC (family 25, model 17)" and block["chip"]
    assert block_of.chip(None) == "" and block_of.chip({"kind": "gpu", "name": "NVIDIA H200"}) == "NVIDIA H200"
