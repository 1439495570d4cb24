"""`specbench estimate`: per-rank accuracy of a method's guesses (for build-tree), or EMS-SD's padding model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import SpecbenchError, did_you_mean
from ..progress import console, out
from .app import app
from .placement_options import DeviceMap, MaxMemory, target_placement
from .parse import float_list, int_list, prompt_limit


@app.command()
def estimate(
    method: Annotated[str, typer.Option(help="Method whose guesses are scored: ppd, medusa, hidden-transfer, eagle "
                                             "or parallelspec; or a chain method (pld, sd, pearl), whose acceptance "
                                             "per draft position is counted while it decodes the prompts.")] = "ppd",
    model: Annotated[str, typer.Option(help="Model spec.")] = "smollm2-135m",
    data: Annotated[str, typer.Option("--dataset", metavar="DATASET", help="Validation prompts (held out of "
                                                                         "training).")]
    = "alpaca-eval",
    limit: Annotated[str, typer.Option(help="Prompts scored: the first N, or all.")] = "50",
    new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Greedy reference length per prompt.")] = 64,
    artifact: Annotated[Optional[str], typer.Option(show_default="the shipped one", help="The method's artefact "
                                                    "folder; ppd also takes untrained[:S] for random real-token "
                                                    "embeddings, eagle and medusa the authors' released "
                                                    "checkpoints (docs/methods.md).")] = None,
    initial: Annotated[bool, typer.Option(help="Score the artefact's initial (untrained) embeddings.")] = False,
    drafter: Annotated[Optional[str], typer.Option("--drafter", show_default="the shipped one", help="sd and pearl: "
                                                   "the drafter (a model spec or a `specbench train drafter` "
                                                   "folder).")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    data_file: Annotated[Optional[str], typer.Option(show_default="the set's own", help="Read the named --dataset "
                                                     "from this file.")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", show_default="acceptance/<model>/<method>.yaml; with "
                        "--padding none", help="Acceptance YAML; with --padding, a CSV of the model's table "
                        "(--run's comparison goes beside it as <name>-measured.csv).")] = None,
    padding: Annotated[bool, typer.Option("--padding", help="Instead: EMS-SD's padding model (Appendix B), the "
                                                            "share of KV entries the padded way of batching wastes "
                                                            "per step, by accuracy p and batch size B. Loads no "
                                                            "model.")] = False,
    accuracy: Annotated[str, typer.Option(metavar="P[,P...]", help="--padding: next-token prediction accuracies p, "
                                                                   "each in (0, 1).")] = "0.5,0.6,0.7,0.8,0.9",
    batch_sizes: Annotated[str, typer.Option("--batch-size", metavar="B[,B...]", help="--padding: batch sizes B.")]
    = "1,2,4,8,16,24",
    max_accept: Annotated[int, typer.Option(help="--padding: maximum acceptance length K = draft length + 1 (the "
                                                 "paper's Figure 7 uses 8).")] = 8,
    run: Annotated[Optional[Path], typer.Option(metavar="DIR", show_default="none", help="--padding: also put the "
                                                "measured KV padding ratio of this run's padded batches beside the "
                                                "model's.")] = None,
):
    """Top-k accuracy of the method's guesses per token distance (PPD Table 2), for `build-tree`; with --padding,
    EMS-SD's padding model instead."""
    if padding:
        _estimate_padding(accuracy, batch_sizes, max_accept, run, out_path)
        return
    from ..core.model.load import load_model
    from .. import families
    from ..planning import acceptance

    scored = [f.name for f in families.FAMILIES.values() if f.scorer]  # the tree families (ppd, medusa, ...)
    if method not in scored and families.find(method) is not None and families.get(method).kind != "baseline":
        _estimate_chain(method, model, data, prompt_limit(limit), new_tokens, data_file, dtype, device, device_map,
                        max_memory, drafter, out_path)
        return
    if method not in scored:
        chains = [f.name for f in families.FAMILIES.values() if not f.scorer and f.kind != "baseline"]
        raise SpecbenchError(f"--method {method}: nothing to estimate{did_you_mean(method, scored + chains)}; choose "
                             f"one of {', '.join(scored)} (tree methods), {', '.join(chains)} (chain methods) or "
                             "--padding")
    limit = prompt_limit(limit)
    if new_tokens < 3:
        raise SpecbenchError(f"--max-new-tokens must be at least 3 (got {new_tokens})")
    family = families.get(method)
    if initial and not family.has_initial:
        raise SpecbenchError(f"--initial scores ppd's untrained prompt tokens; {method} has no initial artefact "
                             "(its untrained heads / projections / drafter repeat the next-token guess or less)")
    target = load_model(model, dtype, device, placement=target_placement(device_map, max_memory))
    scorer = families.load(family.scorer)(target, artifact, initial)
    result = acceptance.estimate_with(target, scorer.ranks, scorer.rows, data, limit, new_tokens, data_file, method,
                                      scorer.source, scorer.extra)
    source = scorer.source
    from ..core import store

    path = out_path or store.filed(acceptance.default_path(model, method + ("-initial" if initial else "")))
    acceptance.write(result, path)
    table = Table(title=f"{method} accuracy, {target.spec} {result['dtype']} ({source}), "
                        f"{result['prompts']} {data} prompts")
    table.add_column("distance", justify="left")
    for k in (1, 2, 3, 5, 10):
        table.add_column(f"top-{k}", justify="right")
    for d, row in enumerate(result["topk_accuracy"]):
        table.add_row(f"@{d + 1}", *(f"{row[k - 1]:.3f}" for k in (1, 2, 3, 5, 10)))
    out.print(table)
    console.print(f"Wrote {escape(store.said_where(path))} ({sum(result['positions'])} scored guesses, "
                  f"{result['seconds']:.0f} s)")


def _estimate_chain(method, model, data, limit, new_tokens, data_file, dtype, device, device_map, max_memory,
                    drafter_spec, out_path) -> None:
    """A chain method's acceptance per draft position (run/chain_estimate.py), its YAML and speculation profile."""
    from ..core import store
    from ..core.model.load import load_model
    from ..methods.sd.drafter import resolve_drafter
    from ..planning import acceptance
    from ..run import chain_estimate

    target = load_model(model, dtype, device, placement=target_placement(device_map, max_memory))
    drafter = resolve_drafter(drafter_spec, target, dtype, device) if drafter_spec else None
    result = chain_estimate.estimate(target, method, data, limit, new_tokens, data_file, drafter)
    path = out_path or store.filed(acceptance.default_path(model, method))
    acceptance.write(result, path)
    profile = chain_estimate.write_profile(result, path)
    table = Table(title=f"{method} acceptance per draft position, {target.spec} {result['dtype']}, "
                        f"{result['prompts']} {data} prompts")
    for col in ("position", "conditional", "marginal", "drafted"):
        table.add_column(col, justify="right")
    for i, (c, m) in enumerate(zip(result["conditional"], result["marginal"])):
        table.add_row(str(i + 1), f"{c:.3f}", f"{m:.3f}", str(result["drafted_per_position"][i]))
    out.print(table)
    if result.get("shapes"):  # lookahead: tokens per step of each shape of its grid, which its sizing reads
        shapes = Table(title=f"{method} tokens per decode step by shape (W, N, G)")
        for col in ("W", "N", "G", "tokens per step", "mean forward width"):
            shapes.add_column(col, justify="right")
        for r in result["shapes"]:
            shapes.add_row(str(r["window"]), str(r["ngram"]), str(r["guesses"]), f"{r['tokens_per_step']:.3f}",
                           f"{r['mean_width']:.1f}")
        out.print(shapes)
    console.print(f"tokens per decode step {result['mean_per_step']:.3f} (every step pooled; per request "
                  f"{result['mean_per_request']:.3f}). Wrote {escape(store.said_where(path))} and "
                  f"{escape(str(profile))} (speculation_profile.json)")


def _estimate_padding(accuracy: str, batch_sizes: str, max_accept: int, run: Optional[Path],
                      out_path: Optional[Path]) -> None:
    """`estimate --padding`: the model's table for the grid, and with --run the measured one beside it."""
    import pandas as pd

    from ..planning import padding_model as pm
    from ..report.run_report import read_records

    ps, batches = float_list(accuracy, "--accuracy"), int_list(batch_sizes, "--batch-size")
    # p = 0 or 1 is a batch that never or always accepts everything: no padding to model
    if bad := [p for p in ps if not 0 < p < 1]:
        raise SpecbenchError(f"--accuracy: each p must be strictly between 0 and 1 (got {bad[0]:g})")
    if bad := [b for b in batches if b < 1]:
        raise SpecbenchError(f"--batch-size: each batch size must be at least 1 (got {bad[0]})")
    if max_accept < 1:
        raise SpecbenchError(f"--max-accept must be at least 1 (got {max_accept})")
    records = read_records(run) if run is not None else None  # a folder without records.csv is refused up front
    rows = pm.table(ps, batches, max_accept)
    table = Table(title=f"EMS-SD padding model (Appendix B), K = {max_accept}",
                  caption="R = E[P] / E[M]: share of the KV entries written per step that are padding (<= 100%); "
                          "R_acc = E[P] / E[A]: padding per accepted token, the form of EMS-SD's measured ratios "
                          "(can pass 100%)")
    for col in ("p", "B", "E[A]", "E[M]", "E[P]", "R", "R_acc"):
        table.add_column(escape(col), justify="right")
    for r in rows:
        table.add_row(f"{r['p']:g}", str(r["B"]), f"{r['E[A]']:.2f}", f"{r['E[M]']:.2f}", f"{r['E[P]']:.2f}",
                      f"{r['R']:.1%}", f"{r['R_acc']:.1%}")
    out.print(table)
    frames = {out_path: pd.DataFrame(rows)}
    if records is not None:
        frame = pm.measured(records)
        _print_measured(frame, run)
        if out_path is not None:
            frames[out_path.with_name(f"{out_path.stem}-measured.csv")] = frame
    if out_path is not None:
        for path, frame in frames.items():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                frame.to_csv(path, index=False)
            except OSError as exc:
                raise SpecbenchError(f"cannot write {path}: {exc.strerror or exc}") from exc
        console.print(f"Wrote {escape(', '.join(str(p) for p in frames))}")


def _print_measured(frame, run: Path) -> None:
    """The measured-vs-model table of a run, or a note that it has no padded batches."""
    if frame.empty:
        console.print(f"[yellow]note[/] {escape(str(run))}: no padded batches (batch size > 1, --batching padded) "
                      "in its records")
        return
    table = Table(title=f"measured vs model KV padding ratio, {escape(str(run))}")
    for col in ("method", "dataset", "B", "tau", "K", "p", "R measured", "R model", "R_acc measured", "R_acc model"):
        table.add_column(col, justify="left" if col in ("method", "dataset") else "right")

    def fmt(v, spec):
        return "-" if math.isnan(float(v)) else spec.format(v)  # NaN: K unknown or tau outside [1, K]

    for r in frame.itertuples(index=False):
        table.add_row(escape(str(r.method)), escape(str(r.dataset)), str(r.batch_size), fmt(r.tau, "{:.2f}"),
                      fmt(r.K, "{:.0f}"), fmt(r.p, "{:.3f}"), fmt(r.R_measured, "{:.1%}"), fmt(r.R_model, "{:.1%}"),
                      fmt(r.R_acc_measured, "{:.1%}"), fmt(r.R_acc_model, "{:.1%}"))
    out.print(table)
