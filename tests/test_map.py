"""`specbench map`: the cost model per grid point, the break-even batch size, and the map table drawn from a run's
records (built here, no model), plus the command's refusals."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app

from specbench.core.profile_file import BatchCurve, LatencyProfile
from specbench.planning.batch_prediction import StepShape, break_even, predicted_tok_s
from specbench.report import map_report, map_table


def _profile() -> LatencyProfile:
    """L(1, w) = 10 + w ms, L(2, w) = 12 + 2w, L(4, w) = 16 + 4w (widths 1-8, one KV length)."""
    widths = [1, 2, 4, 8]
    curve = lambda a, b: {128: {"median_ms": [a + b * w for w in widths], "p10_ms": [0.0] * 4,  # noqa: E731
                                "p90_ms": [0.0] * 4}}
    return LatencyProfile("m", "float32", "cpu-test", "measured", widths, curve(10, 1),
                          batches={2: BatchCurve(widths, curve(12, 2)), 4: BatchCurve(widths, curve(16, 4))})


def test_prediction_reads_the_batch_curve_and_adds_drafting():
    p = _profile()
    assert predicted_tok_s(p, StepShape(1, 1, 1.0)) == pytest.approx(1000 / 11)
    # B = 2, width 4, tau 2, 3 ms drafting: 2 * 2 * 1000 / (12 + 8 + 3)
    assert predicted_tok_s(p, StepShape(2, 4, 2.0, 3.0)) == pytest.approx(4000 / 23)
    assert predicted_tok_s(p, StepShape(8, 1, 1.0)) is None  # no L(8, w) in the profile


def test_break_even_interpolates_on_log2_batch():
    assert break_even([(1, 1.5), (2, 1.2), (4, 0.8)]).value == pytest.approx(2 ** (1 + 0.2 / 0.4))
    assert break_even([(4, 0.8), (1, 1.5), (2, 1.2)]).text == "B~2.8"  # order of the points does not matter
    assert break_even([(1, 1.3), (8, 1.1)]).text == "pays at every B up to 8"
    assert break_even([(1, 0.9), (2, 0.8)]).text == "never pays (0.90x at B=1)"
    assert break_even([(1, math.nan)]).text == "-"


def _records() -> pd.DataFrame:
    """ar and pld at B = 1 (one prompt) and B = 2 (one batch of two prompts), with numbers chosen by hand."""
    base = dict(dataset="gsm8k", prompt_tokens=100, new_tokens=21, draft_s=0.0, prefill_tokens=1)
    rows = [
        # B = 1: 20 decode steps in 0.22 s -> 20 tokens / 0.2 s after the 0.02 s first token
        dict(base, method="ar", batch_size=1, batching="-", target_forwards=21, target_tokens=120, latency_s=0.22,
             ttft_s=0.02, tpot_ms=10.0),
        # pld: 10 steps of width 3 emitting 2 each
        dict(base, method="pld", batch_size=1, batching="-", target_forwards=11, target_tokens=130, latency_s=0.15,
             ttft_s=0.02, tpot_ms=6.5),
    ]
    for method, forwards, tokens, wall in (("ar", 21, 120, 0.30), ("pld", 11, 130, 0.40)):
        for _ in range(2):
            # each row holds its share of the batch's 0.05 s prefill (records: prefill_s), its wall time the batch's
            rows.append(dict(base, method=method, batch_size=2, batching="unpadded", batch_id="2-0-0",
                             target_forwards=forwards, target_tokens=tokens, batch_wall_s=wall, prefill_s=0.025,
                             latency_s=wall, ttft_s=0.05, tpot_ms=12.0))
    return pd.DataFrame(rows)


def test_map_table_measures_predicts_and_finds_the_break_even():
    frame = map_table.table(_records(), None, {}, _profile())
    pld1 = frame[(frame.method == "pld") & (frame.batch_size == 1)].iloc[0]
    assert pld1.width == pytest.approx(3.0) and pld1.tau == pytest.approx(2.0)
    assert pld1.measured_tok_s == pytest.approx(20 / 0.13)
    assert pld1.predicted_tok_s == pytest.approx(2 * 1000 / 13)  # L(1, 3) = 13 ms
    ar2 = frame[(frame.method == "ar") & (frame.batch_size == 2)].iloc[0]
    assert ar2.measured_tok_s == pytest.approx(40 / 0.25)  # two samples' 20 decoded tokens each, after the prefill
    assert ar2.predicted_tok_s == pytest.approx(2000 / 14)
    pld2 = frame[(frame.method == "pld") & (frame.batch_size == 2)].iloc[0]
    assert pld2.measured_speedup == pytest.approx((40 / 0.35) / (40 / 0.25))  # below 1: pld stops paying at B = 2
    assert pld1.break_even.startswith("B~") and pld2.break_even == pld1.break_even
    assert pld1.error == pytest.approx(pld1.predicted_tok_s / pld1.measured_tok_s - 1)


def test_map_section_and_files(tmp_path):
    records = _records()
    profile = _profile()
    (tmp_path / map_table.PROFILE_COPY).write_text(profile.to_yaml())
    lines = map_report.write(tmp_path, records, pd.DataFrame(), {}, "test")
    assert (tmp_path / "map.csv").exists() and (tmp_path / "map.png").exists()
    text = "\n".join(lines)
    assert "Where each method pays" in text and "Break-even batch size" in text
    assert list(pd.read_csv(tmp_path / "map.csv").columns) == map_table.COLUMNS
    # one batch size only: no map
    assert map_report.write(tmp_path, records[records.batch_size == 1], pd.DataFrame(), {}, "test") == []


@pytest.mark.parametrize("args, said", [
    (["--batch-size", "4"], "at least two batch sizes"),
    (["--batch-size", "1,2", "--profile", "old"], "choose fresh or stored"),
    (["-m", "nosuch", "--batch-size", "1,2"], "unknown method"),
    (["-m", "ar", "--batch-size", "1,2"], "besides ar"),
])
def test_map_refuses_bad_grids_before_loading(args, said):
    result = CliRunner().invoke(app, ["map", *args])
    assert result.exit_code != 0 and said in result.output and "Traceback" not in result.output


def test_map_end_to_end_on_a_tiny_model(tmp_path, prompts_file):
    """The command runs the sweep, measures L(B, w) first, and writes the map with a prediction at every point."""
    out = tmp_path / "map"
    result = CliRunner().invoke(app, ["map", "--model", "random:tiny", "-m", "pld", "--batch-size", "1,2",
                                      "--dataset", str(prompts_file), "--limit", "2", "--max-new-tokens", "12",
                                      "--warmup", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "map.csv")
    assert set(frame.batch_size) == {1, 2} and set(frame.method) == {"ar", "pld"}
    assert frame.predicted_tok_s.notna().all() and frame.measured_tok_s.gt(0).all()
    assert (out / map_table.PROFILE_COPY).exists() and (out / "map.png").exists()
    assert (out / map_table.STEP_COPY).exists()  # the grid's steps, measured after the run on its engines
    assert frame.steps_predicted.gt(0).all() and frame.step_ms_predicted.gt(0).all()
    assert "Where each method pays" in (out / "report.md").read_text()


def test_map_compiled_on_a_tiny_model(tmp_path, prompts_file, monkeypatch):
    """`map --compile` runs (its batches padded, as `run --compile`: the unpadded engine is eager-only) and, with no
    compiled profile here, says so before the run and predicts nothing rather than from an eager curve. The static
    step runs uncompiled (compile_step patched: the same engine, seconds instead of minutes)."""
    from specbench.core.batch import static
    from specbench.core.model import compile as cc

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cc, "compile_step", lambda device, name: static.step)
    out = tmp_path / "map"
    result = CliRunner().invoke(app, ["map", "--model", "random:tiny", "-m", "pld", "--batch-size", "1,2",
                                      "--dataset", str(prompts_file), "--limit", "2", "--max-new-tokens", "12",
                                      "--warmup", "1", "--compile", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no compiled profile here" in " ".join(result.output.split())
    frame = pd.read_csv(out / "map.csv")
    assert set(frame.batch_size) == {1, 2} and frame.measured_tok_s.gt(0).all()
    assert frame.predicted_tok_s.isna().all()
    assert set(frame[frame.batch_size == 2]["mode"]) == {"padded"}


def test_context_fill_lengthens_each_prompt_with_the_others():
    from specbench.data.context_fill import CHARS_PER_TOKEN, lengthened
    from specbench.data.specs import Prompt

    pool = [Prompt(id=str(i), turns=(f"question {i} " + "words " * 40,)) for i in range(30)]
    rows = lengthened(pool[:3], pool, 512)
    assert [r["id"] for r in rows] == ["0", "1", "2"]
    for row, prompt in zip(rows, pool):
        assert row["prompt"].endswith(prompt.turns[0])  # the prompt's own question comes last
        assert prompt.turns[0] not in row["prompt"][: -len(prompt.turns[0])]  # and is not among the material
        assert 0.9 * 512 * CHARS_PER_TOKEN <= len(row["prompt"]) <= 512 * CHARS_PER_TOKEN
    with pytest.raises(Exception, match="at least 16"):
        lengthened(pool[:1], pool, 8)


def test_map_compile_refuses_what_the_run_would_before_loading(monkeypatch):
    """A compiled map refuses --warmup 0 (compile time would land in timed turns) before any model loads."""
    import specbench.core.model.load as load
    import specbench.run.own_methods as own

    # both names: own_methods binds load_model when first imported, and a first import while the patch is in place
    # would keep the patch for every later test of this worker
    fail = lambda *a, **k: pytest.fail("a model loaded before the refusal")  # noqa: E731
    monkeypatch.setattr(load, "load_model", fail)
    monkeypatch.setattr(own, "load_model", fail)
    result = CliRunner().invoke(app, ["map", "--model", "random:tiny", "-m", "pld", "--batch-size", "1,2",
                                      "--warmup", "0", "--compile"])
    assert result.exit_code != 0 and "--warmup 1 or more" in result.output and "Traceback" not in result.output
