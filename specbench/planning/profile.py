"""`specbench profile`: forward latency L_fp(n) for n input tokens on top of a KV cache, per (hardware, model, dtype).

PPD §4 chooses the tree size that maximises tau(n) / L_fp(n); this module measures L_fp. Each point is the
median of `repeats` timed forwards after warm-up (CUDA events on GPU, perf_counter on CPU), with the p10 / p90
spread; the widths are timed round-robin so that a machine whose speed drifts keeps the curve's shape, and the
cache grows by one token after every round, so each round meets a new KV length as every decoding step does: a
cost paid once per new shape (an attention kernel's plan, an allocation) is in the median, not hidden by repeating
one shape (on a GPU a per-shape plan made bfloat16 decoding slower than same-shape forwards showed:
benchmarks/RESULTS-gpu.md).
Latency needs no trained weights: `random:<preset>` models give the same curve as the real ones.
With batch sizes (`--batch-size 1,2,4,8`) the same file also gets L(B, w) for every B > 1 (batch_profile.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import __version__
from ..core.machine import contention, ideal
from ..core import store
from ..core.batch.cache import new_cache
from ..core.batch.forward import forward, timed_forward
from ..core.machine.hardware import environment, gpu_facts, hardware_identity, slug_of
from ..core.model.load import LoadedModel, dtype_name, model_slug
from ..core.profile_file import LatencyProfile, load_profile  # noqa: F401  (load_profile: re-exported)
from ..errors import SpecbenchError
from ..progress import progress_bar
from .batch_profile import ENGINE, default_widths, measure_batches

DEFAULT_WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_KV_LENGTHS = (128, 512, 1024)


def check_ranges(widths: list[int], kv_lengths: list[int], repeats: int, warmup: int = 0) -> None:
    """Refuse a profile grid value out of range, naming its option (before any model loads)."""
    for option, values in (("--widths", widths), ("--kv-length", kv_lengths)):
        if min(values) < 1:
            raise SpecbenchError(f"{option}: every value must be at least 1 (got {min(values)})")
    if repeats < 1:
        raise SpecbenchError(f"--repeats must be at least 1 (got {repeats})")
    if warmup < 0:
        raise SpecbenchError(f"profile: warm-up forwards must be 0 or more (got {warmup})")


def check_grid(target: LoadedModel, widths: list[int], kv_lengths: list[int], repeats: int, warmup: int) -> None:
    """Refuse a profile grid (sorted widths and KV lengths) that is not positive or does not fit the context."""
    check_ranges(widths, kv_lengths, repeats, warmup)
    if kv_lengths[-1] + repeats + widths[-1] > target.context_length:
        raise SpecbenchError(f"profile: KV length {kv_lengths[-1]} + {repeats} repeats + width {widths[-1]} exceeds "
                             f"the model's context ({target.context_length}); lower --kv-length or --widths")


@torch.inference_mode()
def measure(target: LoadedModel, widths=DEFAULT_WIDTHS, kv_lengths=DEFAULT_KV_LENGTHS, repeats: int = 7,
            warmup: int = 2, batch_sizes=(1,), batch_widths=None) -> LatencyProfile:
    """Measure L_fp(n) for every width on top of a random-token KV cache of every length; with batch sizes > 1 also
    L(B, w) (batch_profile.py) at `batch_widths` (default: batch_profile.default_widths per B). Batch 1 is always
    measured: it is the profile's main curve."""
    widths, kv_lengths = sorted(set(widths)), sorted(set(kv_lengths))
    batched = sorted({b for b in batch_sizes if b > 1})
    if batch_widths is not None and (not batch_widths or min(batch_widths) < 1):
        raise SpecbenchError("profile: --batch-widths must be positive integers")
    check_grid(target, widths, kv_lengths, repeats, warmup)
    model, device = target.model, target.device
    gen = torch.Generator().manual_seed(0)
    vocab = min(target.vocab_size, 32000)
    curves: dict[int, dict[str, list[float]]] = {}
    before = contention.snapshot()
    with progress_bar() as bar:
        task = bar.add_task("profiling", total=len(kv_lengths) * repeats * (1 + len(batched)), info="")
        for kv in kv_lengths:
            cache = new_cache(model)
            forward(model, torch.randint(0, vocab, (1, kv), generator=gen).to(device), cache, logits_to_keep=1)
            inputs = {n: torch.randint(0, vocab, (1, n), generator=gen).to(device) for n in widths}
            for _ in range(warmup):
                for n in widths:
                    timed_forward(model, inputs[n], cache, device)
            # Round-robin over the widths, alternating direction: a machine whose speed drifts (turbo, noisy
            # neighbours) then slows every width alike, and the curve's shape (what trees are chosen by) holds.
            times: dict[int, list[float]] = {n: [] for n in widths}
            for r in range(repeats):
                for n in (widths if r % 2 == 0 else widths[::-1]):
                    times[n].append(timed_forward(model, inputs[n], cache, device))
                forward(model, inputs[widths[0]][:, :1], cache, logits_to_keep=1)  # next round: KV kv + r + 1
                bar.update(task, advance=1, info=f"kv {kv} round {r + 1}/{repeats}")
            stats = [torch.tensor(times[n]) for n in widths]
            curves[kv] = {"median_ms": [round(float(t.median()), 3) for t in stats],
                          "p10_ms": [round(float(t.quantile(0.1)), 3) for t in stats],
                          "p90_ms": [round(float(t.quantile(0.9)), 3) for t in stats]}
        batches = measure_batches(
            target, batched, lambda b: sorted(set(batch_widths)) if batch_widths else default_widths(widths, b),
            kv_lengths, repeats, warmup, lambda text: bar.update(task, advance=1, info=text))
    meta = profile_meta(target, before, repeats, warmup)
    meta["ideal"] = ideal.of_profile(target, widths, curves)
    if batches:
        meta["batch_engine"] = ENGINE
    return LatencyProfile(model_slug(target.spec), dtype_name(target.dtype), slug_of(meta["identity"]),
                          "measured", list(widths), curves, meta, batches)


def profile_meta(target: LoadedModel, before: dict, repeats: int, warmup: int, placement: str | None = None) -> dict:
    """A profile's meta: where and how it was measured, what else ran meanwhile (since the contention snapshot
    `before`), versions, the placement it is filed under (a device map, --tp or --compile files its own profile:
    store.profile_name) and the model spec (`model` is its file-name key, model_slug, the one build-tree and run use)."""
    device = target.device
    load = contention.between(before, contention.snapshot())
    env = environment(device, target.dtype)
    meta = {"device_name": env["device"], "identity": hardware_identity(device), "threads": env["threads"],
            "repeats": repeats, "warmup": warmup, "kv_growth": "one token a round (round r at KV kv + r)",
            "contention": {**load, "disturbed": contention.disturbed(load)},
            "versions": {"torch": env["torch"], "transformers": env["transformers"], "specbench": __version__,
                         "git": env["git"]},
            "placement": placement or target.placement, "model_spec": target.spec}
    if device.type == "cuda":
        meta["nvml"] = gpu_facts(device.index or 0)
    return meta


def default_path(profile: LatencyProfile, root: Path | None = None) -> Path:
    """profiles/<hardware>/<model key>-<dtype>.yaml (under store.write_root(): the working directory, or the user
    cache inside a specbench checkout; or under `root`), where build-tree and run look (core/store.py)."""
    rel = store.profile_file(profile.hardware, profile.model, profile.dtype, profile.meta.get("placement", ""))
    return store.filed(rel) if root is None else root / rel.relative_to(store.profiles_dir())


def save(profile: LatencyProfile, out: Path | None = None) -> Path:
    """Write the profile to `out` (default: default_path) and its plot beside it (.png); returns the YAML's path."""
    path = out or default_path(profile)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(profile.to_yaml())
    except OSError as exc:
        raise SpecbenchError(f"cannot write {path}: {exc.strerror or exc}") from exc
    plot(profile, path.with_suffix(".png"))
    return path


def plot(profile: LatencyProfile, path: Path) -> None:
    """L(w) per KV length, with the hardware's ideal dashed (core/machine/ideal.py) and a panel of L(w) / ideal; with
    batch sizes, a panel of L(B, w) per batch size at the KV length nearest 512."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ideals = ideal.stated(profile.meta)
    panels = 1 + bool(ideals) + bool(profile.batches)
    fig, axes = plt.subplots(1, panels, figsize=(6 + 5 * (panels - 1), 3.8), squeeze=False)
    ax = axes[0][0]
    for kv, curve in sorted(profile.curves.items()):
        line, = ax.plot(profile.widths, curve["median_ms"], marker="o", label=f"KV {kv}")
        ax.fill_between(profile.widths, curve["p10_ms"], curve["p90_ms"], alpha=0.2)
        if kv in ideals:
            ax.plot(profile.widths, ideals[kv]["ideal_ms"], linestyle="--", color=line.get_color(),
                    label=f"ideal, KV {kv}")
    label = "" if profile.source == "measured" else " (source: estimated)"
    load = profile.meta.get("contention") or {}
    if load.get("disturbed"):  # the profile guard's flag: the curve may be too high, and uneven
        label += f" - DISTURBED: {load.get('foreign_cpu', 0):.2f} other cores busy"
        ax.text(0.5, 0.5, "measured on a busy machine", transform=ax.transAxes, ha="center", va="center",
                fontsize=14, color="firebrick", alpha=0.35, rotation=20)
    ax.set_title(f"{profile.model} {profile.dtype} on {profile.hardware}{label}", fontsize=9,
                 **({"color": "firebrick"} if load.get("disturbed") else {}))
    ax.set_ylabel("forward latency (ms)")
    if ideals:
        ratio = axes[0][1]
        for kv in sorted(ideals):
            ratio.plot(profile.widths, ideals[kv]["measured_over_ideal"], marker="o", label=f"KV {kv}")
        ratio.axhline(1.0, color="black", linewidth=0.8)
        ratio.set_title("L(w) / ideal: ideal = max(bytes / bandwidth, FLOPs / peak)", fontsize=9)
        ratio.set_xlabel("input width n (tokens per forward)")
        ratio.set_ylabel("measured / ideal")
        ratio.set_yscale("log", base=2)  # 1 is the hardware; each step up doubles the distance
    if profile.batches:
        right = axes[0][-1]
        for size in profile.batch_sizes:
            view = profile.at_batch(size)
            kv = min(view.curves, key=lambda k: abs(k - 512))
            right.plot(view.widths, view.curves[kv]["median_ms"], marker="o", label=f"B {size} (KV {kv})")
        right.set_title("L(B, w): B rows of w new tokens each, one forward", fontsize=9)
        right.set_xlabel("new tokens per row w")
        right.set_ylabel("forward latency (ms)")
    for a in axes[0]:
        a.set_xscale("log", base=2)
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    ax.set_xlabel("input width n (tokens per forward)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
