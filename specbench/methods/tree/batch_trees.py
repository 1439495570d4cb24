"""`--tree auto` per batch size: at `run --batch-size B` a tree method decodes each batch size with the tree chosen
for it from this hardware's L(B, w) (every extra candidate costs B rows, so the best tree at B > 1 is smaller).

For each B > 1 of the run, in order:
1. this hardware's tree file for B: trees/<model>/[<method>-]<hardware>-<dtype>-b<B>.yaml (`build-tree --batch-size
   B`; working directory first, then the shipped one);
2. else, when the profile has L(B, w) and the method has an acceptance file, the tree built now by build-tree's code
   at batch size B, filed there (so the next run finds it), said in a note;
3. else batch 1's tree, with a note naming what is missing and the command that measures L(B, w).
Batch 1 keeps the tree the method resolved when it was made (`--tree auto`'s usual order). `--tree PATH | size=N`,
`--tree dynamic` and `--gamma` fix one tree for every batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.markup import escape

from ...core import store
from ...core.machine.hardware import hardware_slug
from ...core.model.load import dtype_name
from ...core.tree import TreeFile, read_tree_file
from ...errors import SpecbenchError
from ...planning import autotree
from ...planning.batch_choice import batch_view
from ...progress import console


@dataclass
class BatchTree:
    """The tree one batch size decodes with: the file, where it came from, and its layouts (state -> TreeLayout)."""

    tree_file: TreeFile
    source: str
    layouts: dict
    chosen_from: str  # "batch 1" (the method's own tree) | "L(B, w)" (a tree chosen for B)


def per_batch(method) -> bool:
    """Whether the method chooses its tree per batch size: only under `--tree auto`, and not with `--gamma` (eagle's
    chain of drafts)."""
    return str(method.options.tree) == "auto" and getattr(method.options, "gamma", None) is None


def plan(method, sizes: list[int]) -> None:
    """Choose (find, build or fall back) the tree of every batch size > 1 in `sizes`; batch 1's stays active."""
    if not per_batch(method):
        return
    for size in sorted({b for b in sizes if b > 1} - set(method.batch_trees)):
        found = _choose(method, size)
        if found is None:
            method.batch_trees[size] = method.batch_trees[1]
            continue
        tree_file, source = found
        method.batch_trees[size] = BatchTree(tree_file, source, _layouts(method, tree_file, source), "L(B, w)")
        console.print(f"[dim]{method.name}: batch size {size}: tree {escape(source)} (size {tree_file.size}, "
                      f"batch 1's: {method.batch_trees[1].tree_file.size})[/]")


def use(method, size: int) -> None:
    """Make batch size `size`'s tree the method's active one (batch 1's when it has none of its own)."""
    entry = method.batch_trees.get(size) or method.batch_trees[1]
    method.tree_file, method.tree_source, method.layouts = entry.tree_file, entry.source, entry.layouts
    method.m = entry.tree_file.prompt_tokens


def chosen(method) -> dict:
    """run.yaml's `chosen` for the batch sizes: size and source of every batch size's tree (when any is planned)."""
    sizes = sorted(b for b in method.batch_trees if b > 1)
    if not sizes:
        return {}
    return {"tree_per_batch_size": {b: {"size": method.batch_trees[b].tree_file.size,
                                        "from": method.batch_trees[b].chosen_from,
                                        "tree": method.batch_trees[b].source} for b in [1, *sizes]}}


def _choose(method, size: int) -> tuple[TreeFile, str] | None:
    """Batch size `size`'s own tree (its file, else built now from L(B, w)), or None after a note (batch 1's)."""
    target, family = method.target, method.family
    hardware, dtype = hardware_slug(target.device), dtype_name(target.dtype)
    rel = autotree.tree_path(target.spec, family, hardware, dtype, size)
    path = store.find(rel)
    if path is not None:
        tree = read_tree_file(path)
        if tree.method == family and tree.dtype in ("any", dtype):
            return tree, str(path)
    view, why = batch_view(target, size)
    found = autotree.inputs(target.spec, family, hardware, dtype)
    if view is not None and found.ready:
        try:
            built = autotree.build_here(target.spec, family, method.one_state, hardware, dtype, method.rows,
                                        method.ept, batch_size=size, draft_ms=method.guesser.draft_ms_here())
        except SpecbenchError as exc:
            why = f"building it from {found.profile} failed: {exc}"
        else:
            console.print(f"[yellow]note[/] {method.name}: no {family} tree for batch size {size} on {hardware} "
                          f"{dtype} yet; built it now from L(B={size}, w) in {escape(str(found.profile))} and "
                          f"{escape(str(found.acceptance))}: filed as {escape(str(built.path))}")
            return read_tree_file(built.path), str(built.path.resolve())
    elif view is not None:  # the files build-tree needs, named with the commands that make them
        why = "; ".join(autotree.missing_steps(target.spec, family, hardware, dtype, target.device.type)[:-1])
    console.print(f"[yellow]note[/] {method.name}: batch size {size} decodes with batch 1's tree (size "
                  f"{method.batch_trees[1].tree_file.size}): {escape(why)}")
    return None


def _layouts(method, tree_file: TreeFile, source: str) -> dict:
    """The layouts of `tree_file` (the guesser reads the method's active tree: made active for the call, then
    batch 1's again), after the guesser checked that its artefact can guess that tree."""
    before = method.tree_file, method.tree_source
    method.tree_file, method.tree_source = tree_file, source
    try:
        method.guesser.check_tree(method.rows)
        return method.guesser.layouts(method.table, method.ept, method.target.device)
    finally:
        method.tree_file, method.tree_source = before
