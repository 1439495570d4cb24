"""`--shard I/N`: which prompts one shard of a run decodes, and what its run.yaml says about it.

The split is round-robin over the run's prompt list (datasets in --dataset order, prompts in file order after
--limit): shard I takes the prompts at positions I, I + N, I + 2N, ... Every method of a prompt, ar included, runs
in the prompt's shard, so every speedup stays a same-device ratio; each prompt keeps its position in its dataset,
so seeds and the per-prompt method rotation are those of the unsharded run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SpecbenchError

# `loaded` below is a list of work.LoadedDataset and `work` of work.PromptWork (not imported: work.py imports
# config.py, which imports this module)

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (0-based) of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """'I/N' (0 <= I < N), with an error naming --shard otherwise."""
        m = _SHARD.match(str(text))
        if not m:
            raise SpecbenchError(f"--shard: expected I/N with 0 <= I < N, e.g. 0/4 (got {text!r})")
        index, count = int(m.group(1)), int(m.group(2))
        if count < 1 or index >= count:
            raise SpecbenchError(f"--shard {text}: need 0 <= I < N and N >= 1 (shards are numbered 0 to N-1)")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def folder(self) -> str:
        """The shard's folder name under RUN/shards/ (sorts in shard order up to 1000 shards)."""
        return f"{self.index:03d}-of-{self.count:03d}"

    def owns(self, position: int) -> bool:
        return position % self.count == self.index


def positions(loaded: list) -> dict[tuple[str, str], int]:
    """(dataset, prompt id) -> the prompt's position in the run's prompt list (the order an unsharded run writes)."""
    out: dict[tuple[str, str], int] = {}
    for d in loaded:
        for p in d.prompts:
            out.setdefault((d.name, str(p.id)), len(out))
    return out


def prompt_count(loaded: list) -> int:
    return len(positions(loaded))


def refuse_too_many(count: int, prompts: int, option: str) -> None:
    """More shards than prompts would leave shards with nothing to do: refuse, naming the prompt count."""
    if count > prompts:
        raise SpecbenchError(f"{option}: {count} shards but the run has only {prompts} prompt(s); use at most "
                             f"{prompts} shards (or raise --limit)")


def select(work: list, loaded: list, shard: Shard | None) -> list:
    """The shard's part of the batch-1 work (all of it without a shard)."""
    if shard is None:
        return work
    where = positions(loaded)
    return [w for w in work if shard.owns(where[(w.dataset, str(w.prompt.id))])]


def shard_block(loaded: list, shard: Shard) -> dict:
    """run.yaml's `shard`: index, count and the prompts it owns, each with its position in the run's list."""
    owned = [{"dataset": ds, "prompt_id": pid, "position": pos}
             for (ds, pid), pos in positions(loaded).items() if shard.owns(pos)]
    return {"index": shard.index, "count": shard.count, "prompts": owned}


SIBLING_NOTE_CORES = 0.25  # siblings below this many cores' worth were idle: nothing to say (contention's bar)


def sibling_note(rows) -> str:
    """"; beside sibling shards ..." for a timing verdict whose rows ran while other shards of the run worked on
    this machine (their CPU time is `sibling_cpu`, kept out of foreign_cpu since it is planned): they share its memory
    bandwidth, so its times are those of a shared machine. Empty when they were idle, and for tensor-parallel rows
    (placement tpN: the siblings are the rows' own ranks, which is what that placement measures)."""
    import pandas as pd

    if "sibling_cpu" not in rows:
        return ""
    rows = rows[~rows.get("placement", pd.Series("", index=rows.index)).astype(str).str.startswith("tp")]
    busy = pd.to_numeric(rows.get("sibling_cpu"), errors="coerce").max()
    if not busy > SIBLING_NOTE_CORES:  # NaN (no readings) too
        return ""
    return (f"; beside sibling shards using up to {busy:.2f} cores (they share this machine's memory bandwidth, so "
            "these are a shared machine's times)")


def resolved_trees(methods: dict) -> dict:
    """run.yaml's `resolved_trees`: per tree-method label and batch size, the tree it decodes with, by content
    (`digest`: the same tree filed at two paths, or built on two machines, is one tree), with its size and source.
    `merge` refuses shards whose trees differ; `--tp` ranks must agree on them."""
    out = {}
    for label, method in methods.items():
        trees = getattr(method, "plans", None)
        if not trees:
            continue
        out[label] = {int(b): {"digest": tree_digest(t.tree_file), "size": t.tree_file.size, "source": str(t.source)}
                      for b, t in sorted(trees.items())}
    return out


def tree_digest(tree_file) -> str:
    """12 hex digits of a tree's shape (the root's prompt tokens and every state's candidate paths): what decodes,
    not where the file came from."""
    import hashlib
    import json

    shape = {"m": tree_file.prompt_tokens,
             "states": {str(k): [[list(p), c] for p, c in v] for k, v in sorted(tree_file.states.items())}}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
