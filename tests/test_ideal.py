"""The hardware's ideal latency per width (core/machine/ideal.py) and the GEMM peak it divides by
(core/machine/peak.py): the arithmetic of a known tiny config, the peak's cache and override, the profile's columns."""

from __future__ import annotations

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.machine import contention, ideal, peak
from specbench.core.machine.bandwidth import Bandwidth
from specbench.errors import SpecbenchError
from specbench.planning.profile import load_profile

# random:tiny: llama, hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 key / value heads, vocab 260, untied
H, I, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 128, 2, 4, 2, 16, 260
PER_LAYER = H * HEADS * HEAD_DIM * 2 + H * KV_HEADS * HEAD_DIM * 2 + 3 * H * I  # q, o; k, v; gate, up, down
LINEAR = LAYERS * PER_LAYER + VOCAB * H  # the LM head over every row
WEIGHT_BYTES = 4 * (LAYERS * (PER_LAYER + 2 * H) + H + VOCAB * H)  # norms too; the input table is gathered, not read
KV_PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
PER_KEY = 4 * LAYERS * HEADS * HEAD_DIM


def _rates(gb_s: float, gflops: float):
    return (Bandwidth(gb_s, gb_s, gb_s, 1, 1, "cpu", 1, "hw", "now"),
            peak.Peak(gflops, "float32", 1, 1, "cpu", 1, "hw", "now"))


def test_bytes_and_flops_of_a_tiny_forward(tiny):
    assert ideal.linear_params(tiny.model) == LINEAR
    assert ideal.attention_flops_per_key(tiny.model.config) == PER_KEY
    # width 4 on 10 cached entries: rows see 11, 12, 13, 14 keys
    assert ideal.forward_flops(LINEAR, PER_KEY, 4, 10) == 2 * 4 * LINEAR + PER_KEY * (11 + 12 + 13 + 14)
    assert ideal.forward_bytes(WEIGHT_BYTES, KV_PER_TOKEN, 4, 10) == WEIGHT_BYTES + KV_PER_TOKEN * 14
    bw, pk = _rates(1.0, 1e-3)  # 1 GB/s, 1 MFLOP/s: compute-bound at every width
    entry = ideal.block(tiny.model, torch.float32, bw, pk, [1, 4], {10: {"median_ms": [2000.0, 4000.0]}})
    assert entry["weight_bytes"] == WEIGHT_BYTES and entry["kv_bytes_per_token"] == KV_PER_TOKEN
    curve = entry["curves"][0]
    want = [1e3 * ideal.forward_flops(LINEAR, PER_KEY, w, 10) / 1e6 for w in (1, 4)]
    assert curve["ideal_ms"] == pytest.approx(want, rel=1e-6) and curve["bound"] == ["compute", "compute"]
    assert curve["measured_over_ideal"] == pytest.approx([2000 / want[0], 4000 / want[1]], rel=1e-3)


def test_the_larger_bound_sets_the_ideal(tiny):
    """Reading the bytes at 1 GB/s against a fast peak: bandwidth-bound at width 1, compute-bound once the width's
    arithmetic takes longer."""
    bw, pk = _rates(1.0, 1.0)  # 1 GFLOP/s
    entry = ideal.block(tiny.model, torch.float32, bw, pk, [1, 64], {0: {"median_ms": [1.0, 1.0]}})
    memory_ms = [1e3 * ideal.forward_bytes(WEIGHT_BYTES, KV_PER_TOKEN, w, 0) / 1e9 for w in (1, 64)]
    compute_ms = [1e3 * ideal.forward_flops(LINEAR, PER_KEY, w, 0) / 1e9 for w in (1, 64)]
    assert memory_ms[0] > compute_ms[0] and compute_ms[1] > memory_ms[1]  # the case this test is for
    curve = entry["curves"][0]
    assert curve["bound"] == ["bandwidth", "compute"]
    assert curve["ideal_ms"] == pytest.approx([memory_ms[0], compute_ms[1]], rel=1e-3)


def test_peak_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(peak.ENV, raising=False)  # (conftest gives profiles a peak: here it is measured)
    monkeypatch.setattr(contention, "disturbed", lambda reading: False)  # quiet, whatever else the suite runs
    calls = []
    real = peak.measure

    def measure(device, dtype, hardware, repeats=peak.REPEATS, size=None):
        calls.append(dtype)
        return real(device, dtype, hardware, repeats=2, size=128)  # a real GEMM, small

    monkeypatch.setattr(peak, "measure", measure)
    first = peak.peak(torch.device("cpu"), torch.float32)
    assert first.gflops > 0 and first.source == "measured now" and first.size == 128
    again = peak.peak(torch.device("cpu"), torch.float32)
    assert again.gflops == first.gflops and again.source.startswith("cached ") and len(calls) == 1
    assert peak.cache_file(first.hardware, torch.float32).is_file()
    peak.peak(torch.device("cpu"), torch.bfloat16)  # another dtype: its own measurement and file
    assert calls == [torch.float32, torch.bfloat16]
    assert peak.cache_file(first.hardware, torch.bfloat16).is_file()
    peak.peak(torch.device("cpu"), torch.float32, remeasure=True)
    assert len(calls) == 3


def test_peak_is_the_faster_of_the_gemm_and_the_panels_linear(tmp_path, monkeypatch):
    """In float32 on a CPU with the native library the panels linear is timed too and the peak is the larger rate
    (torch's GEMM is not the fastest arithmetic a forward reaches here), at bfloat16 on bfloat16 weights; a cache
    from before that probe is measured again; at float16 only the GEMM runs."""
    from specbench.core.model import panel_linear

    if not panel_linear.available(torch.float32):
        pytest.skip("no native library here")
    found = peak.measure(torch.device("cpu"), torch.float32, "hw", repeats=2, size=128)
    assert found.kernel_gflops > 0 and found.gemm_gflops > 0
    assert found.gflops == max(found.kernel_gflops, found.gemm_gflops)
    assert "panels linear" in peak.describe(found)
    assert peak.measure(torch.device("cpu"), torch.bfloat16, "hw", repeats=1, size=64).kernel_gflops > 0
    assert peak.measure(torch.device("cpu"), torch.float16, "hw", repeats=1, size=64).kernel_gflops == 0
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    old = peak.Peak(100.0, "float32", 128, 2, "cpu", threads, "hw", "then")  # no kernel_gflops: before the probe
    peak.write_cached(old)
    assert peak.read_cached("hw", torch.float32, "cpu", threads) is None
    peak.write_cached(found)
    assert peak.read_cached("hw", torch.float32, "cpu", threads).kernel_gflops == found.kernel_gflops


def test_a_given_peak_is_taken_and_a_bad_one_refused(monkeypatch):
    monkeypatch.setenv(peak.ENV, "150")
    given = peak.peak(torch.device("cpu"), torch.float32)
    assert given.gflops == 150.0 and given.source == "$SPECBENCH_PEAK_GFLOPS" and "given" in peak.describe(given)
    monkeypatch.setenv(peak.ENV, "fast")
    with pytest.raises(SpecbenchError, match="SPECBENCH_PEAK_GFLOPS"):
        peak.peak(torch.device("cpu"), torch.float32)


def test_profile_states_the_ideal_beside_the_measured_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_BANDWIDTH_GB_S", "20")
    monkeypatch.setenv(peak.ENV, "100")
    out = tmp_path / "prof.yaml"
    result = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--widths", "1,2,4", "--kv-length",
                                      "8,16", "--repeats", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "x ideal" in result.output and "FLOPs / 100.0 GFLOP/s" in result.output
    data = yaml.safe_load(out.read_text())
    entry = data["ideal"]
    assert entry["bandwidth_gb_s"] == 20.0 and entry["peak_gflops"] == 100.0 and entry["linear_params"] == LINEAR
    medians = {c["kv_length"]: c["median_ms"] for c in data["curves"]}
    for curve in entry["curves"]:
        kv = curve["kv_length"]
        want = [1e3 * ideal.forward_bytes(WEIGHT_BYTES, KV_PER_TOKEN, w, kv) / 20e9 for w in (1, 2, 4)]
        assert curve["ideal_ms"] == pytest.approx(want, rel=1e-3)  # bandwidth-bound at these rates
        assert curve["measured_over_ideal"] == pytest.approx([m / i for m, i in zip(medians[kv], want)], rel=1e-2)
    assert sorted(ideal.stated(load_profile(out).meta)) == [8, 16]  # read back from the file
    assert out.with_suffix(".png").exists()
