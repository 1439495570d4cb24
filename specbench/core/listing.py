"""What `specbench list profiles` and `specbench list trees` show: every profile / tree file of a model in every
source (working directory, user cache, shipped: core/store.sources), with its flags and what a run on this hardware
would do with it (use it, skip it as disturbed, or never reach it because another copy or candidate comes first),
found by the lookups runs make (core/lookup.py, core/tree_file.find_auto_tree), without recording anything."""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from . import lookup, store
from .tree_file import find_auto_tree


@dataclass(frozen=True)
class Row:
    """One file: its path, source, flags, what it is for and what a run here does with it."""

    path: str
    source: str
    flags: str
    what: str  # "float32 eager", "ppd float32 on cpu-...", ...
    status: str  # "used by ...", "skipped: ...", "not used: ..."


def profiles(hardware: str, model: str, allow_disturbed: bool = False) -> list[Row]:
    """Every profile of `model` (its file-name key) for this hardware in any source, and those of other hardware
    keys (never used here)."""
    lookup.start(allow_disturbed, quiet=True)
    rows = []
    folders = sorted({p.name for _, root in store.sources() for p in (root / store.PROFILES).glob("*") if p.is_dir()})
    for folder in [hardware] + [f for f in folders if f != hardware]:
        for name, found in lookup.survey(lookup.PROFILE, store.profiles_dir() / folder, f"{model}-*.yaml").items():
            match = re.fullmatch(re.escape(model) + r"-([a-z0-9]+)(?:@(.+))?\.yaml", name)
            if match is None:
                continue
            dtype, placement = match.group(1), match.group(2) or ""
            compiled = placement == "compiled"
            what = f"{dtype}, " + ("--compile runs" if compiled else f"placement {placement}" if placement else
                                    "eager runs")
            if folder != hardware:
                rows += [_row(f, what, f"not used here: measured on {folder}, this machine is {hardware}")
                         for f in found]
                continue
            chosen = lookup.find_profile(hardware, model, dtype, "" if compiled else placement, compiled)
            for f in found:
                rows.append(_row(f, what, _status(f, chosen, "--dtype auto, --tree auto builds, the noise guard, "
                                                             "predictions and the roofline")))
    return rows


def trees(hardware: str, model: str, dtypes: tuple[str, ...], allow_disturbed: bool = False) -> list[Row]:
    """Every tree file of `model` in any source, and which one `--tree auto` takes here per method and dtype."""
    lookup.start(allow_disturbed, quiet=True)
    found = lookup.survey(lookup.TREE, store.tree_dir(model))
    heads = {name: _head(copies[0].path) for name, copies in found.items()}
    methods = sorted({h.get("method", "ppd") for h in heads.values()})
    picked = {}  # resolved path -> "method dtype" it is picked for
    for method in methods:
        for dtype in dtypes:
            hit = find_auto_tree(model, method, hardware, dtype)
            if hit is not None:
                path = hit[1].split(" (built for ")[0]
                picked.setdefault(lookup.path_key(path), []).append(f"{method} {dtype}")
    rows = []
    for name, copies in found.items():
        head = heads[name]
        what = f"{head.get('method', 'ppd')} {head.get('dtype', '?')} for {head.get('hardware', '?')}"
        batch = re.search(r"-b(\d+)$", name.removesuffix(".yaml"))
        for f in copies:
            why = lookup.skipped_why(f.path)
            if lookup.path_key(f.path) in picked:
                status = f"used by --tree auto: {', '.join(picked[lookup.path_key(f.path)])}"
            elif why:
                status = f"skipped: {why}"
            elif f is not copies[0] and not copies[0].disturbed:
                status = f"not used: {copies[0].said()} comes first"
            elif batch and head.get("hardware") == hardware and head.get("dtype") in dtypes:
                status = f"used by --tree auto at --batch-size {batch.group(1)}"
            elif head.get("hardware") not in (hardware, "any", None):
                status = f"not used here: built for {head.get('hardware')}"
            else:
                status = "not used: another candidate comes first (or another dtype)"
            rows.append(_row(f, what, status))
    return rows


def _row(found: lookup.Found, what: str, status: str) -> Row:
    return Row(store.relative_to_cwd(found.path), found.source, ", ".join(found.flags) or "-", what, status)


def _status(found: lookup.Found, chosen: lookup.Found | None, uses: str) -> str:
    why = lookup.skipped_why(found.path)
    if why:
        return f"skipped: {why}"
    if chosen is not None and lookup.path_key(chosen.path) == lookup.path_key(found.path):
        return f"used by {uses}"
    return f"not used: {chosen.said()} comes first" if chosen else "not used"


def _head(path) -> dict:
    """A tree file's header fields (method, dtype, hardware); {} when unreadable."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}
