"""Long-prompt sets built from another set's records (a spec with a `join` field, e.g. datasets/cnn-dm-long.yaml).

Consecutive records of the source set, from record `start` on, are joined (with `separator`) into one text per
prompt until the text reaches `target_chars[i % len(target_chars)]` characters, prompt i cycling through the
targets so that a run covers several prompt lengths. A text that would pass `max_chars` has its last record cut
at the last sentence end that fits (or at max_chars when none does). Lengths are in characters, not tokens, so
that the prompts are the same for every model; the spec says what they come to in the default model's tokens.

The source is found wherever it is found (sources.py: --data-file, $SPECBENCH_DATA_DIR/<source>/, cache, online),
so the joined set works offline wherever its source does. Deterministic: no randomness, file order only.
"""

from __future__ import annotations

from ..errors import SpecbenchError
from .sources import find_records
from .specs import DatasetSpec, get_spec

SENTENCE_ENDS = (". ", ".\n", "? ", "! ", '." ')


def source_spec(spec: DatasetSpec) -> DatasetSpec:
    """The set a joined spec takes its records from (itself not joined)."""
    source = get_spec(spec.join["source"])
    if source.join is not None:
        raise SpecbenchError(f"{spec.path}: join source {source.name!r} is itself a joined set; name a plain set")
    return source


def joined_records(spec: DatasetSpec, needed: int | None, data_file: str | None, offline: bool | None) -> list[dict]:
    """Up to `needed` records {id, text, count, chars} of a joined set (all the source allows when None): id is
    "<first id>..<last id>" of the source records joined, count how many."""
    join = spec.join
    source = source_spec(spec)
    # a prompt joins about max_chars / 2000 records (news articles average ~3.7k characters); ask for enough rows
    per_prompt = max(2, join["max_chars"] // 2000)
    rows = find_records(source, None if needed is None else join["start"] + per_prompt * needed, data_file, offline)
    out: list[dict] = []
    parts: list[str] = []
    ids: list[str] = []
    for index in range(join["start"], len(rows)):
        if needed is not None and len(out) >= needed:
            break
        record = rows[index]
        text = record.get(join["field"])
        if not isinstance(text, str) or not text.strip():
            raise SpecbenchError(f"dataset {spec.name}: record {index + 1} of {source.name} has no text in field "
                                 f"{join['field']!r}; fix the file or the spec's join.field")
        parts.append(text.strip())
        ids.append(str(record[source.id_field]) if source.id_field and source.id_field in record else str(index))
        target = join["target_chars"][len(out) % len(join["target_chars"])]
        joined = join["separator"].join(parts)
        if len(joined) < target:
            continue
        if len(joined) > join["max_chars"]:
            joined = cut(joined, join["max_chars"], keep=len(joined) - len(parts[-1]))
        out.append({"id": f"{ids[0]}..{ids[-1]}" if len(ids) > 1 else ids[0], "text": joined, "count": len(parts),
                    "chars": len(joined)})
        parts, ids = [], []
    if not out:
        raise SpecbenchError(f"dataset {spec.name}: {source.name} has {len(rows)} records, too few to build one "
                             f"prompt from record {join['start'] + 1} on; supply the full file")
    return out


def cut(text: str, limit: int, keep: int) -> str:
    """`text` cut to at most `limit` characters at the last sentence end after position `keep` (the start of the
    last record); at `limit` itself when no sentence ends there."""
    window = text[:limit]
    end = max(window.rfind(mark) for mark in SENTENCE_ENDS)
    if end > keep:
        return window[:end + 1].rstrip()
    return window.rstrip()
