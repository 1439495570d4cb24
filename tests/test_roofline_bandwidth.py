"""The measured memory bandwidth (core/machine/bandwidth.py): its arithmetic, its buffer size and its cache per
hardware key. Speeds are never asserted (a shared machine's are anything)."""

from __future__ import annotations

import torch
import yaml

from specbench.core.machine import bandwidth as bw
from specbench.core.machine import contention


def test_rates_count_a_copy_twice_and_take_the_best():
    # 1 GB buffer: a copy moves 2 GB, a read 1 GB; the fastest repeat wins
    copy, read = bw.rates(10**9, [0.5, 0.25, 0.4], [0.2, 0.1])
    assert copy == 8.0 and read == 10.0


def test_cpu_buffer_misses_the_cache_and_fits_memory():
    assert bw.cpu_buffer_bytes(0, None) == 512 * bw.MiB  # the floor
    assert bw.cpu_buffer_bytes(480 * bw.MiB, None) == 960 * bw.MiB  # 2 x LLC: two buffers are 4 x the LLC
    assert bw.cpu_buffer_bytes(480 * bw.MiB, 2 * 2**30) == 512 * bw.MiB  # a quarter of what is free
    assert bw.parse_size("491520K") == 480 * bw.MiB and bw.parse_size("2M") == 2 * bw.MiB


def test_measured_once_then_read_from_the_cache_per_hardware_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(bw.ENV, raising=False)  # (conftest gives runs a bandwidth: here it is measured)
    monkeypatch.setattr(contention, "disturbed", lambda reading: False)  # quiet, whatever else the suite runs
    small = 8 * bw.MiB  # the arithmetic and the cache, not a real measurement
    calls = []

    def measure(device, hardware, repeats=bw.REPEATS, buffer_bytes=None):
        calls.append(hardware)
        return real(device, hardware, 2, small)

    real = bw.measure
    monkeypatch.setattr(bw, "measure", measure)
    first = bw.bandwidth(torch.device("cpu"))
    assert first.source == "measured now" and first.gb_s == max(first.copy_gb_s, first.read_gb_s, first.kernel_gb_s) > 0
    from specbench.core.model import panel_linear

    assert (first.kernel_gb_s > 0) == panel_linear.available(torch.float32)  # the panels kernel's read, where it runs
    path = bw.cache_file(first.hardware)
    assert path.parent == tmp_path / "bandwidth" and path.is_file()
    stored = yaml.safe_load(path.read_text())
    assert stored["gb_s"] == first.gb_s and stored["buffer_bytes"] == small and "source" not in stored

    again = bw.bandwidth(torch.device("cpu"))  # the cache answers: no second measurement
    assert calls == [first.hardware] and again.gb_s == first.gb_s and again.source.startswith("cached ")

    # another thread count is another measurement (a CPU's bandwidth depends on the cores used)
    path.write_text(yaml.safe_dump({**stored, "threads": stored["threads"] + 7}))
    bw.bandwidth(torch.device("cpu"))
    assert len(calls) == 2
    # a torn cache file is measured again, not an error
    path.write_text("gb_s: [")
    assert bw.bandwidth(torch.device("cpu")).source == "measured now" and len(calls) == 3


def test_a_bandwidth_measured_beside_other_work_is_used_once_never_cached(tmp_path, monkeypatch):
    """A measurement beside other work (a busy machine reads a low bandwidth) serves the run that took it and is not
    filed: the next run measures again instead of reading the low figure as this machine's."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(bw.ENV, raising=False)
    monkeypatch.setattr(contention, "disturbed", lambda reading: True)
    real = bw.measure
    monkeypatch.setattr(bw, "measure", lambda device, hardware: real(device, hardware, 2, 8 * bw.MiB))
    first = bw.bandwidth(torch.device("cpu"))
    assert first.gb_s > 0 and "not cached" in first.source and "other work" in first.source
    assert not bw.cache_file(first.hardware).exists()
    assert "not cached" in bw.bandwidth(torch.device("cpu")).source  # measured again, not read back


def test_a_given_bandwidth_is_taken_and_a_bad_one_refused(monkeypatch):
    import pytest

    from specbench.errors import SpecbenchError

    monkeypatch.setenv(bw.ENV, "48.5")
    given = bw.bandwidth(torch.device("cpu"))
    assert given.gb_s == 48.5 and given.source == f"${bw.ENV}" and "given" in bw.describe(given)
    monkeypatch.setenv(bw.ENV, "fast")
    with pytest.raises(SpecbenchError, match=bw.ENV):
        bw.bandwidth(torch.device("cpu"))


def test_a_run_measures_the_bandwidth_in_its_own_sitting(tmp_path, monkeypatch):
    """A run's roofline divides by a bandwidth measured before its turns, not by the cached reading of another
    sitting (a machine's bandwidth moves within a day); a measurement beside other work (it reads low) gives way to
    the cached reading, both said; with nothing cached the disturbed one is used, said."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(bw.ENV, raising=False)
    real = bw.measure
    monkeypatch.setattr(bw, "measure", lambda device, hardware: real(device, hardware, 2, 8 * bw.MiB))
    busy = [True]
    monkeypatch.setattr(contention, "disturbed", lambda reading: busy[0])
    alone = bw.for_run(torch.device("cpu"))  # disturbed, nothing cached: used, said
    assert alone.gb_s > 0 and "not cached" in alone.source and not bw.cache_file(alone.hardware).exists()

    busy[0] = False
    old = bw.replace(alone, gb_s=12345.0, measured_at="2000-01-01T00:00:00Z")
    bw.write_cached(old)  # a reading of another sitting: not what this run divides by
    now = bw.for_run(torch.device("cpu"))
    assert now.gb_s != 12345.0 and now.source == "measured now, before this run's turns"
    assert yaml.safe_load(bw.cache_file(now.hardware).read_text())["gb_s"] == now.gb_s  # filed for other commands

    busy[0] = True
    bw.write_cached(old)
    fallback = bw.for_run(torch.device("cpu"))
    assert fallback.gb_s == 12345.0 and fallback.source.startswith("cached ") and "not used" in fallback.source
    assert fallback.measured_at == "2000-01-01T00:00:00Z"  # when that reading was taken, for the report

    monkeypatch.setenv(bw.ENV, "48.5")  # a given bandwidth: nothing measured
    assert bw.for_run(torch.device("cpu")).source == f"${bw.ENV}"


def test_the_verdict_names_the_bandwidth_reading_and_when():
    from specbench.report import roofline

    block = {"bandwidth_source": "measured now, before this run's turns",
             "bandwidth_measured_at": "2026-11-27T15:00:00Z"}
    assert roofline.reading(block) == ", measured now, before this run's turns, at 2026-11-27T15:00:00Z"
    assert roofline.reading({"bandwidth_source": "$SPECBENCH_BANDWIDTH_GB_S", "bandwidth_measured_at": ""}) \
        == ", $SPECBENCH_BANDWIDTH_GB_S"
    assert roofline.reading({}) == ""


def test_a_second_reading_after_the_turns_is_added_and_stated(tmp_path, monkeypatch):
    """After the turns run.yaml's roofline block gains the bandwidth measured again, and the verdict states `ar`
    against it beside the first (the bound scales with the bandwidth); a given bandwidth adds nothing."""
    from specbench.core.machine import roofline as core_roofline
    from specbench.report import roofline

    monkeypatch.delenv(bw.ENV, raising=False)
    real = bw.measure
    monkeypatch.setattr(bw, "measure", lambda device, hardware: real(device, hardware, 2, 8 * bw.MiB))
    monkeypatch.setattr(contention, "disturbed", lambda reading: False)
    meta = tmp_path / "run.yaml"
    meta.write_text(yaml.safe_dump({"roofline": {"bandwidth_gb_s": 40.0, "bandwidth_source": "measured now, before"},
                                    "other": 1}))
    core_roofline.add_after(meta, "cpu")
    block = yaml.safe_load(meta.read_text())["roofline"]
    assert block["bandwidth_after_gb_s"] > 0
    assert block["bandwidth_after_source"] == "measured now, after the run's turns"
    assert yaml.safe_load(meta.read_text())["other"] == 1
    said = roofline.after_text({"bandwidth_gb_s": 40.0, "bandwidth_after_gb_s": 80.0,
                                "bandwidth_after_source": "measured now, after the run's turns"}, 0.9)
    assert said == "; 0.45 of it at the 80.0 GB/s measured after its turns"
    assert roofline.after_text({"bandwidth_gb_s": 40.0}, 0.9) == ""
    given = {"roofline": {"bandwidth_gb_s": 20.0, "bandwidth_source": "$SPECBENCH_BANDWIDTH_GB_S"}}
    meta.write_text(yaml.safe_dump(given))
    core_roofline.add_after(meta, "cpu")
    assert yaml.safe_load(meta.read_text()) == given
