"""`run --shards N`: the prompts split into N shards (run/shard.py), each a Ray task holding --gpus-per-shard GPUs (or
--threads CPU cores) that runs the code path of `run --shard I/N` into RUN/shards/<I-of-N>/; then the merge
(run/merge.py) into RUN.

Faults: a task whose worker dies is retried by Ray (max_retries) and, finding its folder's run.yaml, continues from
the records it had written (the --resume machinery: whole prompts kept, nothing run twice). Ctrl-C cancels the
tasks and keeps every finished record; `--resume` finishes the run (finished shards are not run again). Ray is
imported only here, and only for --shards.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.machine import contention
from ..core.store import RunFolder
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..methods import get_method
from ..progress import console, progress_bar
from .config import RunConfig
from .merge import merge
from .results import read_meta
from .shard import Shard, positions, refuse_too_many
from .validation import validate
from .work import LoadedDataset

RETRIES = 3  # Ray's max_retries: how often a shard whose worker died is started again
KILL_ENV = "SPECBENCH_TEST_KILL_SHARD"  # tests only: "I:K" = shard I's worker dies after K records, first attempt


@dataclass(frozen=True)
class ShardJob:
    """One shard of the run: its config (with --shard I/N and its folder) and the records it will write."""

    cfg: RunConfig
    rows: int

    @property
    def shard(self) -> Shard:
        return self.cfg.shard

    def written(self) -> int:
        path = RunFolder(self.cfg.out).records
        if not path.exists():
            return 0
        with open(path, "rb") as f:
            return max(sum(1 for _ in f) - 1, 0)

    def complete(self) -> bool:
        return bool(read_meta(self.cfg.out).get("complete"))


def import_ray():
    try:
        import ray
    except ImportError:
        raise SpecbenchError("--shards runs on Ray, which is not installed: pip install 'specbench[ray]' (or run "
                             "each shard yourself with --shard I/N and join them with `specbench merge`)") from None
    return ray


def run_sharded(cfg: RunConfig, count: int, gpus_per_shard: float = 0, address: str | None = None) -> list[Path]:
    """Run the N shards on Ray and merge them into cfg.out; returns the merged run folder(s)."""
    if count < 1:
        raise SpecbenchError(f"--shards must be at least 1 (got {count})")
    if gpus_per_shard < 0:
        raise SpecbenchError(f"--gpus-per-shard must be 0 or more (got {gpus_per_shard})")
    if max(cfg.batch_sizes) > 1:
        raise SpecbenchError("--shards: sharded runs decode one prompt at a time (a batch's prompts must share a "
                             "device); run --batch-size > 1 unsharded")
    ray = import_ray()
    cpus = 0 if gpus_per_shard else (cfg.threads or 1)
    cfg = validate(replace(absolute(cfg), threads=cfg.threads or (cpus or None)))
    loaded = [LoadedDataset(*ds.load_prompts(name, cfg.limit, cfg.data_file, per_category=cfg.per_category))
              for name in cfg.datasets]
    refuse_too_many(count, len(positions(loaded)), f"--shards {count}")
    out = Path(cfg.out)
    jobs = shard_jobs(cfg, loaded, count)
    prepare(out, cfg.resume, count)
    started = connect(ray, address, max(cpus, 1))
    try:
        refuse_unfit(ray, cpus, gpus_per_shard)
        todo = [p for p in jobs if not (cfg.resume and p.complete())]
        if len(todo) < len(jobs):
            console.print(f"Resuming {out}: {len(jobs) - len(todo)} of {count} shards already finished")
        with contention.watching_run(out / "shards", "driver"):  # shards count the driver (its bars) as their run's
            run_tasks(ray, todo, jobs, cpus, gpus_per_shard)
    except KeyboardInterrupt:
        from .benchmark import Interrupted

        stopped = Interrupted(out, sum(p.written() for p in jobs))
        stopped.runs = _partial_merge(jobs, out)  # the CLI reports them (marked partial)
        raise stopped from None
    finally:
        if started:
            ray.shutdown()
    try:
        return merge([p.cfg.out for p in jobs], out, replace=True)
    except SpecbenchError as exc:
        raise SpecbenchError(f"{exc}. The shards are kept in {out / 'shards'}; `specbench merge "
                             f"{out / 'shards'}/*/ --out OTHER` merges them once that is settled") from None


def absolute(cfg: RunConfig) -> RunConfig:
    """Paths the workers read or write, made absolute: a worker (or another machine) may start elsewhere."""
    def resolved(value):
        return str(Path(value).resolve()) if value and Path(value).exists() else value

    return replace(cfg, out=Path(cfg.out).resolve(), data_file=resolved(cfg.data_file), model=resolved(cfg.model),
                   drafter=resolved(cfg.drafter), datasets=tuple(resolved(d) for d in cfg.datasets))


def shard_jobs(cfg: RunConfig, loaded: list[LoadedDataset], count: int) -> list[ShardJob]:
    """Each shard's config and its expected record count (prompt turns x method labels) for the progress bars."""
    labels = sum(len(cfg.tree_sizes) if cfg.tree_sizes and get_method(m).kind == "tree" else 1 for m in cfg.methods)
    where = positions(loaded)
    turns = {(d.name, str(p.id)): len(p.turns) for d in loaded for p in d.prompts}
    jobs = []
    for i in range(count):
        shard = Shard(i, count)
        rows = labels * sum(turns[k] for k, pos in where.items() if shard.owns(pos))
        folder = Path(cfg.out) / "shards" / shard.folder
        # --resume continues the shards that started; one that never wrote its run.yaml starts afresh
        jobs.append(ShardJob(replace(cfg, shard=shard, out=folder, resume=cfg.resume and RunFolder(folder).is_run()),
                               rows))
    return jobs


def prepare(out: Path, resume: bool, count: int) -> None:
    """The run folder: a new one, or with --resume one of the same split."""
    shards = out / "shards"
    held = sorted(p.name for p in shards.iterdir() if p.is_dir()) if shards.is_dir() else []
    if not resume and (held or RunFolder(out).is_run()):
        raise SpecbenchError(f"{out} already holds a run. Pass --resume to continue it, or choose another --out.")
    if resume and not held and not RunFolder(out).is_run():
        raise SpecbenchError(f"--resume: {out} is not a run folder (no run.yaml, no shards/). Pass --out with the "
                             "folder of the run to continue, or drop --resume to start a new run there.")
    other = [name for name in held if not name.endswith(f"-of-{count:03d}")]
    if other:
        raise SpecbenchError(f"--resume: {out} was split into other shards ({', '.join(other)}); resume with its "
                             "--shards count, or choose another --out")
    try:
        shards.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecbenchError(f"cannot write to --out {out}: {exc.strerror or exc}. Choose a writable folder.") from exc


def connect(ray, address: str | None, cpus: int) -> bool:
    """Join --ray-address / $RAY_ADDRESS, or start a local Ray (no dashboard, quiet); returns whether this call
    started the session (an already initialised session, as in tests, is used as it is)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False, **quiet,
                     runtime_env={"env_vars": {"PYTHONPATH": _package_path()}})
    except (ConnectionError, RuntimeError) as exc:
        where = f"--ray-address {address}: cannot join a Ray cluster there" if address else "cannot start a local Ray"
        raise SpecbenchError(f"{where} ({' '.join(str(exc).split())})") from None
    return True


def _package_path() -> str:
    """PYTHONPATH for local workers: this specbench first, so they run the code the driver runs."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def refuse_unfit(ray, cpus: int, gpus: float) -> None:
    """A shard asking for more than the whole cluster has would wait forever: refuse, naming what there is."""
    have = ray.cluster_resources()
    if gpus and have.get("GPU", 0) < gpus:
        raise SpecbenchError(f"--gpus-per-shard {gpus:g}: the Ray cluster has {have.get('GPU', 0):g} GPU(s)")
    if cpus and have.get("CPU", 0) < cpus:
        raise SpecbenchError(f"--threads {cpus}: each shard holds {cpus} CPU(s), the Ray cluster has "
                             f"{have.get('CPU', 0):g}")


def run_tasks(ray, todo: list[ShardJob], jobs: list[ShardJob], cpus: int, gpus: float) -> None:
    """Submit the shards, draw a bar per shard from its records.csv, and turn a failed shard into a clear error."""
    task = ray.remote(shard_task).options(num_cpus=cpus, num_gpus=gpus, max_retries=RETRIES, retry_exceptions=False)
    kill = os.environ.get(KILL_ENV, "")
    pending = {task.remote(p.cfg, kill): p for p in todo}
    try:
        with progress_bar() as bar:
            bars = {p.shard.index: bar.add_task(f"shard {p.shard}", total=max(p.rows, 1), info="") for p in jobs}
            while True:
                for p in jobs:
                    bar.update(bars[p.shard.index], completed=min(p.written(), p.rows),
                               info="done" if p not in pending.values() else "")
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    shard_plan = pending.pop(ref)
                    _result(ray, ref, shard_plan)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _result(ray, ref, p: ShardJob) -> None:
    log = _log_path(p.cfg)
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, SpecbenchError):
            raise SpecbenchError(f"shard {p.shard}: {cause}") from None
        raise SpecbenchError(f"shard {p.shard} failed: {type(cause).__name__}: {cause} (its log: {log})") from None
    except ray.exceptions.RayError as exc:
        raise SpecbenchError(f"shard {p.shard}: its worker died {RETRIES + 1} times ({type(exc).__name__}); its "
                             f"records are kept, --resume continues it (its log: {log})") from None


def _log_path(cfg: RunConfig) -> Path:
    return Path(cfg.out).parent / f"{Path(cfg.out).name}.log"


def _partial_merge(jobs: list[ShardJob], out: Path) -> list[Path]:
    """Ctrl-C: what finished, merged (marked partial) when any shard wrote records; the caller writes the report."""
    started = [p.cfg.out for p in jobs if RunFolder(p.cfg.out).is_run()]
    if not any(p.written() for p in jobs):
        return []
    try:
        return merge(started, out, allow_partial=True, per_hardware=True, replace=True)
    except SpecbenchError:
        return []  # the shards' records are what matters; they are kept either way


def shard_task(cfg: RunConfig, kill: str = "") -> str:
    """One shard, in a Ray worker: `run --shard I/N` into its folder, continuing its records on a retry. Console
    output goes to RUN/shards/<I-of-N>.log (the driver draws the bars)."""
    from .. import progress
    from .benchmark import run

    progress.quiet_libraries()
    progress.console.file = open(_log_path(cfg), "a")  # noqa: SIM115 (the worker's console, for its lifetime)
    if kill and kill.split(":")[0] == str(cfg.shard.index):
        _die_after(cfg, int(kill.split(":")[1]))
    with contention.watching_run(Path(cfg.out).parent, Path(cfg.out).name):  # other shards are planned, not noise
        return str(run(replace(cfg, resume=RunFolder(cfg.out).is_run())))


def _die_after(cfg: RunConfig, rows: int) -> None:
    """Tests only (KILL_ENV): end this worker process abruptly once the shard holds `rows` records, on its first
    attempt only (a marker file remembers), as a crashed machine would."""
    marker = Path(cfg.out).parent / f".{Path(cfg.out).name}.killed"
    if marker.exists():
        return
    job = ShardJob(cfg, rows)

    def watch() -> None:
        while job.written() < rows:
            time.sleep(0.02)
        marker.write_text("")
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
