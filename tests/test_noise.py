"""The noise guard: load readings per row, the plausibility bound, and what the report and CI gate do with them."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import yaml
from typer.testing import CliRunner

from specbench.run import noise
from specbench.report.run_report import summarize
from specbench.cli import app
from specbench.core.machine import contention
from specbench.planning.profile import LatencyProfile


def records(ar_wall=10.0, method_wall=5.0, tau=1.5, foreign=0.0, rows=4) -> pd.DataFrame:
    """ar and pld on `rows` prompts, 100 tokens each; pld at the given tau."""
    out = []
    for i in range(rows):
        out.append({"method": "ar", "dataset": "d", "prompt_id": str(i), "turn": 0, "new_tokens": 100,
                    "wall_s": ar_wall, "tokens_per_s": 100 / ar_wall, "target_forwards": 100, "drafted": 0,
                    "accepted_drafts": 0, "lossless": "", "peak_mem_mb": 1.0, "foreign_cpu": foreign,
                    "steal": 0.0})
        out.append({"method": "pld", "dataset": "d", "prompt_id": str(i), "turn": 0, "new_tokens": 100,
                    "wall_s": method_wall, "tokens_per_s": 100 / method_wall,
                    "target_forwards": round(100 / tau), "drafted": 50, "accepted_drafts": 25, "lossless": "match",
                    "peak_mem_mb": 1.0, "foreign_cpu": 0.0, "steal": 0.0})
    return pd.DataFrame(out)


def test_snapshots_measure_other_processes_not_this_one():
    before = contention.snapshot()
    sum(i * i for i in range(3_000_000))  # this process's own work is not "foreign"
    after = contention.snapshot()
    got = contention.between(before, after)
    assert set(got) == {"foreign_cpu", "steal", "load_before", "load_after"}
    if after.wall - before.wall >= contention.MIN_WALL_S:  # other processes use at most every core the machine has
        assert 0 <= got["foreign_cpu"] <= (os.cpu_count() or 1) + 0.05 and 0 <= got["steal"] <= 1
    short = contention.between(before, contention.Snapshot(before.wall + 0.01, before.busy_s + 1, 0, 1, before.own_s, 0))
    assert math.isnan(short["foreign_cpu"])  # 10 ms: below /proc/stat's resolution, not judged


def _cpu_s(pid: int) -> float:
    """utime + stime of a process from its own /proc counters, s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_sharded_runs_other_processes_are_siblings_not_foreign(tmp_path):
    """--shards: a shard's siblings (pid files in RUN/shards/) burn CPU on purpose; it is recorded as sibling_cpu and
    taken out of foreign_cpu. Own pid and other machines' pids are not read.

    How much CPU the scheduler gives the burner depends on how busy the machine is (0.299 of a core on a loaded CI
    machine failed a `> 0.3` bound), so the reading is checked against the burner's own /proc counters read around
    each snapshot, and the window is held open until the burner has used some CPU however busy the machine is."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # stopped by this test, in `finally`
    tick = 1 / os.sysconf("SC_CLK_TCK")
    try:
        with contention.watching_run(tmp_path, "000-of-002"):
            (tmp_path / "001-of-002.pid").write_text(f"{socket.gethostname()} {burner.pid}\n")
            (tmp_path / "driver.pid").write_text(f"another-machine {os.getpid() + 1}\n")
            time.sleep(0.1)
            early = _cpu_s(burner.pid)
            before = contention.snapshot()
            start = _cpu_s(burner.pid)
            deadline = time.perf_counter() + 30
            while time.perf_counter() - before.wall < contention.MIN_WALL_S or (
                    _cpu_s(burner.pid) - start < 0.1 and time.perf_counter() < deadline):
                time.sleep(0.05)
            end = _cpu_s(burner.pid)
            after = contention.snapshot()
            late = _cpu_s(burner.pid)
            got = contention.between(before, after)
            blind = contention.between(replace(before, siblings={}), replace(after, siblings={}))
        assert contention.snapshot().siblings == {} and "sibling_cpu" not in contention.between(before, after)
    finally:
        burner.kill()
        burner.wait()
    assert (tmp_path / "000-of-002.pid").read_text().split() == [socket.gethostname(), str(os.getpid())]
    assert set(before.siblings) == set(after.siblings) == {burner.pid}
    wall = after.wall - before.wall
    used = after.siblings[burner.pid] - before.siblings[burner.pid]
    assert end - start - tick <= used <= late - early + tick  # the burner's own counters, read around the snapshots
    assert end - start >= 0.1  # it did burn in the window (held open until it had)
    assert math.isclose(got["sibling_cpu"], used / wall, abs_tol=0.001)
    # the same CPU time is foreign when the siblings are not known (what the code does, whatever else ran)
    assert blind["foreign_cpu"] >= got["foreign_cpu"] - 0.001
    assert blind["foreign_cpu"] <= got["foreign_cpu"] + got["sibling_cpu"] + 0.002
    if got["foreign_cpu"] > 0:  # not clipped at 0 by accounting lag: exactly the siblings' time apart
        assert math.isclose(blind["foreign_cpu"], got["foreign_cpu"] + got["sibling_cpu"], abs_tol=0.002)


def test_quiet_plausible_run_is_ok():
    v = summarize(records(ar_wall=10, method_wall=8, tau=1.5))
    assert (v.timing == "ok").all()
    assert v.set_index("method").forward_ratio["pld"] == round((8 / 67) / (10 / 100), 3)


def test_speedup_beyond_tau_is_flagged():
    """ar's forwards 2 s, the method's 50 ms: 26x at tau 1.2 is impossible (the loaded-machine run of issue 17)."""
    v = summarize(records(ar_wall=200, method_wall=7.5, tau=1.2)).set_index("method")
    assert v.timing["pld"].startswith("disturbed: speedup 26.67x exceeds what tau 1.20 allows")
    assert v.timing["ar"] == "ok"


def test_latency_floor_widens_the_bound_where_the_curve_dips():
    profile = LatencyProfile("m", "float32", "cpu-x", "measured", [1, 2, 4], {128: {"median_ms": [38.0, 43.4, 36.8]}})
    floor = noise.latency_floor(profile)
    assert floor == round(36.8 / 38.0, 4) and noise.latency_floor(None) == 1.0
    tight = summarize(records(ar_wall=10, method_wall=6.0, tau=1.5), latency_floor=1.0).set_index("method")
    loose = summarize(records(ar_wall=10, method_wall=6.0, tau=1.5), latency_floor=0.9).set_index("method")
    assert tight.timing["pld"].startswith("disturbed") and loose.timing["pld"] == "ok"


def test_load_during_ar_marks_every_comparison_disturbed():
    v = summarize(records(foreign=1.0)).set_index("method")
    assert v.timing["pld"].startswith("disturbed") and "1.00 cores" in v.timing["pld"]
    summary = summarize(records(foreign=1.0))
    assert summary.set_index("method").timing["pld"].startswith("disturbed")


def test_summary_compares_only_turns_both_finished():
    """An uneven interrupt: ar finished 4 prompts, pld 2. pld is compared with ar on those 2 only."""
    recs = records(ar_wall=10, method_wall=8)
    recs.loc[(recs.method == "ar") & (recs.prompt_id.isin(["0", "1"])), "wall_s"] = 20.0  # slow on the shared two
    recs = recs[~((recs.method == "pld") & recs.prompt_id.isin(["2", "3"]))]
    row = summarize(recs).set_index("method").loc["pld"]
    assert row.speedup == round((200 / 16) / (200 / 40), 3)  # 2.5x against ar's 2 shared prompts, not 1.875x


def test_report_gate_refuses_to_judge_disturbed_numbers(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    full = records(foreign=1.0)
    for col in ("tau", "acceptance_rate", "stopped", "accepted_per_position", "temperature", "model", "dtype",
                "device", "threads", "torch", "transformers", "git", "prompt_tokens"):
        full[col] = 0
    full.to_csv(run / "records.csv", index=False)
    (run / "run.yaml").write_text(yaml.safe_dump({"complete": True}))
    runner = CliRunner()
    refused = runner.invoke(app, ["report", str(run), "--fail-below", "1.0"])
    assert refused.exit_code == 3 and "NOT JUDGED" in refused.output and "timing disturbed" in refused.output
    judged = runner.invoke(app, ["report", str(run), "--fail-below", "1.0", "--judge-disturbed"])
    assert judged.exit_code == 0 and "judged anyway" in judged.output
    assert "TIMING DISTURBED" in (run / "report.md").read_text()


def test_report_has_a_per_category_table_with_an_overall_row(tmp_path):
    from specbench.report.run_report import by_category

    recs = records(ar_wall=10, method_wall=8)
    recs["category"] = ["math", "math", "math", "math", "code", "code", "code", "code"]
    recs.loc[(recs.method == "pld") & (recs.category == "code"), "wall_s"] = 5.0
    table = by_category(recs, summarize(recs)).set_index(["method", "category"])
    assert table.loc[("pld", "math"), "speedup"] == 1.25 and table.loc[("pld", "code"), "speedup"] == 2.0
    assert table.loc[("pld", "all"), "speedup"] == round(400 / 26 / (400 / 40), 3)
    assert by_category(records(), summarize(records())).empty  # no categories: no table


def test_the_per_category_section_writes_its_table_and_plot(tmp_path):
    from specbench.report.sections import category_section

    recs = records(ar_wall=10, method_wall=8)
    recs["category"] = ["math", "math", "math", "math", "code", "code", "code", "code"]
    lines = category_section(recs, summarize(recs), tmp_path, 1.0)
    assert lines[0] == "## Per category" and "speedup_by_category.png" in "\n".join(lines)
    assert (tmp_path / "summary_by_category.csv").is_file()
    assert (tmp_path / "speedup_by_category.png").stat().st_size > 1000
    assert category_section(records(), summarize(records()), tmp_path / "none", 1.0) == []


def test_profile_records_what_else_ran_and_says_when_it_was_disturbed(monkeypatch, tmp_path):
    readings = iter([contention.Snapshot(0.0, 0.0, 0.0, 10.0, 0.0, 0.5),
                     contention.Snapshot(10.0, 15.0, 0.0, 20.0, 2.0, 2.5)])  # others: 13 s of CPU in 10 s
    monkeypatch.setattr(contention, "snapshot", lambda: next(readings))
    result = CliRunner().invoke(app, ["profile", "--model", "random:tiny", "--widths", "1,2", "--kv-lengths", "16",
                                      "--repeats", "1", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0, result.output
    meta = yaml.safe_load((tmp_path / "p.yaml").read_text())["contention"]
    assert meta["foreign_cpu"] == 1.3 and meta["disturbed"] is True
    assert "timing disturbed" in result.output and "1.30 cores" in result.output


# ------------------------------------------------------------------------------- judged by time (issue 30)
def slow_ar_turns(foreign=0.62) -> pd.DataFrame:
    """Issue 30's run: 21 prompt turns; ar's two turns of one prompt ran beside other work (24.3 s instead of 8 s):
    2 rows of 21 (9.5%, under the old 10% row threshold) but 24% of ar's timed seconds."""
    recs = records(ar_wall=8.0, method_wall=6.0, tau=1.5, rows=21)
    slow = (recs.method == "ar") & recs.prompt_id.isin(["0", "1"])
    recs.loc[slow, "wall_s"] = 24.3
    recs.loc[slow, "foreign_cpu"] = foreign
    recs["forward_ms"] = 1e3 * recs.wall_s / recs.target_forwards
    return recs


def test_two_slow_ar_turns_with_a_quarter_of_its_seconds_make_the_overall_row_disturbed():
    recs = slow_ar_turns()
    assert (recs.foreign_cpu > contention.FOREIGN_CPU_LIMIT).sum() / (recs.method == "ar").sum() < 0.10  # rows: ok
    v = summarize(recs).set_index("method")
    assert v.disturbed_time["ar"] == round(48.6 / (19 * 8 + 48.6), 3)  # 24%
    assert v.timing["pld"].startswith("disturbed: 24% of its or ar's timed seconds") and "0.62 cores" in v.timing["pld"]
    # the same run on a machine whose counters show nothing: the outlier test finds the two turns
    blind = summarize(slow_ar_turns(foreign=math.nan)).set_index("method")
    assert blind.timing["pld"].startswith("disturbed") and "over 1.5x their method's median" in blind.timing["pld"]


def test_outlier_rows_need_a_median_and_a_turn_whose_other_methods_are_quick():
    recs = records(ar_wall=10, method_wall=8, rows=5)
    recs["forward_ms"] = 1e3 * recs.wall_s / recs.target_forwards
    recs.loc[(recs.method == "pld") & (recs.prompt_id == "1"), "forward_ms"] *= 2  # only pld slow on turn 1
    recs.loc[recs.prompt_id == "3", "forward_ms"] *= 2  # every method slow on turn 3: a long prompt, not noise
    flagged = noise.flag_rows(recs)
    assert flagged[flagged.row_outlier][["method", "prompt_id"]].values.tolist() == [["pld", "1"]]
    few = noise.flag_rows(recs[recs.prompt_id.isin(["0", "1"])])  # 2 rows per method: no median to judge by
    assert not few.row_outlier.any()
    assert noise.outliers({"ar": 3.0, "pld": 1.0, "eagle": 1.1}) == {"ar"}
    assert noise.outliers({"ar": 1.4}) == set() and noise.outliers({"ar": float("nan")}) == set()


# ----------------------------------------------------------------------------------------- robust aggregates
def known_ratios(ratios=(1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9)) -> pd.DataFrame:
    """ar at 10 s per turn, pld at 10 / ratio: per-turn speedups `ratios`."""
    recs = records(ar_wall=10.0, method_wall=5.0, rows=len(ratios))
    pld = recs.method == "pld"
    recs.loc[pld, "wall_s"] = [10 / r for r in ratios]
    recs.loc[pld, "tokens_per_s"] = 100 / recs.loc[pld, "wall_s"]
    return recs


def test_bootstrap_interval_covers_the_pooled_speedup_and_is_reproducible():
    from specbench.run import intervals as robust

    recs = known_ratios()
    row = summarize(recs).set_index("method").loc["pld"]
    pooled = (1000 / sum(10 / r for r in (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9))) / 10
    assert row.speedup == round(pooled, 3)
    assert row.speedup_lo < row.speedup < row.speedup_hi and row.speedup_hi - row.speedup_lo > 0.1
    assert row.speedup_median == 1.45  # the median per-turn ratio
    again = summarize(recs).set_index("method").loc["pld"]
    assert (again.speedup_lo, again.speedup_hi) == (row.speedup_lo, row.speedup_hi)  # seeded: redrawn the same
    pairs = robust.turn_pairs(recs[recs.method == "pld"], recs[recs.method == "ar"], ["dataset", "prompt_id", "turn"])
    assert robust.interval(pairs, seed=7) == robust.interval(pairs, seed=7) != robust.interval(pairs, seed=8)
    low, high = robust.interval(pairs, seed=8)
    assert low < pooled < high
    ar = summarize(recs).set_index("method").loc["ar"]
    assert ar.speedup_lo == ar.speedup_hi == 1.0
    one = summarize(known_ratios((1.3,))).set_index("method").loc["pld"]  # one turn: nothing to resample
    assert one.speedup_lo == one.speedup_hi == one.speedup == 1.3
