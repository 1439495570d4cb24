"""The Runner: the loaded target and the methods of a run, and what one prompt turn goes through: rendering into
the context, timing (the median of --repeats, peak memory), the lossless check against ar's tokens (lossless.py
explains a mismatch) and writing its record (records.py).

Measurement rules (docs/measurement.md): each turn is timed from prefill to the last token, after warm-up, with device
synchronisation at both ends; tokenisation is outside the timed region; new tokens are counted the same way for
every method. Each timed turn records what else the machine did meanwhile (core/machine/contention.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch

from ..core.machine import contention
from ..core.machine import memory
from ..core.batch.forward import count_fed_tokens
from ..core.machine.hardware import environment
from ..core.model.load import LoadedModel
from ..core.model.tensor_parallel import from_writer
from ..core.machine.timing import wall
from ..data import datasets as ds
from ..methods import get_method
from ..methods.base import DecodeMethod, Generation
from ..progress import console, status
from . import compiled as compile_run
from . import synthetic
from .config import RunConfig
from .records import LosslessCheck, TurnResult, build_record, compare
from .results import Record, RecordWriter, append_timeline
from .work import BatchLabel, fit_prompt


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory since memory.reset_peak: allocated on GPU, RSS on CPU (what it is here: memory.peak_label)."""
    return memory.peak_mb(device)


T = TypeVar("T")


class Runner:
    """One run's target and methods (by label), and what each prompt turn goes through on its way to records.csv."""

    def __init__(self, cfg: RunConfig, target: LoadedModel, drafter: LoadedModel | None):
        self.cfg = cfg
        self.target = target
        self.prompt_cut: dict[tuple[ds.Prompt, int], int] = {}  # (prompt, turn) -> tokens cut to fit the context
        self.drafter = drafter
        self.methods: dict[str, DecodeMethod] = {}  # label -> method (label = name, or name@size in a sweep)
        options = cfg.method_options()
        # --synthetic-acceptance: a stated draw keeps the drafts; a method without an artefact gets random weights
        self.synthetic = synthetic.profile_of(cfg)
        # tree methods search and predict their trees with the stated rates (methods/tree/plan.py); None otherwise
        target.extras[synthetic.EXTRAS_KEY] = self.synthetic
        if self.synthetic:  # a drafter method without a drafter: one of the target's layers, untrained
            self.drafter = drafter = synthetic.drafter_for(cfg.methods, target, drafter)
        self.synthetic_tallies: dict[str, synthetic.Tally] = {}
        make = (lambda cls, opts, label: synthetic.build(cls, target, opts, drafter, label)) if self.synthetic \
            else (lambda cls, opts, label: cls(target, opts, drafter))
        for name in cfg.methods:
            cls = get_method(name)
            if cfg.tree_sizes and cls.kind == "tree":
                for n in cfg.tree_sizes:  # 0: `auto`, the method's own choice (per batch size: methods/tree/plan.py)
                    label = f"{name}@{n or 'auto'}"
                    self.methods[label] = make(cls, {**options[name], "tree": f"size={n}" if n else "auto"}, label)
            else:
                self.methods[name] = make(cls, options[name], name)
        if self.synthetic:
            synthetic.install(self.methods, self.synthetic, cfg.seed)
        batched = [b for b in cfg.batch_sizes if b > 1]
        for method in self.methods.values():
            if batched and method.batchable:
                method.plan_batches(batched)  # each batch size's gamma / tree from L(B, w) (planning/batch_choice)
        self.env = environment(target.device, target.dtype)
        self.env["placement"] = target.placement  # core/model/placement.label: records, run.yaml and --resume name it

    def chosen(self) -> dict:
        """Per method label: the settings it chose itself (gamma, exec mode, ...); methods that chose none left out."""
        return {label: chosen for label, method in self.methods.items() if (chosen := method.chosen())}

    def local_profile(self):
        """This hardware's measured latency profile of the target in its dtype (profiles/<slug>/; a `--compile`
        run's compiled one, else the eager one with a note), or None; recorded in run.yaml's data_files."""
        from ..planning.batch_choice import local_profile

        return local_profile(self.target, self.cfg.compile, "noise guard, predictions, roofline")

    def tree_predictions(self, context: float | None = None) -> dict:
        """Per tree-method label: its tree's size, source and predicted tau / speedup on this hardware (from this
        hardware's measured profile, when there is one; never another machine's), at the run's mean `context` (KV
        entries; None: build-tree's KV length), for the report's measured-vs-predicted table; `profile_provenance`
        says how the profile relates to this machine."""
        from ..core.machine.hardware import hardware_identity, provenance
        from ..planning.context_prediction import predict_at_context

        profile = self.local_profile()
        origin = (provenance(profile.hardware, profile.identity, hardware_identity(self.target.device))
                  if profile else (f"no profile of this hardware (run `specbench profile --model {self.target.spec}`):"
                                   " no predicted speedup"))
        out = {}
        for label, method in self.methods.items():
            tree = getattr(method, "tree_file", None)
            if tree is not None and getattr(method, "acceptance", None) is not None:
                cost = method.draft_cost(profile) if profile and hasattr(method, "draft_cost") else None
                out[label] = {"tree": getattr(method, "tree_source", ""),
                              **predict_at_context(tree, method.acceptance, profile, context,
                                                   ept=getattr(method, "ept", 1), draft_ms=cost),
                              "acceptance": getattr(method, "acceptance_source", None),
                              "profile_provenance": origin}
        return out

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt) -> torch.Tensor | None:
        """Render and fit into the context: truncate from the left with a warning, or None (skip) with a reason."""
        rendered = self.target.tokenizer.render(messages)
        ids = fit_prompt(rendered, self.target.context_length, self.cfg.max_new_tokens, prompt.id)
        if ids is None:
            return None
        turn = sum(m["role"] == "user" for m in messages) - 1
        self.prompt_cut[(prompt, turn)] = len(rendered) - len(ids)  # records.csv's prompt_cut
        return torch.tensor([ids], device=self.target.device)

    def timed(self, run: Callable[[], T]) -> tuple[T, float, float]:
        """Call `run` `repeats` times (each call seeds its own generators: the same tokens each time); returns the
        result of the call with the median wall time (which keeps one-off stalls of a shared machine out of the
        numbers; its own draft_s and forward_s then split that same time), that time, and the peak memory over the
        calls."""
        device = self.target.device
        memory.reset_peak(device)
        runs = []
        for _ in range(self.cfg.repeats):
            timed: dict = {}
            with wall(device, timed):
                result = run()
            runs.append((timed["s"], result))
        seconds, result = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        return result, seconds, peak_memory_mb(device)

    def seed(self, index: int, turn: int) -> int:
        """The sampling seed of prompt `index`'s turn: the same for every method and batch size."""
        return self.cfg.seed * 1_000_003 + index * 16 + turn

    def generate(self, method: DecodeMethod, input_ids: torch.Tensor, seed: int) -> tuple[Generation, float, float]:
        """One prompt turn, timed (timed()), with the tokens it fed through the target counted."""
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

    def warm_up(self, prompts: list[ds.Prompt]) -> None:
        if not prompts or self.cfg.warmup == 0:
            return
        messages = ds.conversation(prompts[0], 0, [])
        ids = self.prompt_ids(messages, prompts[0])
        if ids is None:
            return
        with status(f"Warming up {len(self.methods)} method(s) (not timed)"):
            for method in self.methods.values():
                for _ in range(self.cfg.warmup):
                    method.generate(ids, min(self.cfg.max_new_tokens, 32), self.cfg.sampling,
                                    torch.Generator(device=self.target.device).manual_seed(0))

    def warm_up_batches(self, prompts: list[ds.Prompt], labels: list[BatchLabel], sizes: list[int]) -> None:
        """One untimed batch per (method, mode) at every batch size of the run (the first prompts, repeated to fill
        it): the batched code paths' first-call costs at that size's shapes (and its own tree or gamma) land here,
        not on whichever label happens to run first at that size."""
        from ..methods.batch_loop import generate_batch

        ids = [self.prompt_ids(ds.conversation(p, 0, []), p) for p in prompts[:2]]
        ids = [i for i in ids if i is not None]
        if not ids or self.cfg.warmup == 0:
            return
        with status("Warming up batches (not timed)"):
            for size in sorted({b for b in sizes if b > 1}):
                batch = (ids * size)[:size]
                for label in labels:
                    generate_batch(self.methods[label.method], batch, size, label.mode, False,
                                   min(self.cfg.max_new_tokens, 16), self.cfg.sampling, [None] * size)

    def run_prompt(self, prompt: ds.Prompt, index: int, label: str, order: int) -> list[TurnResult]:
        """All turns of one prompt with one method (a skipped turn ends the prompt), timed, with what else the
        machine did meanwhile (core/machine/contention.py)."""
        answers: list[str] = []
        results = []
        for turn in range(len(prompt.turns)):
            ids = self.prompt_ids(ds.conversation(prompt, turn, answers), prompt)
            if ids is None:
                break
            r = self.time_turn(label, ids, index, turn, order)
            results.append(r)
            answers.append(self.target.tokenizer.decode(r.gen.tokens))
        return results

    def time_turn(self, label: str, ids: torch.Tensor, index: int, turn: int, order: int) -> TurnResult:
        """One timed turn of one method with what else the machine did meanwhile; run_prompt's, and retime.py's
        when a disturbed turn is timed again (same ids and seed: the same tokens)."""
        before = contention.snapshot()
        gen, seconds, mem = self.generate(self.methods[label], ids, self.seed(index, turn))
        load = contention.between(before, contention.snapshot())
        # --tp: rank 0's time and reading on every rank, so that re-timing and the outlier test (retime.py) decide
        # alike on every rank (tensor_parallel.py); the tokens are every rank's own and the same
        seconds, load = from_writer((seconds, load))
        reference = None
        if label == "ar" and self.cfg.compile and self.cfg.sampling.greedy:  # untimed: compiled ar's own reference
            reference = compile_run.eager_tokens(self.methods[label], ids, self.cfg.max_new_tokens, self.cfg.sampling,
                                                 (self.target, self.drafter))
        return TurnResult(label, turn, ids, gen, seconds, mem, load, order, reference=reference)

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
                if self.synthetic:  # the output is not the model's: no lossless check applies
                    synthetic.count(self.synthetic_tallies, label, r.gen)
                elif self.cfg.sampling.greedy and label != "ar" and key in reference:
                    lossless = compare(r.gen.tokens, reference[key])
                    if lossless != "match":
                        gap, verdict = self.explain(dataset, prompt, r, reference, ar_ids, verdict)
                elif r.reference is not None:  # --compile: ar against eager ar of the same prompt
                    lossless = compare(r.gen.tokens, r.reference)
                    if lossless != "match":
                        from .lossless import explain_mismatch

                        gap, verdict = explain_mismatch(self.target, r.ids, r.reference, r.gen.tokens,
                                                        int(lossless.split("@")[1]))
                check = LosslessCheck(lossless, gap, verdict if lossless not in ("", "match") else "")
                writer.write(self.record(label, dataset, prompt, r, check), r.gen.tokens,
                             self.target.tokenizer.decode(r.gen.tokens))
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
        index = int(compare(r.gen.tokens, ar_tokens).split("@")[1])
        return explain_mismatch(self.target, ids, ar_tokens, r.gen.tokens, index)

    def record(self, method: str, dataset: str, prompt: ds.Prompt, r: TurnResult, check: LosslessCheck) -> Record:
        """The records.csv row of one checked turn (records.py)."""
        return build_record(self.cfg, self.target, self.env, method, dataset, prompt, r, check,
                            prompt_cut=self.prompt_cut.get((prompt, r.turn), 0))

    def finish_batch(self, dataset: str, label: str, mode: str, rows: list, reference: dict, writer: RecordWriter,
                     order: int) -> None:
        """Check every sample of a finished batch job against batch-1 ar's tokens (per sample, ar included: a
        batched forward may round differently, lossless.py explains it) and write its rows."""
        verdicts: dict[str, str] = {}
        for b in sorted(rows, key=lambda b: (b.index, b.turn)):
            r = TurnResult(label, b.turn, b.ids, b.gen, b.share_s, b.mem, b.noise, order, batch={
                "batch_size": int(b.batch_id.split("-")[0]), "batching": mode, "batch_id": b.batch_id,
                "batch_wall_s": round(b.batch_wall_s, 6), "forward_ms": round(b.forward_ms, 3),
                "prefill_s": round(b.prefill_share_s, 6)},
                disturbed=contention.disturbed(b.noise))  # batch jobs are flagged, not re-timed
            key = (dataset, b.prompt.id, b.turn)
            lossless, gap, verdict = "", math.nan, ""
            if self.synthetic:  # the output is not the model's: no lossless check applies
                synthetic.count(self.synthetic_tallies, f"{label} B={r.batch['batch_size']} {mode}", b.gen)
            elif self.cfg.sampling.greedy and key in reference:
                lossless = compare(b.gen.tokens, reference[key])
                if lossless != "match":
                    gap, verdicts[b.prompt.id] = self.explain(dataset, b.prompt, r, reference, {},
                                                              verdicts.get(b.prompt.id, ""))
                    verdict = verdicts[b.prompt.id]
            record = self.record(label, dataset, b.prompt, r, LosslessCheck(lossless, gap, verdict))
            writer.write(record, b.gen.tokens, self.target.tokenizer.decode(b.gen.tokens))
