"""specbench's own methods as a backend of the runner (backend.py): the loaded target (and drafter), the methods of
the run by label, one timed turn of a method, a mismatch explained from the target's logits (lossless.py), and
what run.yaml says about them (model, trees and their predictions, chosen settings, roofline).

Measurement rules (docs/measurement.md): each turn is timed from prefill to the last token, after warm-up, with
device synchronisation at both ends; tokenisation is outside the timed region; new tokens are counted the same way
for every method.
"""

from __future__ import annotations

import torch
from rich.markup import escape

from ..core import lookup
from ..core.batch.forward import count_fed_tokens
from ..core.machine import memory
from ..core.machine.hardware import environment
from ..core.model import tensor_parallel as tp
from ..core.model.load import LoadedModel, load_model
from ..data import datasets as ds
from ..methods import get_method
from ..methods.base import DecodeMethod, Generation
from ..methods.sd.drafter import resolve_drafter
from ..progress import console, status
from . import compiled as compile_run
from . import synthetic
from .backend import Measures, timed, turn_seed
from .config import RunConfig
from .shard import resolved_trees
from .validation import validate
from .work import BatchLabel, LoadedDataset, fit_prompt

MEASURES = Measures(retime=True, resume=True, batches=True)


def check(cfg: RunConfig) -> RunConfig:
    """What cannot run, refused before anything is written (validation.py); `ar` first in the method list."""
    if cfg.compile:  # before any engine or model: what --compile cannot run
        compile_run.check(cfg)
    cfg = validate(cfg)
    if cfg.recommendation:
        lookup.note_used(lookup.RECOMMENDATION, cfg.recommendation, "--method auto")
    if cfg.compile:  # the model's config, before its weights load
        compile_run.check_model(cfg)
    return cfg


def prepare(cfg: RunConfig, loaded: list[LoadedDataset]) -> "OwnMethods":
    """Load the target (and drafter) onto their placement, build the methods, compile them under --compile, and say
    what each chose."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from dataclasses import replace

    from ..core.model.memory_need import run_workload, stated_workload
    from ..core.model.placement import drafter_placement, target_placement

    work = run_workload(cfg.max_new_tokens, cfg.batch_sizes, compiled=cfg.compile)
    work = replace(work, extra=work.extra + synthetic.artifact_bytes(cfg))  # a synthetic run's random artefacts
    with stated_workload(work):  # what the fit check counts
        target = load_model(cfg.model, cfg.dtype, cfg.device, measured_auto=True,
                            placement=target_placement(cfg.device_map, cfg.max_memory, cfg.tp), compiled=cfg.compile)
    drafter = resolve_drafter(cfg.drafter, target, cfg.dtype, cfg.device,
                              drafter_placement(cfg.drafter_device_map, cfg.drafter_max_memory)) \
        if cfg.drafter else None
    tp.watch_ranks()  # --tp: the other ranks are this run's siblings, not foreign load
    if cfg.compile:  # trees built from the compiled profile: measured now when this hardware has none
        compile_run.ensure_profile(cfg, target)
    backend = OwnMethods(cfg, target, drafter)
    backend.compiled = compile_run.enable_run(cfg, backend, loaded, drafter) if cfg.compile else {}
    tp.same_on_every_rank({label: {b: t["digest"] for b, t in trees.items()}
                           for label, trees in resolved_trees(backend.methods).items()}, "the trees resolved")
    for label, settings in backend.chosen().items():
        known = getattr(backend.methods.get(label), "said_when_loaded", ())  # its load line named these
        said = ", ".join(f"{k} {v}" for k, v in settings.items() if not isinstance(v, dict) and k not in known)
        if said:  # per-batch-size choices (dicts) were said when they were made
            console.print(f"[dim]{label}: {escape(said)}[/]")
    return backend


class OwnMethods:
    """One run's target and methods (by label): the backend of `--engine specbench`."""

    measures = MEASURES

    def __init__(self, cfg: RunConfig, target: LoadedModel, drafter: LoadedModel | None):
        self.cfg, self.target, self.drafter = cfg, target, drafter
        self.model_spec = target.spec
        self.compiled: dict = {}  # --compile: run/compiled.py's state per model
        self.methods: dict[str, DecodeMethod] = {}  # label -> method (label = name, or name@size in a sweep)
        options = cfg.method_options()
        # --synthetic-acceptance: a stated draw keeps the drafts; a method without an artefact gets random weights
        self.synthetic = synthetic.profile_of(cfg)
        # tree methods search and predict their trees with the stated rates (methods/tree/batch_trees.py); None otherwise
        target.extras[synthetic.EXTRAS_KEY] = self.synthetic
        if self.synthetic:  # a drafter method without a drafter: one of the target's layers, untrained
            self.drafter = drafter = synthetic.drafter_for(cfg.methods, target, drafter)
        make = (lambda cls, opts, label: synthetic.build(cls, target, opts, drafter, label)) if self.synthetic \
            else (lambda cls, opts, label: cls(target, opts, drafter))
        for name in cfg.methods:
            cls = get_method(name)
            if cfg.tree_sizes and cls.kind == "tree":
                for n in cfg.tree_sizes:  # 0: `auto`, the method's own choice (per batch size: methods/tree/batch_trees.py)
                    label = f"{name}@{n or 'auto'}"
                    self.methods[label] = make(cls, {**options[name], "tree": f"size={n}" if n else "auto"}, label)
            else:
                self.methods[name] = make(cls, options[name], name)
        if self.synthetic:
            synthetic.install(self.methods, self.synthetic, cfg.seed)
        self.labels = tuple(self.methods)
        batched = [b for b in cfg.batch_sizes if b > 1]
        for method in self.methods.values():
            if batched and method.batchable:
                method.choose_per_batch_size(batched)  # each batch size's gamma / tree from L(B, w) (planning/batch_choice)
        self.env = environment(target.device, target.dtype)
        # the device whose bandwidth is read beside each timed turn (turn_bandwidth.py): one process on one device
        self.bandwidth_device = target.device if target.placement.startswith("single:") and cfg.tp == 1 \
            and cfg.shard is None else None
        self.env["placement"] = target.placement  # core/model/placement.label: records, run.yaml and --resume name it

    # ------------------------------------------------------------------------------------------------ decoding

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt) -> tuple[torch.Tensor, int] | None:
        rendered = self.target.tokenizer.render(messages)
        ids = fit_prompt(rendered, self.target.context_length, self.cfg.max_new_tokens, prompt.id)
        if ids is None:
            return None
        return torch.tensor([ids], device=self.target.device), len(rendered) - len(ids)

    def decode(self, tokens: list[int]) -> str:
        return self.target.tokenizer.decode(tokens)

    def timed(self, run):
        """run() timed as every turn is (backend.timed: the median of --repeats, peak memory)."""
        return timed(run, self.cfg.repeats, self.target.device)

    def seed(self, index: int, turn: int) -> int:
        return turn_seed(self.cfg, index, turn)

    def generate(self, label: str, ids: torch.Tensor, seed: int) -> tuple[Generation, float, float]:
        return self.run_method(self.methods[label], ids, seed)

    def run_method(self, method: DecodeMethod, input_ids: torch.Tensor, seed: int) -> tuple[Generation, float, float]:
        """One prompt turn of `method`, timed (timed()), with the tokens it fed through the target counted."""
        states = compile_run.states_of(self.target, self.drafter)  # --compile: count compiled / eager forwards

        def once() -> Generation:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
            before = compile_run.snapshot(states)
            with count_fed_tokens(self.target.model) as fed:
                gen = method.generate(input_ids, self.cfg.max_new_tokens, self.cfg.sampling, generator)
            if states:
                gen.compiled_forwards, gen.eager_forwards = compile_run.forwards(states, before, gen, method)
            gen.target_tokens = fed.tokens
            gen.forward_s = fed.forward_s  # seconds inside the target's forwards (the host split: results.host_s)
            return gen

        return self.timed(once)

    def reference(self, label: str, ids: torch.Tensor) -> list[int] | None:
        """A compiled greedy `ar`'s untimed eager twin of the same prompt: its own lossless reference."""
        if label == "ar" and self.cfg.compile and self.cfg.sampling.greedy:
            return compile_run.eager_tokens(self.methods[label], ids, self.cfg.max_new_tokens, self.cfg.sampling,
                                            (self.target, self.drafter))
        return None

    def explain(self, ids: torch.Tensor, ar_tokens: list[int], tokens: list[int], index: int) -> tuple[float, str]:
        from .lossless import explain_mismatch

        return explain_mismatch(self.target, ids, ar_tokens, tokens, index)

    def warm_up(self, prompts: list[ds.Prompt], batch_labels: list[BatchLabel], batch_sizes: list[int], out) -> None:
        """Every method once per --warmup on the first prompt, every batched label at each batch size to run, and
        under --compile every bucket compiled, before any timed turn."""
        self.warm_up_single(prompts)
        if batch_sizes:
            self.warm_up_batches(prompts, batch_labels, batch_sizes)
        for method in self.methods.values():
            method.warmed_up()  # e.g. suffix forgets the warm-up's outputs: the run's first timed prompt is cold
        if self.compiled:  # run.yaml's `compile:` block
            from ..core.store import RunFolder

            compile_run.finish_run_warm_up(self.compiled)
            tp.on_writer(lambda: compile_run.record(RunFolder(out).meta, self.compiled))

    def warm_up_single(self, prompts: list[ds.Prompt]) -> None:
        if not prompts or self.cfg.warmup == 0:
            return
        fitted = self.prompt_ids(ds.conversation(prompts[0], 0, []), prompts[0])
        if fitted is None:
            return
        with status(f"Warming up {len(self.methods)} method(s) (not timed)"):
            for method in self.methods.values():
                for _ in range(self.cfg.warmup):
                    method.generate(fitted[0], min(self.cfg.max_new_tokens, 32), self.cfg.sampling,
                                    torch.Generator(device=self.target.device).manual_seed(0))

    def warm_up_batches(self, prompts: list[ds.Prompt], labels: list[BatchLabel], sizes: list[int]) -> None:
        """One untimed batch per (method, mode) at every batch size of the run (the first prompts, repeated to fill
        it): the batched code paths' first-call costs at that size's shapes (and its own tree or gamma) land here,
        not on whichever label happens to run first at that size."""
        from ..methods.batch_loop import generate_batch

        fitted = [self.prompt_ids(ds.conversation(p, 0, []), p) for p in prompts[:2]]
        ids = [f[0] for f in fitted if f is not None]
        if not ids or self.cfg.warmup == 0:
            return
        with status("Warming up batches (not timed)"):
            for size in sorted({b for b in sizes if b > 1}):
                batch = (ids * size)[:size]
                for label in labels:
                    generate_batch(self.methods[label.method], batch, size, label.mode, False,
                                   min(self.cfg.max_new_tokens, 16), self.cfg.sampling, [None] * size)

    def close(self, out) -> None:
        """run.yaml after the turns: the bandwidth measured again (its roofline block), and with --compile the eager
        steps the timed turns took (widths no bucket held)."""
        from ..core.machine.roofline import add_after
        from ..core.store import RunFolder

        if self.compiled:
            tp.on_writer(lambda: compile_run.record(RunFolder(out).meta, self.compiled))
        tp.on_writer(lambda: add_after(RunFolder(out).meta, self.target.device))

    # ------------------------------------------------------------------------------------------------ run.yaml

    def chosen(self) -> dict:
        """Per method label: the settings it chose itself (gamma, exec mode, ...); methods that chose none left out."""
        return {label: chosen for label, method in self.methods.items() if (chosen := method.chosen())}

    def profile(self):
        """This hardware's measured latency profile of the target in its dtype (profiles/<slug>/; a `--compile`
        run's compiled one, else the eager one with a note), or None; recorded in run.yaml's data_files."""
        from ..planning.batch_choice import local_profile

        return local_profile(self.target, self.cfg.compile, "noise guard, predictions, roofline")

    def run_blocks(self, loaded: list[LoadedDataset]) -> dict:
        target = self.target
        roofline = roofline_block(self, loaded)
        trees = resolved_trees(self.methods)
        for label, by_size in trees.items():  # a tree given by path or built without the ledger seeing it
            for size, tree in by_size.items():
                source = str(tree["source"]).split(" (built for ")[0]
                lookup.note_used(lookup.TREE, source, f"{label}" + (f" batch size {size}" if size != 1 else ""),
                                 unless_recorded=True)
        return {"model": {"spec": target.spec, "name": target.name, "source": target.source,
                          "rendering": target.prompt_format, "placement": target.placement,
                          "device_map": _device_map(target)},
                "trees": self.tree_predictions(roofline.get("context_tokens")),  # at the run's mean context
                "resolved_trees": trees, "chosen": self.chosen(), "peak_memory": memory.peak_label(target.device),
                "roofline": roofline}  # report/roofline.py: the bandwidth bound of a forward

    def tree_predictions(self, context: float | None = None) -> dict:
        """Per tree-method label: its tree's size, source and predicted tau / speedup on this hardware (from this
        hardware's measured profile, when there is one; never another machine's), at the run's mean `context` (KV
        entries; None: build-tree's KV length), for the report's measured-vs-predicted table; `profile_provenance`
        says how the profile relates to this machine."""
        from ..core.machine.hardware import hardware_identity, provenance
        from ..planning import host_work
        from ..planning.context_prediction import predict_at_context

        profile = self.profile()
        origin = (provenance(profile.hardware, profile.identity, hardware_identity(self.target.device))
                  if profile else (f"no profile of this hardware (run `specbench profile --model {self.target.spec}`):"
                                   " no predicted speedup"))
        out = {}
        for label, method in self.methods.items():
            tree = getattr(method, "tree_file", None)
            if tree is not None and getattr(method, "acceptance", None) is not None:
                cost = method.draft_cost(profile) if profile and hasattr(method, "draft_cost") else None
                family = method.family
                host = host_work.for_profile(profile, family) if profile is not None else None
                out[label] = {"tree": getattr(method, "tree_source", ""), "family": family,
                              **predict_at_context(tree, method.acceptance, profile, context,
                                                   ept=getattr(method, "ept", 1), draft_ms=cost, host=host),
                              "acceptance": getattr(method, "acceptance_source", None),
                              "profile_provenance": origin}
        return out


def roofline_block(backend: OwnMethods, loaded: list[LoadedDataset], prompts: int = 200) -> dict:
    """run.yaml's roofline (core/machine/roofline.run_block): this machine's memory bandwidth (measured now, in the
    run's own sitting: core/machine/bandwidth.for_run) and the bound of a forward at the run's mean context (the
    first `prompts` first turns' rendered lengths, fitted to the context as runs fit them, + half of
    --max-new-tokens)."""
    from ..core.machine.bandwidth import for_run
    from ..core.machine.roofline import mean_context, run_block

    target, cfg = backend.target, backend.cfg
    room = max(target.context_length - cfg.max_new_tokens, 1)
    firsts = [p for d in loaded for p in d.prompts][:prompts]
    lengths = [min(len(target.tokenizer.render(ds.conversation(p, 0, []))), room) for p in firsts]
    return run_block(target, for_run(target.device), mean_context(lengths, cfg.max_new_tokens), backend.profile())


def _device_map(target) -> dict | None:
    """Which module sits on which device (accelerate's map), for run.yaml; None on one device."""
    dmap = getattr(target.model, "hf_device_map", None)
    return {k: str(v) for k, v in dmap.items()} if dmap and not target.placement.startswith("single:") else None
