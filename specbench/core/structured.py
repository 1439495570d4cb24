"""Reading a user-editable YAML or JSON file (trees, artefact metadata, device maps): one place that turns an
unreadable or malformed file into a SpecbenchError naming it, so every reader's errors read alike."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import SpecbenchError


def read_structured(path: str | Path, label: str, kind: str = "YAML"):
    """The parsed content of `path` (kind: YAML or JSON); errors start with `label` (e.g. "tree file X")."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecbenchError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    try:
        return json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"{label}: not valid {kind} ({exc})") from None
