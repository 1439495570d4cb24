"""`specbench profile` and `specbench build-tree`: the latency curve of this hardware and the tree built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import SpecbenchError, did_you_mean
from ..progress import console, out
from .app import app
from .parse import int_list
from .placement_options import DeviceMap, MaxMemory, TensorParallel, target_placement


@app.command()
def profile(
    model: Annotated[str, typer.Option(help="Model spec; random:<preset> needs no download.")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    tp: TensorParallel = 1,
    widths: Annotated[str, typer.Option(metavar="N[,N...]", help="Input widths n (tokens per forward).")]
    = "1,2,4,8,16,32,64,128",
    kv_lengths: Annotated[str, typer.Option("--kv-length", metavar="N[,N...]", help="KV-cache lengths the widths are "
                                            "timed on.")] = "128,512,1024",
    repeats: Annotated[int, typer.Option(help="Timed forwards per point (median and p10/p90 reported).")] = 7,
    threads: Annotated[Optional[int], typer.Option(show_default="torch's choice", help="torch CPU threads.")] = None,
    batch_sizes: Annotated[str, typer.Option("--batch-size", metavar="B[,B...]", help="Batch sizes B to time L(B, w) "
                           "at: one forward of B rows of w new tokens each, every row on its own KV cache (the "
                           "unpadded engine of `run --batching unpadded`); filed in the same profile, where build-tree "
                           "--batch-size, --tree auto and --gamma auto read it per batch size. Batch 1 (the main "
                           "curve) is always measured.")] = "1",
    batch_widths: Annotated[Optional[str], typer.Option(metavar="W[,W...]", show_default="the --widths whose B x w "
                            "total does not pass the widest width, plus 1 and 2", help="New tokens per row timed at "
                            "each batch size > 1 (wider steps are extrapolated).")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", show_default="profiles/<hardware>/<model>-<dtype>.yaml; "
                        "with a device map or --tp <model>-<dtype>@<placement>.yaml; in the working directory, or "
                        "the user cache inside a specbench checkout", help="Profile YAML.")] = None,
    compile: Annotated[bool, typer.Option("--compile", help="Time the forwards `run --compile` runs: each width a "
                       "compiled static shape (CUDA graphs on CUDA), with --batch-size each B on the static batched "
                       "engine of `run --compile --batch-size B`; every shape compiled before the first timed "
                       "forward; filed as <model>-<dtype>@compiled.yaml.")] = False,
):
    """Measure forward latency L(n) per input width on this hardware (for `build-tree`); with --batch-size also
    L(B, w) per batch size."""
    import torch

    from ..core.model.load import load_model
    from ..planning.batch_profile import check_batch_sizes
    from ..planning.profile import check_ranges, measure, save

    width_list, kv_list = int_list(widths, "--widths"), int_list(kv_lengths, "--kv-length")
    check_ranges(width_list, kv_list, repeats)  # before the model loads
    sizes = check_batch_sizes(int_list(batch_sizes, "--batch-size"))
    row_widths = int_list(batch_widths, "--batch-widths") if batch_widths else None
    if compile and (device_map or tp > 1):
        raise SpecbenchError("profile --compile times one device: leave out --device-map and --tp, or --compile")
    if threads is not None and threads < 1:
        raise SpecbenchError(f"--threads must be at least 1 (got {threads}); leave it out for torch's choice")
    if threads:
        torch.set_num_threads(threads)
    from ..core.model.memory_need import stated_workload, profile_workload

    if compile:  # every batch size's static caches held at once (compiled_profile_workload)
        from ..planning.batch_profile_compiled import compiled_profile_workload

        work = compiled_profile_workload(width_list, kv_list, repeats, sizes, row_widths)
    else:
        work = profile_workload(width_list, kv_list, repeats, sizes)
    with stated_workload(work):  # what the fit check counts
        target = load_model(model, dtype, device, placement=target_placement(device_map, max_memory, tp))
    if compile:  # the curve under torch.compile / CUDA graphs (planning/profile_compiled.py)
        from ..planning.profile_compiled import measure_compiled

        result = measure_compiled(target, width_list, kv_list, repeats, batch_sizes=sizes, batch_widths=row_widths)
    else:
        result = measure(target, width_list, kv_list, repeats, batch_sizes=sizes, batch_widths=row_widths)
    from ..core.model.tensor_parallel import is_writer

    if not is_writer():
        return  # --tp: every rank measured (the forwards are collective); rank 0 writes
    path = save(result, out_path)
    out.print(_latency_table(result))
    for size in result.batch_sizes[1:]:
        out.print(_batch_table(result, size))
    from ..core import store

    console.print(f"Wrote {escape(store.said_where(path))} and its plot (.png)")
    load = result.meta.get("contention") or {}
    if load.get("disturbed"):
        console.print(f"[bold red]timing disturbed[/]: other processes used {load['foreign_cpu']:.2f} cores on "
                      f"average while this profile was measured (steal {load['steal']:.1%}); it is flagged "
                      "disturbed (`contention` in the file): `run`, `recommend` and `build-tree` skip it unless "
                      "given --allow-disturbed-profile. Re-run `specbench profile` on a quiet machine.")


def _latency_table(result) -> Table:
    """L(w) per width and KV length, each with this hardware's ideal and the measured / ideal ratio beside it
    (core/machine/ideal.py) where the profile states them."""
    from ..core.machine.ideal import stated

    ideals = stated(result.meta)
    rates = result.meta.get("ideal") or {}
    said = (f"; ideal = max(bytes / {rates['bandwidth_gb_s']:.1f} GB/s, FLOPs / {rates['peak_gflops']:.1f} GFLOP/s)"
            if ideals else "")
    table = Table(title=f"L(n) ms, {result.model} {result.dtype} on {result.hardware}{said}")
    table.add_column("width n", justify="right")
    for kv in result.curves:
        table.add_column(f"KV {kv}", justify="right")
        if kv in ideals:
            table.add_column("ideal", justify="right")
            table.add_column("x ideal", justify="right")
    for i, n in enumerate(result.widths):
        cells = [str(n)]
        for kv, c in result.curves.items():
            cells.append(f"{c['median_ms'][i]:.2f}")
            if kv in ideals:
                cells += [f"{ideals[kv]['ideal_ms'][i]:.2f}", f"{ideals[kv]['measured_over_ideal'][i]:.2f}"]
        table.add_row(*cells)
    return table


def _batch_table(result, size: int) -> Table:
    """L(B, w) of one batch size: a row per width, a column per KV length, L(B, w) / L(B, 1) beside each."""
    view = result.at_batch(size)
    table = Table(title=f"L(B={size}, w) ms: {size} rows of w new tokens each (x L(B, 1) in brackets)")
    table.add_column("w per row", justify="right")
    for kv in view.curves:
        table.add_column(f"KV {kv}", justify="right")
    for i, w in enumerate(view.widths):
        table.add_row(str(w), *(f"{c['median_ms'][i]:.2f} ({c['median_ms'][i] / c['median_ms'][0]:.2f})"
                                for c in view.curves.values()))
    return table


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
    acceptance: Annotated[Optional[Path], typer.Option(show_default="acceptance/<model>/<method>.yaml",
                                                       help="Acceptance file.")] = None,
    batch_size: Annotated[int, typer.Option(metavar="B", help="Choose the tree for batch size B from the "
                          "profile's L(B, w) (`specbench profile --batch-size`; a preset --gpu estimates it): the "
                          "speedup over ar at the same batch size, tau(n) L(B, 1) / L(B, width). Filed as "
                          "<...>-b<B>.yaml beside batch 1's tree, where `run --tree auto` looks at that batch "
                          "size.")] = 1,
    out_path: Annotated[Optional[Path], typer.Option("--out", show_default="trees/<model>/<hardware>-<dtype>.yaml; "
                        "-b<B> added at --batch-size B > 1; in the working directory, or the user cache inside a "
                        "specbench checkout", help="Tree file.")] = None,
    allow_disturbed_profile: Annotated[bool, typer.Option("--allow-disturbed-profile", help="--gpu cpu: build from "
                                       "this CPU's profile even when it was measured on a disturbed machine (the "
                                       "tree is flagged disturbed too).")] = False,
):
    """Build PPD's hardware-aware dynamic sparse tree: the size that maximises tau(n) / L(n) on --gpu."""

    from .. import families as registry
    from ..core.machine.timing import now, since
    from ..planning.buildtree import BuildTreeRequest, edge_note
    from ..planning.buildtree import build_tree as build
    from ..planning.plan import tree_methods

    from ..core import lookup, store

    lookup.start(allow_disturbed_profile)
    start = now()
    families = tree_methods()  # the declared tree families: dynamic trees first, then one-state ones
    if method not in families:
        raise SpecbenchError(f"--method {method}: not a tree method{did_you_mean(method, families)}; choose "
                             f"one of {', '.join(families)}")
    built = build(BuildTreeRequest(model, method, registry.get(method).one_state, families,
                                   gpu, dtype, prompt_tokens, max_size, kv_length, ept, acceptance, out_path,
                                   batch_size))
    curve, profile = built.curve, built.profile
    i = curve.best_index
    label = " [yellow](source: estimated from the chip's published peak rates)[/]" \
        if profile.source == "estimated" else " (measured profile)"
    at = f" at batch size {batch_size}" if batch_size > 1 else ""
    table = Table(title=f"{method} tree for {built.model} on {profile.hardware} {profile.dtype}{at}")
    step = " + host ms" if built.host_price else " ms"  # the curve's step: the forward, and host work where priced
    for col in ("size n", "tau(n)", f"L(B={batch_size}){step}" if at else f"L(n){step}",
                "predicted speedup" + (" (vs ar at B)" if at else "")):
        table.add_column(col, justify="right")
    marks = sorted({1, 2, 4, 8, 16, 32, 64, 128, curve.best.size} & set(curve.sizes))
    for n in marks:
        j = curve.sizes.index(n)
        style = "bold green" if n == curve.best.size else None
        table.add_row(str(n), f"{curve.tau[j]:.3f}", f"{curve.latency_ms[j]:.2f}", f"{curve.speedup[j]:.3f}x",
                      style=style)
    out.print(table)
    wrote = escape(store.said_where(built.path)) + ("" if built.plot is None else " and its plot (.png)")
    console.print(f"Chosen size {curve.best.size}{at}: predicted tau {curve.tau[i]:.3f}, speedup "
                  f"{curve.speedup[i]:.3f}x"
                  f"{label}. Wrote {wrote} in "
                  f"{since(start):.1f} s.")
    if built.host_price:
        console.print(f"[dim]host work a step priced from this machine's runs ({method}: "
                      f"{escape(built.host_price)})[/]")
    edge = edge_note(curve, max_size)
    if edge:
        console.print(f"[yellow]warning[/] {escape(edge)}")
    if (profile.meta.get("contention") or {}).get("disturbed"):
        console.print("[yellow]note[/] the profile was measured on a disturbed machine: the tree is flagged "
                      "disturbed, and `run --tree auto` skips it unless given --allow-disturbed-profile")
    if curve.speedup[i] < 1:
        console.print(f"[yellow]note[/] no tree size beats ar on {profile.hardware} in {profile.dtype}: even the "
                      "smallest tree's forward costs more than its predicted tau gains. "
                      f"{method} will be slower than ar here; a flatter latency curve (another dtype or device) "
                      "changes that.")
