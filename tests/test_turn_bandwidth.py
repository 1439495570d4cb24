"""The bandwidth read beside each timed turn (run/turn_bandwidth.py): a probe before and after every turn on a CPU,
one probe shared between turns that follow each other, each turn's roofline at its own reading
(report/roofline.py), and a real run's records and report carrying it."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from specbench.core.machine import bandwidth as bw
from specbench.core.store import RunFolder
from specbench.report import roofline
from specbench.run import turn_bandwidth as tb


def test_a_probe_reads_a_buffer_larger_than_the_cache_and_only_on_a_cpu(monkeypatch):
    sizes = []
    monkeypatch.setattr(bw, "cpu_buffer_bytes", lambda llc, available: sizes.append(llc) or 8 * bw.MiB)
    gb_s = bw.probe(torch.device("cpu"))
    assert gb_s > 0 and math.isfinite(gb_s) and sizes  # sized as measure() sizes its buffers
    assert bw.probe(torch.device("meta")) == 0.0  # not a CPU: nothing read


def test_turns_are_bracketed_and_a_fresh_reading_is_shared(monkeypatch):
    monkeypatch.delenv(bw.ENV, raising=False)
    readings = iter([10.0, 20.0, 40.0, 30.0])
    monkeypatch.setattr(bw, "probe", lambda device: next(readings))
    clock = [100.0]
    monkeypatch.setattr(tb.time, "perf_counter", lambda: clock[0])
    probe = tb.TurnBandwidth(torch.device("cpu"))
    first = probe.before()  # 10: read now
    clock[0] += 5.0  # the turn
    assert probe.beside(first) == 15.0  # (10 + 20) / 2
    clock[0] += 0.1  # the record written: the reading after the last turn starts the next one
    second = probe.before()
    assert second == 20.0
    clock[0] += 5.0
    assert probe.beside(second) == 30.0  # (20 + 40) / 2
    clock[0] += tb.REUSE_S + 1  # a pause (a retime, another dataset's loading): read again
    assert probe.before() == 30.0


@pytest.mark.parametrize("device, given", [(None, None), ("meta", None), ("cpu", "48.5")])
def test_no_probe_off_a_cpu_or_with_a_given_bandwidth(device, given, monkeypatch):
    monkeypatch.delenv(bw.ENV, raising=False)
    if given:
        monkeypatch.setenv(bw.ENV, given)
    monkeypatch.setattr(bw, "probe", lambda device: pytest.fail("probed"))
    probe = tb.TurnBandwidth(device)
    assert math.isnan(probe.before()) and math.isnan(probe.beside(probe.before()))


BLOCK = {"bandwidth_gb_s": 1.0, "weight_bytes": 10**9, "kv_bytes_per_token": 0, "bound_ms": 1000.0, "kv_bytes": 0}


def test_each_turn_is_bounded_at_its_own_reading():
    # two turns of 10 tokens: one beside 2 GB/s (0.5 s a forward), one without a reading (the run's 1 GB/s: 1 s)
    records = pd.DataFrame({"prompt_tokens": [0, 0], "new_tokens": [10, 10], "bandwidth_gb_s": [2.0, math.nan]})
    assert roofline.bound_tok_s(records, BLOCK) == pytest.approx(20 / (10 * 0.5 + 10 * 1.0))
    assert roofline.bound_tok_s(records.drop(columns="bandwidth_gb_s"), BLOCK) == pytest.approx(1.0)
    assert roofline.beside_range(records) == (2.0, 2.0, 2.0)
    assert roofline.beside_range(records.drop(columns="bandwidth_gb_s")) is None


def test_the_verdict_says_the_readings_beside_the_turns():
    summary = pd.DataFrame({"method": ["ar"], "batch_size": [1], "new_tokens": [20], "wall_s": [20.0],
                            "tokens_per_s": [1.0], "roofline_tok_s": [2.0], "host_overhead": [0.1],
                            "turns": [2], "ttft_p50_s": [0.0], "tpot_p50_ms": [1000.0]})
    records = pd.DataFrame({"method": ["ar", "ar", "pld"], "batch_size": [1, 1, 1], "bandwidth_gb_s": [1.5, 2.5, 9.0]})
    block = {**BLOCK, "bandwidth_after_gb_s": 3.0}
    line = roofline.verdict_line(summary, block, records)
    assert "read beside each of its turns, 2.0 GB/s on average (1.5-2.5)" in line  # ar's turns only
    assert "1.0 GB/s before its turns and 3.0 after them" in line
    assert "against the 500.00 ms floor, 0.5 of the roofline" in line  # the floor at the turns' mean reading
    assert "read beside" not in roofline.verdict_line(summary, block)  # without records: the run's readings


def test_a_run_records_the_bandwidth_beside_each_turn(tmp_path, monkeypatch):
    """A short real run (random tiny model, ar and pld) with the probe stubbed (a real one reads ~600 MiB): every
    turn's record holds its reading, and the report states them."""
    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setenv("SPECBENCH_DATA_DIR", "/work/shared/datasets")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(bw.ENV, raising=False)
    monkeypatch.setattr(bw, "measure", lambda device, hardware, *a: bw.Bandwidth(
        12.0, 12.0, 12.0, 1, 1, "cpu", torch.get_num_threads(), hardware, "2026-11-28T00:00:00Z"))
    readings = iter(range(10, 100))
    monkeypatch.setattr(bw, "probe", lambda device: float(next(readings)))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-m", "ar", "-m", "pld", "--model", "random:tiny", "--limit", "2",
                                      "--max-new-tokens", "8", "--warmup", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = pd.read_csv(RunFolder(out).records)
    assert records.bandwidth_gb_s.between(10, 100).all() and records.bandwidth_gb_s.nunique() > 1
    assert "read beside each of its turns" in RunFolder(out).report.read_text()
