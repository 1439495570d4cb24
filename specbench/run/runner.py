"""The benchmark loop: warm-up, then dataset x prompt x method x turn, timed and checked against `ar`.

Measurement rules (DESIGN.md §3): each turn is timed from prefill to the last token, after warm-up, with device
synchronisation at both ends; tokenisation is outside the timed region; new tokens are counted the same way for
every method. Every method (ar included) runs each prompt, in an order rotated per prompt (`interleaved`), so every
speedup is measured side by side on the same prompts and a burst of load cannot land on one method only; each timed
turn records what else the machine did meanwhile (core/contention.py). A prompt's records are written together once
every method has run it, after the lossless check against ar (lossless.py explains a mismatch). Batch > 1 runs after
batch 1, in jobs of run/batch_jobs.py.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import pandas as pd
import torch
import yaml
from rich.markup import escape

from ..core import contention, memory
from ..core.forward import count_fed_tokens
from ..core.hardware import environment
from ..core.models import LoadedModel, dtype_name, load_model
from ..core.timing import wall
from ..core.verify import Sampling
from ..data import datasets as ds
from ..data.trainsets import refuse_as_benchmark
from ..artifacts.token_drafter import resolve_drafter
from ..errors import SpecbenchError
from ..methods import REGISTRY, OptionValues, all_options, get_method, split_by_method
from ..methods.base import DecodeMethod, Generation
from ..progress import console, progress_bar
from . import batch_jobs as batching
from . import noise
from .results import RECORD_COLUMNS, Record, RecordWriter, append_timeline, read_tokens, with_batch_columns


@dataclass(frozen=True)
class RunConfig:
    methods: tuple[str, ...] = ("ar", "pld")
    datasets: tuple[str, ...] = ("humaneval",)
    model: str = "smollm2-135m"
    drafter: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    limit: int | None = 6
    per_category: bool = False  # limit = the first N of every category
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    warmup: int = 1
    repeats: int = 1  # timed generations per prompt turn (median wall time recorded)
    threads: int | None = None
    data_file: str | None = None
    out: Path = Path("results/latest")
    resume: bool = False
    options: dict = field(default_factory=dict)  # method options by name (flat, as the CLI gives them)
    tree_sizes: tuple[int, ...] = ()  # tree methods run once per size, labelled <method>@<size>
    batch_sizes: tuple[int, ...] = (1,)  # prompts decoded at once (EMS-SD); 1 = one at a time
    batching: str = "both"  # at batch > 1: unpadded (EMS-SD), padded (the vanilla way) or both
    refill: bool = False  # at batch > 1: a finished sample's slot takes the next prompt (continuous batching)

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed)

    def settings(self) -> dict:
        """The settings a resumed run must share (everything but out / resume)."""
        d = asdict(self)
        d.pop("out"), d.pop("resume")
        d["methods"], d["datasets"] = list(self.methods), list(self.datasets)
        d["tree_sizes"] = list(self.tree_sizes)
        d["batch_sizes"] = list(self.batch_sizes)
        d["options"] = self.method_options()
        return d

    def method_options(self) -> dict[str, dict]:
        """Per method of this run: the options it declares, with their values (defaults filled in)."""
        given = split_by_method(self.options, self.methods, REGISTRY)
        return {m: dict(OptionValues(get_method(m).option_specs, given[m], f"method {m}")) for m in self.methods}


def validate(cfg: RunConfig) -> RunConfig:
    """Cheap checks before any model loads; returns the config with `ar` first in the method list."""
    if cfg.max_new_tokens < 1:
        raise SpecbenchError(f"--max-new-tokens must be at least 1 (got {cfg.max_new_tokens})")
    if cfg.limit is not None and cfg.limit < 1:
        raise SpecbenchError(f"--limit must be at least 1 (got {cfg.limit})")
    if cfg.repeats < 1:
        raise SpecbenchError(f"--repeats must be at least 1 (got {cfg.repeats})")
    if cfg.warmup < 0:
        raise SpecbenchError(f"--warmup must be 0 or more (got {cfg.warmup})")
    if not all(math.isfinite(v) for v in (cfg.temperature, cfg.top_p)):
        raise SpecbenchError(f"sampling: --temperature and --top-p must be numbers (got {cfg.temperature}, "
                             f"{cfg.top_p})")
    if cfg.threads is not None and cfg.threads < 1:
        raise SpecbenchError(f"--threads must be at least 1 (got {cfg.threads}); leave it out for torch's choice")
    if cfg.temperature < 0 or not 0 < cfg.top_p <= 1 or cfg.top_k < 0:
        raise SpecbenchError("sampling: need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0")
    for name in cfg.methods:
        get_method(name)
    for name in cfg.datasets:
        refuse_as_benchmark(name)
    if any(n < 1 for n in cfg.tree_sizes):
        raise SpecbenchError("--tree-sizes: sizes must be positive integers")
    _validate_batching(cfg)
    methods = ("ar",) + tuple(dict.fromkeys(m for m in cfg.methods if m != "ar"))
    cfg = RunConfig(**{**cfg.__dict__, "methods": methods})
    declared = all_options(REGISTRY)
    unknown = sorted(set(cfg.options) - set(declared))
    if unknown:
        raise SpecbenchError(f"unknown method option(s) {', '.join(unknown)}; see `specbench list methods`")
    cfg.method_options()  # each method checks its own values (ranges, choices) before any model loads
    for name, value in cfg.options.items():
        spec, takers = declared[name]
        if value is None or value == spec.default:
            continue
        if not set(takers) & set(methods):
            console.print(f"[yellow]note[/] {spec.flag} is an option of {', '.join(takers)}, and none of them "
                          "runs: it is ignored")
        elif spec.name == "gamma" and (others := [m for m in methods
                                                  if m not in takers and get_method(m).kind == "tree"]):
            # a draft length given beside tree methods: say that their trees, not --gamma, set how far they draft
            console.print(f"[yellow]note[/] --gamma applies to {', '.join(m for m in methods if m in takers)}; "
                          f"it is ignored by {', '.join(others)} (a tree method's tree sets how far it drafts)")
    return cfg


def _validate_batching(cfg: RunConfig) -> None:
    """--batch-size, --batching, --refill: refuse what cannot run, note what does nothing."""
    from .batch_jobs import modes_for

    if not cfg.batch_sizes or any(b < 1 for b in cfg.batch_sizes):
        raise SpecbenchError(f"--batch-size: sizes must be at least 1 (got {', '.join(map(str, cfg.batch_sizes))})")
    modes_for(cfg.batching)
    if max(cfg.batch_sizes) > 1:
        unable = [m for m in cfg.methods if not get_method(m).batchable]
        if unable:
            able = ", ".join(n for n, c in REGISTRY.items() if c.batchable)
            raise SpecbenchError(f"{', '.join(unable)} cannot decode batches yet (--batch-size "
                                 f"{max(cfg.batch_sizes)}): methods that can: {able}. Run {', '.join(unable)} at "
                                 "--batch-size 1 in a separate run.")
        if cfg.tree_sizes:
            raise SpecbenchError("--tree-sizes sweeps run one prompt at a time: use --batch-size 1 for the sweep "
                                 "(a batched ppd takes --tree auto, PATH or size=N)")
    elif cfg.refill:
        console.print("[yellow]note[/] --refill does nothing at --batch-size 1 (one prompt at a time)")


def prepare_out(cfg: RunConfig) -> Path:
    """Create the run directory, refusing to mix runs: an existing run continues only with --resume."""
    out = Path(cfg.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SpecbenchError(f"cannot write to --out {out}: {exc.strerror or exc}. Choose a writable folder.") from exc
    run_file = out / "run.yaml"
    if run_file.exists():
        if not cfg.resume:
            raise SpecbenchError(f"{out} already holds a run. Pass --resume to continue it, or choose another --out.")
        old = yaml.safe_load(run_file.read_text()) or {}
        changed = _differences(old.get("settings") or {}, _plain(cfg.settings()))
        if changed:
            raise SpecbenchError(f"--resume: the options differ from the run in {out}: {'; '.join(changed)}. "
                                 "Resume with the same options, or choose another --out.")
    return out


def missing_folders(path: Path) -> list[Path]:
    """The folders of `path` that do not exist yet, deepest first (what creating it would make)."""
    return [p for p in (path, *path.parents) if not p.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders a refused run created, deepest first, as long as they hold nothing."""
    for folder in folders:
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return


# What the numbers depend on besides the options: a resumed run must match the interrupted one in all of them.
ENVIRONMENT_KEYS = ("device", "device_type", "hardware", "identity", "dtype", "cpu_linear", "torch", "transformers",
                    "threads")


def refuse_other_environment(out: Path, env: dict) -> None:
    """--resume: refuse when kernels, library versions, hardware, dtype, device or threads changed, naming them."""
    old = (yaml.safe_load((out / "run.yaml").read_text()) or {}).get("environment") or {}
    changed = _differences({k: old.get(k) for k in ENVIRONMENT_KEYS}, _plain({k: env.get(k) for k in ENVIRONMENT_KEYS}))
    if changed:
        hint = " (SPECBENCH_CPU_LINEAR chooses the CPU kernels)" if any("cpu_linear" in c for c in changed) else ""
        raise SpecbenchError(f"--resume: the run in {out} was measured in another environment: {'; '.join(changed)}"
                             f"{hint}. Mixing them would mix two sets of numbers; resume where it started, or "
                             "choose another --out.")
    if old.get("git") != env.get("git"):
        console.print(f"[yellow]note[/] resuming with specbench {env.get('git')} (the run started with "
                      f"{old.get('git')})")


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for every (nested) key whose value differs."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a} -> {b}")
    return out


def _plain(obj):
    """Settings as YAML-safe plain data (paths and tuples become strings and lists)."""
    return yaml.safe_load(yaml.safe_dump(obj if not isinstance(obj, dict) else
                                         {k: (str(v) if isinstance(v, Path) else v) for k, v in obj.items()}))


DONE_KEY = ["method", "dataset", "prompt_id", "batch_size", "batching"]


def _drop_incomplete(out: Path, turns: dict[tuple[str, str], int]) -> set[tuple[str, str, str, int, str]]:
    """Keep only (method, dataset, prompt, batch size, batching) groups with every turn recorded; return those."""
    path = out / "records.csv"
    if not path.exists():
        return set()
    df = pd.read_csv(path, dtype={"prompt_id": str, "batching": str}, keep_default_na=False)
    if df.empty:
        return set()
    df = with_batch_columns(df)  # runs from before batching: batch 1
    counts = df.groupby(DONE_KEY)["turn"].nunique()
    done = {key for key, n in counts.items() if n >= turns.get((key[1], key[2]), 1)}
    keep = df[[tuple(k) in done for k in zip(*(df[c] for c in DONE_KEY))]]
    for column in RECORD_COLUMNS:
        if column not in keep:
            keep = keep.assign(**{column: getattr(Record, column, "")})
    keep[RECORD_COLUMNS].to_csv(path, index=False)
    return done


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory since memory.reset_peak: allocated on GPU, RSS on CPU (what it is here: memory.peak_label)."""
    return memory.peak_mb(device)


T = TypeVar("T")


class Runner:
    def __init__(self, cfg: RunConfig, target: LoadedModel, drafter: LoadedModel | None):
        self.cfg = cfg
        self.target = target
        self.methods: dict[str, DecodeMethod] = {}  # label -> method (label = name, or name@size in a sweep)
        options = cfg.method_options()
        for name in cfg.methods:
            cls = get_method(name)
            if cfg.tree_sizes and cls.kind == "tree":
                for n in cfg.tree_sizes:
                    self.methods[f"{name}@{n}"] = cls(target, {**options[name], "tree": f"size={n}"}, drafter)
            else:
                self.methods[name] = cls(target, options[name], drafter)
        self.env = environment(target.device, target.dtype)

    def chosen(self) -> dict:
        """Per method label: the settings it chose itself (gamma, exec mode, ...); methods that chose none left out."""
        return {label: chosen for label, method in self.methods.items() if (chosen := method.chosen())}

    def local_profile(self):
        """This hardware's measured latency profile of the target in its dtype (profiles/<slug>/), or None."""
        from ..core.hardware import hardware_slug
        from ..core.models import model_slug
        from ..core.tree import locate
        from ..planning.profile import load_profile

        path = locate(f"profiles/{hardware_slug(self.target.device)}/{model_slug(self.target.spec)}-"
                      f"{dtype_name(self.target.dtype)}.yaml")
        return load_profile(path) if path else None

    def tree_predictions(self) -> dict:
        """Per tree-method label: its tree's size, source and predicted tau / speedup on this hardware (from this
        hardware's measured profile, when there is one; never another machine's), for the report's
        measured-vs-predicted table; `profile_provenance` says how the profile relates to this machine."""
        from ..core.hardware import hardware_identity, provenance
        from ..planning.buildtree import predict

        profile = self.local_profile()
        origin = (provenance(profile.hardware, profile.identity, hardware_identity(self.target.device))
                  if profile else (f"no profile of this hardware (run `specbench profile --model {self.target.spec}`):"
                                   " no predicted speedup"))
        out = {}
        for label, method in self.methods.items():
            tree = getattr(method, "tree_file", None)
            if tree is not None and getattr(method, "acceptance", None) is not None:
                out[label] = {"tree": getattr(method, "tree_source", ""),
                              **predict(tree, method.acceptance, profile, ept=getattr(method, "ept", 1),
                                         draft_ms=getattr(method, "draft_ms", None)),
                              "acceptance": getattr(method, "acceptance_source", None),
                              "profile_provenance": origin}
        return out

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt) -> torch.Tensor | None:
        """Render and fit into the context: truncate from the left with a warning, or None (skip) with a reason."""
        ids = self.target.tokenizer.render(messages)
        room = self.target.context_length - self.cfg.max_new_tokens
        if room < 16:
            console.print(f"[yellow]skip[/] prompt {escape(prompt.id)}: --max-new-tokens {self.cfg.max_new_tokens} "
                          f"leaves no room in the {self.target.context_length}-token context")
            return None
        if len(ids) > room:
            console.print(f"[yellow]warning[/] prompt {escape(prompt.id)}: {len(ids)} tokens exceed the context "
                          f"({self.target.context_length}) minus --max-new-tokens; kept the last {room}")
            ids = ids[-room:]
        return torch.tensor([ids], device=self.target.device)

    def timed(self, run: Callable[[], T]) -> tuple[T, float, float]:
        """Call `run` `repeats` times (each call seeds its own generators: the same tokens each time); returns its
        last result, the median wall time, which keeps one-off stalls of a shared machine out of the numbers, and
        the peak memory over the calls."""
        device = self.target.device
        memory.reset_peak(device)
        times = []
        for _ in range(self.cfg.repeats):
            timed: dict = {}
            with wall(device, timed):
                result = run()
            times.append(timed["s"])
        return result, sorted(times)[len(times) // 2], peak_memory_mb(device)

    def seed(self, index: int, turn: int) -> int:
        """The sampling seed of prompt `index`'s turn: the same for every method and batch size."""
        return self.cfg.seed * 1_000_003 + index * 16 + turn

    def generate(self, method: DecodeMethod, input_ids: torch.Tensor, seed: int) -> tuple[Generation, float, float]:
        """One prompt turn, timed (timed()), with the tokens it fed through the target counted."""
        def once() -> Generation:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
            with count_fed_tokens(self.target.model) as fed:
                gen = method.generate(input_ids, self.cfg.max_new_tokens, self.cfg.sampling, generator)
            gen.target_tokens = fed.tokens
            return gen

        return self.timed(once)

    def warm_up(self, prompts: list[ds.Prompt]) -> None:
        if not prompts or self.cfg.warmup == 0:
            return
        messages = ds.conversation(prompts[0], 0, [])
        ids = self.prompt_ids(messages, prompts[0])
        if ids is None:
            return
        with console.status("Warming up (not timed)"):
            for method in self.methods.values():
                for _ in range(self.cfg.warmup):
                    method.generate(ids, min(self.cfg.max_new_tokens, 32), self.cfg.sampling,
                                    torch.Generator(device=self.target.device).manual_seed(0))

    def warm_up_batches(self, prompts: list[ds.Prompt], pairs: list[tuple[str, str]]) -> None:
        """One untimed batch of two prompts per (method, mode): the batched code paths' first-call costs."""
        from ..methods.batch_loop import generate_batch

        ids = [self.prompt_ids(ds.conversation(p, 0, []), p) for p in prompts[:2]]
        ids = [i for i in ids if i is not None]
        if not ids or self.cfg.warmup == 0:
            return
        with console.status("Warming up batches (not timed)"):
            for name, mode in pairs:
                generate_batch(self.methods[name], ids * (2 if len(ids) == 1 else 1), 2, mode, False,
                               min(self.cfg.max_new_tokens, 16), self.cfg.sampling, [None, None])

    def run_prompt(self, prompt: ds.Prompt, index: int, label: str, order: int) -> list[TurnResult]:
        """All turns of one prompt with one method (a skipped turn ends the prompt), timed, with what else the
        machine did meanwhile (core/contention.py)."""
        method = self.methods[label]
        answers: list[str] = []
        results = []
        for turn in range(len(prompt.turns)):
            ids = self.prompt_ids(ds.conversation(prompt, turn, answers), prompt)
            if ids is None:
                break
            before = contention.snapshot()
            gen, seconds, mem = self.generate(method, ids, self.seed(index, turn))
            load = contention.between(before, contention.snapshot())
            results.append(TurnResult(label, turn, ids, gen, seconds, mem, load, order))
            answers.append(self.target.tokenizer.decode(gen.tokens))
        return results

    def finish_prompt(self, dataset: str, prompt: ds.Prompt, results: dict[str, list[TurnResult]],
                      reference: dict, writer: RecordWriter) -> None:
        """Check every method's tokens against ar's (explaining a mismatch: lossless.py) and write the records, in
        the registry's method order whatever order they ran in."""
        for r in results.get("ar", []):
            reference[(dataset, prompt.id, r.turn)] = r.gen.tokens
        ar_ids = {r.turn: r.ids for r in results.get("ar", [])}
        for label in (m for m in self.methods if m in results):
            verdict = ""
            for r in results[label]:
                key = (dataset, prompt.id, r.turn)
                lossless, gap = "", math.nan
                if self.cfg.sampling.greedy and label != "ar" and key in reference:
                    lossless = _compare(r.gen.tokens, reference[key])
                    if lossless != "match":
                        gap, verdict = self.explain(dataset, prompt, r, reference, ar_ids, verdict)
                writer.write(self.record(label, dataset, prompt, r, lossless, gap,
                                         verdict if lossless not in ("", "match") else ""), r.gen.tokens)
                if r.gen.timeline:  # sd / pearl: per-step draft and target busy spans (timeline.jsonl)
                    append_timeline(writer.records_path.parent, {"method": label, "dataset": dataset,
                                                                 "prompt_id": str(prompt.id), "turn": r.turn},
                                    r.gen.timeline)

    def explain(self, dataset: str, prompt: ds.Prompt, r: TurnResult, reference: dict, ar_ids: dict,
                earlier: str) -> tuple[float, str]:
        """(logit gap, verdict) at the first mismatch of a turn. A later turn whose prompt already differs from
        ar's (an earlier turn diverged) inherits the earlier turn's verdict."""
        from .lossless import explain_mismatch

        ar_tokens = reference[(dataset, prompt.id, r.turn)]
        ids = ar_ids.get(r.turn)
        if ids is None:  # ar ran in an earlier session (--resume): rebuild its prompt from its own answers
            answers = [self.target.tokenizer.decode(reference[(dataset, prompt.id, t)]) for t in range(r.turn)]
            ids = self.prompt_ids(ds.conversation(prompt, r.turn, answers), prompt)
        if ids is None or not torch.equal(ids, r.ids):
            return math.nan, earlier or "unexplained"
        index = int(_compare(r.gen.tokens, ar_tokens).split("@")[1])
        return explain_mismatch(self.target, ids, ar_tokens, r.gen.tokens, index)

    def record(self, method: str, dataset: str, prompt: ds.Prompt, r: TurnResult, lossless: str, gap: float,
               verdict: str) -> Record:
        gen, seconds, n = r.gen, r.seconds, len(r.gen.tokens)
        per_pos = " ".join(f"{a}/{d}" for a, d in zip(gen.accepted_per_position, gen.drafted_per_position))
        fields = dict(
            method=method, dataset=dataset, prompt_id=str(prompt.id), category=prompt.category, turn=r.turn,
            prompt_tokens=r.ids.shape[1], new_tokens=n, wall_s=round(seconds, 6),
            tokens_per_s=round(n / seconds, 4) if seconds else 0.0,
            target_forwards=gen.target_forwards, tau=round(n / max(gen.target_forwards, 1), 4),
            drafted=gen.drafted, draft_forwards=gen.draft_forwards, draft_s=round(gen.draft_s, 6),
            accepted_drafts=gen.accepted_drafts,
            acceptance_rate=round(gen.accepted_drafts / gen.drafted, 4) if gen.drafted else float("nan"),
            lossless=lossless, stopped=gen.stopped, peak_mem_mb=round(r.mem, 1), accepted_per_position=per_pos,
            temperature=self.cfg.temperature, model=self.target.spec, dtype=dtype_name(self.target.dtype),
            device=self.env["device"], threads=self.env["threads"], torch=self.env["torch"],
            transformers=self.env["transformers"], git=self.env["git"], hardware=self.env["hardware"],
            mismatch_logit_gap=round(gap, 6) if not math.isnan(gap) else gap, mismatch_explained=verdict,
            forward_ms=round(seconds * 1e3 / max(gen.target_forwards, 1), 3), order=r.order, **r.noise)
        fields.update(self.batch_fields(r))  # a batched row's forward_ms is its batch's time per batched step
        return Record(**fields)

    @staticmethod
    def batch_fields(r: TurnResult) -> dict:
        """The record's batching columns: batch 1's, or a batched row's (its batch's time and padding)."""
        gen = r.gen
        fields = {"target_tokens": gen.target_tokens, "padding_tokens": gen.padding_tokens,
                  "padding_ratio": round(gen.padding_tokens / gen.target_tokens, 4) if gen.target_tokens else 0.0,
                  "kv_padding": gen.kv_padding, "batch_wall_s": round(r.seconds, 6), "latency_s": round(r.seconds, 6)}
        if r.batch:
            fields.update(r.batch, latency_s=round(gen.latency_s, 6))
        return fields

    def finish_batch(self, dataset: str, label: str, mode: str, rows: list, reference: dict, writer: RecordWriter,
                     order: int) -> None:
        """Check every sample of a finished batch job against batch-1 ar's tokens (per sample, ar included: a
        batched forward may round differently, lossless.py explains it) and write its rows."""
        verdicts: dict[str, str] = {}
        for b in sorted(rows, key=lambda b: (b.index, b.turn)):
            r = TurnResult(label, b.turn, b.ids, b.gen, b.share_s, b.mem, b.noise, order, batch={
                "batch_size": int(b.batch_id.split("-")[0]), "batching": mode, "batch_id": b.batch_id,
                "batch_wall_s": round(b.batch_wall_s, 6), "forward_ms": round(b.forward_ms, 3)})
            key = (dataset, b.prompt.id, b.turn)
            lossless, gap, verdict = "", math.nan, ""
            if self.cfg.sampling.greedy and key in reference:
                lossless = _compare(b.gen.tokens, reference[key])
                if lossless != "match":
                    gap, verdicts[b.prompt.id] = self.explain(dataset, b.prompt, r, reference, {},
                                                              verdicts.get(b.prompt.id, ""))
                    verdict = verdicts[b.prompt.id]
            record = self.record(label, dataset, b.prompt, r, lossless, gap, verdict)
            writer.write(record, b.gen.tokens)


@dataclass
class TurnResult:
    """One timed generation of one prompt turn, before it is checked and written."""

    label: str
    turn: int
    ids: torch.Tensor  # [1, prompt length]: what the method was given
    gen: Generation
    seconds: float  # median wall time of the repeats
    mem: float  # peak memory, MB
    noise: dict  # contention.between(): foreign_cpu, steal, load_before, load_after
    order: int  # position among the methods run on this prompt
    batch: dict = field(default_factory=dict)  # batch > 1: batch_size, batching, batch_id, batch_wall_s, forward_ms


def interleaved(labels: list[str], index: int) -> list[str]:
    """The method order for prompt `index`: rotated by one per prompt, so each method (ar included) runs first,
    second, ... equally often and a burst of load cannot land on one of them only."""
    k = index % len(labels)
    return labels[k:] + labels[:k]


def _compare(tokens: list[int], reference: list[int]) -> str:
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return f"mismatch@{i}"
    return "match" if len(tokens) == len(reference) else f"mismatch@{min(len(tokens), len(reference))}"


def run(cfg: RunConfig) -> Path:
    """Run the benchmark; returns the run directory. Ctrl-C keeps every finished record (resume with --resume)."""
    cfg = validate(cfg)
    loaded = [(name, ds.load_prompts(name, cfg.limit, cfg.data_file, per_category=cfg.per_category))
              for name in cfg.datasets]
    made = missing_folders(Path(cfg.out))
    try:  # a refusal before run.yaml is written leaves no empty run folder behind
        out = prepare_out(cfg)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        target = load_model(cfg.model, cfg.dtype, cfg.device, measured_auto=True)
        drafter = resolve_drafter(cfg.drafter, target, cfg.dtype, cfg.device) if cfg.drafter else None
        runner = Runner(cfg, target, drafter)
        chosen = runner.chosen()
        for label, settings in chosen.items():
            said = ", ".join(f"{k} {v}" for k, v in settings.items() if not isinstance(v, dict))
            console.print(f"[dim]{label}: {escape(said)}[/]")
        if cfg.resume:
            refuse_other_environment(out, runner.env)
    except BaseException:
        remove_if_empty(made)
        raise
    profile = runner.local_profile()
    (out / "run.yaml").write_text(yaml.safe_dump({
        "settings": _plain(cfg.settings()), "environment": runner.env,
        "model": {"spec": target.spec, "name": target.name, "source": target.source, "rendering": target.prompt_format},
        "trees": runner.tree_predictions(), "chosen": chosen,
        "peak_memory": memory.peak_label(target.device),
        "noise_guard": {"latency_floor": noise.latency_floor(profile),
                        "profile": f"{profile.hardware} {profile.dtype}" if profile else None},
        "complete": False,
    }, sort_keys=False))

    turns = {(spec.name, p.id): len(p.turns) for _, (spec, prompts) in loaded for p in prompts}
    done = _drop_incomplete(out, turns) if cfg.resume else set()
    reference = {(d, p, t): toks for (m, d, p, t), toks in read_tokens(out).items() if m == "ar"}
    writer = RecordWriter(out)
    labels = single_labels(cfg, list(runner.methods))
    todo = [(spec.name, i, p, [m for m in interleaved(labels, i) if (m, spec.name, p.id, 1, "-") not in done])
            for _, (spec, prompts) in loaded for i, p in enumerate(prompts)]
    todo = [t for t in todo if t[3]]
    modes = batching.modes_for(cfg.batching)
    pairs = [("ar", batching.ar_mode(modes))] + [(m, mode) for m in cfg.methods if m != "ar" for mode in modes]
    jobs = batching.plan([(spec.name, prompts) for _, (spec, prompts) in loaded], list(cfg.batch_sizes), pairs,
                         cfg.refill)
    batch_todo = [(job, [(m, mode) for m, mode in job.labels
                         if any((m, job.dataset, p.id, job.batch_size, mode) not in done for _, p in job.prompts)])
                  for job in jobs]
    batch_todo = [t for t in batch_todo if t[1]]
    say_batches(cfg, loaded)
    if done:
        console.print(f"Resuming {escape(str(out))}: {len(done)} method x prompt results kept, "
                      f"{sum(len(t[3]) for t in todo) + sum(len(t[1]) for t in batch_todo)} to go.")
    try:
        runner.warm_up(loaded[0][1][1])
        if batch_todo:
            runner.warm_up_batches(loaded[0][1][1], pairs)
        with progress_bar() as bar:
            task = bar.add_task("decoding", total=sum(len(t[3]) for t in todo) + sum(len(t[1]) for t in batch_todo),
                                info="")
            for dataset, index, prompt, order in todo:
                results = {}
                for position, label in enumerate(order):
                    bar.update(task, description=f"{dataset} {label}")
                    results[label] = runner.run_prompt(prompt, index, label, position)
                    tokens, seconds = (sum(len(r.gen.tokens) for r in results[label]),
                                       sum(r.seconds for r in results[label]))
                    bar.update(task, advance=1, info=f"{tokens / seconds if seconds else 0:6.1f} tok/s")
                runner.finish_prompt(dataset, prompt, results, reference, writer)  # whole prompts only
            for job, pending in batch_todo:
                for position, (name, mode) in enumerate(pending):
                    bar.update(task, description=f"{job.dataset} {name} B={job.batch_size} {mode}")
                    rows = batching.run_label(runner, job, name, mode, cfg.refill)
                    runner.finish_batch(job.dataset, name, mode, rows, reference, writer, position)
                    tokens, seconds = sum(len(r.gen.tokens) for r in rows), sum(r.share_s for r in rows)
                    bar.update(task, advance=1, info=f"{tokens / seconds if seconds else 0:6.1f} tok/s")
    except KeyboardInterrupt:
        writer.close()
        kept = sum(1 for _ in open(out / "records.csv")) - 1
        raise Interrupted(out, kept) from None
    writer.close()
    _mark_complete(out)
    return out


def single_labels(cfg: RunConfig, labels: list[str]) -> list[str]:
    """The labels that decode one prompt at a time: all of them when --batch-size includes 1; else only ar, the
    batch-1 reference every batched sample's tokens are checked against (greedy), or none (sampling)."""
    if 1 in cfg.batch_sizes:
        return labels
    if cfg.sampling.greedy:
        console.print("[dim]ar also runs at batch size 1: its tokens are the reference of every batched sample's "
                      "lossless check[/]")
        return ["ar"]
    return []


def say_batches(cfg: RunConfig, loaded) -> None:
    """A batch size above a dataset's prompt count runs with the prompts there are: say so, once per dataset."""
    for _, (spec, prompts) in loaded:
        big = [b for b in cfg.batch_sizes if b > len(prompts)]
        if big:
            console.print(f"[yellow]note[/] {spec.name} has {len(prompts)} prompt(s): batch size(s) "
                          f"{', '.join(map(str, big))} run with {len(prompts)} (raise --limit for full batches)")


def _mark_complete(out: Path) -> None:
    """run.yaml says whether every planned prompt finished (a report of an interrupted run says it is partial)."""
    path = out / "run.yaml"
    meta = yaml.safe_load(path.read_text()) or {}
    meta["complete"] = True
    path.write_text(yaml.safe_dump(meta, sort_keys=False))


class Interrupted(SpecbenchError):
    exit_code = 130

    def __init__(self, out: Path, kept: int):
        kept_text = f"{kept} records kept in {out}" if kept else f"no results yet in {out}"
        super().__init__(f"Interrupted: {kept_text}. Continue with the same command plus --resume (only whole "
                         "prompts are kept: every method of a prompt, written together).")
        self.out = out
        self.kept = kept


def default_out() -> Path:
    """results/<timestamp> so that plain repeated runs never collide."""
    import time

    return Path(os.environ.get("SPECBENCH_RESULTS", "results")) / time.strftime("%Y%m%d-%H%M%S")
