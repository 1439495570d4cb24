"""Dataset specs: `DatasetSpec` read from datasets/<name>.yaml and validated with errors naming the file and field,
and `Prompt`, one benchmark item."""

from __future__ import annotations

import os
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..core import store
from ..errors import SpecbenchError


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
