"""`specbench plan`: every tree method's tree, predicted tau and speedup, and memory for a model before anything is
trained, from a latency curve and published (or estimated) acceptance (planning/plan.py). Apart from `recommend`,
which predicts from this machine's trained artefacts and files the pick `run --method auto` takes, a plan is for
hardware and training you do not have yet: it writes plan.yaml in its own folder and files nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..progress import console, out
from .app import app


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


@app.command()
def plan(
    model: Annotated[str, typer.Option(help="Model spec: random:<preset> (a published shape, no download), a local "
                                            "directory, .gguf file or HF id (its config only).")] = "random:vicuna-7b",
    gpu: Annotated[str, typer.Option(help="Hardware: a100, a100-80gb, h100, h200, l40s, rtx4090, rtx3090 (a measured "
                                          "profile of that GPU if one is filed, else a roofline estimate), cpu (this "
                                          "CPU's measured profile), or a profile .yaml path.")] = "a100",
    dtype: Annotated[str, typer.Option(help="auto (bfloat16), float32, bfloat16, float16")] = "auto",
    acceptance: Annotated[str, typer.Option(metavar="published|published:MODEL|DIR", help="Acceptance figures: the "
                          "papers' tables for this model (acceptance/published/<model>/), another model's "
                          "(published:vicuna-7b), or a folder `specbench estimate` wrote (<method>.yaml, or <method>.json: a "
                          "speculation_profile.json, e.g. a run's speculation_profiles/).")] = "published",
    methods: Annotated[str, typer.Option(metavar="M[,M...]", help="Methods to plan: tree methods, and chain methods "
                                         "(pld, sd, pearl: their best draft length) where the folder has their "
                                         "acceptance.")]
    = "ppd,hidden-transfer,medusa,eagle,parallelspec",
    kv_length: Annotated[int, typer.Option(help="KV length whose latency curve is read.")] = 512,
    context: Annotated[int, typer.Option(help="Tokens of context (prompt + new tokens) the KV cache holds, for "
                                              "memory.")] = 2048,
    max_size: Annotated[int, typer.Option(help="Largest tree size searched.")] = 128,
    out_dir: Annotated[Optional[Path], typer.Option("--out", show_default="results/plan-<model>-<hardware>-<dtype>",
                       help="Folder for plan.yaml and the trees.")] = None,
):
    """Plan the methods for a model before training: tree, predicted tau and speedup, memory (predicted, not
    measured)."""
    from ..planning.plan import PlanRequest
    from ..planning.plan import plan as make_plan

    chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
    result = make_plan(PlanRequest(model, gpu, dtype, acceptance, chosen, kv_length, context, max_size, out_dir))
    prof = result.profile
    label = "roofline estimate" if prof.source == "estimated" else "measured profile"
    table = Table(title=f"Plan for {model} on {prof.hardware} {result.dtype} ({label}), acceptance "
                        f"{result.acceptance}, context {context}: predicted, not measured")
    for col in ("method", "acceptance", "tree size", "tau", "speedup", "draft ms/step", "target GB", "drafter GB",
                "KV GB", "total GB", "paper measured", "why not"):
        table.add_column(col, justify="left" if col in ("method", "acceptance", "paper measured", "why not")
                         else "right")
    table.add_row("ar", "-", "-", "1.000", "1.00x", "-", *(["-"] * 4), "-", "")
    pick = result.pick
    for row in result.ranked:  # checked acceptance first: an unchecked row ranks below every checked one
        mem = row.memory_gb
        paper = (f"{row.paper['speedup']:.2f}x tau {row.paper.get('tau', '-')} ({row.paper.get('gpu', '?')})"
                 if row.paper.get("speedup") else "-")
        checked = "-" if row.speedup is None else "UNVERIFIED" if row.unverified else "checked"
        table.add_row(row.method + (" (?)" if row.unverified else ""), checked, _num(row.size, "d"),
                      _num(row.tau, ".3f"),
                      "-" if row.speedup is None else f"{row.speedup:.2f}x", _num(row.draft_ms, ".2f"),
                      *(_num(mem.get(k), ".2f") for k in ("target", "drafter", "kv", "total")), escape(paper),
                      escape(row.why_not), style="bold green" if row is pick else None)
    out.print(table)
    if result.random_weights:
        console.print("[yellow]note[/] a plan rests on the model's shape only: no weights were loaded, and the "
                      "acceptance is the papers' (or the named folder's), not this model's")
    for note in result.notes:
        console.print(f"[yellow]note[/] {escape(note)}")
    where = escape(str(result.out / "plan.yaml"))
    best = f"Best predicted: {pick.method} ({pick.speedup:.2f}x, tree {pick.size}" + (
        ", on acceptance recalled and not checked: no row has checked acceptance)" if pick.unverified else ")") \
        if pick else "No method planned"
    if any(r.unverified for r in result.rows):
        console.print("[yellow]note[/] rows marked (?) / UNVERIFIED rest on acceptance recalled from a paper and not "
                      "checked against its table: they rank below every checked row")
    console.print(f"{best}. Wrote {where} and the trees under {escape(str(result.out / 'trees'))}.")
