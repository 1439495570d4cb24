"""Per-batch-size choices at run time (`--tree auto`, `--gamma auto` at `run --batch-size B`): this hardware's latency
profile of the target and its L(B, w), or the note that says batch 1's choice is used because the profile lacks B.

At batch B every extra candidate costs B rows, so a draft length or tree that pays at B = 1 can be too large at
B > 1: a step of B samples verifying w tokens each costs L(B, w) (`specbench profile --batch-size`), and the
speedup over `ar` at that batch size is tau(w) L(B, 1) / L(B, w). A `--compile` run reads the compiled L(B, w)
(`specbench profile --compile --batch-size 1,B`: the static batched engine's shapes), else the eager one, said.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from ..core import lookup, store
from ..core.machine.hardware import hardware_slug
from ..core.model.load import dtype_name, model_slug
from ..core.profile_file import LatencyProfile, load_profile
from .shape_pricing import relative_costs

KV_LENGTH = 512  # the KV length whose curve the choices read (build-tree's default)


def local_profile_path(target, compiled: bool | None = None, use_for: str | None = None) -> Path | None:
    """This hardware's measured profile of the target in its dtype and placement (profiles/<hardware>/), or None;
    `compiled`: the `--compile` one (core/lookup.find_profile: the eager one stands in, said; a disturbed one is
    skipped unless allowed); None: the compiled one in a `--compile` run (core/lookup.compiled_run), the eager one
    otherwise. `use_for`: recorded in the run's ledger."""
    if compiled is None:
        compiled = lookup.compiled_run()
    found = lookup.find_profile(hardware_slug(target.device), model_slug(target.spec), dtype_name(target.dtype),
                                target.placement, compiled, use_for)
    return found.path if found else None


def local_profile(target, compiled: bool | None = None, use_for: str | None = None) -> LatencyProfile | None:
    path = local_profile_path(target, compiled, use_for)
    return load_profile(path) if path else None


def batch_view(target, batch_size: int, eager_ok: bool = True) -> tuple[LatencyProfile | None, str]:
    """(this hardware's L(B, w) as a profile, "") or (None, why not: the words of a note that says batch 1's choice
    is used, with the command that measures B). A `--compile` run (core/lookup.compiled_run) reads the compiled
    L(B, w) (compiled_view); without one, the eager L(B, w) (unless not `eager_ok`: a choice filed as compiled
    decoding's), said, and why in its second value."""
    if lookup.compiled_run():
        return compiled_view(target, batch_size, eager_ok)
    path = local_profile_path(target, use_for=f"batch size {batch_size}'s choices")
    command = (f"`specbench profile --model {target.spec} --dtype {dtype_name(target.dtype)} --batch-size "
               f"1,{batch_size}` measures it")
    if path is None:
        return None, f"no latency profile of this hardware ({command} and L(1, w))"
    view = load_profile(path).at_batch(batch_size)
    if view is None:
        return None, f"{path} has no L(B={batch_size}, w) ({command})"
    return view, ""


def compiled_view(target, batch_size: int, eager_ok: bool = True) -> tuple[LatencyProfile | None, str]:
    """A `--compile` run's L(B, w): (the compiled profile's, "") when this hardware has one with batch size B
    (`specbench profile --compile --batch-size 1,B`); else (the eager profile's L(B, w), why: the compiled one's
    absence and the command that measures it), said once and recorded in the run's ledger (report.md's settings
    name the file each batch size's choices read); else, or without `eager_ok`, (None, why, with that command)."""
    size, hardware = batch_size, hardware_slug(target.device)
    model, dtype = model_slug(target.spec), dtype_name(target.dtype)
    command = (f"`specbench profile --model {target.spec} --dtype {dtype} --compile --batch-size 1,{size}` "
               "measures it")
    found = lookup.find_profile(hardware, model, dtype, target.placement, compiled=True)
    if found is not None and lookup.EAGER_FOR_COMPILED not in found.flags:
        view = load_profile(found.path).at_batch(size)
        if view is not None:
            lookup.use(found, f"batch size {size}'s choices (compiled L(B, w))")
            return view, ""
        missing = f"{store.relative_to_cwd(found.path)} has no compiled L(B={size}, w)"
    else:
        missing = "no compiled profile of this hardware"
    if not eager_ok:
        return None, f"{missing} ({command})"
    eager = lookup.find_profile(hardware, model, dtype, target.placement)
    view = load_profile(eager.path).at_batch(size) if eager is not None and "compiled" not in eager.flags else None
    if view is None:
        return None, f"{missing} and no eager L(B={size}, w) ({command})"
    why = f"{missing} ({command})"
    note = f"the eager L(B={size}, w) of {store.relative_to_cwd(eager.path)}, standing in: {why}"
    lookup.use(eager.with_flag(lookup.EAGER_FOR_COMPILED), f"batch size {size}'s choices ({note})")
    lookup.say_once(("eager for compiled", str(eager.path), size),
                    f"[yellow]note[/] --compile: batch size {size}'s choices read {escape(note)}")
    return view, why


def is_compiled(view: LatencyProfile) -> bool:
    """Whether a profile (or its batch view) was measured under `--compile` (its placement, or its compile block)."""
    return view.compiled


def relative_latency(profile: LatencyProfile, most: int, padded: bool = False) -> list[float]:
    """[L(w) / L(1) for w = 1 .. most] at KV_LENGTH on a profile (L(1, w) or a batch view's L(B, w)), made
    non-decreasing in w: a forward never costs less than a narrower one (a narrower input can be padded to it), so a
    measured dip (noise) between two widths is read as the cheaper width's cost for both (shape_pricing). `padded`:
    each width at the next measured width's cost (a compiled run's forwards of varying width run at their bucket)."""
    return relative_costs(profile, most, KV_LENGTH, padded)
