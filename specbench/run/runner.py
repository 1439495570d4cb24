"""The Runner: what every prompt turn goes through on its way to records.csv, whichever backend decodes it
(backend.py): rendering into the context, the timed turn with what else the machine did meanwhile
(core/machine/contention.py), the lossless check against `ar`'s tokens (a mismatch explained from the backend's
logits: lossless.py) and the record (records.py). benchmark.py drives it over the run's work.
"""

from __future__ import annotations

import math

from ..core.machine import contention
from ..core.model.tensor_parallel import from_writer
from ..data import datasets as ds
from ..methods.base import Generation
from . import synthetic
from .backend import Backend, turn_seed
from .config import RunConfig
from .records import LosslessOutcome, TurnResult, build_record, compare, same_ids
from .results import Record, RecordWriter, append_timeline
from .turn_bandwidth import TurnBandwidth


class Runner:
    """One run's backend and what each prompt turn goes through on its way to records.csv."""

    def __init__(self, cfg: RunConfig, backend: Backend):
        self.cfg, self.backend = cfg, backend
        self.prompt_cut: dict[tuple[ds.Prompt, int], int] = {}  # (prompt, turn) -> tokens cut to fit the context
        # --synthetic-acceptance (own_methods.py): the output is not the model's; acceptance is tallied instead
        self.synthetic = getattr(backend, "synthetic", None)
        self.synthetic_tallies: dict[str, synthetic.Tally] = {}
        # the bandwidth read beside each timed turn (turn_bandwidth.py), where the backend owns a CPU's roofline
        self.turn_bandwidth = TurnBandwidth(getattr(backend, "bandwidth_device", None))

    @property
    def labels(self) -> tuple[str, ...]:
        return self.backend.labels

    def prompt_ids(self, messages: list[dict], prompt: ds.Prompt):
        """Rendered and fitted into the context by the backend (truncated from the left with a warning, or None:
        skipped with a reason); the cut is remembered for the turn's record."""
        fitted = self.backend.prompt_ids(messages, prompt)
        if fitted is None:
            return None
        ids, cut = fitted
        self.prompt_cut[(prompt, sum(m["role"] == "user" for m in messages) - 1)] = cut  # records.csv's prompt_cut
        return ids

    def seed(self, index: int, turn: int) -> int:
        """The sampling seed of prompt `index`'s turn: the same for every method and batch size."""
        return turn_seed(self.cfg, index, turn)

    def generate(self, label: str, ids, seed: int) -> tuple[Generation, float, float]:
        """One timed turn of one method by the backend: (generation, median seconds, peak memory MB)."""
        return self.backend.generate(label, ids, seed)

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
            answers.append(self.backend.decode(r.gen.tokens))
        return results

    def time_turn(self, label: str, ids, index: int, turn: int, order: int) -> TurnResult:
        """One timed turn of one method with what else the machine did meanwhile and the bandwidth beside it;
        run_prompt's, and retime.py's when a disturbed turn is timed again (same ids and seed: the same tokens)."""
        bandwidth = self.turn_bandwidth.before()  # untimed, outside the contention reading
        before = contention.snapshot()
        gen, seconds, mem = self.generate(label, ids, self.seed(index, turn))
        load = contention.between(before, contention.snapshot())
        load["bandwidth_gb_s"] = self.turn_bandwidth.beside(bandwidth)
        # --tp: rank 0's time and reading on every rank, so that re-timing and the outlier test (retime.py) decide
        # alike on every rank (tensor_parallel.py); the tokens are every rank's own and the same
        seconds, load = from_writer((seconds, load))
        return TurnResult(label, turn, ids, gen, seconds, mem, load, order,
                          reference=self.backend.reference(label, ids))

    def finish_prompt(self, dataset: str, prompt: ds.Prompt, results: dict[str, list[TurnResult]],
                      reference: dict, writer: RecordWriter) -> None:
        """Check every method's tokens against ar's (check_prompt) and write the records, in the registry's method
        order whatever order they ran in."""
        for label, r, outcome in self.check_prompt(dataset, prompt, results, reference):
            writer.write(self.record(label, dataset, prompt, r, outcome), r.gen.tokens,
                         self.backend.decode(r.gen.tokens))
            if r.gen.timeline:  # sd / pearl: per-step draft and target busy spans (timeline.jsonl)
                append_timeline(writer.records_path.parent, {"method": label, "dataset": dataset,
                                                             "prompt_id": str(prompt.id), "turn": r.turn},
                                r.gen.timeline)

    def check_prompt(self, dataset: str, prompt: ds.Prompt, results: dict[str, list[TurnResult]],
                     reference: dict) -> list[tuple[str, TurnResult, LosslessOutcome]]:
        """The lossless check of one prompt's turns, every method's against ar's (a mismatch explained from the
        backend's logits: lossless.py), in the registry's method order: (label, turn, outcome). ar's compared
        sequences are added to `reference`, (dataset, prompt id, turn) -> sequence."""
        for r in results.get("ar", []):
            reference[(dataset, prompt.id, r.turn)] = compared(r)
        ar_ids = {r.turn: r.ids for r in results.get("ar", [])}
        checked = []
        for label in (m for m in self.labels if m in results):
            verdict = ""
            for r in results[label]:
                key = (dataset, prompt.id, r.turn)
                lossless, gap = "", math.nan
                if self.synthetic:  # the output is not the model's: no lossless check applies
                    synthetic.count(self.synthetic_tallies, label, r.gen)
                elif self.cfg.sampling.greedy and label != "ar" and key in reference:
                    lossless = compare(compared(r), reference[key])
                    if lossless != "match":
                        gap, verdict = self.explain(dataset, prompt, r, reference, ar_ids, verdict)
                elif r.reference is not None:  # the backend's own reference (a compiled ar's eager twin)
                    lossless = compare(r.gen.tokens, r.reference)
                    if lossless != "match":
                        gap, verdict = self.backend.explain(r.ids, r.reference, r.gen.tokens,
                                                            int(lossless.split("@")[1]))
                checked.append((label, r, LosslessOutcome(lossless, gap,
                                                          verdict if lossless not in ("", "match") else "")))
        return checked

    def explain(self, dataset: str, prompt: ds.Prompt, r: TurnResult, reference: dict, ar_ids: dict,
                earlier: str) -> tuple[float, str]:
        """(logit gap, verdict) at the first mismatch of a turn. A later turn whose prompt already differs from
        ar's (an earlier turn diverged) inherits the earlier turn's verdict."""
        ar_tokens = reference[(dataset, prompt.id, r.turn)]
        ids = ar_ids.get(r.turn)
        if ids is None:  # ar ran in an earlier session (--resume): rebuild its prompt from its own answers
            answers = [self.backend.decode(reference[(dataset, prompt.id, t)]) for t in range(r.turn)]
            ids = self.prompt_ids(ds.conversation(prompt, r.turn, answers), prompt)
        if ids is None or not same_ids(ids, r.ids):
            return math.nan, earlier or "unexplained"
        index = int(compare(compared(r), ar_tokens).split("@")[1])
        return self.backend.explain(ids, ar_tokens, compared(r), index)

    def record(self, method: str, dataset: str, prompt: ds.Prompt, r: TurnResult, outcome: LosslessOutcome) -> Record:
        """The records.csv row of one checked turn (records.py)."""
        return build_record(self.cfg, self.backend.env, self.backend.model_spec, method, dataset, prompt, r, outcome,
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
                lossless = compare(compared(r), reference[key])
                if lossless != "match":
                    gap, verdicts[b.prompt.id] = self.explain(dataset, b.prompt, r, reference, {},
                                                              verdicts.get(b.prompt.id, ""))
                    verdict = verdicts[b.prompt.id]
            record = self.record(label, dataset, b.prompt, r, LosslessOutcome(lossless, gap, verdict))
            writer.write(record, b.gen.tokens, self.backend.decode(b.gen.tokens))


def compared(r: TurnResult) -> list:
    """What the lossless check compares of a turn: its tokens, or the backend's stand-in where its tokens are not
    comparable (a server's text, when it gives no token strings)."""
    return r.tokens_compared if r.tokens_compared is not None else r.gen.tokens
