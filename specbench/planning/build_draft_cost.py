"""What drafting costs per step in a tree build-tree is building (buildtree.build_tree): a drafting forward timed by
the run building it, else the acceptance file's moved to the profile's machine; and the depths the file measured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from rich.markup import escape

from ..errors import SpecbenchError
from ..progress import console
from .acceptance import drafting, moved_draft_ms, read_fields
from .profile import LatencyProfile


def acceptance_rows(path: Path) -> int:
    """Depths an acceptance file measured (its rows)."""
    try:
        return len((yaml.safe_load(path.read_text()) or {}).get("per_rank") or []) or 1
    except (OSError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"{path}: cannot read it ({exc})") from exc


def scaled(cost: Callable[[int], float], factor: float) -> Callable[[int], float]:
    """depth -> cost(depth) x factor."""
    return lambda depth: cost(depth) * factor


def draft_cost_here(family: str, path: Path, profile: LatencyProfile, kv_length: int, here_ms: float | None = None):
    """(depth -> drafting ms per step, a note for the tree file or None): `here_ms` (a drafting forward timed by the
    run building the tree) when given, else the acceptance file's moved to the profile's machine (moved_draft_ms)
    with what draft_scale did to get there; with a console note when a drafting method's file lacks the drafter's
    forward time or it was timed elsewhere."""
    file_ms, moved = moved_draft_ms(family, read_fields(path), profile, kv_length)
    drafts = drafting(family)
    if here_ms is not None and drafts is not None:
        was = f"; the acceptance file's, moved here: {file_ms:.2f} ms" if file_ms is not None else ""
        note = (f"a drafting forward timed on {profile.hardware} {profile.dtype} as the tree was built: "
                f"{here_ms:.2f} ms{was}")
        console.print(f"[dim]{escape(note)}[/]")
        return drafts.cost_law(here_ms), note
    if file_ms is None:
        if drafts is not None:
            console.print(f"[yellow]note[/] {escape(str(path))} has no draft_forward_ms: the drafter's cost is left "
                          f"out of the prediction (re-run `specbench estimate --method {family}`)")
        return None, None
    if moved:
        console.print(f"[dim]{escape(moved)}[/]")
    return drafts.cost_law(file_ms), moved
