"""Speedup and tau per method over successive commits (`specbench report --history DIR...`): history.csv and
history.png. Runs are taken in the order given (oldest first); each is labelled by the git revision it was measured
at (run.yaml environment.git, else records.csv `git`, else the folder's name)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..errors import SpecbenchError  # noqa: E402
from .baseline import load_side  # noqa: E402
from ..run.noise import is_disturbed  # noqa: E402
from ..report.titles import set_title  # noqa: E402

COLUMNS = ["order", "commit", "run", "method", "dataset", "speedup", "tau", "acceptance_rate", "lossless_rate",
           "timing", "hardware", "model", "dtype"]


def collect(run_dirs: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """One row per run x method x dataset (COLUMNS), and notes on what the runs do not share."""
    rows, seen = [], {}
    for order, run_dir in enumerate(run_dirs):
        side = load_side(Path(run_dir), role="history")
        commit = str(side.environment.get("git") or "")
        if not commit or commit == "unknown":
            commit = Path(run_dir).resolve().name
        seen[commit] = seen.get(commit, 0) + 1
        label = commit if seen[commit] == 1 else f"{commit} #{seen[commit]}"  # the same commit measured again
        for r in side.summary.itertuples(index=False):
            rows.append({"order": order, "commit": label, "run": str(run_dir), "method": r.method,
                         "dataset": r.dataset, "speedup": r.speedup, "tau": r.tau,
                         "acceptance_rate": getattr(r, "acceptance_rate", float("nan")),
                         "lossless_rate": getattr(r, "lossless_rate", float("nan")),
                         "timing": str(getattr(r, "timing", "") or ""), "hardware": side.hardware or "",
                         "model": side.model or "", "dtype": side.dtype or ""})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    notes = [f"the runs differ in {col}: {', '.join(dict.fromkeys(frame[col]))}; their numbers are not comparable"
             for col in ("hardware", "model", "dtype") if frame[col].nunique() > 1]
    return frame, notes


def plot(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """Two panels (speedup, tau) over commits, one line per method (x dataset when there are several); hollow
    markers where the noise guard marked the timing disturbed."""
    shown = frame[frame.method != "ar"]
    commits = frame.drop_duplicates("order").sort_values("order")
    several = shown.dataset.nunique() > 1
    width = max(6.0, 0.7 * len(commits) + 3)
    fig, axes = plt.subplots(2, 1, figsize=(width, 6), sharex=True)
    for ax, column, ylabel in ((axes[0], "speedup", "speedup over ar"), (axes[1], "tau", "tau (tokens / forward)")):
        for (method, dataset), g in shown.groupby(["method", "dataset"], sort=False):
            g = g.sort_values("order")
            label = f"{method} ({dataset})" if several else method
            line, = ax.plot(g.order, g[column], marker="o", label=label)
            bad = g[g.timing.map(is_disturbed)]
            if column == "speedup" and len(bad):
                ax.plot(bad.order, bad[column], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                        markeredgecolor="red")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    if shown.timing.map(is_disturbed).any():
        axes[0].text(1.01, 0.0, "red ring: timing\ndisturbed", transform=axes[0].transAxes, fontsize=7, color="red")
    axes[1].set_xticks(list(commits.order), list(commits.commit), rotation=45, ha="right", fontsize=8)
    axes[1].set_xlabel("commit (oldest first)")
    set_title(axes[0], title, width)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write(run_dirs: list[Path], out: Path) -> tuple[pd.DataFrame, list[Path], list[str]]:
    """history.csv and history.png in `out`; returns the frame, the paths and the notes."""
    if not run_dirs:
        raise SpecbenchError("--history: give the run folders of successive commits, oldest first")
    frame, notes = collect(run_dirs)
    try:
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "history.csv", index=False)
    except OSError as exc:
        raise SpecbenchError(f"--out {out}: cannot write there ({exc.strerror or exc})") from exc
    said = {k: " vs ".join(dict.fromkeys(v for v in frame[k] if v)) or "?" for k in ("model", "hardware", "dtype")}
    title = f"{said['model']} on {said['hardware']}, {said['dtype']}, {frame.order.nunique()} runs"
    plot(frame, out / "history.png", title)
    return frame, [out / "history.csv", out / "history.png"], notes
