"""`specbench map`: where each method pays. A batch-size sweep of `run` (specbench's own batched engine, EMS-SD's
unpadded mode; under --compile the static engine, padded to one shape a step) with this machine's L(B, w) measured
just before it and, after it, on the run's own engines at the widths its grid verified (planning/spot_profile.py),
and the map drawn from both: predicted beside measured throughput per batch size, the break-even batch size per
method, the best setting per batch size (report/map_table.py, map_report.py). Under --compile the prediction reads
the compiled profile filed for this hardware instead."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..errors import SpecbenchError
from ..progress import console
from .app import app
from .method_flags import WithMethodOptions, given_method_options
from .parse import int_list, prompt_limit, tree_size_list
from .run import _check_methods

PROFILE_CHOICES = ("fresh", "stored")
SERVER = "Servers (--engine openai)"


@app.command(name="map", cls=WithMethodOptions)
def map_(
    ctx: typer.Context,
    method: Annotated[list[str], typer.Option("--method", "-m", help="Method to map (repeatable); `ar` runs at "
                      "every batch size as the baseline.")] = ["pld", "sd"],
    batch_size: Annotated[str, typer.Option("--batch-size", "-b", metavar="B[,B...]", help="The batch sizes of the "
                          "grid (at least two).")] = "1,2,4,8",
    dataset: Annotated[list[str], typer.Option("--dataset", "-d", help="Dataset name or a .jsonl file "
                                                                       "(repeatable).")] = ["gsm8k"],
    model: Annotated[str, typer.Option(help="smollm2-135m, HF id, local dir, .gguf file, random:<preset>")]
    = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    limit: Annotated[Optional[str], typer.Option(show_default="the largest batch size (at least 4)",
                                                 help="Prompts per dataset: the first N, or all.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Cap on new tokens per turn.")] = 64,
    context: Annotated[Optional[str], typer.Option(metavar="C[,C...]", show_default="the prompts as they are",
                       help="Context lengths in tokens: each prompt is lengthened to about C tokens with the set's "
                            "other records before it (a dataset labelled <name>-ctx<C> per length), so the map "
                            "covers long contexts too.")] = None,
    tree_sizes: Annotated[Optional[str], typer.Option(metavar="N[,N...]", show_default="none", help="Tree methods: "
                          "map these sizes too, labelled <method>@<size> (`auto`: the method's own choice per "
                          "batch size).")] = None,
    profile: Annotated[str, typer.Option(metavar="fresh|stored", help="fresh: measure L(B, w) at the grid's batch "
                       "sizes just before the run (kept in the run folder as latency_profile.yaml), so the "
                       "prediction and the run share the machine's state; stored: the profile filed for this "
                       "hardware (`specbench profile --batch-size`).")] = "fresh",
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up generations per method.")] = 1,
    retime: Annotated[int, typer.Option(metavar="N", help="Re-time a disturbed prompt turn up to N times (as "
                      "`run --retime`).", envvar="SPECBENCH_RETIME")] = 2,
    threads: Annotated[Optional[int], typer.Option(show_default="torch's choice", help="torch CPU threads.")] = None,
    compile: Annotated[bool, typer.Option("--compile", help="Run the methods compiled (as `run --compile`: a batch "
                       "padded to one static shape a step); the prediction reads the compiled profile filed for this "
                       "hardware (with --profile fresh given, the grid's batch sizes it lacks are measured first: "
                       "every shape compiled, minutes each on a CPU).")] = False,
    allow_disturbed_profile: Annotated[bool, typer.Option("--allow-disturbed-profile", help="Let the run use "
                                       "profiles and trees measured on a disturbed machine.")] = False,
    out_dir: Annotated[Optional[Path], typer.Option("--out", show_default="results/<time>", help="Run folder.")]
    = None,
    engine: Annotated[str, typer.Option(metavar="NAME", rich_help_panel=SERVER, help="specbench (its own batched "
                      "engine) or openai: two OpenAI-compatible servers, speculation on (--base-url) against off "
                      "(--baseline-url), mapped over --concurrency (measured only: no latency curve of a server is "
                      "profiled here).")] = "specbench",
    base_url: Annotated[Optional[str], typer.Option(metavar="URL", rich_help_panel=SERVER, show_default="none",
                        help="--engine openai: the server with speculation on.")] = None,
    baseline_url: Annotated[Optional[str], typer.Option(metavar="URL", rich_help_panel=SERVER, show_default="none",
                            help="--engine openai: the same model served with speculation off.")] = None,
    served_model: Annotated[Optional[str], typer.Option(metavar="NAME", rich_help_panel=SERVER, show_default="the "
                            "server's first model", help="--engine openai: the model name to request.")] = None,
    concurrency: Annotated[str, typer.Option(metavar="N[,N...]", rich_help_panel=SERVER, help="--engine openai: "
                           "requests in flight, the grid of a server's map.")] = "1,4,16",
    resume: Annotated[bool, typer.Option(help="Continue an interrupted map in --out.")] = False,
    # and one option per method option (methods/options.py), as for `run`
):
    """Where each method pays: throughput and per-user tokens/s against batch size, predicted from L(B, w) beside
    measured, and the batch size where each method stops beating [bold]ar[/] (map.csv, map.png, report.md)."""
    if engine not in ("specbench", "openai"):
        raise SpecbenchError(f"--engine {engine}: map runs specbench's own batched engine or openai servers "
                             "(llama.cpp in process decodes one prompt at a time: no grid to map)")
    if engine == "openai":
        return _map_servers(ctx, base_url, baseline_url, served_model, concurrency, dataset, limit, max_new_tokens,
                            seed, out_dir, resume)
    sizes = sorted(set(int_list(batch_size, "--batch-size")))
    if len(sizes) < 2 or sizes[0] < 1:
        raise SpecbenchError(f"--batch-size: a map needs at least two batch sizes >= 1 (got {batch_size}), e.g. "
                             "--batch-size 1,2,4,8")
    if profile not in PROFILE_CHOICES:
        raise SpecbenchError(f"--profile {profile}: choose fresh or stored")
    # under --compile the prediction reads the compiled profile filed for this hardware: measured now, at the grid's
    # batch sizes it lacks, only when --profile fresh is given (every shape compiled first: minutes each on a CPU)
    measure_compiled = compile and profile == "fresh" and \
        getattr(ctx.get_parameter_source("profile"), "name", "DEFAULT") != "DEFAULT"
    prompts = prompt_limit(limit) if limit is not None else max(4, sizes[-1])
    methods = [m for m in method if m != "ar"]
    _check_methods(methods)
    if not methods:
        raise SpecbenchError("--method: name at least one method besides ar (ar runs at every batch size anyway)")
    from ..report.run_report import write_run_report
    from ..run.benchmark import run as run_benchmark
    from ..run.config import RunConfig, default_out
    from .run import file_host_work

    out_dir = out_dir or default_out()
    contexts = sorted(set(int_list(context, "--context"))) if context else []
    datasets = _context_datasets(dataset, contexts, prompts, out_dir) if contexts else list(dataset)
    cfg = RunConfig(methods=("ar", *methods), datasets=tuple(datasets), model=model, dtype=dtype, device=device,
                    limit=prompts, max_new_tokens=max_new_tokens, seed=seed, warmup=warmup, retime=retime,
                    threads=threads, out=out_dir, resume=resume,
                    tree_sizes=tree_size_list(tree_sizes) if tree_sizes else (), batch_sizes=tuple(sizes),
                    # under --compile a batch runs the static engine, padded to one shape a step (as `run --compile`)
                    batching="padded" if compile else "unpadded", options=given_method_options(ctx), compile=compile,
                    allow_disturbed_profile=allow_disturbed_profile)
    if compile:
        from ..run.own_methods import check

        check(cfg)  # what the run would refuse, refused before the compiled profile's model loads
        _compiled_profile(cfg, sizes, measure_compiled)
    elif profile == "fresh" and not (resume and (out_dir / "latency_profile.yaml").exists()):
        _fresh_profile(cfg, out_dir, sizes, [128, 512, *contexts])
    run_dir = run_benchmark(cfg)
    if not compile:  # a compiled run's steps are the stored compiled profile's: no eager engine stands in for them
        _step_profile(cfg, Path(run_dir))
    file_host_work(Path(run_dir), write_run_report(run_dir))
    _print_map(run_dir)


def _map_servers(ctx, base_url, baseline_url, served_model, concurrency: str, datasets: list[str], limit,
                 max_new_tokens: int, seed: int, out_dir: Path | None, resume: bool) -> None:
    """The map of two servers over concurrency levels: speculation on against off at each level, the break-even
    level (measured only)."""
    from ..backends.openai_options import parse_concurrency
    from ..report.run_report import write_run_report
    from ..run.benchmark import run as run_benchmark
    from ..run.config import RunConfig, default_out

    if not base_url or not baseline_url:
        raise SpecbenchError("map --engine openai needs --base-url (speculation on) and --baseline-url (the same "
                             "model with speculation off): a break-even is a comparison")
    given = [f"--{n.replace('_', '-')}" for n in ("batch_size", "context", "tree_sizes", "compile")
             if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"]
    if given:
        raise SpecbenchError(f"{', '.join(given)}: not options of a server's map (the servers decide how they "
                             "batch and decode); --concurrency sets its grid")
    levels = parse_concurrency(concurrency)
    if len(levels) < 2:
        raise SpecbenchError(f"--concurrency {concurrency}: a map needs at least two levels, e.g. 1,4,16")
    prompts = prompt_limit(limit) if limit is not None else max(4, max(levels))
    cfg = RunConfig(methods=("ar",), datasets=tuple(datasets), limit=prompts, max_new_tokens=max_new_tokens,
                    seed=seed, out=out_dir or default_out(), resume=resume, engine="openai",
                    engine_options={k: v for k, v in dict(base_url=base_url, baseline_url=baseline_url,
                                                          served_model=served_model,
                                                          concurrency=concurrency).items() if v is not None})
    run_dir = run_benchmark(cfg)
    write_run_report(run_dir)
    _print_map(run_dir)


def _context_datasets(names: list[str], contexts: list[int], prompts: int, out_dir: Path) -> list[str]:
    """One user file per dataset and context length (OUT/contexts/<name>-ctx<C>.jsonl), its prompts lengthened
    (data/context_fill.py); the run reads them as --dataset files. Written again on --resume: same input, same text."""
    import json

    from ..data.context_fill import lengthened
    from ..data.datasets import load_prompts

    folder = out_dir / "contexts"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for name in names:
        spec, pool = load_prompts(name, prompts + 200)  # the prompts, then the material that lengthens them
        for size in contexts:
            path = folder / f"{spec.name}-ctx{size}.jsonl"
            rows = lengthened(pool[:prompts], pool, size)
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            files.append(str(path))
    return files


def _fresh_profile(cfg, out_dir: Path, sizes: list[int], kv_lengths: list[int]) -> None:
    """L(B, w) at the grid's batch sizes, measured now and kept in the run folder (not filed: a run's choices keep
    reading the profile filed for this hardware)."""
    import gc

    import torch

    from ..core.model.load import load_model
    from ..core.model.memory_need import stated_workload, profile_workload
    from ..planning.profile import measure, save
    from ..report.map_table import PROFILE_COPY

    widths, repeats = [1, 2, 3, 4, 6, 8, 12, 16, 32], 5
    kv_lengths = sorted(set(kv_lengths))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    console.print(f"Measuring L(B, w) at B = {', '.join(map(str, sizes))} for the prediction (widths up to "
                  f"{widths[-1]}, KV {', '.join(map(str, kv_lengths))}) ...")
    with stated_workload(profile_workload(widths, kv_lengths, repeats, sizes)):
        target = load_model(cfg.model, cfg.dtype, cfg.device, measured_auto=True)  # the run's dtype
    room = target.context_length - repeats - widths[-1] - 1  # the longest KV a width-32 forward can sit on
    kv_lengths = sorted({min(kv, room) for kv in kv_lengths})
    result = measure(target, widths, kv_lengths, repeats, batch_sizes=sizes)
    out_dir.mkdir(parents=True, exist_ok=True)
    save(result, out_dir / PROFILE_COPY)
    load = result.meta.get("contention") or {}
    if load.get("disturbed"):
        console.print(f"[yellow]the profile was measured while other processes used {load['foreign_cpu']:.2f} "
                      "cores: the prediction may be off; map on a quiet machine[/]")
    del target
    gc.collect()


def _compiled_profile(cfg, sizes: list[int], measure: bool) -> None:
    """--compile: the compiled profile filed for this hardware, with L(B, w) at the grid's batch sizes, which the
    prediction reads. `measure` (--profile fresh given): what it lacks is measured now and filed
    (run/compiled.ensure_compiled_profile); else the batch sizes it lacks are named, with the two ways to fill them."""
    import gc

    from ..core.model.load import load_model
    from ..run import compiled as compiled_run

    # the profile of the dtype the compiled run takes (--dtype auto reads compiled decoding's profiles), asked without
    # loading the target: its weights load only to measure what the profile lacks
    usable, missing = compiled_run.compiled_profile_gaps(cfg)
    if usable and not missing:
        console.print("[dim]--compile: the prediction reads the compiled profile filed here[/]")
    elif measure:
        target = load_model(cfg.model, cfg.dtype, cfg.device, measured_auto=True, compiled=True)
        compiled_run.ensure_compiled_profile(cfg, target, "the map's prediction")
        del target
        gc.collect()
    else:
        lacking = "no compiled profile here: the map shows measured throughput only (no prediction from an eager " \
            "curve)" if not usable else f"the compiled profile filed here has no L(B, w) at B = " \
            f"{', '.join(map(str, missing))}: the map predicts only where it has a curve"
        console.print(f"[yellow]--compile: {lacking}[/] (measured stays whole). `--profile fresh` measures it before "
                      f"the run, or `specbench profile --compile --batch-size {','.join(map(str, sizes))}` files it "
                      "for every later map (every shape compiled first: minutes each on a CPU)")


def _step_profile(cfg, run_dir: Path) -> None:
    """L(B, w) measured now, after the run, on its engines at the widths and KV lengths its grid points verified
    (planning/spot_profile.py), kept in the run folder for the prediction (report/map_table.STEP_COPY); and a
    drafter model's L_d(B, w) beside it (DRAFT_COPY) when a method of the run drafts with one."""
    import gc

    import pandas as pd
    import torch

    from ..core.model.load import load_model
    from ..core.model.memory_need import profile_workload, stated_workload
    from ..planning.spot_profile import drafter_widths, grid_widths, measure_on_the_spot
    from ..report.map_table import DRAFT_COPY, STEP_COPY, grid_needs

    path, records = run_dir / STEP_COPY, run_dir / "records.csv"
    if path.exists() or not records.exists():
        return
    needs, kvs = grid_needs(pd.read_csv(records))
    if not needs or not kvs:
        return
    widths = grid_widths(needs)
    repeats = 8
    console.print(f"Measuring the grid's steps on the run's engines: widths "
                  f"{'; '.join(f'B {b}: ' + ','.join(map(str, w)) for b, w in widths.items())} at KV "
                  f"{', '.join(map(str, kvs))} ...")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    flat = sorted({w for ws in widths.values() for w in ws})
    with stated_workload(profile_workload(flat, kvs, repeats + 4, sorted(widths))):
        target = load_model(cfg.model, cfg.dtype, cfg.device, measured_auto=True)  # as the run loads it
    result = measure_on_the_spot(target, widths, kvs, repeats=repeats)
    path.write_text(result.to_yaml())
    drafter = _run_drafter(cfg, target)
    if drafter is not None:  # a drafter model's batched drafting: its own L_d(B, w) on its own engines
        sizes = ", ".join(map(str, sorted(widths)))
        console.print(f"Measuring the drafter's forwards on its engines at B = {sizes} ...")
        drafted = measure_on_the_spot(drafter, drafter_widths(sorted(widths)), kvs, repeats=repeats, pick=True)
        (run_dir / DRAFT_COPY).write_text(drafted.to_yaml())
    load = result.meta.get("contention") or {}
    if load.get("disturbed"):
        console.print(f"[yellow]the grid's steps were measured while other processes used "
                      f"{load['foreign_cpu']:.2f} cores: the prediction may be off; map on a quiet machine[/]")
    del target, drafter
    gc.collect()


def _run_drafter(cfg, target):
    """The drafter model the run's draft-model methods decoded with (--drafter, else the target's shipped one), or
    None when no method of the run drafts with one."""
    from ..methods import get_method
    from ..methods.sd.drafter import default_drafter, resolve_drafter

    if not any("drafter" in get_method(m).needs for m in cfg.methods):
        return None
    return resolve_drafter(cfg.drafter, target, cfg.dtype, cfg.device) if cfg.drafter else default_drafter(target)


def _print_map(run_dir: Path) -> None:
    """The map's table on the console (report.md has it in full)."""
    import pandas as pd
    from rich.table import Table

    from ..progress import out

    path = Path(run_dir) / "map.csv"
    if not path.exists():
        console.print(f"No map: {escape(str(run_dir))} has no rows at two batch sizes (see report.md)")
        return
    frame = pd.read_csv(path)
    table = Table(title=f"map ({run_dir})")
    for name in ("dataset", "method", "B", "setting", "predicted tok/s", "measured tok/s", "error", "steps err",
                 "step cost err", "speedup",
                 "per user tok/s", "break-even"):
        table.add_column(name, justify="left" if name in ("dataset", "method", "setting", "break-even") else "right")
    for r in frame.itertuples():
        table.add_row(r.dataset, r.method, str(r.batch_size), "" if pd.isna(r.setting) else str(r.setting),
                      _num(r.predicted_tok_s), _num(r.measured_tok_s), _num(r.error, "{:+.0%}"),
                      _num(r.steps_error, "{:+.0%}"), _num(r.step_cost_error, "{:+.0%}"),
                      _num(r.measured_speedup, "{:.2f}x"), _num(r.per_user_tok_s),
                      "" if pd.isna(r.break_even) else str(r.break_even))
    out.print(table)
    console.print(f"Reports: {escape(str(run_dir))}/map.csv, map.png, report.md (section \"Where each method pays\")")


def _num(value, pattern: str = "{:.2f}") -> str:
    import math

    return "-" if value is None or not math.isfinite(float(value)) else pattern.format(float(value))
