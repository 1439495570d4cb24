"""The benchmark loop: warm-up, then dataset x prompt x method x turn, timed and checked against `ar`.

Every method (ar included) runs each prompt, in an order rotated per prompt (work.interleaved), so every speedup
is measured side by side on the same prompts and a burst of load cannot land on one method only. A prompt's records
are written together once every method has run it, after its disturbed turns were re-timed (--retime: retime.py)
and after the lossless check against ar (lossless.py explains a mismatch). Batch > 1 runs after batch 1, in jobs
of run/batch_schedule.py. Ctrl-C keeps every finished record (resume.py continues the run).
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from rich.markup import escape

from ..core import lookup
from ..methods.sd.drafter import resolve_drafter
from ..core.model import tensor_parallel as tp
from ..core.machine import memory
from ..core.model.load import load_model
from ..data import datasets as ds
from ..core.store import RunFolder
from ..progress import console, progress_bar
from . import batch_schedule, compiled as compile_run, noise, retime, synthetic
from .config import RunConfig
from .resume import Interrupted  # noqa: F401  (raised here; run/ray_shards and tests name it benchmark.Interrupted)
from .resume import Done, drop_incomplete, mark_complete, missing_folders, plain, prepare_out
from .resume import finished, refuse_other_environment, remove_if_empty
from .results import RecordWriter, read_tokens
from .runner import Runner
from .shard import refuse_too_many, prompt_count, resolved_trees, select, shard_block
from .validation import validate
from .work import LoadedDataset, check_categories, pending_batches, pending_prompts, say_batches, single_labels


def run(cfg: RunConfig) -> Path:
    """Run the benchmark; returns the run directory. Ctrl-C keeps every finished record (resume with --resume)."""
    if cfg.compile:  # before any engine or model: what --compile cannot run
        compile_run.check(cfg)
    if cfg.engine != "specbench":  # llama.cpp in process or an OpenAI-compatible server (specbench/engines/)
        from ..engines import run_engine

        return run_engine(cfg)
    cfg = validate(cfg)
    lookup.start(cfg.allow_disturbed_profile)  # the ledger of files this run reads (run.yaml's data_files)
    if cfg.recommendation:
        lookup.note_used(lookup.RECOMMENDATION, cfg.recommendation, "--method auto")
    if cfg.compile:  # the model's config, before its weights load
        compile_run.check_model(cfg)
    loaded = [LoadedDataset(*ds.load_prompts(name, cfg.limit, cfg.data_file, per_category=cfg.per_category))
              for name in cfg.datasets]
    check_categories(cfg, loaded)
    if cfg.shard:
        refuse_too_many(cfg.shard.count, prompt_count(loaded), f"--shard {cfg.shard}")
    made = missing_folders(Path(cfg.out))
    try:  # a refusal before run.yaml is written leaves no empty run folder behind
        out = prepare_out(cfg)
        if cfg.resume and finished(out):  # said before any model loads: there is nothing to run
            console.print(f"Nothing to resume: every prompt of {escape(str(out))} has run.")
            return out
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        from ..core.model.placement import drafter_placement, target_placement

        from ..core.model.memory_need import planned, run_workload

        with planned(run_workload(cfg.max_new_tokens, cfg.batch_sizes)):  # what the fit check counts
            target = load_model(cfg.model, cfg.dtype, cfg.device, measured_auto=True,
                                placement=target_placement(cfg.device_map, cfg.max_memory, cfg.tp),
                                compiled=cfg.compile)
        drafter = resolve_drafter(cfg.drafter, target, cfg.dtype, cfg.device,
                                  drafter_placement(cfg.drafter_device_map, cfg.drafter_max_memory)) \
            if cfg.drafter else None
        tp.watch_ranks()  # --tp: the other ranks are this run's siblings, not foreign load
        if cfg.compile:  # trees built from the compiled profile: measured now when this hardware has none
            compile_run.ensure_profile(cfg, target)
        runner = Runner(cfg, target, drafter)
        compiled = compile_run.enable_run(cfg, runner, loaded, drafter) if cfg.compile else {}
        tp.same_on_every_rank({label: {b: t["digest"] for b, t in trees.items()}
                               for label, trees in resolved_trees(runner.methods).items()}, "the trees resolved")
        chosen = runner.chosen()
        for label, settings in chosen.items():
            known = getattr(runner.methods.get(label), "said_when_loaded", ())  # its load line named these
            said = ", ".join(f"{k} {v}" for k, v in settings.items() if not isinstance(v, dict) and k not in known)
            if said:  # per-batch-size choices (dicts) were said when they were made
                console.print(f"[dim]{label}: {escape(said)}[/]")
        if cfg.resume:  # --tp: rank 0 holds the run folder (tensor_parallel.py: rank 0 decides, every rank follows)
            tp.on_writer(lambda: refuse_other_environment(out, runner.env))
    except BaseException:
        remove_if_empty(made)
        raise
    write_run_file(out, cfg, runner, chosen, shard_block(loaded, cfg.shard) if cfg.shard else None,
                   roofline=roofline_block(runner, loaded))

    turns = {(d.name, p.id): len(p.turns) for d in loaded for p in d.prompts}
    done = tp.on_writer(lambda: drop_incomplete(out, turns)) if cfg.resume else Done()
    reference = tp.on_writer(lambda: {(d, p, t): ids for (m, d, p, t), ids in read_tokens(out).items() if m == "ar"})
    # each method's quiet time per forward so far (a resumed run's kept rows too): the outlier test's reference
    history = tp.on_writer(lambda: retime.History.of_run(out))
    writer = RecordWriter(out)
    prompt_work = select(pending_prompts(loaded, single_labels(cfg, list(runner.methods)), done), loaded, cfg.shard)
    labels = batch_schedule.batch_labels(tuple(runner.methods), batch_schedule.modes_for(cfg.batching))
    jobs = batch_schedule.plan(loaded, list(cfg.batch_sizes), labels, cfg.refill)
    batch_work = pending_batches(jobs, done)
    say_batches(cfg, loaded)
    to_go = sum(len(w.labels) for w in prompt_work) + sum(len(w.labels) for w in batch_work)
    # the bar counts timed turns (a two-turn prompt is two of a method's), and grows by each re-timed one
    turns_to_go = (sum(len(w.labels) * len(w.prompt.turns) for w in prompt_work)
                   + sum(len(w.labels) for w in batch_work))
    if done:
        console.print(f"Resuming {escape(str(out))}: {len(done)} method x prompt results kept, {to_go} to go.")
    try:
        runner.warm_up(loaded[0].prompts)
        if batch_work:
            runner.warm_up_batches(loaded[0].prompts, labels, sorted({w.job.batch_size for w in batch_work}))
        if compiled:  # every bucket compiled now, before any timed turn; run.yaml's `compile:` block
            compile_run.finish_run_warm_up(compiled)
            tp.on_writer(lambda: compile_run.record(RunFolder(out).meta, compiled))
        with progress_bar() as bar:
            task = bar.add_task("decoding", total=turns_to_go, info="")

            def retimed(label, r, position, w):  # one more timed turn than planned: the bar's total grows with it
                bar.update(task, total=bar.tasks[task].total + 1)
                again = runner.time_turn(label, r.ids, w.index, r.turn, position)
                bar.update(task, advance=1)
                return again

            for work in prompt_work:
                results = {}
                for position, label in enumerate(work.labels):
                    bar.update(task, description=f"{work.dataset} {label}")
                    results[label] = runner.run_prompt(work.prompt, work.index, label, position)
                    tokens, seconds = (sum(len(r.gen.tokens) for r in results[label]),
                                       sum(r.seconds for r in results[label]))
                    bar.update(task, advance=len(work.prompt.turns),  # a skipped turn counts as done
                               info=f"{tokens / seconds if seconds else 0:6.1f} tok/s")
                retime.heal_prompt(lambda label, r, position, w=work: retimed(label, r, position, w),
                                   work.dataset, results, work.labels, history, cfg.retime,
                                   say=lambda text: bar.update(task, description=text))
                runner.finish_prompt(work.dataset, work.prompt, results, reference, writer)  # whole prompts only
            for work in batch_work:
                job = work.job
                for position, label in enumerate(work.labels):
                    bar.update(task, description=f"{job.dataset} {label.method} B={job.batch_size} {label.mode}")
                    rows = batch_schedule.run_label(runner, job, label.method, label.mode, cfg.refill)
                    runner.finish_batch(job.dataset, label.method, label.mode, rows, reference, writer, position)
                    tokens, seconds = sum(len(r.gen.tokens) for r in rows), sum(r.share_s for r in rows)
                    bar.update(task, advance=1, info=f"{tokens / seconds if seconds else 0:6.1f} tok/s")
    except KeyboardInterrupt:
        writer.close()
        kept = sum(1 for _ in open(RunFolder(out).records)) - 1
        raise Interrupted(out, kept) from None
    writer.close()
    if compiled:  # eager steps the timed turns took (widths no bucket held)
        tp.on_writer(lambda: compile_run.record(RunFolder(out).meta, compiled))
    mark_complete(out)
    if runner.synthetic:  # measured acceptance against the stated one: fails loudly on a disagreement
        tp.on_writer(lambda: synthetic.finish(out, runner.synthetic_tallies))
    return out


def write_run_file(out: Path, cfg: RunConfig, runner: Runner, chosen: dict, shard: dict | None = None,
                   roofline: dict | None = None) -> None:
    """run.yaml: the settings and environment (what --resume must match), the model, the trees' predictions, what
    the methods chose and the noise guard's floor; a shard's index, count and prompts (run/shard.py); `complete`
    turns true when every planned prompt finished."""
    target = runner.target
    profile = runner.local_profile()
    RunFolder(out).meta.write_text(yaml.safe_dump({
        "settings": plain(cfg.settings()), "environment": runner.env,
        "model": {"spec": target.spec, "name": target.name, "source": target.source, "rendering": target.prompt_format,
                  "placement": target.placement, "device_map": _device_map(target)},
        "trees": runner.tree_predictions((roofline or {}).get("context_tokens")),  # at the run's mean context
        "resolved_trees": resolved_trees(runner.methods), "chosen": chosen,
        "peak_memory": memory.peak_label(target.device),
        "noise_guard": {"latency_floor": noise.latency_floor(profile),
                        "profile": f"{profile.hardware} {profile.dtype}" if profile else None},
        "data_files": data_files(runner),
        **({"shard": shard} if shard else {}),
        **({"roofline": roofline} if roofline else {}),  # report/roofline.py: the bandwidth bound of a forward
        **({"synthetic_acceptance": synthetic.block(cfg, runner.synthetic)} if runner.synthetic else {}),
        "complete": False,
    }, sort_keys=False))


def data_files(runner: Runner) -> dict:
    """run.yaml's `data_files`: every profile, tree, acceptance file and recommendation the run used (path, source:
    working directory / user cache / shipped, flags, what for) and what it skipped and why (core/lookup.py); a tree
    given by path or built without the ledger seeing it is added from the methods' resolved trees."""
    for label, trees in resolved_trees(runner.methods).items():
        for size, tree in trees.items():
            source = str(tree["source"]).split(" (built for ")[0]
            lookup.note_used(lookup.TREE, source, f"{label}" + (f" batch size {size}" if size != 1 else ""),
                             unless_recorded=True)
    return lookup.record()


def roofline_block(runner: Runner, loaded: list[LoadedDataset], prompts: int = 200) -> dict:
    """run.yaml's roofline (core/machine/roofline.run_block): this machine's memory bandwidth (measured once per hardware
    key, then cached: core/machine/bandwidth.py) and the bound of a forward at the run's mean context (the first
    `prompts` first turns' rendered lengths, fitted to the context as runs fit them, + half of --max-new-tokens)."""
    from ..core.machine.bandwidth import bandwidth
    from ..core.machine.roofline import mean_context, run_block

    target, cfg = runner.target, runner.cfg
    room = max(target.context_length - cfg.max_new_tokens, 1)
    firsts = [p for d in loaded for p in d.prompts][:prompts]
    lengths = [min(len(target.tokenizer.render(ds.conversation(p, 0, []))), room) for p in firsts]
    return run_block(target, bandwidth(target.device), mean_context(lengths, cfg.max_new_tokens),
                     runner.local_profile())


def _device_map(target) -> dict | None:
    """Which module sits on which device (accelerate's map), for run.yaml; None on one device."""
    dmap = getattr(target.model, "hf_device_map", None)
    return {k: str(v) for k, v in dmap.items()} if dmap and not target.placement.startswith("single:") else None
