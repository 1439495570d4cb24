"""Plots draw each speedup's 95% interval as error bars and mark disturbed or partial rows (issue 41 section 4):
the bar plots, context.png, batch_speedup.png, pareto.png and tree_sizes.png. Each figure is inspected as it is
closed (matplotlib objects, not pixels)."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from specbench.report import batchreport, context, pareto, plots

ROWS = [  # method, dataset, batch size, batching, tok/s, speedup, lo, hi, timing
    ("ar", "d", 1, "-", 10.0, 1.0, 1.0, 1.0, "ok"),
    ("pld", "d", 1, "-", 15.0, 1.5, 1.3, 1.7, "ok"),
    ("sd", "d", 1, "-", 12.0, 1.2, 0.9, 1.6, "disturbed: 40% of its or ar's timed seconds ran disturbed"),
    ("ar", "d", 2, "unpadded", 18.0, 1.0, 1.0, 1.0, "ok"),
    ("pld", "d", 2, "unpadded", 24.0, 24 / 18, 1.2, 1.45, "ok"),
    ("pld", "d", 2, "padded", 20.0, 20 / 18, 1.0, 1.2, "disturbed: slow forwards"),
]


def summary() -> pd.DataFrame:
    frame = pd.DataFrame(ROWS, columns=["method", "dataset", "batch_size", "batching", "tokens_per_s", "speedup",
                                        "speedup_lo", "speedup_hi", "timing"])
    return frame.assign(sample_tokens_per_s=frame.tokens_per_s / frame.batch_size, tau=1.5)


@pytest.fixture
def figures(monkeypatch):
    """The axes of every figure closed while the test runs."""
    import matplotlib.pyplot as plt

    seen, real_close = [], plt.close

    def keep(fig):
        seen.append(fig.axes)
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return seen


def error_bars(ax) -> int:
    return sum(isinstance(c, ErrorbarContainer) for c in ax.containers)


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_speedup_bars_carry_the_interval_and_marks(tmp_path, figures):
    single = summary()[summary().batch_size == 1]
    plots.plot_bars(single, "speedup", "speedup", tmp_path / "s.png", baseline=1.0)
    ax = figures[-1][0]
    assert error_bars(ax) == 2  # pld and sd; ar's interval is the point 1.00-1.00
    labels = texts(ax)
    assert "1.20*" in labels and "1.50" in labels  # sd disturbed, pld not
    sd_bar = ax.containers[2].patches[0]
    assert sd_bar.get_hatch() == "///" and ax.containers[1].patches[0].get_hatch() is None
    assert any("95% bootstrap interval" in t and "timing disturbed" in t for t in labels)


def test_tau_bars_have_no_interval_and_partial_rows_are_faded(tmp_path, figures):
    single = summary()[summary().batch_size == 1].assign(partial=True)
    plots.plot_bars(single, "tau", "tau", tmp_path / "t.png", timed=False)
    ax = figures[-1][0]
    assert error_bars(ax) == 0  # tau has no interval, and load does not change it: sd's bar is not hatched
    assert not any(p.get_hatch() for c in ax.containers for p in c.patches)
    assert all(p.get_alpha() == pytest.approx(0.45) for c in ax.containers for p in c.patches)
    assert "1.50\u2020" in texts(ax) and any("partial run" in t for t in texts(ax))


def test_batch_speedup_plot_has_error_bars_and_rings_disturbed_points(tmp_path, figures):
    frame = batchreport.table(summary())
    assert {"padded speedup lo", "unpadded speedup hi", "padded timing"} <= set(frame)
    batchreport.plot(frame, tmp_path / "b.png")
    ax = figures[-1][0]
    assert error_bars(ax) >= 2
    assert "timing disturbed" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_pareto_points_keep_the_interval_and_timing_and_the_plot_draws_them(tmp_path, figures):
    points = pareto.points(summary())
    assert {"speedup_lo", "speedup_hi", "timing"} <= set(points)
    pareto.plot(points, tmp_path / "p.png")
    ax = figures[-1][0]
    assert error_bars(ax) >= 1
    assert "timing disturbed" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_context_plot_has_speedup_error_bars(tmp_path, figures):
    table = pd.DataFrame([{"method": "pld", "dataset": "d", "bucket": b, "tau": 1.5, "speedup": 1.4,
                           "speedup_lo": 1.2, "speedup_hi": 1.6, "timing": t}
                          for b, t in (("<256", "ok"), ("256-1k", "disturbed: x"))])
    assert context.plot(table, tmp_path / "c.png")
    tau_ax, speed_ax = figures[-1][:2]
    assert error_bars(speed_ax) == 1 and error_bars(tau_ax) == 0
    assert "timing disturbed" in [t.get_text() for t in speed_ax.get_legend().get_texts()]


def test_tree_size_plot_has_error_bars(tmp_path, figures):
    frame = pd.DataFrame([{"dataset": "d", "size": n, "speedup": 1.1, "speedup_lo": 1.0, "speedup_hi": 1.2,
                           "timing": "ok", "predicted_speedup": 1.2} for n in (4, 8)])
    plots.plot_tree_sizes(frame, tmp_path / "tree.png")
    assert error_bars(figures[-1][0]) == 1


def test_a_batched_run_of_ar_alone_has_its_batching_section_without_a_speedup_plot(tmp_path, figures):
    only_ar = summary()[lambda f: f.method == "ar"]
    lines = batchreport.section(only_ar, tmp_path)
    assert (tmp_path / "batching.csv").exists() and (tmp_path / "pareto.png").exists()
    assert not (tmp_path / "batch_speedup.png").exists() and lines
