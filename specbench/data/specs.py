"""Dataset specs: `DatasetSpec` read from datasets/<name>.yaml and validated with errors naming the file and field,
and `Prompt`, one benchmark item."""

from __future__ import annotations

import os
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..core import store
from ..errors import SpecbenchError, did_you_mean


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
    join: dict | None = None  # a set built from another set's records (joined.py): source, field, start, ...


def specs_dir() -> Path:
    """The folder of dataset specs: $SPECBENCH_DATASETS_DIR, else datasets/ next to the package."""
    return Path(os.environ.get("SPECBENCH_DATASETS_DIR") or store.dataset_specs())


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
    "join": (dict, False),
}
_TYPE_NAMES = {str: "a string", list: "a list", dict: "a mapping", int: "a whole number"}


def get_spec(name: str) -> DatasetSpec:
    """Read and validate datasets/<name>.yaml."""
    names = dataset_names()
    if name not in names:
        raise SpecbenchError(f"unknown dataset {name!r}{did_you_mean(name, names)}: choose one of "
                             f"{', '.join(names) or '(none found)'} (see `specbench list datasets`), or pass the path "
                             "of your own .jsonl file")
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
        if required and raw.get(key) is None and not (key == "files" and raw.get("join") is not None):
            raise bad(key, "is missing")  # a joined set's files are its source's

    files = raw.get("files") or []
    if raw.get("join") is None and not files or not all(isinstance(f, str) and f for f in files):
        raise bad("files", "must be a non-empty list of file names")
    join = _join(raw.get("join"), bad) if raw.get("join") is not None else None
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
        default_limit=raw.get("default_limit"), max_new_tokens=raw.get("max_new_tokens"), join=join,
    )


# join's keys -> (type, default; None: required)
_JOIN_KEYS: dict[str, tuple[type, object]] = {
    "source": (str, None), "field": (str, None), "target_chars": (list, None), "max_chars": (int, None),
    "start": (int, 0), "separator": (str, "\n\n-----\n\n"),
}


def _join(raw: dict, bad) -> dict:
    """The `join` field of a set built from another set's records (joined.py), with its defaults filled in."""
    unknown = set(raw) - set(_JOIN_KEYS)
    if unknown:
        raise bad("join", f"has unknown keys {', '.join(sorted(map(str, unknown)))} (known: {', '.join(_JOIN_KEYS)})")
    out = {}
    for key, (kind, default) in _JOIN_KEYS.items():
        value = raw.get(key, default)
        if value is None:
            raise bad("join", f"needs the key {key!r}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad("join", f"key {key!r} must be {_TYPE_NAMES[kind]}, got {value!r}")
        out[key] = value
    targets = out["target_chars"]
    if not targets or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in targets):
        raise bad("join", "key 'target_chars' must be a non-empty list of positive whole numbers")
    if out["max_chars"] < max(targets):
        raise bad("join", f"key 'max_chars' ({out['max_chars']}) must be at least the largest target ({max(targets)})")
    if out["start"] < 0:
        raise bad("join", "key 'start' must be 0 or more")
    return out
