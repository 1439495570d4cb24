"""`specbench run`: parse the options into a RunConfig, run it, write the report, print the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..errors import SpecbenchError, did_you_mean
from ..progress import console
from .app import app, invocation
from .method_flags import WithMethodOptions, given_method_options
from .parse import int_list, prompt_limit, tree_size_list
from .placement_options import DeviceMap, DrafterDeviceMap, DrafterMaxMemory, MaxMemory, TensorParallel
from .show import print_summary, warn_unexplained


BATCHING, SHARDING, ENGINES = "Batching (EMS-SD)", "Sharding", "Engines (llama.cpp in process, OpenAI-compatible servers)"


@app.command(cls=WithMethodOptions)
def run(
    ctx: typer.Context,
    method: Annotated[list[str], typer.Option("--method", "-m", help="Method to run (repeatable); auto: the one "
                      "`specbench recommend` chose here. `ar` always runs too, as the baseline.")] = ["ar", "pld"],
    dataset: Annotated[list[str], typer.Option("--dataset", "-d", help="Dataset name or a .jsonl file "
                                                                       "(repeatable).")] = ["humaneval"],
    model: Annotated[str, typer.Option(help="smollm2-135m, HF id, local dir, .gguf file, random:<preset>")]
    = "smollm2-135m",
    drafter: Annotated[Optional[str], typer.Option("--drafter", "--draft-model", show_default="the method's own",
                                                   help="Draft model, for methods that need one (--engine llama.cpp:"
                                                        " a draft .gguf for sd).")] = None,
    dtype: Annotated[str, typer.Option(help="auto (the faster dtype by this hardware's float32 and bfloat16 "
                                            "profiles; without both, float32 on CPU and bfloat16 on GPU), float32, "
                                            "bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    limit: Annotated[str, typer.Option(help="Prompts per dataset: the first N, or all.")] = "6",
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
    threads: Annotated[Optional[int], typer.Option(show_default="torch's choice", help="torch CPU threads.")] = None,
    data_file: Annotated[Optional[str], typer.Option(show_default="the set's own", help="Read the named --dataset "
                                                     "from this file.")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", show_default="results/<time>; with --resume the newest "
                                                    "run there", help="Run folder.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run in --out.")] = False,
    tree_sizes: Annotated[Optional[str], typer.Option(metavar="N[,N...]", show_default="none", help="Tree methods: "
                                                      "sweep these sizes in one run "
                                                           "(e.g. 4,8,16,32,64), labelled <method>@<size>; `auto` "
                                                           "adds <method>@auto, --tree auto's own choice (per batch "
                                                           "size at --batch-size B > 1), to compare with the "
                                                           "sizes.")] = None,
    batch_size: Annotated[Optional[list[str]], typer.Option(
        "--batch-size", "-b", metavar="B[,B...]", show_default="1: one prompt at a time", rich_help_panel=BATCHING,
        help="Prompts decoded at once (repeatable or a comma list, e.g. 1,2,4,8,16); ar runs batched at each size as "
             "that size's baseline.")] = None,
    batching: Annotated[str, typer.Option(
        metavar="MODE", rich_help_panel=BATCHING,
        help="At batch size > 1: unpadded (EMS-SD: per-sample KV lengths, packed inputs), padded (the vanilla way) "
             "or both, side by side.")] = "both",
    refill: Annotated[bool, typer.Option(
        rich_help_panel=BATCHING,
        help="At batch size > 1: a finished sample's slot takes the next prompt at once (continuous batching) "
             "instead of waiting for the batch.")] = False,
    shard: Annotated[Optional[str], typer.Option(
        metavar="I/N", show_default="all prompts", rich_help_panel=SHARDING,
        help="Run only shard I of N (0-based) of the prompts, no Ray (SLURM arrays, several terminals); `specbench "
             "merge` joins the folders.")] = None,
    shards: Annotated[Optional[int], typer.Option(
        metavar="N", show_default="no Ray", rich_help_panel=SHARDING,
        help="Split the prompts into N shards run as Ray tasks (pip install 'specbench\\[ray]'), written to "
             "OUT/shards/ and merged into OUT.")] = None,
    gpus_per_shard: Annotated[float, typer.Option(metavar="K", help="--shards: GPUs each shard holds (0: a CPU "
                              "shard of --threads cores).", rich_help_panel=SHARDING)] = 0,
    ray_address: Annotated[Optional[str], typer.Option(metavar="ADDR", show_default="$RAY_ADDRESS, else a local Ray",
                           help="--shards: join this Ray cluster.", rich_help_panel=SHARDING)] = None,
    recommendation: Annotated[Optional[Path], typer.Option(show_default="the one `specbench recommend` filed for "
                              "this model and hardware", help="--method auto: the recommendation.yaml to "
                              "follow.")] = None,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    drafter_device_map: DrafterDeviceMap = None,
    drafter_max_memory: DrafterMaxMemory = None,
    tp: TensorParallel = 1,
    compile: Annotated[bool, typer.Option("--compile", help="Forwards of the target and its drafters, at batch 1 "
                       "and every batch size (padded batches), through torch.compile at static shapes: a "
                       "preallocated KV cache, query widths bucketed; CUDA graphs on CUDA. Every shape compiles in "
                       "warm-up, after a line with the expected wait; run.yaml's `compile:` block says how long.")]
    = False,
    allow_disturbed_profile: Annotated[bool, typer.Option("--allow-disturbed-profile", help="Let --tree auto, "
                                       "--dtype auto and the noise guard use profiles and trees measured on a "
                                       "disturbed machine (skipped otherwise, with a line saying which; "
                                       "`specbench list profiles` shows them).")] = False,
    synthetic_acceptance: Annotated[str | None, typer.Option("--synthetic-acceptance", metavar="RATES|FILE|DIR",
                                    show_default="off: the model's own acceptance",
                                    help="Every method drafts and verifies for real, but which drafts are kept is "
                                    "drawn (seeded) from stated acceptance: rates per draft position, each given the "
                                    "previous accepted (0.8,0.6,0.4; ranks at a position by /: 0.6/0.1), or a file "
                                    "(`specbench estimate`'s, acceptance/published/..., a speculation_profile.json), or a "
                                    "folder of one file per method (acceptance/published/vicuna-7b: each method its "
                                    "paper's). "
                                    "The output is not the model's: no lossless check; tau is checked against the "
                                    "rates. Methods without a trained artefact get random weights of its shape.")]
    = None,
    engine: Annotated[str, typer.Option(metavar="NAME", rich_help_panel=ENGINES, help="Who decodes: specbench (its "
                      "own PyTorch loop), llama.cpp (llama-cpp-python in process; --model FILE.gguf; pip install "
                      "'specbench\\[llamacpp]') or openai (an OpenAI-compatible server at --base-url).")]
    = "specbench",
    base_url: Annotated[Optional[str], typer.Option(metavar="URL", rich_help_panel=ENGINES, show_default="none",
                        help="--engine openai: the server, e.g. http://localhost:8000/v1.")] = None,
    baseline_url: Annotated[Optional[str], typer.Option(metavar="URL", rich_help_panel=ENGINES, show_default="none: no "
                            "speedup, the server's own numbers", help="--engine "
                            "openai: a second server with speculation off, run on the same prompts interleaved as "
                            "the baseline.")] = None,
    served_model: Annotated[Optional[str], typer.Option(metavar="NAME", rich_help_panel=ENGINES, show_default="the "
                            "server's first model", help="--engine openai: the model name to request.")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(metavar="VAR", rich_help_panel=ENGINES, show_default="no key",
                           help="--engine openai: the environment variable holding the API key.")] = None,
    concurrency: Annotated[str, typer.Option(metavar="N[,N...]", rich_help_panel=ENGINES, help="--engine openai: "
                           "requests in flight (closed loop), a row each.")] = "1",
    request_rate: Annotated[Optional[float], typer.Option(metavar="R", rich_help_panel=ENGINES, show_default="closed"
                            " loop", help="--engine openai: requests per second, seeded Poisson arrivals (open "
                            "loop).")] = None,
    slo: Annotated[Optional[str], typer.Option(metavar="ttft=MS,tpot=MS", rich_help_panel=ENGINES, show_default="no "
                   "goodput", help="--engine openai: goodput counts the requests within these limits.")] = None,
    timeout: Annotated[float, typer.Option(metavar="S", rich_help_panel=ENGINES, help="--engine openai: seconds to "
                       "wait for a server's answer.")] = 60.0,
    # and one option per method option (methods/options.py): WithMethodOptions adds them
):
    """Benchmark methods side by side against [bold]ar[/] and write records.csv, summary.csv, report.md, plots."""
    prompts = prompt_limit(limit)  # before the slow imports: a typo is answered at once
    from ..report.run_report import write_run_report
    from ..run.config import RunConfig, default_out
    from ..run.benchmark import run as run_benchmark
    from ..run.shard import Shard

    method_options = given_method_options(ctx)
    if shards is None and (gpus_per_shard or ray_address):
        raise SpecbenchError("--gpus-per-shard and --ray-address go with --shards N (a run on Ray)")
    if shards is not None and shard is not None:
        raise SpecbenchError("--shard I/N runs one shard yourself and --shards N runs all of them on Ray: give one")
    if shards is not None and tp > 1:
        raise SpecbenchError("--tp N runs under torchrun and --shards N on Ray: launch `torchrun ... specbench run "
                             "--tp N --shard I/N` per shard instead")
    _refuse_server_options(ctx, engine)
    _refuse_retime(ctx, engine)
    methods = list(method)
    _check_methods(methods)
    followed = None
    if "auto" in methods:
        methods, dtype, followed = _auto_method(methods, model, device, dtype, recommendation, method_options, compile)
    elif recommendation is not None:
        raise SpecbenchError("--recommendation is read by --method auto only")
    from ..core.model.tensor_parallel import is_writer, rank_out

    given_out = out_dir is not None
    if out_dir is None:
        out_dir = _newest_run() if resume else default_out()
    out_dir = rank_out(out_dir)  # --tp: ranks other than 0 write to scratch
    cfg = RunConfig(
        methods=tuple(methods), datasets=tuple(dataset), model=model,
        drafter=drafter, dtype=dtype, device=device, limit=prompts, per_category=per_category,
        max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, warmup=warmup, repeats=repeats,
        retime=retime, threads=threads,
        data_file=data_file, out=out_dir, resume=resume,
        tree_sizes=tree_size_list(tree_sizes) if tree_sizes else (),
        batch_sizes=tuple(dict.fromkeys(b for text in batch_size for b in int_list(text, "--batch-size")))
        if batch_size else (1,), batching=batching, refill=refill, device_map=device_map, max_memory=max_memory,
        drafter_device_map=drafter_device_map, drafter_max_memory=drafter_max_memory, tp=tp,
        options=method_options, shard=Shard.parse(shard) if shard is not None else None,
        compile=compile, allow_disturbed_profile=allow_disturbed_profile, recommendation=followed,
        synthetic_acceptance=synthetic_acceptance,
        engine=engine, engine_options={k: v for k, v in dict(
            base_url=base_url, baseline_url=baseline_url, served_model=served_model, api_key_env=api_key_env,
            concurrency=concurrency, request_rate=request_rate, slo=slo, timeout=timeout).items() if v is not None})
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
        if exc.exit_code == 130 and getattr(exc, "out", None):  # Ctrl-C: the command that continues, to paste
            exc.args = (f"{exc}\n  to continue: {_resume_command(exc.out, given_out)}",)
        raise
    if not is_writer():
        return
    summary = write_run_report(run_dir)
    file_host_work(run_dir, summary)
    print_summary(summary, f"results ({run_dir})")
    warn_unexplained([run_dir])
    batched = ", batching.csv, pareto.png, batch_fastest.csv" if max(cfg.batch_sizes) > 1 else ""
    console.print(f"Reports: {escape(str(run_dir))}/records.csv, summary.csv, report.md, context.csv, speedup.png, "
                  f"tokens_per_s.png, tau.png{batched}")
    if cfg.shard:
        console.print(f"[dim]shard {cfg.shard} of a sharded run: once every shard has run, `specbench merge "
                      "SHARD_FOLDERS... --out RUN` joins them[/]")


def file_host_work(run_dir: Path, summary) -> None:
    """This machine's host work a step, as a run measured it, for later predictions (planning/host_work.py): after
    `run`, `map` and `recommend`'s confirming run."""
    from ..planning import host_work
    from ..report.prediction_split import host_points
    from ..run.results import read_meta

    filed = host_work.remember(run_dir, host_points(summary, read_meta(run_dir)))
    if filed:
        console.print(f"[dim]host work a step: {filed} figure(s) filed for later predictions here "
                      f"({escape(str(host_work.where()))})[/]")


def _report_sharded(runs: list[Path], out_dir: Path) -> None:
    """The merged report of a run on Ray (one run, or one per hardware key with --shards on mixed hardware)."""
    import pandas as pd

    from ..core.store import RunFolder
    from ..report.merged import report_merged

    report_merged(out_dir, runs)
    for run_dir in runs:
        print_summary(pd.read_csv(RunFolder(run_dir).summary), f"results ({run_dir}, merged from its shards)")
    warn_unexplained(runs)
    console.print(f"Reports: {escape(str(out_dir))}/records.csv, summary.csv, report.md; shards in "
                  f"{escape(str(out_dir))}/shards/")


def _auto_method(methods: list[str], model: str, device: str, dtype: str, recommendation: Optional[Path],
                 options: dict, compiled: bool = False) -> tuple[list[str], str, str | None]:
    """--method auto -> the method, tree and dtype `specbench recommend` (`--compile`: `recommend --compile`) chose
    for this model and hardware."""
    from ..run.recommend import read_choice

    choice = read_choice(model, device, recommendation, dtype, compiled)
    console.print(f"[dim]{escape(choice.said)}[/]" if choice.confirmed else f"[yellow]{escape(choice.said)}[/]")
    rest = [m for m in methods if m != "auto"]
    alone = not [m for m in rest if m != "ar" and m not in choice.methods]  # its tree applies to it alone
    for name, value in choice.options.items():
        if alone and options.get(name) in (None, "auto"):
            options[name] = value
    chosen = rest + [m for m in choice.methods if m not in rest]
    return chosen or ["ar"], choice.dtype, choice.path


SERVER_OPTIONS = ("base_url", "baseline_url", "served_model", "api_key_env", "concurrency", "request_rate", "slo",
                  "timeout")


def _refuse_server_options(ctx, engine: str) -> None:
    """--concurrency, --base-url, ... given without --engine openai: refused (they would be recorded, never applied)."""
    if engine == "openai":
        return
    given = [f"--{name.replace('_', '-')}" for name in SERVER_OPTIONS
             if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"]
    if given:
        raise SpecbenchError(f"{', '.join(given)}: {'apply' if len(given) > 1 else 'applies'} to --engine openai "
                             f"only (an OpenAI-compatible server); --engine {engine} would ignore "
                             f"{'them' if len(given) > 1 else 'it'}. Drop {'them' if len(given) > 1 else 'it'}, or "
                             "add --engine openai --base-url URL.")


def _refuse_retime(ctx, engine: str) -> None:
    """--retime N (N > 0) on the command line for a backend that cannot time a turn again: one line with its
    reason, before anything runs (the default, or SPECBENCH_RETIME set for every run, stays quietly off there)."""
    if getattr(ctx.get_parameter_source("retime"), "name", "") != "COMMANDLINE" or not ctx.params.get("retime"):
        return
    from ..run.backend import backend_module

    measures = backend_module(engine).MEASURES
    if not measures.retime:
        raise SpecbenchError(f"--retime does not apply to --engine {engine}: {measures.why_not_retime}. Drop --retime.")


def _newest_run() -> Path:
    from ..core.store import RunFolder
    from ..run.config import results_root

    runs = sorted(p for p in results_root().glob("*") if RunFolder(p).is_run())
    if not runs:
        raise SpecbenchError("--resume: no earlier run in results/; pass --out with the run folder.")
    return runs[-1]


def _check_methods(methods: list[str]) -> None:
    """Unknown method names refused before anything loads, a near miss with its fix."""
    from ..methods import REGISTRY

    for name in methods:
        if name != "auto" and name not in REGISTRY:
            raise SpecbenchError(f"--method {name}: unknown method{did_you_mean(name, REGISTRY)}; available: "
                                 f"{', '.join(REGISTRY)}, auto (see `specbench list methods`)")


def _resume_command(out: Path, given_out: bool) -> str:
    """This invocation's command line plus --resume (and the run folder, when it was the default one)."""
    import shlex

    args = list(invocation)
    if "--resume" not in args:
        args.append("--resume")
    if not given_out:
        args += ["--out", str(out)]
    return shlex.join(["specbench", *args])
