"""The `specbench` command line: thin wrappers that parse options into dataclasses and call one function each."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from . import __version__
from .errors import SpecbenchError
from .progress import console, out


class _ClearErrors(TyperGroup):
    """User mistakes (SpecbenchError) print one clear line and exit non-zero, without a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecbenchError as exc:
            console.print(f"[bold red]error:[/] {escape(str(exc))}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=_ClearErrors, add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    help="Benchmark speculative and parallel decoding methods on your own hardware.\n\n"
         "Start with [bold]specbench run[/] (ar vs pld on HumanEval with the embedded SmolLM2-135M).")
list_app = typer.Typer(help="List methods and datasets.", no_args_is_help=True)
app.add_typer(list_app, name="list")
train_app = typer.Typer(help="Train the small artefacts some methods need (drafters, prompt tokens, ...).",
                        no_args_is_help=True)
app.add_typer(train_app, name="train")


def _version(value: bool):
    if value:
        out.print(f"specbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False):
    pass


@app.command()
def env(device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
        key: Annotated[bool, typer.Option("--key", help="Print only the hardware key that runs, profiles and trees "
                                                        "are keyed by (for scripts: e.g. a CI artefact name).")]
        = False):
    """Print the hardware and software that results will be recorded with."""
    from .core.hardware import describe, hardware_slug
    from .core.models import resolve_device

    if key:
        print(hardware_slug(resolve_device(device)))  # plain stdout: no table, no colour, for $(specbench env --key)
        return
    table = Table(title="specbench environment", show_header=False)
    for key, value in describe(resolve_device(device)).items():
        table.add_row(key, str(value))
    out.print(table)


@list_app.command("methods")
def list_methods():
    """Decoding methods: name, kind, what they need, lossless or lossy, whether they decode batches."""
    from .methods import REGISTRY

    table = Table(title="methods")
    for col in ("name", "kind", "needs", "exactness", "batch > 1", "what it does", "options (specbench run)"):
        table.add_column(col)
    for name, cls in REGISTRY.items():
        options = "\n".join(f"{o.flag} {cls.unset_text.get(o.name, o.default_text)}" for o in cls.option_specs)
        table.add_row(name, cls.kind, " + ".join(cls.needs), "lossless" if cls.lossless else "lossy",
                      "padded, unpadded" if cls.batchable else "-", cls.summary, options or "-")
    out.print(table)


@list_app.command("datasets")
def list_datasets():
    """Benchmark datasets: where each is found and how many prompts it has."""
    from .data import datasets as ds

    table = Table(title="datasets")
    for col in ("name", "description", "sources (in the order tried)"):
        table.add_column(col)
    for name in ds.dataset_names():
        spec = ds.get_spec(name)
        sources = "\n".join(f"{place}: {state}" for place, state in ds.describe_sources(spec))
        table.add_row(name, spec.description, sources)
    from .data.trainsets import SOURCES

    for name, (description, _) in SOURCES.items():
        table.add_row(name, f"{description} (training only: `train --data`)", "built in, offline")
    out.print(table)


def _with_method_options(func):
    """Give `func` one CLI option per method option the registered methods declare (methods/options.py), after
    its own parameters; Typer reads the signature, and the values arrive in `func`'s **kwargs."""
    import inspect

    from .methods import REGISTRY, all_options

    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    extra = []
    for name, (spec, methods) in all_options(REGISTRY).items():
        text = f"{', '.join(methods)}: {spec.help}" + (f" ({', '.join(spec.choices)})" if spec.choices else "")
        option = typer.Option(spec.flag, help=text + ".", rich_help_panel="Method options")
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=spec.default,
                                       annotation=Annotated[Optional[spec.type], option]))
    func.__signature__ = sig.replace(parameters=own + extra)
    func.__annotations__ = {**func.__annotations__, **{p.name: p.annotation for p in extra}}
    return func


@app.command()
@_with_method_options
def run(
    method: Annotated[Optional[list[str]], typer.Option("--method", "-m", help="Method to run (repeatable). "
                      "`ar` always runs too, as the baseline.")] = None,
    dataset: Annotated[Optional[list[str]], typer.Option("--dataset", "-d", help="Dataset name or a .jsonl "
                       "file (repeatable).")] = None,
    model: Annotated[str, typer.Option(help="smollm2-135m, HF id, local dir, .gguf file, random:<preset>")]
    = "smollm2-135m",
    drafter: Annotated[Optional[str], typer.Option(help="Draft model, for methods that need one.")] = None,
    dtype: Annotated[str, typer.Option(help="auto (bfloat16 on GPU; on CPU the faster dtype by this CPU's "
                                            "profiles, float32 without them), float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    limit: Annotated[int, typer.Option(help="Prompts per dataset (the first N).")] = 6,
    per_category: Annotated[bool, typer.Option(help="--limit takes the first N of every category (files with a "
                                                    "`category` field: MT-Bench, Spec-Bench question files).")]
    = False,
    max_new_tokens: Annotated[int, typer.Option(help="Cap on new tokens per turn.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy (checks lossless methods against ar).")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (temperature > 0).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Top-k sampling, 0 = off (temperature > 0).")] = 0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up generations per method.")] = 1,
    repeats: Annotated[int, typer.Option(help="Timed generations per prompt turn; the median time is "
                                              "recorded (use 3 on a noisy machine).")] = 1,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Run folder (default results/<time>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run in --out (default: the newest "
                                              "folder in results/).")] = False,
    tree_sizes: Annotated[Optional[str], typer.Option(help="Tree methods: sweep these sizes in one run "
                                                           "(e.g. 4,8,16,32,64).")] = None,
    batch_size: Annotated[Optional[list[str]], typer.Option("--batch-size", "-b", metavar="B[,B...]", help="Prompts decoded at once "
                          "(repeatable or a comma list, e.g. 1,2,4,8,16); ar runs batched at each size as that size's "
                          "baseline. Default 1: one prompt at a time.", rich_help_panel="Batching (EMS-SD)")] = None,
    batching: Annotated[str, typer.Option(metavar="MODE", help="At batch size > 1: unpadded (EMS-SD: per-sample KV lengths, packed "
                                               "inputs), padded (the vanilla way) or both, side by side.",
                                          rich_help_panel="Batching (EMS-SD)")] = "both",
    refill: Annotated[bool, typer.Option(help="At batch size > 1: a finished sample's slot takes the next prompt "
                                              "at once (continuous batching) instead of waiting for the batch.",
                                         rich_help_panel="Batching (EMS-SD)")] = False,
    **method_options,  # one option per method option (methods/options.py), added by _with_method_options
):
    """Benchmark methods side by side against [bold]ar[/] and write records.csv, summary.csv, report.md, plots."""
    from .bench.report import write_run_report
    from .bench.runner import RunConfig, default_out
    from .bench.runner import run as run_benchmark

    if out_dir is None:
        out_dir = _newest_run() if resume else default_out()
    cfg = RunConfig(
        methods=tuple(method or ("ar", "pld")), datasets=tuple(dataset or ("humaneval",)), model=model,
        drafter=drafter, dtype=dtype, device=device, limit=limit, per_category=per_category,
        max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, warmup=warmup, repeats=repeats,
        threads=threads,
        data_file=data_file, out=out_dir, resume=resume,
        tree_sizes=tuple(_int_list(tree_sizes, "--tree-sizes")) if tree_sizes else (),
        batch_sizes=tuple(dict.fromkeys(b for text in batch_size for b in _int_list(text, "--batch-size")))
        if batch_size else (1,), batching=batching, refill=refill,
        options=method_options)
    try:
        run_dir = run_benchmark(cfg)
    except SpecbenchError as exc:
        if getattr(exc, "kept", 0):
            write_run_report(exc.out)  # partial summary of what finished (marked partial)
        raise
    summary = write_run_report(run_dir)
    _print_summary(summary, f"results ({run_dir})")
    _warn_unexplained([run_dir])
    console.print(f"Reports: {escape(str(run_dir))}/records.csv, summary.csv, report.md, speedup.png, "
                  "tokens_per_s.png, tau.png")


def _newest_run() -> Path:
    from .bench.runner import default_out

    runs = sorted(p for p in default_out().parent.glob("*") if (p / "run.yaml").exists())
    if not runs:
        raise SpecbenchError("--resume: no earlier run in results/; pass --out with the run folder.")
    return runs[-1]


def _print_summary(summary, title: str) -> None:
    from .bench.noise import is_disturbed
    from .bench.report import row_name

    batched = "batch_size" in summary and (summary.batch_size.fillna(1) > 1).any()
    table = Table(title=title)
    for col in ("method", "dataset", "prompts", "tok/s", "speedup vs ar", "mean ratio", "tau", "accept",
                "lossless") + (("padding", "tau min") if batched else ()) + ("timing",):
        table.add_column(col, justify="left" if col in ("method", "dataset", "timing") else "right")

    def fmt(v, spec="{:.2f}"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)

    for r in summary.itertuples(index=False):
        explained = getattr(r, "lossless_explained_rate", math.nan)
        loss = fmt(r.lossless_rate, "{:.0%}") + ("" if r.exactness != "lossy" else " (lossy)")
        if not (isinstance(explained, float) and math.isnan(explained)) and explained != r.lossless_rate:
            loss += f" ({explained:.0%} explained)"
        timing = str(getattr(r, "timing", "") or "")
        batch = (fmt(r.padding_ratio, "{:.0%}"), fmt(r.tau_batch_min)) if batched else ()
        table.add_row(escape(row_name(r)), r.dataset, str(r.prompts), fmt(r.tokens_per_s), fmt(r.speedup, "{:.2f}x"),
                      fmt(r.speedup_mean, "{:.2f}x"), fmt(r.tau), fmt(r.acceptance_rate), loss, *batch,
                      "[bold red]DISTURBED[/]" if is_disturbed(timing) else timing)
    out.print(table)
    _warn_disturbed(summary)


def _warn_unexplained(run_dirs) -> None:
    """Say loudly when a lossless method differs from ar where the dtype's rounding does not explain it."""
    from .bench.report import read_records, unexplained_mismatches

    for run_dir in run_dirs:
        bad = unexplained_mismatches(read_records(run_dir))
        if len(bad):
            console.print(f"[bold red]lossless check FAILED[/] in {escape(str(run_dir))}: {len(bad)} prompt turn(s) "
                          "differ from ar beyond rounding (a defect, not numerics):")
            for r in bad.head(10).itertuples(index=False):
                console.print(f"  {escape(r.method)} {escape(r.dataset)} prompt {escape(r.prompt_id)} turn {r.turn}: "
                              f"first difference at token {r.index}, logit gap {r.gap} ({r.verdict})")


def _warn_disturbed(summary) -> None:
    """Say loudly which rows the noise guard distrusts, why, and what to do."""
    from .bench.noise import ADVICE
    from .bench.report import disturbed, row_name

    bad = disturbed(summary)
    if len(bad):
        console.print("[bold red]timing disturbed[/]: these speedups are not trustworthy:")
        for r in bad.itertuples(index=False):
            console.print(f"  {escape(row_name(r))} on {escape(r.dataset)}: "
                          f"{escape(r.timing.removeprefix('disturbed: '))}")
        console.print(f"  Advice: {ADVICE}.")


def _int_list(text: str, option: str) -> list[int]:
    return _number_list(text, option, int, "integers")


def _float_list(text: str, option: str) -> list[float]:
    return _number_list(text, option, float, "numbers")


def _number_list(text: str, option: str, kind, what: str) -> list:
    """A comma-separated option value as numbers of `kind`; a clear error names the option."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecbenchError(f"{option}: expected comma-separated {what}, got {text!r}") from None
    if not values:
        raise SpecbenchError(f"{option}: give at least one value")
    return values


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

    from .core.models import load_model
    from .hwtrees.profile import default_path, measure, plot

    width_list, kv_list = _int_list(widths, "--widths"), _int_list(kv_lengths, "--kv-lengths")
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
    import time

    from .core.hardware import hardware_slug
    from .core.models import model_config, model_slug, resolve_device
    from .hwtrees.acceptance import read_per_rank
    from .hwtrees.buildtree import plot, size_curve, tree_file
    from .hwtrees.latency_estimate import GPU_CHOICES, resolve_profile

    start = time.perf_counter()
    if gpu not in GPU_CHOICES and not gpu.endswith((".yaml", ".yml")):
        raise SpecbenchError(f"unknown --gpu {gpu!r}: use one of {', '.join(GPU_CHOICES)} or a profile .yaml path")
    from .core.models import auto_cpu_dtype

    cpu_auto = str(auto_cpu_dtype(model)[0]).removeprefix("torch.") if gpu == "cpu" else "bfloat16"
    dtype_name = {"auto": cpu_auto, "fp32": "float32", "bf16": "bfloat16",
                  "fp16": "float16"}.get(dtype, dtype)
    if dtype_name not in ("float32", "bfloat16", "float16"):
        raise SpecbenchError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    from .core.tree import locate

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
        from .hwtrees.buildtree import candidate_curve, candidate_tree_file

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
                  f"{time.perf_counter() - start:.1f} s.")
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
    from .hwtrees.acceptance import draft_cost

    cost = draft_cost(method, path)
    if cost is None and method in ("eagle", "parallelspec"):
        console.print(f"[yellow]note[/] {escape(str(path))} has no draft_forward_ms: the drafter's cost is left "
                      f"out of the prediction (re-run `specbench estimate --method {method}`)")
    return cost


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="Run folders written by `specbench run` (with --history: runs of "
                                                    "successive commits, oldest first).")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Where a comparison of several runs goes (default "
                                                    "specbench-report/); with --baseline, the vs_baseline files "
                                                    "(default: the run folder); with --history, history.csv and "
                                                    ".png (default specbench-history/).")] = None,
    fail_below: Annotated[Optional[float], typer.Option(help="Exit 1 when a method's speedup is below this (or a "
                                                             "lossless method differs from ar beyond rounding); exit "
                                                             "3 (not judged) when the noise guard marks timings "
                                                             "disturbed.")] = None,
    judge_disturbed: Annotated[bool, typer.Option(help="With --fail-below / --fail-regression: judge disturbed "
                                                       "timings anyway (they are still listed).")] = False,
    baseline: Annotated[Optional[Path], typer.Option(help="Compare with this earlier run (its folder or summary.csv, "
                                                          "e.g. the last main-branch run): change in speedup, tau, "
                                                          "acceptance and lossless rate per method x dataset. "
                                                          "Refused when hardware, model, dtype or settings "
                                                          "differ.")] = None,
    fail_regression: Annotated[Optional[str], typer.Option(metavar="PCT", help="With --baseline: exit 1 when a "
                                                           "speedup or tau fell by more than PCT percent of the "
                                                           "baseline's, or a lossless rate fell. Default: off.")]
    = None,
    allow_different: Annotated[bool, typer.Option(help="Compare with a baseline from other hardware, model, dtype or "
                                                       "settings anyway (the report says so).")] = False,
    junit: Annotated[Optional[Path], typer.Option(help="Write JUnit XML: one test case per method x dataset check "
                                                       "(lossless, floor, regression); not judged = skipped.")]
    = None,
    job_summary: Annotated[Optional[Path], typer.Option(help="Append the Markdown report to this file (default: "
                                                             "$GITHUB_STEP_SUMMARY when set).")] = None,
    artifact_url: Annotated[Optional[str], typer.Option(help="Job summary: link plots as URL/<path> (GitLab: "
                                                             "$CI_JOB_URL/artifacts/file). Default on GitHub "
                                                             "Actions: the run's artefacts.")] = None,
    history: Annotated[bool, typer.Option("--history", help="Draw speedup and tau per method over the runs "
                                                            "(successive commits) as history.png and history.csv "
                                                            "in --out.")] = False,
):
    """Re-draw tables and plots from result CSVs, compare runs, compare with a baseline, and gate CI."""
    from .bench import ci
    from .bench.report import compare_runs, write_run_report

    opts = ci.CiOptions(baseline=baseline, fail_below=fail_below, fail_regression=ci.parse_percent(fail_regression),
                        judge_disturbed=judge_disturbed, allow_different=allow_different, junit=junit,
                        job_summary=job_summary, artifact_url=artifact_url)
    old = ci.prepare(opts, runs, history)  # bad input is refused before any work
    if history:
        from .bench.history import write

        frame, paths, notes = write(runs, out_dir or Path("specbench-history"))
        _print_history(frame)
        for note in notes:
            console.print(f"[yellow]note[/] {escape(note)}")
        console.print(f"Wrote {escape(', '.join(str(p) for p in paths))}")
        return
    if len(runs) == 1:
        summary = write_run_report(runs[0])
        _print_summary(summary, str(runs[0]))
        _warn_unexplained(runs)
        console.print(f"Wrote {escape(str(runs[0]))}/summary.csv, report.md and plots.")
    else:
        out_dir = out_dir or Path("specbench-report")
        summary = compare_runs(runs, out_dir)
        summary["method"] = summary.run + ":" + summary.method
        _print_summary(summary, "comparison")
        _warn_unexplained(runs)
        console.print(f"Wrote {escape(str(out_dir))}/comparison.csv, summary.md and plots.")
    code = ci.judge(summary, runs, out_dir or runs[0], opts, old)
    if code:
        raise typer.Exit(code)


def _print_history(frame) -> None:
    from .bench.noise import is_disturbed

    table = Table(title="history (oldest first)")
    for col in ("commit", "method", "dataset", "speedup", "tau", "timing"):
        table.add_column(col, justify="right" if col in ("speedup", "tau") else "left")
    for r in frame[frame.method != "ar"].itertuples(index=False):
        table.add_row(escape(r.commit), escape(r.method), escape(r.dataset), f"{r.speedup:.2f}x", f"{r.tau:.2f}",
                      "[bold red]DISTURBED[/]" if is_disturbed(r.timing) else r.timing)
    out.print(table)


@train_app.command("ppd")
def train_ppd(
    model: Annotated[str, typer.Option(help="Model spec (the prompt tokens are trained for it).")] = "smollm2-135m",
    prompt_tokens: Annotated[int, typer.Option(help="S: prompt tokens (token distances predicted).")] = 3,
    ept: Annotated[int, typer.Option(help="Ensemble prompt tokens per prompt token.")] = 1,
    data: Annotated[str, typer.Option(help="Prompts to self-distill, comma-separated: datasets, files, or the "
                                           "training-only sources stdlib-code and word-problems.")] = "alpaca-eval",
    steps: Annotated[int, typer.Option(help="Optimiser steps (one sequence each).")] = 450,
    out: Annotated[Optional[Path], typer.Option(help="Artefact folder (default artifacts/<model>/ppd).")] = None,
    dtype: Annotated[str, typer.Option(help="auto (float32 on CPU: bf16 backward is slow there), float32, "
                                            "bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    lr: Annotated[float, typer.Option(help="Peak learning rate (cosine decay).")] = 0.01,
    alpha: Annotated[float, typer.Option(help="Loss decay over prompt tokens.")] = 0.8,
    insertions: Annotated[int, typer.Option(help="Random insertion points per sequence per step.")] = 64,
    prompts: Annotated[Optional[int], typer.Option(help="Training prompts per --data source (after the held-out "
                                                        "ones); default: one per step, at most 300 (self-distilling "
                                                        "them is the slow part on a CPU).")] = None,
    held_out: Annotated[int, typer.Option(help="First prompts left out for `specbench estimate`.")] = 100,
    new_tokens: Annotated[int, typer.Option(help="Self-distilled continuation length.")] = 96,
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 50,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    seed: Annotated[int, typer.Option(help="Data order, insertion points, initial tokens.")] = 0,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
):
    """Train PPD's prompt tokens (only their embeddings train; the model is frozen)."""
    from .drafters.train_ppd import TrainConfig, train

    cfg = TrainConfig(model=model, prompt_tokens=prompt_tokens, ept=ept, data=data, steps=steps, out=out,
                      dtype=dtype, device=device, lr=lr, alpha=alpha, insertions=insertions, prompts=prompts,
                      held_out=held_out, new_tokens=new_tokens, save_every=save_every, resume=resume, seed=seed,
                      data_file=data_file)
    path = train(cfg)
    import yaml

    meta = yaml.safe_load((path / "ppd.yaml").read_text())
    console.print(f"Wrote {escape(str(path))}/prompt_tokens.safetensors, ppd.yaml, loss.png: {meta['steps']} steps, "
                  "final loss "
                  f"{meta['final_loss']} (from {meta['initial_loss']}), {meta['train_seconds']:.0f} s training + "
                  f"{meta['data_seconds']:.0f} s data.")


@train_app.command("drafter")
def train_drafter(
    model: Annotated[str, typer.Option(help="Target model spec (the drafter is trained for it).")] = "smollm2-135m",
    layers: Annotated[int, typer.Option(help="L: decoder layers of the drafter (initialised from the target's "
                                             "first and last layers).")] = 2,
    vocab_top: Annotated[Optional[int], typer.Option(help="K: score only the K most frequent tokens of the "
                                                          "data (cheaper drafts; verification stays exact).")] = None,
    data: Annotated[str, typer.Option(help="Prompts to self-distill, comma-separated: datasets, files, or the "
                                           "training-only sources stdlib-code and word-problems.")
                    ] = "alpaca-eval,stdlib-code,word-problems",
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 1500,
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    out: Annotated[Optional[Path], typer.Option(help="Artefact folder (default artifacts/<model>/drafter).")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    lr: Annotated[float, typer.Option(help="Peak learning rate (warm-up, then cosine decay).")] = 5e-4,
    topk: Annotated[int, typer.Option(help="Teacher probabilities kept per position.")] = 32,
    prompts: Annotated[int, typer.Option(help="Training prompts (after the held-out ones).")] = 300,
    held_out: Annotated[int, typer.Option(help="First prompts left out (the agreement check uses them).")] = 100,
    new_tokens: Annotated[int, typer.Option(help="Self-distilled continuation length.")] = 96,
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 100,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    seed: Annotated[int, typer.Option(help="Data order.")] = 0,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
):
    """Train a small drafter for sd / pearl that shares the target's tokenizer, embeddings and LM head."""
    from .drafters.train_drafter import DrafterConfig, train

    cfg = DrafterConfig(model=model, layers=layers, vocab_top=vocab_top, data=data, steps=steps, batch=batch,
                        out=out, dtype=dtype, device=device, lr=lr, topk=topk, prompts=prompts, held_out=held_out,
                        new_tokens=new_tokens, save_every=save_every, resume=resume, seed=seed,
                        data_file=data_file)
    path = train(cfg)
    import yaml

    meta = yaml.safe_load((path / "drafter.yaml").read_text())
    console.print(f"Wrote {escape(str(path))}/drafter.safetensors, drafter.yaml, loss.png: "
                  f"{meta['parameters'] / 1e6:.1f} M own "
                  f"parameters, agreement with the target {meta['agreement']:.1%} (untrained "
                  f"{meta['agreement_untrained']:.1%}), speed ratio c = {meta['speed_ratio_c']}, "
                  f"{meta['train_seconds']:.0f} s training + {meta['data_seconds']:.0f} s data.")


@train_app.command("medusa")
def train_medusa(
    model: Annotated[str, typer.Option(help="Target model spec (the heads are trained for it).")] = "smollm2-135m",
    heads: Annotated[int, typer.Option(help="K: heads, guessing the tokens 2..K+1 positions ahead.")] = 3,
    layer: Annotated[Optional[int], typer.Option(help="Layer whose state the heads read (default: the last, "
                                                      "Medusa); a middle layer trains early-exit heads, written to "
                                                      "artifacts/<model>/early-exit-l<layer>.")] = None,
    vocab_top: Annotated[Optional[int], typer.Option(help="Restrict the heads to the K most frequent tokens of the "
                                                          "data (cheaper heads; verification stays exact).")] = None,
    data: Annotated[str, typer.Option(help="Prompts to self-distil, comma-separated (datasets, files, or the "
                                           "training-only sources).")] = "alpaca-eval,stdlib-code,word-problems",
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 400,
    positions: Annotated[int, typer.Option(help="Random positions per step.")] = 128,
    lr: Annotated[float, typer.Option(help="Peak learning rate (warm-up, then cosine decay).")] = 1e-3,
    prompts: Annotated[int, typer.Option(help="Training prompts per source (after the held-out ones).")] = 120,
    held_out: Annotated[int, typer.Option(help="First prompts of each source left out.")] = 100,
    new_tokens: Annotated[int, typer.Option(help="Self-distilled reply length.")] = 96,
    out: Annotated[Optional[Path], typer.Option(help="Artefact folder (default artifacts/<model>/medusa).")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 100,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    seed: Annotated[int, typer.Option(help="Data order.")] = 0,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
):
    """Train Medusa-1 heads for `medusa` / `medusa-typical` (the target stays frozen; its LM head is shared)."""
    from .drafters.train_medusa import MedusaConfig, train

    cfg = MedusaConfig(model=model, heads=heads, layer=layer, vocab_top=vocab_top, data=data, steps=steps,
                       positions=positions, lr=lr, prompts=prompts, held_out=held_out, new_tokens=new_tokens, out=out,
                       dtype=dtype, device=device, save_every=save_every, resume=resume, seed=seed,
                       data_file=data_file)
    _said_trained(train(cfg), "medusa.yaml", "heads.safetensors")


@train_app.command("hidden-transfer")
def train_hidden_transfer(
    model: Annotated[str, typer.Option(help="Target model spec (the projections are trained for it).")]
    = "smollm2-135m",
    transfer_layers: Annotated[Optional[str], typer.Option(help="Strictly increasing layers l_1,l_2,... in "
                                                                "1..L-1, one per transfer step (default: the measured "
                                                                "choice where one exists, 12,17,22 for "
                                                                "smollm2-135m; otherwise the paper's choice scaled "
                                                                "to the depth, from 40% of it, 1/6 of it apart).")]
    = None,
    data: Annotated[str, typer.Option(help="Prompts to self-distil, comma-separated (datasets, files, or the "
                                           "training-only sources).")] = "alpaca-eval,stdlib-code,word-problems",
    steps: Annotated[int, typer.Option(help="Optimiser steps (one sequence each; 800 is about two passes over "
                                           "the default data).")] = 800,
    insertions: Annotated[int, typer.Option(help="Insertion points per sequence per step.")] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate (warm-up, then cosine decay).")] = 1e-3,
    prompts: Annotated[int, typer.Option(help="Training prompts per source (after the held-out ones).")] = 120,
    held_out: Annotated[int, typer.Option(help="First prompts of each source left out.")] = 100,
    new_tokens: Annotated[int, typer.Option(help="Self-distilled reply length.")] = 96,
    out: Annotated[Optional[Path], typer.Option(help="Artefact folder (default artifacts/<model>/hidden-transfer)."
                                                )] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 50,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    seed: Annotated[int, typer.Option(help="Data order and insertion points.")] = 0,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
    masked: Annotated[bool, typer.Option("--masked", help="The paper's Masked ablation: pseudo positions do not "
                                                          "see each other. For accuracy comparisons (estimate, "
                                                          "benchmarks/accuracy_comparison.py); not decodable.")]
    = False,
):
    """Train Hidden Transfer's projections for `hidden-transfer` (only the k linear maps train)."""
    from .drafters.train_transfer import TransferConfig, train

    layers = tuple(_int_list(transfer_layers, "--transfer-layers")) if transfer_layers else None
    cfg = TransferConfig(model=model, transfer_layers=layers, data=data, steps=steps, insertions=insertions, lr=lr,
                         prompts=prompts, held_out=held_out, new_tokens=new_tokens, out=out, dtype=dtype,
                         device=device, save_every=save_every, resume=resume, seed=seed, data_file=data_file,
                         masked=masked)
    _said_trained(train(cfg), "hidden-transfer.yaml", "projections.safetensors")


def _train_feature(method: str, **kwargs) -> None:
    from .drafters.train_feature import FeatureConfig, train

    _said_trained(train(FeatureConfig(method=method, **kwargs)), f"{method}.yaml", "feature-drafter.safetensors")


_FEATURE_HELP = {
    "vocab_top": "Restrict the drafter's head to the K most frequent tokens of the data (cheaper drafts; "
                 "verification stays exact). 0: the full vocabulary.",
    "data": "Prompts to self-distil, comma-separated (datasets, files, or the training-only sources).",
}


@train_app.command("eagle")
def train_eagle(
    model: Annotated[str, typer.Option(help="Target model spec (the drafter is trained for it).")] = "smollm2-135m",
    vocab_top: Annotated[int, typer.Option(help=_FEATURE_HELP["vocab_top"])] = 8192,
    data: Annotated[str, typer.Option(help=_FEATURE_HELP["data"])] = "alpaca-eval,stdlib-code,word-problems",
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 1500,
    sequences: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    lr: Annotated[float, typer.Option(help="Peak learning rate (warm-up, then cosine decay).")] = 5e-4,
    noise: Annotated[float, typer.Option(help="Uniform noise on the input features (EAGLE: 0.1).")] = 0.1,
    prompts: Annotated[int, typer.Option(help="Training prompts per source (after the held-out ones).")] = 120,
    held_out: Annotated[int, typer.Option(help="First prompts of each source left out.")] = 100,
    new_tokens: Annotated[int, typer.Option(help="Self-distilled reply length.")] = 96,
    out: Annotated[Optional[Path], typer.Option(help="Artefact folder (default artifacts/<model>/eagle).")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 100,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    seed: Annotated[int, typer.Option(help="Data order and noise.")] = 0,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
):
    """Train the EAGLE-style feature drafter for `eagle` (one decoder layer over the target's hidden states and the
    next token's embedding; the target's embeddings and LM head are shared, frozen)."""
    _train_feature("eagle", model=model, vocab_top=vocab_top or None, data=data, steps=steps, sequences=sequences,
                   lr=lr, noise=noise, prompts=prompts, held_out=held_out, new_tokens=new_tokens, out=out,
                   dtype=dtype, device=device, save_every=save_every, resume=resume, seed=seed, data_file=data_file)


@train_app.command("parallelspec")
def train_parallelspec(
    model: Annotated[str, typer.Option(help="Target model spec (the drafter is trained for it).")] = "smollm2-135m",
    mask_tokens: Annotated[int, typer.Option(help="k: [MASK] inputs; one drafter forward drafts k + 1 tokens.")] = 4,
    init: Annotated[str, typer.Option(help="Start from this eagle drafter folder (auto: the model's trained "
                                           "`eagle` drafter when there is one; none: the target's last layer).")]
    = "auto",
    vocab_top: Annotated[int, typer.Option(help=_FEATURE_HELP["vocab_top"])] = 8192,
    data: Annotated[str, typer.Option(help=_FEATURE_HELP["data"])] = "alpaca-eval,stdlib-code,word-problems",
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 1500,
    sequences: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    groups: Annotated[int, typer.Option(help="Parallel groups (an input and its k masks) per sequence.")] = 24,
    lr: Annotated[float, typer.Option(help="Peak learning rate (warm-up, then cosine decay).")] = 5e-4,
    noise: Annotated[float, typer.Option(help="Uniform noise on the input features (EAGLE: 0.1).")] = 0.1,
    prompts: Annotated[int, typer.Option(help="Training prompts per source (after the held-out ones).")] = 120,
    held_out: Annotated[int, typer.Option(help="First prompts of each source left out.")] = 100,
    new_tokens: Annotated[int, typer.Option(help="Self-distilled reply length.")] = 96,
    out: Annotated[Optional[Path], typer.Option(help="Artefact folder (default artifacts/<model>/parallelspec)."
                                                )] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 100,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    seed: Annotated[int, typer.Option(help="Data order, groups and noise.")] = 0,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
):
    """Train the ParallelSpec drafter for `parallelspec`: the feature drafter with k trained [MASK] inputs, by
    group-wise parallel training (ParallelSpec §4.1, Figure 3)."""
    _train_feature("parallelspec", model=model, mask_tokens=mask_tokens, init=init, vocab_top=vocab_top or None,
                   data=data, steps=steps, sequences=sequences, groups=groups, lr=lr, noise=noise, prompts=prompts,
                   held_out=held_out, new_tokens=new_tokens, out=out, dtype=dtype, device=device,
                   save_every=save_every, resume=resume, seed=seed, data_file=data_file)


def _said_trained(path: Path, meta_file: str, weights: str) -> None:
    import yaml

    meta = yaml.safe_load((path / meta_file).read_text())
    console.print(f"Wrote {escape(str(path))}/{weights}, {meta_file}, loss.png: {meta['parameters'] / 1e6:.2f} M "
                  f"parameters, top-1 agreement per distance {meta['top1_agreement_train_sample']} (untrained "
                  f"{meta['top1_agreement_untrained']}), final loss {meta['final_loss']} (from "
                  f"{meta['initial_loss']}), {meta['train_seconds']:.0f} s training + {meta['data_seconds']:.0f} s "
                  "data.")


@app.command()
def estimate(
    method: Annotated[str, typer.Option(help="Method whose guesses are scored: ppd, medusa, hidden-transfer, eagle "
                                             "or parallelspec.")] = "ppd",
    model: Annotated[str, typer.Option(help="Model spec.")] = "smollm2-135m",
    data: Annotated[str, typer.Option(help="Validation prompts (held out of training).")] = "alpaca-eval",
    limit: Annotated[int, typer.Option(help="Prompts scored (the first N).")] = 50,
    new_tokens: Annotated[int, typer.Option(help="Greedy reference length per prompt.")] = 64,
    artifact: Annotated[Optional[str], typer.Option(help="The method's artefact folder (default: the shipped one; ppd "
                                                        "also takes untrained[:S] for random real-token "
                                                        "embeddings).")] = None,
    initial: Annotated[bool, typer.Option(help="Score the artefact's initial (untrained) embeddings.")] = False,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Acceptance YAML (default "
                        "acceptance/<model>/ppd.yaml); with --padding, a CSV of the model's table (not written "
                        "unless given; --run's comparison goes beside it as <name>-measured.csv).")] = None,
    padding: Annotated[bool, typer.Option("--padding", help="Instead: EMS-SD's padding model (Appendix B), the "
                                                            "share of KV entries the padded way of batching wastes "
                                                            "per step, by accuracy p and batch size B. Loads no "
                                                            "model.")] = False,
    accuracy: Annotated[str, typer.Option(help="--padding: next-token prediction accuracies p, each in (0, 1).")]
    = "0.5,0.6,0.7,0.8,0.9",
    batch_sizes: Annotated[str, typer.Option(help="--padding: batch sizes B.")] = "1,2,4,8,16,24",
    max_accept: Annotated[int, typer.Option(help="--padding: maximum acceptance length K = draft length + 1 (the "
                                                 "paper's Figure 7 uses 8).")] = 8,
    run: Annotated[Optional[Path], typer.Option(metavar="DIR", help="--padding: also put the measured KV padding "
                                                "ratio of this run's padded batches beside the model's.")] = None,
):
    """Top-k accuracy of the method's guesses per token distance (PPD Table 2), for `build-tree`; with --padding,
    EMS-SD's padding model instead."""
    if padding:
        _estimate_padding(accuracy, batch_sizes, max_accept, run, out_path)
        return
    from .core.models import load_model
    from .drafters import prompt_tokens as pt
    from .hwtrees import acceptance

    methods = ("ppd", "medusa", "hidden-transfer", "eagle", "parallelspec")
    if method not in methods:
        raise SpecbenchError(f"estimate --method {method}: choose one of {', '.join(methods)} (or --padding)")
    if limit < 1 or new_tokens < 3:
        raise SpecbenchError("--limit must be at least 1 and --new-tokens at least 3")
    if initial and method != "ppd":
        raise SpecbenchError(f"--initial scores ppd's untrained prompt tokens; {method} has no initial artefact "
                             "(its untrained heads / projections / drafter repeat the next-token guess or less)")
    target = load_model(model, dtype, device)
    if method == "ppd":
        tokens = pt.resolve(artifact, target)
        if initial and not tokens.meta.get("untrained"):
            tokens = pt.load(tokens.source, target, initial=True)  # the embeddings training started from
        result = acceptance.estimate(target, tokens, data, limit, new_tokens, data_file)
        source = tokens.source
    else:
        result, source = _estimate_heads(method, target, artifact, data, limit, new_tokens, data_file)
    path = out_path or acceptance.default_path(model, method + ("-initial" if initial else ""))
    acceptance.write(result, path)
    table = Table(title=f"{method} accuracy, {target.spec} {result['dtype']} ({source}), "
                        f"{result['prompts']} {data} prompts")
    table.add_column("distance", justify="left")
    for k in (1, 2, 3, 5, 10):
        table.add_column(f"top-{k}", justify="right")
    for d, row in enumerate(result["topk_accuracy"]):
        table.add_row(f"@{d + 1}", *(f"{row[k - 1]:.3f}" for k in (1, 2, 3, 5, 10)))
    out.print(table)
    console.print(f"Wrote {escape(str(path))} ({sum(result['positions'])} scored guesses, {result['seconds']:.0f} s)")


def _estimate_heads(method: str, target, artifact: Optional[str], data: str, limit: int, new_tokens: int,
                    data_file: Optional[str]) -> tuple[dict, str]:
    """estimate for medusa (or early-exit heads: --artifact artifacts/<model>/early-exit-l<l>), hidden-transfer and
    the feature drafters (eagle: ranks at each depth along the true path; parallelspec: per drafted position)."""
    from .hwtrees import acceptance
    from .hwtrees.head_accuracy import medusa_ranks, transfer_ranks

    if method == "medusa":
        from .drafters import medusa_heads as mh

        art = mh.resolve(artifact, target)
        heads = art.heads
        result = acceptance.estimate_with(target, lambda ids, s: medusa_ranks(target, heads, ids, s), heads.heads,
                                          data, limit, new_tokens, data_file, method, art.source,
                                          {"heads": heads.heads, "layer": heads.layer})
        return result, art.source
    if method in ("eagle", "parallelspec"):
        from .drafters import feature_drafter as fd
        from .hwtrees.head_accuracy import drafter_ranks
        from .methods.eagle import EAGLE_DEPTH

        art = fd.resolve(artifact, target, method)
        drafter = art.drafter.to(target.device)
        depths = drafter.mask_tokens + 1 if method == "parallelspec" else EAGLE_DEPTH
        # the drafter's own forward time (build-tree adds it per drafter forward to the target's step latency)
        ms = fd.forward_ms(drafter, 1 + drafter.mask_tokens)
        result = acceptance.estimate_with(target, lambda ids, s: drafter_ranks(target, drafter, ids, s, depths),
                                          depths, data, limit, new_tokens, data_file, method, art.source,
                                          {"mask_tokens": drafter.mask_tokens, "draft_forward_ms": ms,
                                           "draft_forward_rows": 1 + drafter.mask_tokens})
        return result, art.source
    from .drafters import transfer_projections as tp

    art = tp.resolve(artifact, target)
    proj = art.projections
    result = acceptance.estimate_with(target, lambda ids, s: transfer_ranks(target, proj, ids, s), proj.steps,
                                      data, limit, new_tokens, data_file, method, art.source,
                                      {"transfer_layers": proj.layers})
    return result, art.source


def _estimate_padding(accuracy: str, batch_sizes: str, max_accept: int, run: Optional[Path],
                      out_path: Optional[Path]) -> None:
    """`estimate --padding`: the model's table for the grid, and with --run the measured one beside it."""
    import pandas as pd

    from .bench import padding_model as pm
    from .bench.report import read_records

    ps, batches = _float_list(accuracy, "--accuracy"), _int_list(batch_sizes, "--batch-sizes")
    # p = 0 or 1 is a batch that never or always accepts everything: no padding to model
    if bad := [p for p in ps if not 0 < p < 1]:
        raise SpecbenchError(f"--accuracy: each p must be strictly between 0 and 1 (got {bad[0]:g})")
    if bad := [b for b in batches if b < 1]:
        raise SpecbenchError(f"--batch-sizes: each batch size must be at least 1 (got {bad[0]})")
    if max_accept < 1:
        raise SpecbenchError(f"--max-accept must be at least 1 (got {max_accept})")
    records = read_records(run) if run is not None else None  # a folder without records.csv is refused up front
    rows = pm.table(ps, batches, max_accept)
    table = Table(title=f"EMS-SD padding model (Appendix B), K = {max_accept}",
                  caption="R = E[P] / E[M]: share of the KV entries written per step that are padding")
    for col in ("p", "B", "E[A]", "E[M]", "E[P]", "R"):
        table.add_column(escape(col), justify="right")
    for r in rows:
        table.add_row(f"{r['p']:g}", str(r["B"]), f"{r['E[A]']:.2f}", f"{r['E[M]']:.2f}", f"{r['E[P]']:.2f}",
                      f"{r['R']:.1%}")
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
    for col in ("method", "dataset", "B", "tau", "K", "p", "R measured", "R model"):
        table.add_column(col, justify="left" if col in ("method", "dataset") else "right")

    def fmt(v, spec):
        return "-" if math.isnan(float(v)) else spec.format(v)  # NaN: K unknown or tau outside [1, K]

    for r in frame.itertuples(index=False):
        table.add_row(escape(str(r.method)), escape(str(r.dataset)), str(r.batch_size), fmt(r.tau, "{:.2f}"),
                      fmt(r.K, "{:.0f}"), fmt(r.p, "{:.3f}"), fmt(r.R_measured, "{:.1%}"), fmt(r.R_model, "{:.1%}"))
    out.print(table)


def main() -> None:
    """Console-script entry point: quiet library logging, then the Typer app."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
    app()
