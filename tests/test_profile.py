"""Latency profiles: measurement on a tiny model, YAML round trip, interpolation, malformed files."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.planning.profile import LatencyProfile, load_profile, measure


def test_measure_and_round_trip(tiny, tmp_path):
    prof = measure(tiny, widths=[1, 4, 2], kv_lengths=[16, 32], repeats=2, warmup=1)
    assert prof.widths == [1, 2, 4] and sorted(prof.curves) == [16, 32]
    for curve in prof.curves.values():
        assert all(ms > 0 for ms in curve["median_ms"])
        assert all(lo <= hi for lo, hi in zip(curve["p10_ms"], curve["p90_ms"]))
    path = tmp_path / "p.yaml"
    path.write_text(prof.to_yaml())
    back = load_profile(path)
    assert back.curves == prof.curves and back.widths == prof.widths and back.source == "measured"


def test_every_round_meets_a_new_kv_length(tiny, monkeypatch):
    """Decoding never repeats a KV length, so neither do the profile's rounds: a cost paid per new shape (an
    attention plan) is measured, not hidden. The widths of one round share a length; the next round's is one more."""
    import specbench.planning.profile as profile

    seen = []
    real = profile.timed_forward

    def recording(model, ids, cache, device):
        seen.append((ids.shape[1], cache.get_seq_length()))
        return real(model, ids, cache, device)

    monkeypatch.setattr(profile, "timed_forward", recording)
    prof = measure(tiny, widths=[2, 4], kv_lengths=[16], repeats=3, warmup=1)
    timed = seen[2:]  # after the warm-up round (two widths at KV 16)
    assert [kv for _, kv in timed] == [16, 16, 17, 17, 18, 18]
    assert {n for n, _ in timed} == {2, 4} and prof.meta["kv_growth"].startswith("one token a round")


def test_latency_interpolates_and_extrapolates():
    prof = LatencyProfile("m", "float32", "cpu-x", "measured", [1, 2, 4],
                          {128: {"median_ms": [10.0, 12.0, 20.0], "p10_ms": [], "p90_ms": []}})
    assert prof.latency_ms(1) == 10.0
    assert prof.latency_ms(3) == pytest.approx(16.0)
    assert prof.latency_ms(6) == pytest.approx(28.0)  # slope of the last segment
    assert prof.latency_ms(2, kv_length=4096) == 12.0  # nearest KV curve


@pytest.mark.parametrize("content, message", [
    ("kind: latency-profile\nmodel: m\n", "missing field"),
    ("[unclosed", "malformed YAML"),
    ("kind: something-else\n", "not a latency profile"),
    ("kind: latency-profile\nmodel: m\ndtype: f\nhardware: h\nwidths: [1, 2]\ncurves:\n"
     "  - {kv_length: 1, median_ms: [1.0]}\n", "has 1 values for 2 widths"),
])
def test_malformed_profiles(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(SpecbenchError, match=message):
        load_profile(path)


def test_profile_command_writes_yaml_and_plot(tmp_path):
    out = tmp_path / "prof.yaml"
    result = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--widths", "1,2", "--kv-lengths",
                                      "8", "--repeats", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    assert data["kind"] == "latency-profile" and data["source"] == "measured"
    assert out.with_suffix(".png").exists()
    bad = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--widths", "a,b"])
    assert bad.exit_code != 0 and "comma-separated integers" in bad.output


def _config(preset):
    from transformers import AutoConfig

    from specbench.core.model.load import RANDOM_PRESETS

    d = dict(RANDOM_PRESETS[preset])
    return AutoConfig.for_model(d.pop("model_type"), **d)


def test_estimates_follow_the_chip_rates():
    from specbench.planning.latency_estimate import estimate_profile

    cfg = _config("llama2-7b")
    h100 = estimate_profile("llama2-7b", cfg, "h100", "bfloat16", [1, 16, 256], kv_lengths=[512])
    r3090 = estimate_profile("llama2-7b", cfg, "rtx3090", "bfloat16", [1, 16, 256], kv_lengths=[512])
    assert h100.source == "estimated"
    h, r = h100.curves[512]["median_ms"], r3090.curves[512]["median_ms"]
    assert r[0] > h[0]  # less bandwidth: slower single-token forwards
    assert h[1] == pytest.approx(h[0], rel=0.05)  # memory-bound: flat at small widths
    assert r[2] / r[0] > h[2] / h[0]  # fewer FLOP/s: the curve bends up earlier


def test_resolve_profile_prefers_measured_and_rejects_unknown(tmp_path):
    from specbench.planning.latency_estimate import resolve_profile

    cfg = _config("smollm2-135m")
    est = resolve_profile("a100", "smollm2-135m", cfg, "bfloat16", "cpu-x", [1, 2], root=tmp_path)
    assert est.source == "estimated"
    measured = LatencyProfile("smollm2-135m", "bfloat16", "nvidia-a100-sxm4-40gb", "measured", [1, 2],
                              {128: {"median_ms": [5.0, 5.1], "p10_ms": [5.0, 5.1], "p90_ms": [5.0, 5.1]}})
    folder = tmp_path / "nvidia-a100-sxm4-40gb"
    folder.mkdir()
    (folder / "smollm2-135m-bfloat16.yaml").write_text(measured.to_yaml())
    got = resolve_profile("a100", "smollm2-135m", cfg, "bfloat16", "cpu-x", [1, 2], root=tmp_path)
    assert got.source == "measured" and got.latency_ms(1) == 5.0
    with pytest.raises(SpecbenchError, match="unknown --gpu"):
        resolve_profile("tpu9", "smollm2-135m", cfg, "bfloat16", "cpu-x", [1], root=tmp_path)
    with pytest.raises(SpecbenchError, match="specbench profile"):
        resolve_profile("cpu", "smollm2-135m", cfg, "bfloat16", "cpu-x", [1], root=tmp_path)


# ------------------------------------------------------------------ batch sizes: L(B, w) in the same file


def test_batch_sizes_measure_round_trip_and_view(tiny, tmp_path):
    prof = measure(tiny, widths=[1, 2, 4], kv_lengths=[16], repeats=2, warmup=1, batch_sizes=[1, 2, 3])
    assert prof.batch_sizes == [1, 2, 3]
    assert prof.batches[2].widths == [1, 2] and prof.batches[3].widths == [1, 2]  # B x w <= the widest, + 1 and 2
    assert all(ms > 0 for c in prof.batches.values() for ms in c.curves[16]["median_ms"])
    path = tmp_path / "p.yaml"
    path.write_text(prof.to_yaml())
    back = load_profile(path)
    assert back.batch_sizes == [1, 2, 3] and back.curves == prof.curves
    assert back.batches[3].curves == prof.batches[3].curves and back.batches[3].widths == [1, 2]
    assert "batch_curves" not in back.meta and back.meta["batch_engine"].startswith("unpadded")
    view = back.at_batch(3)
    assert view.widths == [1, 2] and view.latency_ms(2, 16) == pytest.approx(back.batches[3].curves[16]["median_ms"][1])
    assert view.meta["batch_size"] == 3 and back.at_batch(1) is back and back.at_batch(8) is None
    assert back.to_yaml() == prof.to_yaml()


def test_batch_one_profiles_are_unchanged_and_still_read(tmp_path):
    old = LatencyProfile("m", "float32", "cpu-x", "measured", [1, 2],
                         {128: {"median_ms": [10.0, 12.0], "p10_ms": [9.0, 11.0], "p90_ms": [11.0, 13.0]}},
                         {"threads": 2})
    path = tmp_path / "old.yaml"
    path.write_text(old.to_yaml())
    assert "batch_curves" not in path.read_text()  # a batch-1 profile is written exactly as before batch sizes
    back = load_profile(path)
    assert back.batch_sizes == [1] and back.at_batch(2) is None and back.to_yaml() == path.read_text()


@pytest.mark.parametrize("entry, message", [
    ("{batch_size: 1, kv_length: 8, widths: [1], median_ms: [1.0]}", "integer >= 2"),
    ("{batch_size: 2, kv_length: 8, widths: [2, 1], median_ms: [1.0, 2.0]}", "increasing positive integers"),
    ("{batch_size: 2, kv_length: 8, widths: [1, 2], median_ms: [1.0]}", "has 1 values for 2 widths"),
    ("{batch_size: 2, widths: [1], median_ms: [1.0]}", "needs batch_size, kv_length, widths and median_ms"),
])
def test_malformed_batch_curves(tmp_path, entry, message):
    path = tmp_path / "bad.yaml"
    path.write_text("kind: latency-profile\nmodel: m\ndtype: f\nhardware: h\nwidths: [1]\ncurves:\n"
                    f"  - {{kv_length: 8, median_ms: [1.0]}}\nbatch_curves:\n  - {entry}\n")
    with pytest.raises(SpecbenchError, match=message):
        load_profile(path)


def test_profile_command_with_batch_sizes(tmp_path):
    out = tmp_path / "prof.yaml"
    result = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--widths", "1,2,4", "--kv-lengths", "8",
                                      "--repeats", "2", "--batch-sizes", "2,1", "--batch-widths", "1,3",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    back = load_profile(out)
    assert back.batch_sizes == [1, 2] and back.batches[2].widths == [1, 3]
    assert "L(B=2, w)" in result.output


@pytest.mark.parametrize("value, message", [("0", "integers >= 1"), ("-2", "integers >= 1"),
                                            ("1.5", "comma-separated integers"), ("2,x", "comma-separated integers"),
                                            ("1,0", "integers >= 1")])
def test_bad_batch_sizes_are_refused_before_loading(tmp_path, value, message):
    result = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--batch-sizes", value,
                                      "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code != 0 and message in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "p.yaml").exists()


def test_batch_rounds_also_meet_new_kv_lengths(tiny, monkeypatch):
    """L(B, w) too: every slot of the batch is one token deeper each round."""
    import specbench.planning.batch_profile as bp

    seen = []
    real = bp._step_ms

    def recording(batch, rows, kv, device):
        seen.append(sorted(set(batch.lengths.values())))
        return real(batch, rows, kv, device)

    monkeypatch.setattr(bp, "_step_ms", recording)
    measure(tiny, widths=[1, 2], kv_lengths=[16], repeats=3, warmup=1, batch_sizes=(1, 2), batch_widths=[1])
    assert seen == [[16], [16], [17], [18]]  # warm-up, then rounds 1-3: every slot one token deeper each round
