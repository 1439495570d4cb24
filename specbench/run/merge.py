"""`specbench merge`: shard folders (`run --shard I/N`, or a Ray run's RUN/shards/) into one run folder.

The checks come first and name what they refuse: folders that are not shards, shards of other settings or of
another split, the same shard or prompt twice, missing or unfinished shards (unless allow_partial) and, since a
speedup pooled over two kinds of hardware is no same-device ratio, more than one hardware key (unless
per_hardware: then each key gets its own merged run folder, and nothing is pooled across keys), and within a
hardware key, a tree method decoded with different trees by different shards (check_trees).

The merged records.csv / tokens.jsonl / timeline.jsonl hold the shards' rows unchanged, in the order an unsharded run
writes them (prompts by their position in the run's prompt list); run.yaml lists the shards (hardware, prompts, ar
tok/s) for report.md's shard table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..progress import console
from .resume import differences
from .results import read_meta

# environment keys that must agree within one hardware key (the numbers depend on them); device names, identity,
# threads and git may differ between machines of one key and are listed per shard instead
SAME_ENVIRONMENT = ("device_type", "dtype", "cpu_linear", "attention", "torch", "transformers")
ROW_KEY = ["method", "dataset", "prompt_id", "turn", "batch_size", "batching"]


@dataclass
class ShardFolder:
    """One shard folder, read: its run.yaml and records (every cell as the text the shard wrote)."""

    folder: Path
    meta: dict
    records: pd.DataFrame

    @property
    def shard(self) -> dict:
        return self.meta["shard"]

    @property
    def name(self) -> str:
        return f"{self.shard['index']}/{self.shard['count']}"

    @property
    def hardware(self) -> str:
        return str((self.meta.get("environment") or {}).get("hardware"))

    def positions(self) -> dict[tuple[str, str], int]:
        return {(p["dataset"], str(p["prompt_id"])): int(p["position"]) for p in self.shard.get("prompts") or []}

    def ar_tokens_per_s(self) -> float | None:
        ar = self.records[self.records.method == "ar"]
        seconds = pd.to_numeric(ar.wall_s, errors="coerce").sum()
        return round(float(pd.to_numeric(ar.new_tokens, errors="coerce").sum() / seconds), 2) if seconds else None

    def summary_row(self) -> dict:
        env = self.meta.get("environment") or {}
        return {"shard": self.name, "folder": str(self.folder), "hardware": self.hardware,
                "device": env.get("device"), "threads": env.get("threads"), "prompts": len(self.positions()),
                "records": len(self.records), "ar_tokens_per_s": self.ar_tokens_per_s(),
                "complete": bool(self.meta.get("complete"))}


def read_shard(folder: Path) -> ShardFolder:
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecbenchError(f"merge: {folder} is not a folder")
    meta = read_meta(folder)
    if not meta:
        raise SpecbenchError(f"merge: {folder} has no run.yaml; pass folders written by `specbench run --shard I/N`")
    if not isinstance(meta.get("shard"), dict):
        raise SpecbenchError(f"merge: {folder} is not a shard (its run.yaml has no `shard`: it ran unsharded); "
                             "merge takes the folders of `specbench run --shard I/N`")
    path = RunFolder(folder).records
    records = (pd.read_csv(path, dtype=str, keep_default_na=False) if path.exists() and path.stat().st_size
               else pd.DataFrame(columns=ROW_KEY + ["new_tokens", "wall_s"]))
    return ShardFolder(folder, meta, records)


def settings_of(s: ShardFolder) -> dict:
    return {k: v for k, v in (s.meta.get("settings") or {}).items() if k != "shard"}


def check(shards: list[ShardFolder], allow_partial: bool, per_hardware: bool) -> bool:
    """Refuse what cannot be merged, naming it; returns whether the merged run is complete."""
    first = shards[0]
    for s in shards[1:]:
        changed = differences(settings_of(first), settings_of(s))
        if changed:
            raise SpecbenchError(f"merge: {s.folder} is a shard of another run than {first.folder} (settings differ: "
                                 f"{'; '.join(changed)}); merge shards of one run configuration only")
    counts = {s.shard["count"] for s in shards}
    if len(counts) > 1:
        raise SpecbenchError("merge: the shards come from different splits (" +
                             ", ".join(f"{s.folder}: {s.name}" for s in shards) + "); merge shards of one --shard .../N")
    seen: dict[int, Path] = {}
    for s in shards:
        if s.shard["index"] in seen:
            raise SpecbenchError(f"merge: shard {s.name} twice ({seen[s.shard['index']]} and {s.folder}); "
                                 "pass each shard folder once")
        seen[s.shard["index"]] = s.folder
    owner: dict[tuple[str, str], Path] = {}
    for s in shards:
        for key in s.positions():
            if key in owner:
                raise SpecbenchError(f"merge: prompt {key[1]} of {key[0]} is in two shards ({owner[key]} and "
                                     f"{s.folder}); the shards overlap")
            owner[key] = s.folder
        stray = {(d, p) for d, p in zip(s.records.dataset, s.records.prompt_id)} - set(s.positions())
        if stray:
            d, p = sorted(stray)[0]
            raise SpecbenchError(f"merge: {s.folder} holds records of prompt {p} of {d}, which its shard does not own")
    count = counts.pop()
    missing = [f"{i}/{count}" for i in range(count) if i not in seen]
    unfinished = [f"{s.name} ({s.folder})" for s in shards if not s.meta.get("complete")]
    problems = ([f"missing shard(s) {', '.join(missing)}"] if missing else []) + \
               ([f"unfinished shard(s) {', '.join(unfinished)} (continue each with its command plus --resume)"]
                if unfinished else [])
    if problems and not allow_partial:
        raise SpecbenchError(f"merge: {'; '.join(problems)}. Merge every shard, finished, or pass --allow-partial "
                             "for a report marked partial")
    for problem in problems:
        console.print(f"[yellow]warning[/] {problem}: the merged report is marked partial")
    keys = sorted({s.hardware for s in shards})
    if len(keys) > 1 and not per_hardware:
        listed = "; ".join(f"{k}: shard(s) {', '.join(s.name for s in shards if s.hardware == k)}" for k in keys)
        raise SpecbenchError(f"merge: the shards ran on {len(keys)} hardware keys ({listed}); a speedup pooled over "
                             "them is no same-device ratio. Re-run the odd shards on matching hardware, or pass "
                             "--per-hardware for one merged run per hardware key")
    for key in keys:
        group = [s for s in shards if s.hardware == key]
        for s in group[1:]:
            env0, env = group[0].meta.get("environment") or {}, s.meta.get("environment") or {}
            changed = differences({k: env0.get(k) for k in SAME_ENVIRONMENT}, {k: env.get(k) for k in SAME_ENVIRONMENT})
            if changed:
                raise SpecbenchError(f"merge: {s.folder} and {group[0].folder} ran on hardware {key} in different "
                                     f"environments ({'; '.join(changed)}); their numbers do not pool")
        check_trees(group)
    return not problems


def check_trees(group: list[ShardFolder]) -> None:
    """Refuse shards of one hardware key that decoded a tree method with different trees, naming the shards and
    trees: the same settings can resolve different trees (`--tree auto` finds a tree file on one machine and builds
    one on another, or times the drafter differently), and a method's rows pooled over two trees measure neither.
    Trees compare by content (run.yaml's resolved_trees digests); shards from before those, by size."""
    held = [(s, _trees(s)) for s in group]
    for label in sorted({label for _, trees in held for label in trees}):
        used = [(s, trees[label]) for s, trees in held if label in trees]
        by_digest = all(v.get("digest") for _, tree in used for v in tree.values())
        kinds = {tuple(sorted((b, v.get("digest") if by_digest else v.get("size")) for b, v in tree.items()))
                 for _, tree in used}
        if len(kinds) > 1:
            listed = "; ".join(f"shard {s.name}: {_said(tree)}" for s, tree in used)
            raise SpecbenchError(f"merge: the shards decoded {label} with different trees ({listed}); its rows pooled "
                                 "over them would measure neither. Re-run the odd shards with the others' tree "
                                 "(--tree PATH, e.g. the file named above), or merge each tree's shards apart")


def _trees(s: ShardFolder) -> dict:
    """label -> batch size -> {digest, size, source} of the trees a shard resolved (older shards: run.yaml's
    `trees`, batch 1, without digests)."""
    resolved = s.meta.get("resolved_trees")
    if isinstance(resolved, dict):
        return {label: {int(b): v for b, v in (per or {}).items()} for label, per in resolved.items()}
    return {label: {1: {"size": v.get("size"), "source": v.get("tree")}}
            for label, v in (s.meta.get("trees") or {}).items() if isinstance(v, dict)}


def _said(tree: dict) -> str:
    def one(v: dict) -> str:
        source = str(v.get("source") or "")
        source = source if len(source) <= 70 else source[:67] + "..."
        return f"size {v.get('size')}" + (f" [{v['digest']}]" if v.get("digest") else "") + f" from {source}"

    if set(tree) == {1}:
        return one(tree[1])
    return ", ".join(f"batch {b} {one(v)}" for b, v in sorted(tree.items()))


def merge(folders: list[Path], out: Path, allow_partial: bool = False, per_hardware: bool = False,
          replace: bool = False) -> list[Path]:
    """Check and merge shard folders into `out`; returns the merged run folders (one, or one per hardware key)."""
    if not folders:
        raise SpecbenchError("merge: give the shard folders to merge")
    out = Path(out)
    shards = [read_shard(Path(f)) for f in dict.fromkeys(Path(f).resolve() for f in folders)]
    if any(s.folder == out.resolve() for s in shards):
        raise SpecbenchError(f"merge: --out {out} is one of the shard folders; choose another folder")
    if not replace and (RunFolder(out).is_run() or RunFolder(out).merge.exists()):
        raise SpecbenchError(f"merge: {out} already holds a run; choose another --out or remove it")
    complete = check(shards, allow_partial, per_hardware)
    shards.sort(key=lambda s: s.shard["index"])
    keys = sorted({s.hardware for s in shards})
    if len(keys) == 1:
        write_merged(out, shards, complete)
        return [out]
    runs = [write_merged(out / key, [s for s in shards if s.hardware == key], complete) for key in keys]
    RunFolder(out).merge.write_text(yaml.safe_dump({"hardware_keys": keys, "runs": [str(r) for r in runs],
                                                    "shards": [s.summary_row() for s in shards]}, sort_keys=False))
    return runs


def write_merged(out: Path, shards: list[ShardFolder], complete: bool) -> Path:
    """One run folder from shards of one hardware key: records, tokens, timeline and run.yaml (the report: report/)."""
    out.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(out)
    where = {k: v for s in shards for k, v in s.positions().items()}

    def position(dataset: str, prompt_id) -> int:
        return where.get((dataset, str(prompt_id)), len(where))

    records = pd.concat([s.records for s in shards], ignore_index=True)
    order = sorted(range(len(records)), key=lambda i: position(records.dataset[i], records.prompt_id[i]))
    records.iloc[order].to_csv(folder.records, index=False)
    # tokens: one row per record, in the records' order (a row written twice by a killed shard counts once)
    index = {_key(r): i for i, r in enumerate(records.iloc[order].to_dict("records"))}
    tokens = {_key(r): r for r in _rows([RunFolder(s.folder).tokens for s in shards]) if _key(r) in index}
    folder.tokens.write_text("".join(json.dumps(tokens[k]) + "\n" for k in sorted(tokens, key=index.get)))
    timeline = {(r.get("method"), r["dataset"], str(r["prompt_id"]), r.get("turn")): r
                for r in _rows([RunFolder(s.folder).timeline for s in shards])}
    if timeline:  # sd / pearl: each prompt's steps, in prompt order
        rows = sorted(timeline.values(), key=lambda r: position(r["dataset"], r["prompt_id"]))
        folder.timeline.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = shards[0].meta
    meta = {k: v for k, v in first.items() if k not in ("shard", "complete")}
    meta["settings"] = settings_of(shards[0])
    meta["shards"] = [s.summary_row() for s in shards]
    meta["complete"] = complete
    folder.meta.write_text(yaml.safe_dump(meta, sort_keys=False))
    return out


def _key(row: dict) -> tuple[str, ...]:
    """A record's identity, from a records.csv row (text cells) or a tokens.jsonl row."""
    return tuple(str(row.get(k, {"batch_size": 1, "batching": "-"}.get(k))) for k in ROW_KEY)


def _rows(paths: list[Path]) -> list[dict]:
    """The JSONL rows of the files `paths` (one per shard, in shard order) that exist."""
    return [row for path in paths if path.exists()
            for row in map(_row, path.read_text().splitlines()) if row is not None]


def _row(line: str) -> dict | None:
    """A JSONL row; a torn last line (a shard killed mid-write) is left out, as read_tokens does."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and "dataset" in row and "prompt_id" in row else None

