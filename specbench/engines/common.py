"""What every engine shares to write a run folder exactly as run/benchmark.py does, so that the same report, noise
guard, --resume, merge and CI gates read it (llama_cpp.py uses it; openai_server.py can).

An engine measures turns; this module turns them into the run folder:

    from .common import EngineRun, EngineTurn, load_work, local_environment

    cfg = check_methods(cfg, supported=("ar", "pld"), engine="llama.cpp")   # ar first; others refused by name
    loaded = load_work(cfg)                       # --dataset / --limit / --data-file / --per-category, as specbench
    env = local_environment("llama.cpp", threads=4, dtype="Q4_1")   # what records and --resume's checks carry
    run = EngineRun.open(cfg, loaded, env,
                         model={"spec": cfg.model, "name": ..., "source": ..., "rendering": "chat template"},
                         engine={"name": "llama.cpp", "version": llama_cpp.__version__, "build": {...}})
    #   prepare_out (an existing folder continues only with --resume and the same options), run.yaml with an
    #   `engine:` block, --resume bookkeeping (incomplete prompts dropped, ar's kept tokens the references)
    if run.nothing_left: return run.out
    try:
        for work in run.pending():                # run.work.PromptWork: dataset, index, prompt, labels
            results = {}                          # labels rotated per prompt (ar included), as specbench's run
            for order, label in enumerate(work.labels):
                results[label] = [EngineTurn(...) for each turn]     # the engine's timed generations
            run.finish_prompt(work, results, explain=...)   # lossless check, records.csv + tokens.jsonl
    except KeyboardInterrupt:
        raise run.interrupted() from None          # whole prompts kept; "--resume" continues
    run.complete()                                 # run.yaml complete: true; closes the files
    return run.out

EngineTurn holds what one timed turn measured: tokens, wall time, per-token arrival times (streaming) and the
engine's counts (target evaluations, draft proposals, accepted drafts) where the engine exposes them;
`target_forwards=None` means "not known" (tau and acceptance are then left empty, never guessed).

The lossless check compares each method's greedy tokens with the same engine's `ar` tokens of the same prompt turn
(run/records.compare: "match" or "mismatch@<first index>"). `explain(label, work, turn, index)`, when the engine can
give logits, returns (gap, verdict) at the first divergence: gap = ar's logit of its own token minus its logit of the
method's token, verdict from near_tie() ("near-tie" within the arithmetic's rounding, else "unexplained").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from rich.markup import escape

from ..core.store import RunFolder
from ..data import datasets as ds
from ..errors import SpecbenchError
from ..methods import get_method
from ..progress import console
from ..run.config import RunConfig
from ..run.lossless import NEAR_TIE, UNEXPLAINED, CALIBRATION_LAYERS, DTYPE_ULPS, FLOAT32_ULPS
from ..run.records import LosslessCheck, compare, serving_view
from ..run.resume import Done, drop_incomplete, finished, mark_complete, missing_folders, plain, prepare_out
from ..run.resume import Interrupted, refuse_other_environment, remove_if_empty
from ..run.results import Record, RecordWriter, read_tokens
from ..run.work import LoadedDataset, PromptWork, check_categories, pending_prompts


@dataclass
class EngineTurn:
    """One timed generation of one prompt turn by an engine, before it is checked and written."""

    tokens: list[int]  # new token ids, a stop token included when the engine emitted one
    wall_s: float  # from sending the prompt (prefill included) to the last token
    prompt_tokens: int
    token_times: list[float] = field(default_factory=list)  # seconds from the turn's start to each token's arrival
    target_forwards: int | None = None  # target evaluations (prefill included); None: the engine does not say
    drafted: int = 0  # draft tokens proposed for verification
    accepted: int = 0  # of those, accepted
    draft_forwards: int = 0  # draft-model evaluations (0: no draft model)
    draft_s: float = 0.0  # seconds inside drafting (the draft model's / prompt lookup's calls)
    forward_s: float = math.nan  # seconds inside the target's evaluations; NaN where not measured
    drafted_per_position: list[int] = field(default_factory=list)  # proposed drafts by draft position
    accepted_per_position: list[int] = field(default_factory=list)  # accepted drafts by draft position
    stopped: bool = False  # ended on a stop token (not the length cap)
    noise: dict = field(default_factory=dict)  # core.machine.contention.between(): foreign_cpu, steal, load_*
    peak_mem_mb: float = math.nan
    order: int = -1  # position of this method among the methods run on this prompt
    turn: int = 0
    text: str = ""  # the decoded answer (a later turn's conversation carries it)
    prompt_ids: list[int] = field(default_factory=list)  # what the engine was given (the lossless explanation)
    prompt_cut: int = 0  # tokens cut from the rendered prompt's left to fit the context (records.csv prompt_cut)


def check_methods(cfg: RunConfig, supported: tuple[str, ...], engine: str) -> RunConfig:
    """The config with `ar` first; refuses a method the engine does not run, listing those it does, and the
    cheap mistakes specbench's own validation refuses (--max-new-tokens, --limit, --threads, --warmup)."""
    for flag, value, least in (("--max-new-tokens", cfg.max_new_tokens, 1), ("--limit", cfg.limit, 1),
                               ("--threads", cfg.threads, 1), ("--warmup", cfg.warmup, 0), ("--repeats", cfg.repeats, 1)):
        if value is not None and value < least:
            raise SpecbenchError(f"{flag} must be at least {least} (got {value})")
    for name in cfg.methods:
        if name not in supported:
            get_method(name)  # a typo is named as such (did you mean ...) before the engine's own refusal
            raise SpecbenchError(f"-m {name}: --engine {engine} runs {', '.join(supported)} (its own decoding); "
                                 f"run {name} with --engine specbench, or drop -m {name}")
    if max(cfg.batch_sizes) > 1 or cfg.shard or cfg.tree_sizes or cfg.tp > 1:
        raise SpecbenchError(f"--engine {engine} decodes one prompt at a time on one machine: drop --batch-size, "
                             "--shard, --tree-sizes and --tp (they are options of --engine specbench)")
    methods = ("ar",) + tuple(dict.fromkeys(m for m in cfg.methods if m != "ar"))
    return RunConfig(**{**cfg.__dict__, "methods": methods})


def load_work(cfg: RunConfig) -> list[LoadedDataset]:
    """The run's prompts, loaded exactly as specbench's own run loads them (--dataset, --limit, --data-file,
    --per-category); render each turn with ds.conversation(prompt, turn, answers)."""
    loaded = [LoadedDataset(*ds.load_prompts(name, cfg.limit, cfg.data_file, per_category=cfg.per_category))
              for name in cfg.datasets]
    check_categories(cfg, loaded)
    return loaded


def local_environment(engine: str, threads: int, dtype: str, placement: str = "") -> dict:
    """The environment records and run.yaml carry (core.machine.hardware.environment: hardware slug and identity,
    library versions, git), with the engine's own threads and weight type (e.g. "Q4_1") and the engine's name."""
    import torch

    from ..core.machine.hardware import environment

    env = environment(torch.device("cpu"))
    env.update(threads=int(threads), dtype=str(dtype), engine=engine, placement=placement or f"{engine}:cpu")
    return env


def near_tie(logits: np.ndarray, ar_token: int, method_token: int, layers: int = CALIBRATION_LAYERS,
             eps: float = 2.0 ** -7) -> tuple[float, str]:
    """(gap, verdict) from ar's logits at the first divergence (run/lossless.py's rule): gap = logit[ar's token] -
    logit[method's token]; "near-tie" when |gap| <= max|logit| x (8 ulps at `eps` + 128 float32 ulps) x
    sqrt(layers / 30), else "unexplained". eps 2^-7 (default): a quantised engine's 8-bit activations round about as
    coarsely as bfloat16 (not calibrated on any engine: a wide tolerance, said so in docs/engines.md)."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    gap = float(row[int(ar_token)] - row[int(method_token)])
    depth = math.sqrt(max(1.0, layers / CALIBRATION_LAYERS))
    tolerance = float(np.abs(row).max()) * (DTYPE_ULPS * eps + FLOAT32_ULPS * float(np.finfo(np.float32).eps)) * depth
    return gap, (NEAR_TIE if math.isfinite(gap) and abs(gap) <= tolerance else UNEXPLAINED)


def engine_record(cfg: RunConfig, env: dict, model: str, method: str, dataset: str, prompt: ds.Prompt,
                  t: EngineTurn, check: LosslessCheck) -> Record:
    """The records.csv row of one engine turn (the columns specbench's own rows fill, engine=env["engine"])."""
    n = len(t.tokens)
    known = t.target_forwards is not None
    forwards = int(t.target_forwards or 0)
    per_pos = " ".join(f"{a}/{d}" for a, d in zip(t.accepted_per_position, t.drafted_per_position))
    gap = check.gap
    host = (t.wall_s - t.forward_s - t.draft_s) if math.isfinite(t.forward_s) else math.nan
    return Record(
        method=method, dataset=dataset, prompt_id=str(prompt.id), category=prompt.category, turn=t.turn,
        prompt_tokens=t.prompt_tokens, new_tokens=n, wall_s=round(t.wall_s, 6),
        tokens_per_s=round(n / t.wall_s, 4) if t.wall_s else 0.0,
        target_forwards=forwards, tau=round(n / max(forwards, 1), 4) if known else math.nan,
        drafted=t.drafted, draft_forwards=t.draft_forwards, draft_s=round(t.draft_s, 6), accepted_drafts=t.accepted,
        acceptance_rate=round(t.accepted / t.drafted, 4) if t.drafted else math.nan,
        lossless=check.lossless, stopped=t.stopped, peak_mem_mb=round(t.peak_mem_mb, 1), accepted_per_position=per_pos,
        temperature=cfg.temperature, model=model, dtype=env["dtype"], device=env["device"],
        hardware=env["hardware"], threads=env["threads"], torch=env.get("torch", ""),
        transformers=env.get("transformers", ""), git=env.get("git", ""),
        mismatch_logit_gap=round(gap, 6) if math.isfinite(gap) else math.nan, mismatch_explained=check.verdict,
        forward_ms=round(t.wall_s * 1e3 / forwards, 3) if forwards else math.nan, order=t.order,
        placement=env.get("placement", ""), target_tokens=0, batch_wall_s=round(t.wall_s, 6),
        latency_s=round(t.wall_s, 6), kv_padding_ratio=0.0, engine=env.get("engine", "specbench"),
        forward_s=round(t.forward_s, 6) if math.isfinite(t.forward_s) else math.nan,
        host_s=round(host, 6) if math.isfinite(host) else math.nan, prompt_cut=t.prompt_cut,
        **serving_view(t.token_times), **t.noise)  # ttft, tpot, itl percentiles: one definition for all rows


# explain(label, work, turn, index) -> (gap, verdict) at a method's first divergence from ar, or None
Explain = Callable[[str, PromptWork, EngineTurn, int], "tuple[float, str] | None"]


class EngineRun:
    """One engine run folder: run.yaml, records.csv and tokens.jsonl as run/benchmark.py writes them (open())."""

    def __init__(self, cfg: RunConfig, loaded: list[LoadedDataset], env: dict, out: Path, done: Done):
        self.cfg, self.loaded, self.env, self.out, self.done = cfg, loaded, env, out, done
        # (dataset, prompt id, turn) -> ar's tokens: this run's, and a resumed run's kept ones
        self.reference = {(d, p, t): ids for (m, d, p, t), ids in read_tokens(out).items() if m == "ar"}
        self.writer = RecordWriter(out)
        self.nothing_left = False

    @classmethod
    def open(cls, cfg: RunConfig, loaded: list[LoadedDataset], env: dict, model: dict, engine: dict,
             chosen: dict | None = None) -> "EngineRun":
        """Create (or, with --resume, continue) the run folder cfg.out and write run.yaml. Refuses to mix runs (an
        existing folder needs --resume with the same options, and the same environment: hardware, threads, weight
        type, library versions). model: spec, name, source, rendering; engine: name, version and build facts."""
        made = missing_folders(Path(cfg.out))
        try:
            out = prepare_out(cfg)
            if cfg.resume and finished(out):
                console.print(f"Nothing to resume: every prompt of {escape(str(out))} has run.")
                run = cls.__new__(cls)
                run.out, run.nothing_left = out, True
                return run
            if cfg.resume and RunFolder(out).meta.exists():
                refuse_other_environment(out, env)
        except BaseException:
            remove_if_empty(made)
            raise
        RunFolder(out).meta.write_text(yaml.safe_dump(plain({
            "settings": plain(cfg.settings()), "environment": env, "model": model, "engine": engine,
            "chosen": chosen or {}, "peak_memory": "peak RSS during the generation (the engine runs in this "
                                                   "process)" if env.get("device_type") == "cpu" else "",
            "noise_guard": {"latency_floor": 1.0, "profile": None},
            "complete": False}), sort_keys=False))
        turns = {(d.name, p.id): len(p.turns) for d in loaded for p in d.prompts}
        done = drop_incomplete(out, turns) if cfg.resume else Done()
        run = cls(cfg, loaded, env, out, done)
        if len(done):
            console.print(f"Resuming {escape(str(out))}: {len(done)} method x prompt results kept.")
        return run

    def pending(self) -> list[PromptWork]:
        """Every prompt with the methods still to run on it, in an order rotated per prompt (run/work.py)."""
        return pending_prompts(self.loaded, list(self.cfg.methods), self.done)

    def check(self, label: str, work: PromptWork, t: EngineTurn, explain: Explain | None = None) -> LosslessCheck:
        """The lossless check of one turn against the same engine's ar (greedy runs only; ar itself unchecked)."""
        key = (work.dataset, work.prompt.id, t.turn)
        if label == "ar" or not self.cfg.sampling.greedy or key not in self.reference:
            return LosslessCheck()
        lossless = compare(t.tokens, self.reference[key])
        if lossless == "match":
            return LosslessCheck(lossless)
        index = int(lossless.split("@")[1])
        reason = explain(label, work, t, index) if explain else None
        gap, verdict = reason if reason else (math.nan, UNEXPLAINED)
        return LosslessCheck(lossless, gap, verdict)

    def finish_prompt(self, work: PromptWork, results: dict[str, list[EngineTurn]],
                      explain: Explain | None = None) -> None:
        """Check every method's turns against ar's and write the prompt's records together (methods in the run's
        order, whatever order they ran in): an interrupted run keeps whole prompts only."""
        for t in results.get("ar", []):
            self.reference[(work.dataset, work.prompt.id, t.turn)] = t.tokens
        for label in (m for m in self.cfg.methods if m in results):
            for t in results[label]:
                check = self.check(label, work, t, explain)
                self.writer.write(engine_record(self.cfg, self.env, self.cfg.model, label, work.dataset,
                                                work.prompt, t, check), t.tokens, t.text or None)

    def interrupted(self) -> SpecbenchError:
        """The error to raise on Ctrl-C (exit 130): what was kept and how to continue (--resume)."""
        self.writer.close()
        kept = max(sum(1 for _ in open(RunFolder(self.out).records)) - 1, 0)
        return Interrupted(self.out, kept)

    def complete(self) -> Path:
        """Close the files and mark run.yaml complete (every planned prompt ran)."""
        if not self.nothing_left:
            self.writer.close()
            mark_complete(self.out)
        return self.out
