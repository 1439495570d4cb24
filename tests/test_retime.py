"""--retime: a prompt turn timed beside a real CPU burner (a process this test starts) is timed again, and the quiet
timing is kept; a burner that never stops leaves the turn flagged with its tries counted.

The machine running the tests may be shared, so the /proc reading is narrowed to the burner: "other processes' CPU"
is the burner's own CPU time (/proc/<pid>/stat), measured for real, and nothing else the machine does. The timed
stretch is held open while the burner runs until the burner has used 0.3 of a core in it (and at least 0.3 s, for
/proc's 10 ms ticks), so the reading is over the 0.25-core limit however busy the machine is otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.machine import contention
from specbench.run import runner as runner_module

TICK = os.sysconf("SC_CLK_TCK")


class Burner:
    """Two busy-looping Python processes (started and stopped by this test only: two, so that together they get
    over a quarter of a core even on a crowded machine) and the CPU time they used."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.used_s = 0.0  # CPU seconds of burners already stopped

    def start(self) -> None:
        if not self.procs:
            self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
            time.sleep(0.1)  # let them start spinning before the timing begins

    def cpu_s(self) -> float:
        return self.used_s + sum(_cpu_s(p.pid) for p in self.procs)

    def stop(self) -> None:
        if self.procs:
            self.used_s = self.cpu_s()
            for p in self.procs:
                p.kill()
                p.wait()
            self.procs = []


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, s (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


@pytest.fixture
def burner(monkeypatch):
    """A burner whose CPU time is what contention.snapshot() reports as other processes' work."""
    b = Burner()
    real = contention.snapshot

    def snapshot():
        s = real()
        return dataclasses.replace(s, busy_s=s.own_s + b.cpu_s(), steal_s=0.0, total_s=s.wall * 2)

    monkeypatch.setattr(contention, "snapshot", snapshot)
    yield b
    b.stop()


def burn_ar_turn(monkeypatch, burner: Burner, tries_burned: int | None):
    """Run the burner while ar's first turn is timed, for its first `tries_burned` timings (None: every one); the
    timed stretch of a burned timing is held 0.3 s longer. Returns the list of (label, burned) per timing."""
    original = runner_module.Runner.time_turn
    timings = []

    def time_turn(self, label, ids, index, turn, order):
        ar_tries = sum(1 for lab, _ in timings if lab == "ar")
        burn = label == "ar" and index == 0 and turn == 0 and (tries_burned is None or ar_tries < tries_burned)
        if burn:
            burner.start()
        elif tries_burned is not None:
            burner.stop()
        timings.append((label, burn))
        if not burn:
            return original(self, label, ids, index, turn, order)
        generate = self.generate

        def slow_generate(*args):  # inside the contention window of time_turn
            start, used = time.perf_counter(), burner.cpu_s()
            result = generate(*args)
            # hold the window until the burner used over 0.3 of a core in it (over the 0.25 limit, whatever the
            # machine's other load), and for at least 0.3 s (/proc counts in 10 ms ticks)
            while time.perf_counter() - start < 20 and (time.perf_counter() - start < 0.3 or
                                                         burner.cpu_s() - used < 0.3 * (time.perf_counter() - start)):
                time.sleep(0.05)
            return result

        self.generate = slow_generate
        try:
            return original(self, label, ids, index, turn, order)
        finally:
            del self.generate

    monkeypatch.setattr(runner_module.Runner, "time_turn", time_turn)
    return timings


def run(tmp_path, prompts_file, *extra) -> pd.DataFrame:
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--max-new-tokens", "8", "--warmup", "0",
                                      "--threads", "1",
                                      "-m", "pld", "-d", str(prompts_file), "--limit", "1", "--out",
                                      str(tmp_path / "run"), *extra])
    assert result.exit_code == 0, result.output
    return pd.read_csv(tmp_path / "run" / "records.csv", dtype={"prompt_id": str})


def test_a_turn_timed_beside_a_burner_is_retimed_and_the_quiet_timing_kept(tmp_path, prompts_file, monkeypatch,
                                                                            burner):
    timings = burn_ar_turn(monkeypatch, burner, tries_burned=1)
    records = run(tmp_path, prompts_file, "--retime", "2").set_index("method")
    assert [t for t in timings if t[1]] == [("ar", True)]  # the first timing of ar ran beside the burner
    assert len(timings) == 4  # ar and pld, then both again
    assert burner.used_s > 0.15  # it really burned
    for method in ("ar", "pld"):
        row = records.loc[method]
        assert row.timing_tries == 2 and not row.timing_disturbed
        assert row.foreign_cpu <= contention.FOREIGN_CPU_LIMIT or pd.isna(row.foreign_cpu)  # the quiet timing
    meta = (tmp_path / "run" / "run.yaml").read_text()
    assert "retime: 2" in meta
    summary = pd.read_csv(tmp_path / "run" / "summary.csv").set_index("method")
    assert summary.disturbed_time["pld"] == 0


def test_a_burner_that_never_stops_leaves_the_turn_flagged_with_its_tries(tmp_path, prompts_file, monkeypatch,
                                                                          burner):
    timings = burn_ar_turn(monkeypatch, burner, tries_burned=None)
    records = run(tmp_path, prompts_file, "--retime", "2").set_index("method")
    assert [label for label, burned in timings if burned] == ["ar", "ar", "ar"]  # 1 timing + 2 re-timings
    assert records.loc["ar"].timing_tries == 3 and bool(records.loc["ar"].timing_disturbed)
    assert records.loc["ar"].foreign_cpu > contention.FOREIGN_CPU_LIMIT
    assert records.loc["pld"].timing_tries == 3  # every method of the turn was timed again (beside the burner too)
    summary = pd.read_csv(tmp_path / "run" / "summary.csv").set_index("method")
    assert summary.timing["pld"].startswith("disturbed") and summary.disturbed_time["pld"] == 1.0
    assert "re-timed" in (tmp_path / "run" / "report.md").read_text()


def test_retime_zero_only_flags(tmp_path, prompts_file, monkeypatch, burner):
    timings = burn_ar_turn(monkeypatch, burner, tries_burned=None)
    records = run(tmp_path, prompts_file, "--retime", "0").set_index("method")
    assert len(timings) == 2 and records.loc["ar"].timing_tries == 1 and bool(records.loc["ar"].timing_disturbed)


def test_negative_retime_is_refused_without_a_traceback(tmp_path, prompts_file):
    result = CliRunner().invoke(app, ["run", "--model", "random:tiny", "-d", str(prompts_file), "--retime", "-1",
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--retime must be 0 or more" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "r").exists()
    assert "--retime" in CliRunner().invoke(app, ["run", "--help"]).output


def test_an_outlier_against_the_methods_earlier_turns_is_retimed_without_proc():
    """No /proc reading (a VM that hides its neighbours): ar's forward is 3x its median so far, pld's is not."""
    from types import SimpleNamespace

    from specbench.run import retime
    from specbench.run.records import TurnResult

    def row(label, seconds, order=0):
        gen = SimpleNamespace(tokens=[1, 2, 3], target_forwards=10)
        return TurnResult(label, 0, None, gen, seconds, 1.0, {"foreign_cpu": float("nan")}, order)

    history = retime.History()
    for s in (1.0, 1.1, 0.9):
        history.keep("d", {"ar": row("ar", s), "pld": row("pld", s / 2)})
    results = {"ar": [row("ar", 3.0)], "pld": [row("pld", 0.5, 1)]}
    calls = []

    def again(label, first, position):
        calls.append((label, position))
        return row(label, 1.0 if label == "ar" else 0.5, position)

    retime.heal_prompt(again, "d", results, ["ar", "pld"], history, retime=2)
    assert calls == [("pld", 0), ("ar", 1)]  # every method of the turn, the order rotated
    assert results["ar"][0].seconds == 1.0 and results["ar"][0].tries == 2 and not results["ar"][0].disturbed
    assert results["pld"][0].tries == 2 and history.forward_ms[("d", "ar")][-1] == (100.0, 1.0)


def test_a_machine_busy_throughout_stops_being_retimed_until_a_turn_is_quiet():
    from types import SimpleNamespace

    from specbench.run import retime
    from specbench.run.records import TurnResult

    def row(label, busy):
        gen = SimpleNamespace(tokens=[1], target_forwards=10)
        return TurnResult(label, 0, None, gen, 1.0, 1.0, {"foreign_cpu": 2.0 if busy else 0.0}, 0)

    history, calls = retime.History(), []

    def again(label, first, position):
        calls.append(label)
        return row(label, busy=True)

    for _ in range(retime.GIVE_UP):
        retime.heal_prompt(again, "d", {"ar": [row("ar", True)]}, ["ar"], history, retime=2)
    assert len(calls) == 2 * retime.GIVE_UP and history.unhealed == retime.GIVE_UP
    late = {"ar": [row("ar", True)]}
    retime.heal_prompt(again, "d", late, ["ar"], history, retime=2)
    assert len(calls) == 2 * retime.GIVE_UP and late["ar"][0].tries == 1 and late["ar"][0].disturbed  # only flagged
    retime.heal_prompt(again, "d", {"ar": [row("ar", False)]}, ["ar"], history, retime=2)  # a quiet turn
    assert history.unhealed == 0


def test_a_resumed_run_takes_its_outlier_reference_from_the_kept_records(tmp_path):
    from specbench.run import retime

    rows = [{"method": "ar", "dataset": "d", "forward_ms": v, "timing_disturbed": d, "batch_size": b}
            for v, d, b in ((80.0, False, 1), (82.0, False, 1), (250.0, True, 1), (40.0, False, 4))]
    pd.DataFrame(rows).to_csv(tmp_path / "records.csv", index=False)
    history = retime.History.of_run(tmp_path)
    assert history.forward_ms[("d", "ar")] == [(80.0, 1.0), (82.0, 1.0)]  # the disturbed and the batched left out
    assert not retime.History.of_run(tmp_path / "new").forward_ms


def test_a_run_from_before_retime_resumes(tmp_path):
    import yaml

    from specbench.run.config import RunConfig
    from specbench.run.resume import plain, prepare_out

    cfg = RunConfig(out=tmp_path, resume=True)
    old = plain(cfg.settings())
    del old["retime"]
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"settings": old}))
    assert prepare_out(cfg) == tmp_path  # not refused as "retime: None -> 2"
