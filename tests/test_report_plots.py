"""Plots of a run: titles naming model, hardware, dtype and prompt count; files written; timeline PNGs per prompt."""

from __future__ import annotations

import json

import pandas as pd
import yaml

from specbench.report import run_report as report
from specbench.report import timeline
from specbench.run.results import append_timeline

META = {"model": {"spec": "smollm2-135m", "name": "SmolLM2-135M-Instruct", "source": "gguf"},
        "environment": {"device": "AMD EPYC 7B13", "device_type": "cpu", "dtype": "float32", "threads": 2}}


def records(prompts: dict[str, int], dtype: str = "float32") -> pd.DataFrame:
    """ar and pld rows for `prompts` (dataset -> prompt count), 2 turns each."""
    rows = []
    for dataset, n in prompts.items():
        for method, tps in (("ar", 10.0), ("pld", 15.0)):
            for p in range(n):
                for turn in range(2):
                    rows.append(dict(method=method, dataset=dataset, prompt_id=str(p), turn=turn, new_tokens=30,
                                     wall_s=30 / tps, tokens_per_s=tps, target_forwards=30 if method == "ar" else 20,
                                     drafted=0 if method == "ar" else 20, accepted_drafts=0 if method == "ar" else 10,
                                     peak_mem_mb=100.0, lossless="" if method == "ar" else "match",
                                     model="smollm2-135m", device="AMD EPYC 7B13", dtype=dtype))
    return pd.DataFrame(rows)


def test_plot_title_names_model_hardware_dtype_and_prompts():
    assert report.plot_title(META, records({"humaneval": 6})) == \
        "SmolLM2-135M-Instruct on AMD EPYC 7B13, float32, 6 prompts (humaneval)"
    title = report.plot_title(META, records({"humaneval": 6, "gsm8k": 4}))
    assert title.endswith("10 prompts (humaneval 6, gsm8k 4)")


def test_plot_title_falls_back_to_the_records_without_run_yaml():
    title = report.plot_title({}, records({"gsm8k": 1}, dtype="bfloat16"))
    assert title == "smollm2-135m on AMD EPYC 7B13, bfloat16, 1 prompt (gsm8k)"


def test_comparison_title_says_shared_parts_once():
    bf16 = {**META, "environment": {**META["environment"], "dtype": "bfloat16"}}
    title = report.comparison_title([(META, records({"humaneval": 6})), (bf16, records({"humaneval": 6}))])
    assert title == "SmolLM2-135M-Instruct on AMD EPYC 7B13, float32 vs bfloat16, 6 prompts (humaneval)"


def write_run(run_dir, prompts=None, dtype="float32"):
    run_dir.mkdir(parents=True, exist_ok=True)
    records(prompts or {"humaneval": 3}, dtype).to_csv(run_dir / "records.csv", index=False)
    meta = {**META, "environment": {**META["environment"], "dtype": dtype}}
    (run_dir / "run.yaml").write_text(yaml.safe_dump(meta))
    return run_dir


def test_write_plots_writes_titled_pngs(tmp_path):
    summary = report.summarize(records({"humaneval": 2, "gsm8k": 2}))
    paths = report.write_plots(summary, tmp_path, title="a title")
    assert [p.name for p in paths] == ["speedup.png", "tokens_per_s.png", "tau.png"]
    assert all(p.is_file() and p.stat().st_size > 1000 for p in paths)


def test_plot_bars_keeps_legend_outside_and_labels_readable(tmp_path, monkeypatch):
    """The legend sits right of the axes (it covers no bar label) and the axes leave headroom above the tallest
    bar's label."""
    import matplotlib.pyplot as plt

    seen = {}
    real_close = plt.close

    def keep(fig):
        ax = fig.axes[0]
        seen["legend_x0"] = ax.get_legend().get_window_extent().x0
        seen["axes_x1"] = ax.get_window_extent().x1
        seen["ylim"] = ax.get_ylim()[1]
        seen["title"] = ax.get_title()
        real_close(fig)

    monkeypatch.setattr(report.plt, "close", keep)
    summary = report.summarize(records({"humaneval": 2}))
    report.plot_bars(summary, "speedup", "speedup", tmp_path / "s.png", baseline=1.0, title="model on hw, fp32")
    assert seen["legend_x0"] >= seen["axes_x1"]
    assert seen["ylim"] >= 1.5 * 1.1 and seen["title"] == "model on hw, fp32"


def test_run_report_and_comparison_carry_the_title(tmp_path):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", dtype="bfloat16")
    report.write_run_report(a)
    for name in ("speedup.png", "tokens_per_s.png", "tau.png", "report.md"):
        assert (a / name).is_file()
    out = tmp_path / "cmp"
    combined = report.compare_runs([a, b], out)
    assert "lossless_explained_rate" in combined
    text = (out / "summary.md").read_text()
    assert "float32 vs bfloat16, 3 prompts (humaneval)" in text
    assert all((out / n).is_file() for n in ("speedup.png", "tokens_per_s.png", "tau.png"))


def test_tree_plot_is_written_with_a_title(tmp_path):
    summary = pd.DataFrame([{"method": f"ppd@{n}", "dataset": "gsm8k", "tau": 1.5, "speedup": 1.1} for n in (4, 8)])
    trees = {f"ppd@{n}": {"size": n, "predicted_tau": 1.6, "predicted_speedup": 1.2} for n in (4, 8)}
    md = report.tree_section(summary, trees, tmp_path, title="SmolLM2 on cpu, float32, 2 prompts")
    assert (tmp_path / "tree_sizes.png").is_file() and "![speedup per tree size](tree_sizes.png)" in md


def write_timeline(run_dir, prompts=3):
    steps = [{"mode": "pre", "t0": 0.1 * i, "t1": 0.1 * (i + 1), "draft": [0.1 * i, 0.1 * i + 0.05],
              "target": [0.1 * i + 0.02, 0.1 * i + 0.09], "checked": 2, "accepted": 1, "emitted": 2, "sampled": 1}
             for i in range(20)]
    for method in ("sd", "pearl"):
        for p in range(prompts):
            for turn in (0, 1):
                append_timeline(run_dir, {"method": method, "dataset": "mt-bench", "prompt_id": f"8{p}",
                                          "turn": turn}, steps)


def test_timeline_draws_the_first_prompt_and_says_how_to_draw_the_others(tmp_path):
    write_timeline(tmp_path)
    md = "\n".join(timeline.report_section(tmp_path, title="SmolLM2 on cpu, float32, 3 prompts"))
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["timeline_pearl.png", "timeline_sd.png"]
    assert "first prompt only" in md and "--prompts all" in md and "timeline_<method>_<dataset>-<prompt>.png" in md


def test_timeline_draws_every_prompt_on_request(tmp_path, capsys):
    write_timeline(tmp_path)
    timeline.main([str(tmp_path), "--prompts", "all", "--seconds", "0"])
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert {f"timeline_{m}_mt-bench-8{p}.png" for m in ("sd", "pearl") for p in range(3)} <= pngs
    assert {"timeline_sd.png", "timeline_pearl.png"} <= pngs and len(pngs) == 8
    assert "wrote 8 PNGs" in capsys.readouterr().out


def test_gantt_title_names_the_prompt_and_the_window(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    titles = []
    real_close = plt.close
    monkeypatch.setattr(timeline.plt, "close", lambda fig: (titles.append(fig.axes[0].get_title()), real_close(fig)))
    write_timeline(tmp_path, prompts=2)
    timeline.draw(tmp_path, prompts=1, title="SmolLM2 on cpu, float32, 2 prompts")
    assert titles and titles[0].startswith("SmolLM2 on cpu, float32, 2 prompts\nsd: mt-bench prompt 80 (first of 2 "
                                           "prompts), turn 1; first 1.5 s of 2.00 s shown")
    rows = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert len(rows) == 8


def test_throughput_latency_needs_two_load_levels(tmp_path):
    from specbench.report.serving import plot_throughput_latency

    one = pd.DataFrame([{"method": m, "dataset": "gsm8k", "batch_size": 1, "batching": "-",
                         "tokens_per_s_per_user": v, "output_throughput": v} for m, v in (("ar", 10.0), ("pld", 15.0))])
    path = tmp_path / "throughput_latency.png"
    assert not plot_throughput_latency(one, path) and not path.exists()  # both axes the same number: nothing to say
    two = pd.concat([one, one.assign(batch_size=4, batching="unpadded", output_throughput=one.output_throughput * 3)])
    assert plot_throughput_latency(two, path) and path.is_file()


def test_a_profile_measured_on_a_busy_machine_is_marked_on_its_plot(tmp_path, monkeypatch):
    from specbench.planning import profile as profiles
    from specbench.planning.profile import LatencyProfile

    titles = []
    real = profiles.plot
    busy = LatencyProfile("tiny", "float32", "cpu-x", "measured", [1, 2],
                          {128: {"median_ms": [1.0, 1.5], "p10_ms": [1.0, 1.4], "p90_ms": [1.1, 1.6]}},
                          {"contention": {"disturbed": True, "foreign_cpu": 0.8}})
    import matplotlib.axes

    set_title = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title",
                        lambda self, text, *a, **k: titles.append(text) or set_title(self, text, *a, **k))
    real(busy, tmp_path / "busy.png")
    assert (tmp_path / "busy.png").is_file() and "DISTURBED: 0.80 other cores busy" in titles[0]
