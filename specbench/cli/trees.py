"""`specbench profile` and `specbench build-tree`: the latency curve of this hardware and the tree built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..core.timing import now, since
from ..errors import SpecbenchError
from ..progress import console, out
from .app import app
from .parse import int_list


@app.command()
def profile(
    model: Annotated[str, typer.Option(help="Model spec; random:<preset> needs no download.")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    widths: Annotated[str, typer.Option(help="Input widths n (tokens per forward).")] = "1,2,4,8,16,32,64,128",
    kv_lengths: Annotated[str, typer.Option(help="KV-cache lengths the widths are timed on.")] = "128,512,1024",
    repeats: Annotated[int, typer.Option(help="Timed forwards per point (median and p10/p90 reported).")] = 7,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Profile YAML (default "
                        "profiles/<hardware>/<model>-<dtype>.yaml).")] = None,
):
    """Measure forward latency L_fp(n) per input width on this hardware (for `build-tree`)."""
    import torch

    from ..core.models import load_model
    from ..planning.profile import default_path, measure, plot

    width_list, kv_list = int_list(widths, "--widths"), int_list(kv_lengths, "--kv-lengths")
    if threads is not None and threads < 1:
        raise SpecbenchError(f"--threads must be at least 1 (got {threads}); leave it out for torch's choice")
    if threads:
        torch.set_num_threads(threads)
    target = load_model(model, dtype, device)
    result = measure(target, width_list, kv_list, repeats)
    path = out_path or default_path(result)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.to_yaml())
    except OSError as exc:
        raise SpecbenchError(f"cannot write {path}: {exc.strerror or exc}") from exc
    plot(result, path.with_suffix(".png"))
    table = Table(title=f"L_fp(n) ms, {result.model} {result.dtype} on {result.hardware}")
    table.add_column("width n", justify="right")
    for kv in result.curves:
        table.add_column(f"KV {kv}", justify="right")
    for i, n in enumerate(result.widths):
        table.add_row(str(n), *(f"{c['median_ms'][i]:.2f}" for c in result.curves.values()))
    out.print(table)
    console.print(f"Wrote {escape(str(path))} and {escape(str(path.with_suffix('.png')))}")
    load = result.meta.get("contention") or {}
    if load.get("disturbed"):
        console.print(f"[bold red]timing disturbed[/]: other processes used {load['foreign_cpu']:.2f} cores on "
                      f"average while this profile was measured (steal {load['steal']:.1%}); trees and --dtype auto "
                      "built on it may be wrong. Re-run `specbench profile` on a quiet machine (recorded under "
                      "`contention` in the file).")


@app.command("build-tree")
def build_tree(
    model: Annotated[str, typer.Option(help="Model the tree is for (its acceptance file and profile).")]
    = "smollm2-135m",
    method: Annotated[str, typer.Option(help="Tree method: ppd (dynamic sparse tree over prompt tokens), "
                                             "hidden-transfer (the same search over its pseudo positions), medusa, "
                                             "eagle or parallelspec (one-state tree of the best candidates; eagle "
                                             "and parallelspec add their drafter's measured cost per step).")]
    = "ppd",
    gpu: Annotated[str, typer.Option(help="Hardware: a100, a100-80gb, h100, h200, l40s, rtx4090, rtx3090, cpu "
                                          "(this CPU's measured profile), or a profile .yaml path. A measured "
                                          "profile always wins over a preset estimate.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto (bfloat16 for GPUs; for cpu what `run --dtype auto` picks on "
                                            "this CPU), float32, bfloat16, float16")] = "auto",
    prompt_tokens: Annotated[int, typer.Option(help="Prompt tokens m (the states of the dynamic tree; "
                                                    "hidden-transfer: pseudo positions per node, medusa: heads).")] = 3,
    max_size: Annotated[int, typer.Option(help="Largest tree size n searched (candidates + their prompt "
                                               "tokens).")] = 128,
    kv_length: Annotated[int, typer.Option(help="KV length whose latency curve is used.")] = 512,
    ept: Annotated[int, typer.Option(help="Ensemble tokens per prompt token (widens each forward).")] = 1,
    acceptance: Annotated[Optional[Path], typer.Option(help="Acceptance file (default "
                                                            "acceptance/<model>/ppd.yaml).")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Tree file (default "
                        "trees/<model>/<hardware>-<dtype>.yaml).")] = None,
):
    """Build PPD's hardware-aware dynamic sparse tree: the size that maximises tau(n) / L_fp(n) on --gpu."""

    from ..core.hardware import hardware_slug
    from ..core.models import model_config, model_slug, resolve_device
    from ..planning.acceptance import read_per_rank
    from ..planning.buildtree import plot, size_curve, tree_file
    from ..planning.latency_estimate import GPU_CHOICES, resolve_profile

    start = now()
    if gpu not in GPU_CHOICES and not gpu.endswith((".yaml", ".yml")):
        raise SpecbenchError(f"unknown --gpu {gpu!r}: use one of {', '.join(GPU_CHOICES)} or a profile .yaml path")
    from ..core.models import auto_cpu_dtype

    cpu_auto = str(auto_cpu_dtype(model)[0]).removeprefix("torch.") if gpu == "cpu" else "bfloat16"
    dtype_name = {"auto": cpu_auto, "fp32": "float32", "bf16": "bfloat16",
                  "fp16": "float16"}.get(dtype, dtype)
    if dtype_name not in ("float32", "bfloat16", "float16"):
        raise SpecbenchError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    from ..core.tree import locate

    slug = model_slug(model)  # the model's file-name key: acceptance/, profiles/ and trees/ all use it
    tree_methods = ("ppd", "hidden-transfer", "medusa", "eagle", "parallelspec")
    one_state = ("medusa", "eagle", "parallelspec")
    if method not in tree_methods:
        raise SpecbenchError(f"build-tree --method {method}: choose one of {', '.join(tree_methods)}")
    acc_path = acceptance or locate(f"acceptance/{slug}/{method}.yaml") or Path("acceptance") / slug / f"{method}.yaml"
    if not acc_path.exists():
        raise SpecbenchError(f"no acceptance estimates at {acc_path}: run `specbench estimate --method {method} "
                             f"--model {model}` first, or pass --acceptance FILE")
    m = prompt_tokens
    if m < 1:
        raise SpecbenchError("--prompt-tokens must be at least 1")
    if max_size < max(2, m):
        raise SpecbenchError(f"--max-size {max_size} is smaller than the {m} prompt tokens (and every candidate "
                             "needs at least one prompt token: size >= 2)")
    acc = read_per_rank(acc_path, m)
    local = hardware_slug(resolve_device("cpu"))
    measured = locate(f"profiles/{local}/{slug}-{dtype_name}.yaml") if gpu == "cpu" else None
    profile = resolve_profile(gpu, slug, model_config(model), dtype_name, local, [1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                                                  512], spec=model,
                              root=measured.parent.parent if measured else Path("profiles"))
    stem = f"{profile.hardware}-{profile.dtype}" if method == "ppd" else f"{method}-{profile.hardware}-{profile.dtype}"
    path = out_path or Path("trees") / slug / f"{stem}.yaml"
    if method in one_state:
        from ..planning.buildtree import candidate_curve, candidate_tree_file

        acc = read_per_rank(acc_path, _acceptance_rows(acc_path))  # every depth the estimate measured
        draft_ms = _draft_cost(method, acc_path)
        with console.status(f"Choosing the best candidate tree of sizes 1..{max_size}"):
            curve = candidate_curve(acc, profile, max_size, kv_length, draft_ms)
        result = candidate_tree_file(curve, method, slug, profile, str(acc_path), kv_length)
    else:
        with console.status(f"Searching dynamic sparse trees of sizes 2..{max_size}"):
            curve = size_curve(acc, m, profile, max_size, kv_length, ept)
        result = tree_file(curve, m, slug, profile, str(acc_path), kv_length, method)
    result.write(path)
    if method not in one_state:
        plot(curve, profile, path.with_suffix(".png"))
    i = curve.best_index
    label = " [yellow](source: estimated from the chip's published peak rates)[/]" \
        if profile.source == "estimated" else " (measured profile)"
    table = Table(title=f"{method} tree for {slug} on {profile.hardware} {profile.dtype}")
    for col in ("size n", "tau(n)", "L_fp ms", "predicted speedup"):
        table.add_column(col, justify="right")
    marks = sorted({1, 2, 4, 8, 16, 32, 64, 128, curve.best.size} & set(curve.sizes))
    for n in marks:
        j = curve.sizes.index(n)
        style = "bold green" if n == curve.best.size else None
        table.add_row(str(n), f"{curve.tau[j]:.3f}", f"{curve.latency_ms[j]:.2f}", f"{curve.speedup[j]:.3f}x",
                      style=style)
    out.print(table)
    wrote = escape(str(path)) + ("" if method in one_state else f" and {escape(str(path.with_suffix('.png')))}")
    console.print(f"Chosen size {curve.best.size}: predicted tau {curve.tau[i]:.3f}, speedup {curve.speedup[i]:.3f}x"
                  f"{label}. Wrote {wrote} in "
                  f"{since(start):.1f} s.")
    if curve.speedup[i] < 1:
        console.print(f"[yellow]note[/] no tree size beats ar on {profile.hardware} in {profile.dtype}: even the "
                      "smallest tree's forward costs more than its predicted tau gains. "
                      f"{method} will be slower than ar here; a flatter latency curve (another dtype or device) changes "
                      "that.")


def _acceptance_rows(path: Path) -> int:
    """Depths an acceptance file measured (its rows)."""
    import yaml

    try:
        return len((yaml.safe_load(path.read_text()) or {}).get("per_rank") or []) or 1
    except (OSError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"{path}: cannot read it ({exc})") from exc


def _draft_cost(method: str, path: Path):
    """acceptance.draft_cost, with a note when a feature-drafter method's file lacks the drafter's forward time."""
    from ..planning.acceptance import draft_cost

    cost = draft_cost(method, path)
    if cost is None and method in ("eagle", "parallelspec"):
        console.print(f"[yellow]note[/] {escape(str(path))} has no draft_forward_ms: the drafter's cost is left "
                      f"out of the prediction (re-run `specbench estimate --method {method}`)")
    return cost
