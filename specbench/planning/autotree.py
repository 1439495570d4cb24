"""`--tree auto` without a tree file for this hardware: build it at once, as `specbench build-tree` would, from this
hardware's latency profile and the method's acceptance file (and file it where build-tree files it); when either
is missing, the exact commands that make them for this method, model, dtype and device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core import lookup, store
from ..core.model.load import model_slug
from ..families import method_flag, tree_stem
from ..errors import SpecbenchError
from .buildtree import BuildTreeRequest, BuiltTree, build_tree

MAX_SIZE, KV_LENGTH = 128, 512  # build-tree's defaults


@dataclass
class Inputs:
    """What building this hardware's tree needs: the profile and the acceptance file (found or None), and the
    relative paths where they would be."""

    profile: Path | None
    acceptance: Path | None
    profile_rel: Path
    acceptance_rel: Path

    @property
    def ready(self) -> bool:
        return self.profile is not None and self.acceptance is not None


def inputs(model_spec: str, family: str, hardware: str, dtype: str, use_for: str | None = None) -> Inputs:
    """The profile (eager decoding's; a `--compile` run's compiled one, core/lookup.compiled_run; a disturbed one is
    skipped unless allowed: core/lookup.py) and the acceptance file; `use_for`: record both in the run's ledger."""
    key, compiled = model_slug(model_spec), lookup.compiled_run()
    prof = store.profile_file(hardware, key, dtype, "compiled" if compiled else "")
    acc = store.acceptance_file(key, family)
    profile = lookup.find_profile(hardware, key, dtype, compiled=compiled, use_for=use_for)
    acceptance = lookup.find(lookup.ACCEPTANCE, acc, use_for)
    return Inputs(profile.path if profile else None, acceptance.path if acceptance else None, prof, acc)


def tree_relative(model_spec: str, family: str, hardware: str, dtype: str, batch_size: int = 1) -> Path:
    """This hardware's tree of the method inside a data root (trees/<model>/<family prefix><hardware>-<dtype>.yaml;
    at batch size B > 1 with -b<B> added; a `--compile` run's, built from the compiled profile, with @compiled
    added): what lookups search every source for."""
    stem = store.batch_stem(tree_stem(family, f"{hardware}-{dtype}"), batch_size)
    return store.tree_file(model_slug(model_spec), stem + ("@compiled" if lookup.compiled_run() else ""))


def tree_path(model_spec: str, family: str, hardware: str, dtype: str, batch_size: int = 1) -> Path:
    """Where build-tree files this hardware's tree of the method: tree_relative under store.write_root()."""
    return store.filed(tree_relative(model_spec, family, hardware, dtype, batch_size))


def build_here(model_spec: str, family: str, one_state: bool, hardware: str, dtype: str, rows: int,
               ept: int = 1, batch_size: int = 1, draft_ms: float | None = None) -> BuiltTree:
    """build-tree for this hardware (its measured profile, passed as a path so a GPU's works too) and the method's
    acceptance file, at batch size B from the profile's L(B, w); writes the tree where build-tree would. Needs
    inputs(...).ready (and, at B > 1, a profile with that batch size). `rows`: the depths the method's artefact
    drafts, which bound a one-state tree (an acceptance file of 3 heads' medusa read by 2 heads). `draft_ms`: one
    drafting forward timed here (tree/pricing.DraftPricing.ms_here), which prices the drafting instead of the acceptance file's."""
    found = inputs(model_spec, family, hardware, dtype, use_for=f"{family} tree built now")
    if not found.ready:
        raise SpecbenchError(f"cannot build the {family} tree here: " + "; ".join(
            missing_commands(model_spec, family, hardware, dtype, "cpu" if hardware.startswith("cpu") else "cuda")))
    req = BuildTreeRequest(model_spec, family, one_state, (family,), str(found.profile), dtype,
                           1 if one_state else max(rows, 1),
                           MAX_SIZE, KV_LENGTH, ept, found.acceptance,
                           tree_path(model_spec, family, hardware, dtype, batch_size), batch_size, draft_ms,
                           rows if one_state and rows > 0 else None)
    return build_tree(req)


def missing_commands(model_spec: str, family: str, hardware: str, dtype: str, device: str) -> list[str]:
    """The commands, in order, that make this hardware's tree of the method: `specbench profile` (when this
    hardware has no profile of the model in this dtype), `specbench estimate --method F` (when the method has no
    acceptance file), then `specbench build-tree --method F`."""
    found = inputs(model_spec, family, hardware, dtype)
    steps = []
    if found.profile is None:
        disturbed = [f for f in lookup.copies(lookup.PROFILE, found.profile_rel) if f.disturbed]
        steps.append((f"{disturbed[0].said()} was measured on a disturbed machine (skipped; {lookup.ALLOW_FLAG} "
                      "uses it): re-measure on a quiet machine with " if disturbed else f"no {found.profile_rel}: ")
                     + f"`specbench profile --model {model_spec} --dtype {dtype} --device {device}"
                     + (" --compile`" if lookup.compiled_run() else "`"))
    if found.acceptance is None:
        steps.append(f"no {found.acceptance_rel}: `specbench estimate --method {family} --model {model_spec}`")
    gpu = "cpu" if hardware.startswith("cpu") and not lookup.compiled_run() else str(found.profile or found.profile_rel)
    steps.append(f"then `specbench build-tree --model {model_spec}{method_flag(family)} --gpu {gpu} --dtype {dtype}` "
                 f"-> {tree_path(model_spec, family, hardware, dtype)}")
    return steps
