"""L(n) / L(1) of several latency profiles on one plot: where each model's flat, memory-bound stretch ends (the
widths a verify of n tokens costs about one token's forward), which is what the tree search lives on.

    .venv/bin/python benchmarks/latency_shape.py PROFILE.yaml [PROFILE.yaml ...] [--kv 512] [--out shape.png]

Any profiles `specbench profile` (or a preset estimate saved as a profile) wrote: e.g. the shipped 135M one beside
random:qwen2.5-0.5b / 1.5b / vicuna-7b profiles of the same machine. Prints, per profile, L(1), the ratio at each
width, and the widest n whose L(n) stays within FLAT of L(1).
"""

from __future__ import annotations

import argparse
from pathlib import Path

FLAT = 1.25  # "flat": a forward of n tokens within 25% of one token's


def ratios(profile, kv: int) -> tuple[int, list[int], list[float], float]:
    """(the KV length used, widths, L(n) / L(1), L(1) ms) on the curve nearest `kv`."""
    near = min(profile.curves, key=lambda k: abs(k - kv))
    med = profile.curves[near]["median_ms"]
    return near, list(profile.widths), [m / med[0] for m in med], med[0]


def flat_until(widths: list[int], ratio: list[float]) -> int:
    last = widths[0]
    for w, r in zip(widths, ratio):
        if r > FLAT:
            break
        last = w
    return last


def label(profile, path: Path) -> str:
    busy = (profile.meta.get("contention") or {}).get("disturbed")
    borrowed = " (a paper's numbers, not measured here)" if profile.meta.get("note") else ""
    return (f"{profile.model} {profile.dtype} on {profile.hardware}"
            f"{' (estimated)' if profile.source == 'estimated' else ''}{' (busy machine)' if busy else ''}{borrowed}")


def main() -> None:
    from specbench.planning.profile import load_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--kv", type=int, default=512, help="KV length whose curve is drawn (nearest measured)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/latency_shape/latency_shape.png"))
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for path in args.profiles:
        profile = load_profile(path)
        kv, widths, ratio, base = ratios(profile, args.kv)
        name = label(profile, path)
        ax.plot(widths, ratio, marker="o", label=f"{name}, L(1) {base:.1f} ms")
        print(f"{name} (KV {kv}): L(1) = {base:.2f} ms; flat (<= {FLAT}x) to n = {flat_until(widths, ratio)}; "
              + ", ".join(f"n={w}: {r:.2f}" for w, r in zip(widths, ratio)))
    ax.axhline(FLAT, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("input width n (tokens per forward)")
    ax.set_ylabel("L(n) / L(1)")
    ax.set_title(f"Forward latency relative to one token, KV {args.kv}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
