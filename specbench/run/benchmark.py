"""The one run loop, over whichever backend decodes (backend.py: specbench's own methods, llama.cpp, a server):
warm-up, then dataset x prompt x method x turn, timed and checked against `ar`.

Every method (ar included) runs each prompt, in an order rotated per prompt (work.interleaved), so every speedup
is measured side by side on the same prompts and a burst of load cannot land on one method only. A prompt's records
are written together once every method has run it, after its disturbed turns were re-timed (--retime: retime.py)
and after the lossless check against ar (lossless.py explains a mismatch). Batch > 1 runs after batch 1, in jobs
of run/batch_schedule.py, on a backend that decodes batches. Ctrl-C keeps every finished record (resume.py
continues the run). A backend whose requests a server schedules (its concurrency levels, Poisson arrivals) runs
load levels instead of turns (load_levels.py): measured whole by the backend, checked and written by the runner.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.markup import escape

from ..core import lookup
from ..core.model import tensor_parallel as tp
from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..progress import console, progress_bar
from . import batch_schedule, load_levels, noise, retime, synthetic
from .backend import Backend, backend_module
from .config import RunConfig
from .resume import Interrupted  # noqa: F401  (raised here; run/ray_shards and tests name it benchmark.Interrupted)
from .resume import Done, drop_incomplete, mark_complete, missing_folders, plain, prepare_out
from .resume import finished, refuse_other_environment, remove_if_empty
from .results import RecordWriter, read_tokens
from .runner import Runner
from .shard import refuse_too_many, prompt_count, select, shard_block
from .work import LoadedDataset, load_datasets, pending_batches, pending_prompts, say_batches, single_labels


def run(cfg: RunConfig) -> Path:
    """Run the benchmark on cfg.engine's backend; returns the run directory. Ctrl-C keeps every finished record
    (resume with --resume)."""
    module = backend_module(cfg.engine)
    lookup.start(cfg.allow_disturbed_profile)  # the ledger of files this run reads (run.yaml's data_files)
    cfg = module.check(cfg)  # the backend's refusals, before anything is written
    if cfg.resume and not module.MEASURES.resume:
        raise SpecbenchError(f"--resume: {module.MEASURES.why_not_resume}; run it again into a new --out")
    loaded = load_datasets(cfg)
    if cfg.shard:
        refuse_too_many(cfg.shard.count, prompt_count(loaded), f"--shard {cfg.shard}")
    made = missing_folders(Path(cfg.out))
    try:  # a refusal before run.yaml is written leaves no empty run folder behind
        out = prepare_out(cfg)
        if cfg.resume and finished(out):  # said before any model loads: there is nothing to run
            console.print(f"Nothing to resume: every prompt of {escape(str(out))} has run.")
            return out
        backend = module.prepare(cfg, loaded)
        if cfg.resume:  # --tp: rank 0 holds the run folder (tensor_parallel.py: rank 0 decides, every rank follows)
            tp.on_writer(lambda: refuse_other_environment(out, backend.env))
    except BaseException:
        remove_if_empty(made)
        raise
    write_run_file(out, cfg, backend, loaded)
    if backend.measures.phases:  # a server's load levels: each measured whole by the backend (load_levels.py)
        return load_levels.run_levels(cfg, out, backend, loaded)
    return run_turns(cfg, out, backend, loaded)


def run_turns(cfg: RunConfig, out: Path, backend: Backend, loaded: list[LoadedDataset]) -> Path:
    """The turn loop: every pending prompt x method at batch 1 (re-timed, checked, written whole), then every
    pending batch job; returns the run folder, marked complete."""
    runner = Runner(cfg, backend)
    turns = {(d.name, p.id): len(p.turns) for d in loaded for p in d.prompts}
    done = tp.on_writer(lambda: drop_incomplete(out, turns)) if cfg.resume else Done()
    reference = tp.on_writer(lambda: {(d, p, t): ids for (m, d, p, t), ids in read_tokens(out).items() if m == "ar"})
    # each method's quiet time per forward so far (a resumed run's kept rows too): the outlier test's reference
    history = tp.on_writer(lambda: retime.History.of_run(out))
    writer = RecordWriter(out)
    prompt_work = select(pending_prompts(loaded, single_labels(cfg, list(runner.labels)), done), loaded, cfg.shard)
    labels = batch_schedule.batch_labels(runner.labels, batch_schedule.modes_for(cfg.batching))
    jobs = batch_schedule.jobs(loaded, list(cfg.batch_sizes), labels, cfg.refill) if backend.measures.batches else []
    batch_work = pending_batches(jobs, done)
    say_batches(cfg, loaded)
    to_go = sum(len(w.labels) for w in prompt_work) + sum(len(w.labels) for w in batch_work)
    # the bar counts timed turns (a two-turn prompt is two of a method's), and grows by each re-timed one
    turns_to_go = (sum(len(w.labels) * len(w.prompt.turns) for w in prompt_work)
                   + sum(len(w.labels) for w in batch_work))
    if done:
        console.print(f"Resuming {escape(str(out))}: {len(done)} method x prompt results kept, {to_go} to go.")
    try:
        backend.warm_up(loaded[0].prompts, labels, sorted({w.job.batch_size for w in batch_work}), out)
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
                                   work.dataset, results, work.labels, history,
                                   cfg.retime if backend.measures.retime else 0,
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
    backend.close(out)
    mark_complete(out)
    if runner.synthetic:  # measured acceptance against the stated one: fails loudly on a disagreement
        tp.on_writer(lambda: synthetic.finish(out, runner.synthetic_tallies))
    return out


def write_run_file(out: Path, cfg: RunConfig, backend: Backend, loaded: list[LoadedDataset]) -> None:
    """run.yaml: the settings and environment (what --resume must match), what the backend says about what decoded
    (model, engine, trees and their predictions, chosen settings, roofline), the noise guard's floor, every data
    file the run used or skipped (core/lookup.py), a shard's index, count and prompts (run/shard.py); `complete`
    turns true when every planned prompt finished."""
    blocks = backend.run_blocks(loaded)  # first: the trees it notes in the ledger
    profile = backend.profile()
    roofline = blocks.pop("roofline", None)
    RunFolder(out).meta.write_text(yaml.safe_dump(plain({
        "settings": plain(cfg.settings()), "environment": backend.env, **blocks,
        "noise_guard": {"latency_floor": noise.latency_floor(profile),
                        "profile": f"{profile.hardware} {profile.dtype}" if profile else None},
        "data_files": lookup.record(),
        **({"shard": shard_block(loaded, cfg.shard)} if cfg.shard else {}),
        **({"roofline": roofline} if roofline else {}),  # report/roofline.py: the bandwidth bound of a forward
        **({"synthetic_acceptance": synthetic.block(cfg, stated)} if (stated := getattr(backend, "synthetic", None))
           else {}),
        "complete": False,
    }), sort_keys=False))
