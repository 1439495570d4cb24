"""Per-batch-size choices at run time (`--tree auto`, `--gamma auto` at `run --batch-size B`): this hardware's latency
profile of the target and its L(B, w), or the note that says batch 1's choice is used because the profile lacks B.

At batch B every extra candidate costs B rows, so a draft length or tree that pays at B = 1 can be too large at
B > 1: a step of B samples verifying w tokens each costs L(B, w) (`specbench profile --batch-size`), and the
speedup over `ar` at that batch size is tau(w) L(B, 1) / L(B, w).
"""

from __future__ import annotations

from pathlib import Path

from ..core import lookup
from ..core.machine.hardware import hardware_slug
from ..core.model.load import dtype_name, model_slug
from ..core.profile_file import LatencyProfile, load_profile

KV_LENGTH = 512  # the KV length whose curve the choices read (build-tree's default)


def local_profile_path(target, compiled: bool = False, use_for: str | None = None) -> Path | None:
    """This hardware's measured profile of the target in its dtype and placement (profiles/<hardware>/), or None;
    `compiled`: the `--compile` one (core/lookup.find_profile: the eager one stands in, said; a disturbed one is
    skipped unless allowed). `use_for`: recorded in the run's ledger."""
    found = lookup.find_profile(hardware_slug(target.device), model_slug(target.spec), dtype_name(target.dtype),
                                target.placement, compiled, use_for)
    return found.path if found else None


def local_profile(target, compiled: bool = False, use_for: str | None = None) -> LatencyProfile | None:
    path = local_profile_path(target, compiled, use_for)
    return load_profile(path) if path else None


def batch_view(target, batch_size: int) -> tuple[LatencyProfile | None, str]:
    """(this hardware's L(B, w) as a profile, "") or (None, why not: the words of a note that says batch 1's choice
    is used, with the command that measures B)."""
    path = local_profile_path(target, use_for=f"batch size {batch_size}'s choices")
    command = (f"`specbench profile --model {target.spec} --dtype {dtype_name(target.dtype)} --batch-size "
               f"1,{batch_size}` measures it")
    if path is None:
        return None, f"no latency profile of this hardware ({command} and L(1, w))"
    view = load_profile(path).at_batch(batch_size)
    if view is None:
        return None, f"{path} has no L(B={batch_size}, w) ({command})"
    return view, ""


def relative_latency(profile: LatencyProfile, most: int) -> list[float]:
    """[L(w) / L(1) for w = 1 .. most] at KV_LENGTH on a profile (L(1, w) or a batch view's L(B, w)), made
    non-decreasing in w: a forward never costs less than a narrower one (a narrower input can be padded to it), so a
    measured dip (noise) between two widths is read as the cheaper width's cost for both."""
    costs = [profile.latency_ms(w, KV_LENGTH) for w in range(1, most + 1)]
    for w in range(len(costs) - 2, -1, -1):
        costs[w] = min(costs[w], costs[w + 1])
    return [c / costs[0] for c in costs]
