"""The loss curve every trainer writes next to its artefact (loss.png): the loss per step and its running mean."""

from __future__ import annotations

from pathlib import Path


def plot_losses(losses: list[float], path: Path, title: str,
                ylabel: str = "sum_j 0.8^j KL(teacher || student)") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, alpha=0.35, label="per step")
    k = 20
    if len(losses) >= k:
        smooth = [sum(losses[i - k:i]) / k for i in range(k, len(losses) + 1)]
        ax.plot(range(k - 1, len(losses)), smooth, label=f"mean of {k}")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
