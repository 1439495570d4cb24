"""Record files of the benchmark sets: .jsonl, .jsonl.gz or .json (a list of objects), read with errors that name
the file and line, written atomically."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ..errors import SpecbenchError


def read_records(path: Path) -> list[dict]:
    """Records of a .jsonl, .jsonl.gz or .json (a list of objects) file."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            if path.name.endswith((".json", ".json.gz")):
                return as_records(parse_json(fh.read(), str(path)), str(path))
            return [as_record(parse_json(line, f"{path}, line {n}"), f"{path}, line {n}")
                    for n, line in enumerate(fh, start=1) if line.strip()]
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise SpecbenchError(f"cannot read {path}: {exc}; check or replace the file") from exc


def parse_json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecbenchError(f"{where}: not valid JSON ({exc.msg}); fix or replace the file") from exc


def as_record(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise SpecbenchError(f"{where}: expected a JSON object, got {type(value).__name__}; fix the file")
    return value


def as_records(value, where: str) -> list[dict]:
    if not isinstance(value, list):
        raise SpecbenchError(f"{where}: expected a JSON list of objects (or JSONL, one object a line)")
    return [as_record(v, f"{where}, item {i + 1}") for i, v in enumerate(value)]


def write_records(path: Path, records: list[dict]) -> None:
    """Write records in the format the file name says (.jsonl, .jsonl.gz or .json), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(tmp, "wt", encoding="utf-8") as fh:
        if path.name.endswith((".json", ".json.gz")):
            json.dump(records, fh, ensure_ascii=False)
        else:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    tmp.replace(path)


def count_rows(path: Path) -> str:
    try:
        return f"found, {len(read_records(path))} rows"
    except SpecbenchError as exc:
        return f"found but unreadable: {exc}"
