"""Result records (frozen dataclasses) and their files. The CSVs are the interface: reports never re-run models.

A run directory holds:
  run.yaml        the settings and environment of the run (a resumed run must match them)
  records.csv     one row per method x prompt x turn, appended as each finishes
  tokens.jsonl    the generated token ids of every row (for the lossless check and for resuming)
  summary.csv     one row per method x dataset (written by report/run_report.py)
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd
import yaml

from ..core.store import RunFolder
from ..errors import SpecbenchError


@dataclass(frozen=True)
class Record:
    method: str
    dataset: str
    prompt_id: str
    category: str  # the prompt's category ("" when its file has none)
    turn: int
    prompt_tokens: int
    new_tokens: int
    wall_s: float
    tokens_per_s: float
    target_forwards: int
    tau: float  # new tokens / target forwards (bonus token included; ar = 1.00)
    drafted: int
    draft_forwards: int  # drafter forward passes, prefill included (0: no drafter; empty in older runs)
    draft_s: float  # seconds inside drafting: drafter forwards + choosing drafts (pearl: the drafter's busy time;
    # batch > 1: an equal share of each batched drafting step among its samples)
    accepted_drafts: int
    acceptance_rate: float  # accepted drafts / drafted (empty for methods that draft nothing)
    lossless: str  # "match", "mismatch@<index>", or "" (no greedy reference)
    stopped: bool  # ended on a stop token
    peak_mem_mb: float
    accepted_per_position: str  # "a1/d1 a2/d2 ...": accepted / drafted per draft position
    temperature: float
    model: str
    dtype: str
    device: str
    hardware: str  # slug of the hardware identity (core/machine/hardware.py)
    threads: int
    torch: str
    transformers: str
    git: str
    # lossless check at the first mismatch (run/lossless.py): ar's logit of its own token minus its logit of the
    # method's token at that position, and the verdict ("near-tie": within the dtype's rounding; "unexplained")
    mismatch_logit_gap: float = float("nan")
    mismatch_explained: str = ""
    # noise guard (run/noise.py): per-forward time, and what else the machine did while this row was timed
    forward_ms: float = float("nan")  # wall_s / target_forwards, in ms
    foreign_cpu: float = float("nan")  # cores' worth of CPU used by other processes during the timing
    sibling_cpu: float = float("nan")  # of a sharded run: cores' worth its other shards used (not in foreign_cpu)
    steal: float = float("nan")  # share of CPU time the hypervisor stole during the timing (0..1)
    load_before: float = float("nan")  # 1-minute load average before / after the timing
    load_after: float = float("nan")
    bandwidth_gb_s: float = float("nan")  # the memory bandwidth read beside the timing (run/turn_bandwidth.py; CPU)
    order: int = -1  # position of this method among the methods run on this prompt (interleaved per prompt)
    # --retime (run/retime.py): how many timings of this prompt turn were taken (1: the first was kept), and whether
    # the kept one was still disturbed (/proc reading or forward-time outlier) when the tries ran out
    timing_tries: int = 1
    timing_disturbed: bool = False
    # batching (EMS-SD; methods/batch_loop.py). Batch 1: batch_size 1, batching "-". At batch > 1 a sample's wall_s is
    # its share of its batch's wall time (batch_wall_s x its share of the batch's new tokens), so that sums over
    # rows give the batch's throughput; latency_s is its own time from joining the batch to its last token.
    batch_size: int = 1
    batching: str = "-"  # "-" (batch 1), "unpadded" (EMS-SD) or "padded" (the vanilla way)
    batch_id: str = ""  # which batch the sample was decoded in (<batch size>-<group>-<turn>)
    batch_wall_s: float = float("nan")
    latency_s: float = float("nan")
    target_tokens: int = 0  # tokens fed through the target for this row, prefill and padding included
    padding_tokens: int = 0  # of those, padding tokens (padded batching)
    padding_ratio: float = 0.0  # padding_tokens / target_tokens
    kv_padding: int = 0  # padded KV-cache entries the sample held when it left the batch (padded batching)
    placement: str = ""  # the target's placement (core/model/placement.label): single:cpu, map:0:16,1:14, tp2
    # EMS-SD's own numbers beside ours (§4.1, Appendix B). Decode-only throughput: the batch's prefill-only steps
    # timed apart (prefill_s: this row's share of them, as wall_s is of the batch; NaN at batch 1, not timed apart)
    prefill_s: float = float("nan")
    prefill_tokens: int = 0  # tokens emitted by those prefill steps (the sample's first token)
    decode_tokens_per_s: float = float("nan")  # (new_tokens - prefill_tokens) / (wall_s - prefill_s)
    kv_padding_ratio: float = 0.0  # kv_padding / new_tokens: EMS-SD's padding ratio (padding per accepted token,
    # can pass 100%), beside padding_ratio (ours: padding's share of the tokens fed, at most 100%)
    # which engine decoded this row: specbench's own loop, llama.cpp in process, an OpenAI-compatible server
    engine: str = "specbench"
    # the serving view of the turn (a request's): time to first token, time per output token after the first
    # ((wall - ttft) / (new tokens - 1)), the percentiles of its inter-token latencies (one gap per arrival: a
    # forward's or a chunk's tokens arrive together) and those gaps themselves (ms, space-separated: the report
    # pools them over requests)
    ttft_s: float = float("nan")
    tpot_ms: float = float("nan")
    itl_p50_ms: float = float("nan")
    itl_p90_ms: float = float("nan")
    itl_p99_ms: float = float("nan")
    itl_gaps_ms: str = ""
    # where the turn's time went: target forwards, and the rest after drafting (wall - forward - draft:
    # masks, tree building, top-k, host syncs, acceptance); NaN where not measured
    forward_s: float = float("nan")
    host_s: float = float("nan")
    # tokens cut from the left of the rendered prompt to fit the context with room for --max-new-tokens (0: whole)
    prompt_cut: int = 0
    # --compile: decode forwards through a compiled graph and those run eagerly (NaN: the run did not compile)
    compiled_forwards: float = float("nan")
    eager_forwards: float = float("nan")


RECORD_COLUMNS = [f.name for f in fields(Record)]


class RecordWriter:
    """Appends records and their tokens, flushing each row so an interrupted run loses nothing."""

    def __init__(self, run_dir: Path):
        folder = RunFolder(run_dir)
        self.records_path, self.tokens_path = folder.records, folder.tokens
        # new, or left empty by a process killed before its header reached the disk
        new = not self.records_path.exists() or self.records_path.stat().st_size == 0
        self._csv_file = self.records_path.open("a", newline="")
        self._csv = csv.DictWriter(self._csv_file, fieldnames=RECORD_COLUMNS)
        if new:
            self._csv.writeheader()
            self._csv_file.flush()
        self._tokens_file = self.tokens_path.open("a")

    def write(self, record: Record, tokens: list[int], text: str | None = None) -> None:
        """A record and its tokens (with `text`, the tokens decoded: tokens.jsonl's `text`, to read what was said)."""
        key = {"method": record.method, "dataset": record.dataset, "prompt_id": record.prompt_id,
               "turn": record.turn, "batch_size": record.batch_size, "batching": record.batching}
        said = {"text": text} if text is not None else {}
        self._tokens_file.write(json.dumps({**key, "tokens": tokens, **said}) + "\n")
        self._tokens_file.flush()
        self._csv.writerow(asdict(record))
        self._csv_file.flush()

    def close(self) -> None:
        self._csv_file.close()
        self._tokens_file.close()


def read_tokens(run_dir: Path) -> dict[tuple[str, str, str, int], list[int]]:
    """(method, dataset, prompt_id, turn) -> token ids of batch-1 rows, from tokens.jsonl (a torn last line is
    ignored; batched rows, which carry batch_size > 1, are not the references)."""
    path = RunFolder(run_dir).tokens
    out: dict[tuple[str, str, str, int], list[int]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(row.get("batch_size", 1)) != 1:
            continue
        out[(row["method"], row["dataset"], str(row["prompt_id"]), int(row["turn"]))] = row["tokens"]
    return out


def with_batch_columns(records: pd.DataFrame) -> pd.DataFrame:
    """Records with batch_size (int) and batching (1 and "-" for runs from before batching, and for blank cells)."""
    size = (pd.to_numeric(records["batch_size"], errors="coerce").fillna(1).astype(int) if "batch_size" in records
            else 1)
    mode = records["batching"].astype(str).replace({"": "-", "nan": "-"}) if "batching" in records else "-"
    return records.assign(batch_size=size, batching=mode)


def read_meta(run_dir: Path) -> dict:
    """run.yaml of a run folder ({} when it has none; an unreadable one is an error naming the file)."""
    path = RunFolder(run_dir).meta
    if not path.exists():
        return {}
    try:
        meta = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError) as exc:
        raise SpecbenchError(f"{path}: not a readable run.yaml ({' '.join(str(exc).split())})") from exc
    return meta if isinstance(meta, dict) else {}


def append_timeline(run_dir: Path, key: dict, steps: list[dict]) -> None:
    """Add one generation's steps to timeline.jsonl (key: method, dataset, prompt_id, turn)."""
    with open(RunFolder(run_dir).timeline, "a") as f:
        f.write(json.dumps({**key, "steps": steps}) + "\n")
