"""The benchmark loop: warm-up, then dataset x prompt x method x turn, timed and checked against `ar`.

Measurement rules (DESIGN.md §3): each turn is timed from prefill to the last token, after warm-up, with device
synchronisation at both ends; tokenisation is outside the timed region; new tokens are counted the same way for
every method. `ar` runs first on every prompt, so every speedup is measured side by side on the same prompts.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch
import yaml
from rich.markup import escape

from ..core.hardware import environment
from ..core.models import LoadedModel, dtype_name, load_model
from ..core.timing import wall
from ..core.verify import Sampling
from ..data import datasets as ds
from ..data.trainsets import refuse_as_benchmark
from ..drafters.token_drafter import resolve_drafter
from ..errors import SpecbenchError
from ..methods import REGISTRY, OptionValues, all_options, get_method, split_by_method
from ..methods.base import DecodeMethod, Generation
from ..progress import console, progress_bar
from . import timeline
from .results import RECORD_COLUMNS, Record, RecordWriter, read_tokens


@dataclass(frozen=True)
class RunConfig:
    methods: tuple[str, ...] = ("ar", "pld")
    datasets: tuple[str, ...] = ("humaneval",)
    model: str = "smollm2-135m"
    drafter: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    limit: int | None = 6
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

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed)

    def settings(self) -> dict:
        """The settings a resumed run must share (everything but out / resume)."""
        d = asdict(self)
        d.pop("out"), d.pop("resume")
        d["methods"], d["datasets"] = list(self.methods), list(self.datasets)
        d["tree_sizes"] = list(self.tree_sizes)
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
    methods = ("ar",) + tuple(dict.fromkeys(m for m in cfg.methods if m != "ar"))
    cfg = RunConfig(**{**cfg.__dict__, "methods": methods})
    declared = all_options(REGISTRY)
    unknown = sorted(set(cfg.options) - set(declared))
    if unknown:
        raise SpecbenchError(f"unknown method option(s) {', '.join(unknown)}; see `specbench list methods`")
    cfg.method_options()  # each method checks its own values (ranges, choices) before any model loads
    for name, value in cfg.options.items():
        spec, takers = declared[name]
        if value is not None and value != spec.default and not set(takers) & set(methods):
            console.print(f"[yellow]note[/] {spec.flag} is an option of {', '.join(takers)}, and none of them "
                          "runs: it is ignored")
    return cfg


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
        if old.get("settings") != _plain(cfg.settings()):
            raise SpecbenchError(f"--resume: the settings differ from the run in {out} ({run_file}); "
                                 "resume with the same options or choose another --out.")
    return out


def _plain(obj):
    """Settings as YAML-safe plain data (paths and tuples become strings and lists)."""
    return yaml.safe_load(yaml.safe_dump(obj if not isinstance(obj, dict) else
                                         {k: (str(v) if isinstance(v, Path) else v) for k, v in obj.items()}))


def _drop_incomplete(out: Path, turns: dict[tuple[str, str], int]) -> set[tuple[str, str, str]]:
    """Keep only (method, dataset, prompt) groups with every turn recorded; return those done groups."""
    path = out / "records.csv"
    if not path.exists():
        return set()
    df = pd.read_csv(path, dtype={"prompt_id": str})
    if df.empty:
        return set()
    counts = df.groupby(["method", "dataset", "prompt_id"])["turn"].nunique()
    done = {key for key, n in counts.items() if n >= turns.get((key[1], key[2]), 1)}
    keep = df[[(m, d, p) in done for m, d, p in zip(df.method, df.dataset, df.prompt_id)]]
    keep[RECORD_COLUMNS].to_csv(path, index=False)
    return done


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated GPU memory since the last reset, or the process's peak RSS on CPU (monotonic)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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

    def tree_predictions(self) -> dict:
        """Per tree-method label: its tree's size, source and predicted tau / speedup on this hardware (from the
        measured profile in profiles/, when there is one), for the report's measured-vs-predicted table."""
        from ..core.hardware import hardware_slug
        from ..core.models import model_slug
        from ..core.tree import locate
        from ..hwtrees.buildtree import predict
        from ..hwtrees.profile import load_profile

        path = locate(f"profiles/{hardware_slug(self.target.device)}/{model_slug(self.target.spec)}-"
                      f"{dtype_name(self.target.dtype)}.yaml")
        profile = load_profile(path) if path else None
        out = {}
        for label, method in self.methods.items():
            tree = getattr(method, "tree_file", None)
            if tree is not None and getattr(method, "acceptance", None) is not None:
                out[label] = {"tree": getattr(method, "tree_source", ""),
                              **predict(tree, method.acceptance, profile, ept=getattr(method.prompts, "ept", 1))}
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

    def generate(self, method: DecodeMethod, input_ids: torch.Tensor, seed: int) -> tuple[Generation, float, float]:
        """Generate `repeats` times with the same seed (same tokens); the wall time is the median of the repeats,
        which keeps one-off stalls of a shared machine out of the numbers."""
        device = self.target.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(self.cfg.repeats):
            gen_rng = torch.Generator(device=device).manual_seed(seed)
            timed: dict = {}
            with wall(device, timed):
                gen = method.generate(input_ids, self.cfg.max_new_tokens, self.cfg.sampling, gen_rng)
            times.append(timed["s"])
        return gen, sorted(times)[len(times) // 2], peak_memory_mb(device)

    def warm_up(self, prompts: list[ds.Prompt]) -> None:
        if not prompts or self.cfg.warmup == 0:
            return
        messages = _messages(prompts[0], 0, [])
        ids = self.prompt_ids(messages, prompts[0])
        if ids is None:
            return
        with console.status("Warming up (not timed)"):
            for method in self.methods.values():
                for _ in range(self.cfg.warmup):
                    method.generate(ids, min(self.cfg.max_new_tokens, 32), self.cfg.sampling,
                                    torch.Generator(device=self.target.device).manual_seed(0))

    def run_prompt(self, dataset: str, prompt: ds.Prompt, index: int, label: str, reference: dict,
                   writer: RecordWriter) -> float:
        """All turns of one prompt with one method; returns the tokens/s of the prompt (0 when skipped)."""
        method = self.methods[label]
        answers: list[str] = []
        total_tokens, total_s = 0, 0.0
        for turn in range(len(prompt.turns)):
            ids = self.prompt_ids(_messages(prompt, turn, answers), prompt)
            if ids is None:
                return 0.0
            gen, seconds, mem = self.generate(method, ids, self.cfg.seed * 1_000_003 + index * 16 + turn)
            key = (dataset, prompt.id, turn)
            if label == "ar":
                reference[key] = gen.tokens
            lossless = ""
            if self.cfg.sampling.greedy and key in reference and label != "ar":
                lossless = _compare(gen.tokens, reference[key])
            writer.write(self.record(label, dataset, prompt.id, turn, ids.shape[1], gen, seconds, mem,
                                     lossless), gen.tokens)
            if gen.timeline:  # sd / pearl: per-step draft and target busy spans (timeline.jsonl)
                timeline.append(writer.records_path.parent, {"method": label, "dataset": dataset,
                                                             "prompt_id": str(prompt.id), "turn": turn}, gen.timeline)
            answers.append(self.target.tokenizer.decode(gen.tokens))
            total_tokens += len(gen.tokens)
            total_s += seconds
        return total_tokens / total_s if total_s else 0.0

    def record(self, method, dataset, prompt_id, turn, prompt_tokens, gen: Generation, seconds, mem,
               lossless) -> Record:
        n = len(gen.tokens)
        per_pos = " ".join(f"{a}/{d}" for a, d in zip(gen.accepted_per_position, gen.drafted_per_position))
        return Record(
            method=method, dataset=dataset, prompt_id=str(prompt_id), turn=turn, prompt_tokens=prompt_tokens,
            new_tokens=n, wall_s=round(seconds, 6), tokens_per_s=round(n / seconds, 4) if seconds else 0.0,
            target_forwards=gen.target_forwards, tau=round(n / max(gen.target_forwards, 1), 4),
            drafted=gen.drafted, accepted_drafts=gen.accepted_drafts,
            acceptance_rate=round(gen.accepted_drafts / gen.drafted, 4) if gen.drafted else float("nan"),
            lossless=lossless, stopped=gen.stopped, peak_mem_mb=round(mem, 1), accepted_per_position=per_pos,
            temperature=self.cfg.temperature, model=self.target.spec, dtype=dtype_name(self.target.dtype),
            device=self.env["device"], threads=self.env["threads"], torch=self.env["torch"],
            transformers=self.env["transformers"], git=self.env["git"])


def _messages(prompt: ds.Prompt, turn: int, answers: list[str]) -> list[dict]:
    """The conversation up to user turn `turn`, with the model's own earlier answers (MT-Bench turn 2)."""
    msgs = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for i in range(turn + 1):
        msgs.append({"role": "user", "content": prompt.turns[i]})
        if i < turn:
            msgs.append({"role": "assistant", "content": answers[i]})
    return msgs


def _compare(tokens: list[int], reference: list[int]) -> str:
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return f"mismatch@{i}"
    return "match" if len(tokens) == len(reference) else f"mismatch@{min(len(tokens), len(reference))}"


def run(cfg: RunConfig) -> Path:
    """Run the benchmark; returns the run directory. Ctrl-C keeps every finished record (resume with --resume)."""
    cfg = validate(cfg)
    loaded = [(name, ds.load_prompts(name, cfg.limit, cfg.data_file)) for name in cfg.datasets]
    out = prepare_out(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target = load_model(cfg.model, cfg.dtype, cfg.device)
    drafter = resolve_drafter(cfg.drafter, target, cfg.dtype, cfg.device) if cfg.drafter else None
    runner = Runner(cfg, target, drafter)
    chosen = runner.chosen()
    for label, settings in chosen.items():
        said = ", ".join(f"{k} {v}" for k, v in settings.items() if not isinstance(v, dict))
        console.print(f"[dim]{label}: {escape(said)}[/]")
    (out / "run.yaml").write_text(yaml.safe_dump({
        "settings": _plain(cfg.settings()), "environment": runner.env,
        "model": {"spec": target.spec, "name": target.name, "source": target.source},
        "trees": runner.tree_predictions(), "chosen": chosen,
    }, sort_keys=False))

    turns = {(spec.name, p.id): len(p.turns) for _, (spec, prompts) in loaded for p in prompts}
    done = _drop_incomplete(out, turns) if cfg.resume else set()
    reference = {(d, p, t): toks for (m, d, p, t), toks in read_tokens(out).items() if m == "ar"}
    writer = RecordWriter(out)
    todo = [(spec.name, i, p, m) for _, (spec, prompts) in loaded for i, p in enumerate(prompts)
            for m in runner.methods if (m, spec.name, p.id) not in done]
    if done:
        console.print(f"Resuming {escape(str(out))}: {len(done)} method x prompt results kept, {len(todo)} to go.")
    try:
        runner.warm_up(loaded[0][1][1])
        with progress_bar() as bar:
            task = bar.add_task("decoding", total=len(todo), info="")
            for dataset, index, prompt, method in todo:
                bar.update(task, description=f"{dataset} {method}")
                tps = runner.run_prompt(dataset, prompt, index, method, reference, writer)
                bar.update(task, advance=1, info=f"{tps:6.1f} tok/s")
    except KeyboardInterrupt:
        writer.close()
        kept = sum(1 for _ in open(out / "records.csv")) - 1
        raise Interrupted(out, kept) from None
    writer.close()
    return out


class Interrupted(SpecbenchError):
    exit_code = 130

    def __init__(self, out: Path, kept: int):
        super().__init__(f"Interrupted: {kept} records kept in {out}. Continue with the same command plus --resume.")
        self.out = out


def default_out() -> Path:
    """results/<timestamp> so that plain repeated runs never collide."""
    import time

    return Path(os.environ.get("SPECBENCH_RESULTS", "results")) / time.strftime("%Y%m%d-%H%M%S")
