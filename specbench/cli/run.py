"""`specbench run`: parse the options into a RunConfig, run it, write the report, print the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..errors import SpecbenchError
from ..progress import console
from .app import app
from .parse import int_list, tree_size_list
from .placement_options import DeviceMap, DrafterDeviceMap, DrafterMaxMemory, MaxMemory, TensorParallel
from .show import print_summary, warn_unexplained


def _with_method_options(func):
    """Give `func` one CLI option per method option the registered methods declare (methods/options.py), after
    its own parameters; Typer reads the signature, and the values arrive in `func`'s **kwargs."""
    import inspect

    from ..methods import REGISTRY, all_options

    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    extra = []
    for name, (spec, methods) in all_options(REGISTRY).items():
        text = f"{', '.join(methods)}: {spec.help}" + (f" ({', '.join(spec.choices)})" if spec.choices else "")
        chooses = spec.default is None and spec.type is not str  # `auto` or a number (e.g. --gamma auto)
        option = typer.Option(spec.flag, help=text + (" (auto: the method chooses)" if chooses else "") + ".",
                              rich_help_panel="Method options", metavar="[auto|INTEGER]" if chooses else None)
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=spec.default,
                                       annotation=Annotated[Optional[str if chooses else spec.type], option]))
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
    dtype: Annotated[str, typer.Option(help="auto (the faster dtype by this hardware's float32 and bfloat16 "
                                            "profiles; without both, float32 on CPU and bfloat16 on GPU), float32, "
                                            "bfloat16, float16")] = "auto",
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
    retime: Annotated[int, typer.Option(metavar="N", help="Re-time a prompt turn up to N times when its timing "
                                          "was disturbed (other processes used over 0.25 cores meanwhile, or a "
                                          "method's time per forward was over 1.5x its median so far), all its "
                                          "methods again, and keep the quiet timing; records.csv says how many "
                                          "tries it took (timing_tries) and whether it stayed disturbed "
                                          "(timing_disturbed). 0: only flag.", envvar="SPECBENCH_RETIME")] = 2,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    data_file: Annotated[Optional[str], typer.Option(help="Read the dataset from this file.")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Run folder (default results/<time>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run in --out (default: the newest "
                                              "folder in results/).")] = False,
    tree_sizes: Annotated[Optional[str], typer.Option(help="Tree methods: sweep these sizes in one run "
                                                           "(e.g. 4,8,16,32,64), labelled <method>@<size>; `auto` "
                                                           "adds <method>@auto, --tree auto's own choice (per batch "
                                                           "size at --batch-size B > 1), to compare with the "
                                                           "sizes.")] = None,
    batch_size: Annotated[Optional[list[str]], typer.Option("--batch-size", "-b", metavar="B[,B...]", help="Prompts decoded at once "
                          "(repeatable or a comma list, e.g. 1,2,4,8,16); ar runs batched at each size as that size's "
                          "baseline. Default 1: one prompt at a time.", rich_help_panel="Batching (EMS-SD)")] = None,
    batching: Annotated[str, typer.Option(metavar="MODE", help="At batch size > 1: unpadded (EMS-SD: per-sample KV lengths, packed "
                                               "inputs), padded (the vanilla way) or both, side by side.",
                                          rich_help_panel="Batching (EMS-SD)")] = "both",
    refill: Annotated[bool, typer.Option(help="At batch size > 1: a finished sample's slot takes the next prompt "
                                              "at once (continuous batching) instead of waiting for the batch.",
                                         rich_help_panel="Batching (EMS-SD)")] = False,
    shard: Annotated[Optional[str], typer.Option(metavar="I/N", help="Run only shard I of N (0-based) of the "
                     "prompts, no Ray (SLURM arrays, several terminals); `specbench merge` joins the folders.",
                     rich_help_panel="Sharding")] = None,
    shards: Annotated[Optional[int], typer.Option(metavar="N", help="Split the prompts into N shards run as Ray "
                      "tasks (pip install 'specbench[ray]'), written to OUT/shards/ and merged into OUT.",
                      rich_help_panel="Sharding")] = None,
    gpus_per_shard: Annotated[float, typer.Option(metavar="K", help="--shards: GPUs each shard holds (0: a CPU "
                              "shard of --threads cores, default 1).", rich_help_panel="Sharding")] = 0,
    ray_address: Annotated[Optional[str], typer.Option(metavar="ADDR", help="--shards: join this Ray cluster "
                           "(default $RAY_ADDRESS, else a local Ray).", rich_help_panel="Sharding")] = None,
    recommendation: Annotated[Optional[Path], typer.Option(help="--method auto: the recommendation.yaml to follow "
                              "(default: the one `specbench recommend` filed for this model and hardware).")] = None,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    drafter_device_map: DrafterDeviceMap = None,
    drafter_max_memory: DrafterMaxMemory = None,
    tp: TensorParallel = 1,
    **method_options,  # one option per method option (methods/options.py), added by _with_method_options
):
    """Benchmark methods side by side against [bold]ar[/] and write records.csv, summary.csv, report.md, plots."""
    from ..report.run_report import write_run_report
    from ..run.config import RunConfig, default_out
    from ..run.benchmark import run as run_benchmark
    from ..run.shard import Shard

    if shards is None and (gpus_per_shard or ray_address):
        raise SpecbenchError("--gpus-per-shard and --ray-address go with --shards N (a run on Ray)")
    if shards is not None and shard is not None:
        raise SpecbenchError("--shard I/N runs one shard yourself and --shards N runs all of them on Ray: give one")
    if shards is not None and tp > 1:
        raise SpecbenchError("--tp N runs under torchrun and --shards N on Ray: launch `torchrun ... specbench run "
                             "--tp N --shard I/N` per shard instead")
    methods = list(method or ("ar", "pld"))
    if "auto" in methods:
        methods, dtype = _auto_method(methods, model, device, dtype, recommendation, method_options)
    elif recommendation is not None:
        raise SpecbenchError("--recommendation is read by --method auto only")
    from ..core.model.tensor_parallel import is_writer, rank_out

    if out_dir is None:
        out_dir = _newest_run() if resume else default_out()
    out_dir = rank_out(out_dir)  # --tp: ranks other than 0 write to scratch
    cfg = RunConfig(
        methods=tuple(methods), datasets=tuple(dataset or ("humaneval",)), model=model,
        drafter=drafter, dtype=dtype, device=device, limit=limit, per_category=per_category,
        max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, warmup=warmup, repeats=repeats,
        retime=retime, threads=threads,
        data_file=data_file, out=out_dir, resume=resume,
        tree_sizes=tree_size_list(tree_sizes) if tree_sizes else (),
        batch_sizes=tuple(dict.fromkeys(b for text in batch_size for b in int_list(text, "--batch-size")))
        if batch_size else (1,), batching=batching, refill=refill, device_map=device_map, max_memory=max_memory,
        drafter_device_map=drafter_device_map, drafter_max_memory=drafter_max_memory, tp=tp,
        options=method_options, shard=Shard.parse(shard) if shard is not None else None)
    if shards is not None:
        from ..report.merged import report_merged
        from ..run.ray_shards import run_sharded

        try:
            runs = run_sharded(cfg, shards, gpus_per_shard, ray_address)
        except SpecbenchError as exc:
            if getattr(exc, "runs", None):
                report_merged(out_dir, exc.runs)  # partial report of what finished (marked partial)
            raise
        _report_sharded(runs, out_dir)
        return
    try:
        run_dir = run_benchmark(cfg)
    except SpecbenchError as exc:
        if getattr(exc, "kept", 0):
            write_run_report(exc.out)  # partial summary of what finished (marked partial)
        raise
    if not is_writer():
        return
    summary = write_run_report(run_dir)
    print_summary(summary, f"results ({run_dir})")
    warn_unexplained([run_dir])
    batched = ", batching.csv, pareto.png, batch_fastest.csv" if max(cfg.batch_sizes) > 1 else ""
    console.print(f"Reports: {escape(str(run_dir))}/records.csv, summary.csv, report.md, context.csv, speedup.png, "
                  f"tokens_per_s.png, tau.png{batched}")
    if cfg.shard:
        console.print(f"[dim]shard {cfg.shard} of a sharded run: once every shard has run, `specbench merge "
                      "SHARD_FOLDERS... --out RUN` joins them[/]")


def _report_sharded(runs: list[Path], out_dir: Path) -> None:
    """The merged report of a run on Ray (one run, or one per hardware key with --shards on mixed hardware)."""
    import pandas as pd

    from ..report.merged import report_merged

    report_merged(out_dir, runs)
    for run_dir in runs:
        print_summary(pd.read_csv(run_dir / "summary.csv"), f"results ({run_dir}, merged from its shards)")
    warn_unexplained(runs)
    console.print(f"Reports: {escape(str(out_dir))}/records.csv, summary.csv, report.md; shards in "
                  f"{escape(str(out_dir))}/shards/")


def _auto_method(methods: list[str], model: str, device: str, dtype: str, recommendation: Optional[Path],
                 options: dict) -> tuple[list[str], str]:
    """--method auto -> the method, tree and dtype `specbench recommend` chose for this model and hardware."""
    from ..run.recommend import read_choice

    choice = read_choice(model, device, recommendation, dtype)
    console.print(f"[dim]{escape(choice.said)}[/]")
    rest = [m for m in methods if m != "auto"]
    alone = not [m for m in rest if m != "ar" and m not in choice.methods]  # its tree applies to it alone
    for name, value in choice.options.items():
        if alone and options.get(name) in (None, "auto"):
            options[name] = value
    chosen = rest + [m for m in choice.methods if m not in rest]
    return chosen or ["ar"], choice.dtype


def _newest_run() -> Path:
    from ..run.config import results_root

    runs = sorted(p for p in results_root().glob("*") if (p / "run.yaml").exists())
    if not runs:
        raise SpecbenchError("--resume: no earlier run in results/; pass --out with the run folder.")
    return runs[-1]
