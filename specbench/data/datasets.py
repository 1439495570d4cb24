"""Benchmark prompts: load a named set (its spec: specs.py; where its file is found: sources.py) or a user's own
file, and render each record into a Prompt through the spec's template.

`--dataset path.jsonl` reads a user's own file instead: one record a line with a `prompt`, `instruction` or
`question` string (the first present) or a `turns` list, an optional `id` and an optional `system`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SpecbenchError
from .joined import joined_records, source_spec
from .record_files import read_records
from .sources import describe_sources as _describe_sources
from .sources import find_records
from .specs import DatasetSpec, Prompt, dataset_names, get_spec

USER_TEXT_FIELDS = ("prompt", "instruction", "question")

__all__ = ["DatasetSpec", "Prompt", "conversation", "dataset_names", "describe_sources", "get_spec", "load_prompts",
           "looks_like_path"]


def load_prompts(name_or_path: str, limit: int | None = None, data_file: str | None = None,
                 offline: bool | None = None, per_category: bool = False) -> tuple[DatasetSpec, list[Prompt]]:
    """The first `limit` prompts (default: the spec's default_limit, else all) of a named set or a user's file;
    with `per_category`, the first `limit` of every category (records without one form the category "")."""
    if limit is not None and limit < 1:
        raise SpecbenchError(f"--limit must be at least 1 (got {limit})")
    if name_or_path not in dataset_names() and looks_like_path(name_or_path):
        if data_file:
            raise SpecbenchError(f"--data-file is for named datasets; {name_or_path} is already a file, "
                                 "so drop --data-file")
        spec, prompts = _user_prompts(Path(name_or_path))
        return spec, _first(prompts, limit, per_category)

    spec = get_spec(name_or_path)
    needed = limit or spec.default_limit
    find = joined_records if spec.join else find_records  # a long-prompt set joins another set's records
    records = find(spec, None if per_category else needed, data_file, offline)
    prompts = _first([_render(spec, record, i) for i, record in enumerate(records if per_category else
                                                                         records[:needed])], needed, per_category)
    if not prompts:
        raise SpecbenchError(f"dataset {spec.name}: the file has no records; check or replace it")
    return spec, prompts


def describe_sources(spec: DatasetSpec) -> list[tuple[str, str]]:
    """(place, status) for each place a set is looked for (a joined set: its source's places), no network."""
    if not spec.join:
        return _describe_sources(spec)
    source = source_spec(spec)
    return [(f"{place} (joined from {source.name} record {spec.join['start'] + 1} on)", state)
            for place, state in _describe_sources(source)]


def _first(prompts: list[Prompt], limit: int | None, per_category: bool) -> list[Prompt]:
    """The first `limit` prompts, or the first `limit` of each category (file order kept)."""
    if not per_category:
        return prompts[:limit]
    taken: dict[str, int] = {}
    out = []
    for p in prompts:
        if limit is None or taken.get(p.category, 0) < limit:
            taken[p.category] = taken.get(p.category, 0) + 1
            out.append(p)
    return out


def looks_like_path(name: str) -> bool:
    return name.endswith((".jsonl", ".json", ".gz")) or os.sep in name or "/" in name or Path(name).is_file()


def _render(spec: DatasetSpec, record: dict, index: int) -> Prompt:
    """A record -> Prompt: each turn (or the text field) goes through the template with the record's fields."""
    prompt_id = str(record[spec.id_field]) if spec.id_field and spec.id_field in record else str(index)
    if spec.turns_field:
        turns = record.get(spec.turns_field)
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise SpecbenchError(f"dataset {spec.name}, record {index + 1}: field {spec.turns_field!r} is missing or "
                                 "not a non-empty list of strings; fix the file")
        texts = [_fill(spec, {**record, "turn": t}, index) for t in turns]
    else:
        if not isinstance(record.get(spec.text_field), str):
            raise SpecbenchError(f"dataset {spec.name}, record {index + 1}: field {spec.text_field!r} is missing or "
                                 "not a string; fix the file or pass the right one with --data-file")
        texts = [_fill(spec, record, index)]
    return Prompt(id=prompt_id, turns=tuple(texts), system=spec.system, category=_category(record))


def _category(record: dict) -> str:
    value = record.get("category")
    return str(value) if isinstance(value, (str, int)) else ""


def _fill(spec: DatasetSpec, fields: dict, index: int) -> str:
    """format_map with the record's fields; braces inside the field values are inserted as they are."""
    try:
        return spec.template.format_map(fields)
    except KeyError as exc:
        raise SpecbenchError(f"dataset {spec.name}, record {index + 1}: field {exc.args[0]!r} used by the template is "
                             "missing; fix the file or the spec's template") from exc


# A user file's own prompt id: the first of these fields present (Spec-Bench / MT-Bench use question_id).
USER_ID_FIELDS = ("id", "question_id", "prompt_id", "task_id")


def _user_prompts(path: Path) -> tuple[DatasetSpec, list[Prompt]]:
    """A user's own file: `prompt` / `instruction` / `question` (first present) or `turns`; optional id (or
    question_id, ...), category, system."""
    if not path.is_file():
        raise SpecbenchError(f"--dataset {path}: no such file (and not a dataset name: "
                             f"{', '.join(dataset_names())})")
    records = read_records(path)
    if not records:
        raise SpecbenchError(f"{path}: no records; write one JSON object a line with a 'prompt' field")
    prompts = []
    for i, record in enumerate(records):
        field = next((f for f in (*USER_TEXT_FIELDS, "turns") if f in record), None)
        value = record.get(field) if field else None
        turns = value if field == "turns" else [value]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise SpecbenchError(f"{path}, record {i + 1}: needs a string field {' / '.join(USER_TEXT_FIELDS)} or a "
                                 "'turns' list of strings")
        system = record.get("system") if isinstance(record.get("system"), str) else None
        own_id = next((record[f] for f in USER_ID_FIELDS if isinstance(record.get(f), (str, int))), i)
        prompts.append(Prompt(id=str(own_id), turns=tuple(turns), system=system, category=_category(record)))
    ids = [p.id for p in prompts]
    if len(set(ids)) < len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise SpecbenchError(f"{path}: prompt id {dup!r} appears more than once; ids must be unique (results are "
                             "keyed by them)")
    name = path.name.removesuffix(".gz").rsplit(".", 1)[0]
    spec = DatasetSpec(name=name, description=f"user file {path}", path=None, files=(str(path),),
                       licence="(user's own)", template="{text}")
    return spec, prompts


def conversation(prompt: Prompt, turn: int, answers: list[str]) -> list[dict]:
    """The conversation up to user turn `turn`, with the model's own earlier answers (MT-Bench turn 2)."""
    msgs = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for i in range(turn + 1):
        msgs.append({"role": "user", "content": prompt.turns[i]})
        if i < turn:
            msgs.append({"role": "assistant", "content": answers[i]})
    return msgs
