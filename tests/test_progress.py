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
