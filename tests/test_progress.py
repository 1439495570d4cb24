"""Progress in logs and pipes (no live bar there): plain lines at every tenth of a task, the bar once at the end."""

from __future__ import annotations

from specbench.progress import LogProgress, progress_bar


def test_log_progress_prints_a_line_per_tenth(capsys):
    bar = progress_bar()
    assert isinstance(bar, LogProgress)  # pytest's stderr is not a terminal
    with bar:
        task = bar.add_task("work", total=40, info="")
        for i in range(40):
            bar.update(task, advance=1, info=f"loss {i}")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("work: ")]
    assert len(lines) == 9  # 10%, 20%, ..., 90%; the finished bar is printed once as the bar itself
    assert lines[0].startswith("work: 4/40 loss 3") and lines[-1].startswith("work: 36/40 loss 35")


def test_a_long_phase_says_it_started_and_how_long_it_took_in_logs(capsys, monkeypatch):
    import time

    from specbench import progress

    monkeypatch.setattr(progress, "SAY_DONE_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.05)
    with progress.status("Loading a model"):
        with progress.status("De-quantising it"):  # nested: its own lines too, no second spinner
            time.sleep(0.2)
    err = capsys.readouterr().err
    assert "Loading a model ..." in err and "De-quantising it ..." in err
    assert "De-quantising it: still going" in err  # a heartbeat while it runs
    assert "De-quantising it: done in" in err and "Loading a model: done in" in err


def test_the_decoding_bar_counts_turns_and_re_timed_turns(tmp_path, monkeypatch, prompts_file):
    """The bar's total is every method's timed turns (a two-turn prompt counts twice) plus each re-timed turn."""
    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.run import retime

    totals = []
    real = LogProgress.update

    def watch(self, task_id, **kwargs):
        real(self, task_id, **kwargs)
        task = next(t for t in self.tasks if t.id == task_id)
        totals.append((task.total, task.completed))

    monkeypatch.setattr(LogProgress, "update", watch)
    monkeypatch.setattr(retime, "disturbed", lambda rows, history, dataset: set(rows))  # every turn looks busy
    res = CliRunner().invoke(app, ["run", "--model", "random:tiny", "--max-new-tokens", "8", "--warmup", "0",
                                   "--dataset", str(prompts_file), "--limit", "4", "--retime", "1",
                                   "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    planned = 2 * 5  # ar and pld x (3 one-turn prompts + 1 two-turn prompt)
    # each turn re-timed once (both methods) until the machine counts as busy throughout (GIVE_UP turns)
    assert totals[0][0] == planned and totals[-1][0] == planned + 2 * retime.GIVE_UP
    assert totals[-1][1] == totals[-1][0]  # it ends full
