"""Which tree a tree method decodes with, decided in one place: (family, `--tree`, hardware, dtype, batch size) ->
a BatchTree (the tree file, its layouts, where it came from, EAGLE-2's dynamic shape) that the step decodes with.

- `--tree` is parsed once (tree_spec: core/tree_file.TreeSpec): auto | PATH | size=N | dynamic[=M]; eagle's
  `--gamma` is a chain.
- auto: planning/tree_choice.choose, the find / build-here / explain sequence every command shares: this hardware's
  tree file, else built now from this hardware's profile and the method's acceptance file (build-tree's code,
  filed where build-tree files it), else a default-size tree and a note naming the commands that make the files.
- batch size B > 1 under `--tree auto`: B's own tree from L(B, w) (every extra candidate costs B rows, so the best
  tree at B > 1 is smaller): its file, else built now, else batch 1's with a note. `--tree PATH | size=N`,
  `--tree dynamic` and `--gamma` fix one tree for every batch size.
- The per-rank acceptance the tree is searched and predicted with: acceptance/<model>/<family>.yaml, else a generic
  table and a note. The family's tree shapes (shapes.py) build a tree of a size (searched_tree: PPD's dynamic sparse
  tree, or the static candidate tree), check that its artefact can guess a tree (check_tree) and lay it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from ... import families
from ...core import lookup, store
from ...core.machine.hardware import hardware_slug
from ...core.model.load import dtype_name, model_slug
from ...core.synthetic import stated_for
from ...core.tree_file import TreeFile, TreeSpec, resolve_tree
from ...errors import SpecbenchError
from ...planning import tree_choice
from ...planning.acceptance import GENERIC_PER_RANK, read_per_rank
from ...planning.batch_choice import batch_view
from ...planning.treesearch import search, static_candidates
from ...progress import console

DEFAULT_SIZE = 16
SYNTHETIC = "synthetic_acceptance"  # target.extras key: the stated AcceptanceProfile of a --synthetic-acceptance run


def searched_tree(acc: list[list[float]], m: int, size: int, model: str = "", source: str = "") -> TreeFile:
    """`--tree size=N` (and the default without a tree file): the dynamic sparse tree of size N found by
    build-tree's search (treesearch.search), so a size sweep measures the trees build-tree predicts for."""
    if size < 2:  # the search's own minimum: build-tree may choose any size it can search (2 on a steep curve)
        raise SpecbenchError(f"tree size {size} is too small: a candidate and its prompt token need at least 2")
    tree = search(acc, m, size)
    states = {k: list(zip(t.paths, t.prompt_tokens)) for k, t in tree.trees.items()}
    return TreeFile(states, m, model=model, built_by=f"dynamic sparse tree search at size {size} over "
                    f"{source or 'per-rank probabilities'}", predicted_tau=tree.tau)


def candidate_tree(acc, heads: int, size: int, model: str = "", source: str = "", method: str = "medusa") -> TreeFile:
    """The static tree of the `size` most probable candidate paths (depth <= heads): one state, no prompt tokens
    (Medusa's, and every other method whose candidates at a depth do not depend on a prompt-token state)."""
    if size < 1:
        raise SpecbenchError(f"tree size {size} is too small: a {method} tree needs at least 1 candidate")
    tree = static_candidates(acc[:heads], size)
    return TreeFile({0: [(p, 0) for p in tree.paths]}, 0, model=model, method=method,
                    built_by=f"the {size} most probable candidate paths over {source or 'per-rank probabilities'}",
                    predicted_tau=tree.tau)


def chain(gamma: int, model: str) -> TreeFile:
    """A chain of gamma candidates (rank 0 at every depth): sd's shape, verified as a one-path tree."""
    return TreeFile({0: [((0,) * d, 0) for d in range(1, gamma + 1)]}, 0, model=model, method="eagle",
                    built_by=f"--gamma {gamma}: a chain of {gamma} drafts")


def per_rank_acceptance(method, rows: int, model_name: str) -> tuple[list[list[float]], Path | None, str]:
    """(per-rank probabilities, the acceptance file they came from or None, that source in words for run.yaml and
    report.md); with no file for this model a generic table is used and a note printed once per model and family."""
    target, family = method.target, method.family
    stated = target.extras.get(SYNTHETIC)
    if stated is not None:  # --synthetic-acceptance: the tree is searched and predicted with the stated rates
        stated = stated_for(stated, family)  # a folder of them: the family's own
        return stated.per_rank_rows(rows), None, f"--synthetic-acceptance: {stated.source}"
    relative = store.acceptance_file(model_name, family)
    found = lookup.find(lookup.ACCEPTANCE, relative, f"{method.name} acceptance")
    acc_path = found.path if found else None
    acc = read_per_rank(acc_path, rows) if acc_path else GENERIC_PER_RANK[:rows]
    source = str(acc_path) if acc_path else (
        f"a generic acceptance table, not {target.spec}'s (no {relative}: "
        f"`specbench estimate --method {family} --model {target.spec}` measures it)")
    said = f"generic_acceptance_said_{family}"
    if acc_path is None and not target.extras.get(said):  # once per model and method (tree sweeps)
        target.extras[said] = True
        console.print(f"[yellow]note[/] {method.name}: predicted tau and tree search use {escape(source)}")
    return acc, acc_path, source


@dataclass(frozen=True)
class BatchTree:
    """The tree one batch size decodes with."""

    tree_file: TreeFile
    source: str  # where it came from, in words (run.yaml, report.md)
    layouts: dict  # state -> TreeLayout (shapes.layouts)
    chosen_from: str  # "batch 1" (the method's own tree) | "L(B, w)" (a tree chosen for batch size B)
    dynamic: tuple[int, int, int] | None = None  # --tree dynamic: (candidates m, depth, top-k per expansion)


def first_tree(method) -> BatchTree:
    """Batch 1's tree: --tree (or eagle's --gamma chain), checked against the artefact and laid out."""
    spec, gamma = method.tree_spec, getattr(method.options, "gamma", None)
    shapes, model_name = method.shapes, model_slug(method.target.spec)
    dynamic = None
    if spec.kind == "dynamic":
        if not families.get(method.family).dynamic_trees:
            raise SpecbenchError(f"--tree {spec}: only eagle and parallelspec choose their tree per step (EAGLE-2's "
                                 f"dynamic tree); {method.name} takes auto, size=N or a trees/*.yaml path")
        if gamma is not None:
            raise SpecbenchError(f"{method.name}: give --gamma (a chain of drafts) or --tree dynamic, not both")
        # the static tree of the size: the prefill, predictions and the artefact check read it
        tf, source = resolve(method, TreeSpec("auto") if spec.size is None else TreeSpec("size", spec.size))
        dynamic = shapes.dynamic_shape(tf)
        source = f"EAGLE-2 dynamic tree, {tf.size} candidates per step (the size of {source})"
    elif gamma is not None:
        if spec.kind != "auto":
            raise SpecbenchError(f"{method.name}: give --gamma (a chain of drafts) or --tree (a draft tree), not both")
        tf, source = chain(gamma, model_name), f"a chain of {gamma} (--gamma)"
    else:
        tf, source = resolve(method, spec)
    return laid_out(method, tf, source, "batch 1", dynamic)


def laid_out(method, tf: TreeFile, source: str, chosen_from: str, dynamic=None) -> BatchTree:
    """A tree the method's artefact can guess (its shapes refuse one it cannot), laid out for its states."""
    method.shapes.check_tree(tf, source)
    return BatchTree(tf, source, method.shapes.layouts(tf, method.target.device), chosen_from, dynamic)


def tree_spec(options) -> TreeSpec:
    """The run's `--tree` as a TreeSpec: the one place the option is parsed (run validation refuses a bad value
    with it before a model loads; a tree method keeps the result as `tree_spec`)."""
    return TreeSpec.parse(options.get("tree"))


def resolve(method, spec: TreeSpec) -> tuple[TreeFile, str]:
    """auto | PATH | size=N -> (tree file, where it came from); the family's shapes search a tree of a size."""
    target, model_name = method.target, model_slug(method.target.spec)
    hardware, dtype = hardware_slug(target.device), dtype_name(target.dtype)
    source = str(method.acceptance_file) if method.acceptance_file else "a generic table"

    def build(size: int) -> TreeFile:
        return method.shapes.searched_tree(method.acceptance, size, model_name, source)

    if spec.kind == "auto" and target.extras.get(SYNTHETIC) is not None:  # no hardware tree file: its acceptance
        return build(DEFAULT_SIZE), f"searched at size {DEFAULT_SIZE} over the stated rates"  # is another's
    if spec.kind == "auto":
        return auto_tree(method, build, hardware, dtype)
    return resolve_tree(spec, hardware, build)


def choose(method, sizes: list[int]) -> None:
    """Each batch size's tree in method.trees: under `--tree auto` (no --gamma) B > 1's own tree (its file, else
    built now from L(B, w)), else batch 1's."""
    if method.tree_spec.kind != "auto" or getattr(method.options, "gamma", None) is not None \
            or method.target.extras.get(SYNTHETIC) is not None:  # stated rates: batch 1's searched tree
        return  # one tree for every batch size: batch 1's (start_batch falls back to it)
    for size in sorted({b for b in sizes if b > 1} - set(method.trees)):
        found = _batch_tree(method, size)
        if found is None:
            method.trees[size] = method.trees[1]
            continue
        tree_file, source = found
        method.trees[size] = laid_out(method, tree_file, source, "L(B, w)")
        console.print(f"[dim]{method.name}: batch size {size}: tree {escape(source)} (size {tree_file.size}, "
                      f"batch 1's: {method.trees[1].tree_file.size})[/]")


def chosen(method) -> dict:
    """run.yaml's `chosen` for the batch sizes: size and source of every batch size's tree (when any is chosen)."""
    sizes = sorted(b for b in method.trees if b > 1)
    if not sizes:
        return {}
    return {"tree_per_batch_size": {b: {"size": method.trees[b].tree_file.size, "from": method.trees[b].chosen_from,
                                        "tree": method.trees[b].source} for b in [1, *sizes]}}


def _batch_tree(method, size: int) -> tuple[TreeFile, str] | None:
    """Batch size `size`'s own tree (tree_choice.choose: its file, else built now from L(B, w)), or None after a note
    (batch 1's)."""
    target, family = method.target, method.family
    hardware, dtype = hardware_slug(target.device), dtype_name(target.dtype)
    # a --compile run's tree is filed as compiled decoding's (@compiled): built from a compiled L(B, w) only
    view, why = batch_view(target, size, eager_ok=False)
    choice = tree_choice.choose(target.spec, family, hardware, dtype, size, one_state=method.one_state,
                                rows=method.rows, ept=method.ept, device=target.device.type,
                                draft_ms=method.pricing.ms_here, can_build=view is not None)
    if choice.tree is not None:
        if choice.built is not None:
            console.print(f"[yellow]note[/] {method.name}: no {family} tree for batch size {size} on {hardware} "
                          f"{dtype} yet; built it now from L(B={size}, w) in {escape(str(choice.inputs.profile))} "
                          f"and {escape(str(choice.inputs.acceptance))}: filed as {escape(store.said_where(choice.built))}")
        return choice.tree, choice.source
    if lookup.compiled_run() and view is None:
        why = f"a compiled run builds batch size {size}'s tree from a compiled L(B, w) only: {why}"
    if choice.failed:
        why = choice.failed
    elif choice.missing:  # the files build-tree needs, named with the commands that make them
        why = "; ".join(choice.missing[:-1])
    console.print(f"[yellow]note[/] {method.name}: batch size {size} decodes with batch 1's tree (size "
                  f"{method.trees[1].tree_file.size}): {escape(why)}")
    return None


def auto_tree(method, build, hardware: str, dtype: str) -> tuple[TreeFile, str]:
    """--tree auto at batch 1 (tree_choice.choose: this hardware's tree file, else built and filed now from its
    profile and the family's acceptance file); without one, the default-size tree and a note with the commands that
    make the missing files (only the files that matter)."""
    target, family = method.target, method.family
    choice = tree_choice.choose(target.spec, family, hardware, dtype, one_state=method.one_state, rows=method.rows,
                                ept=method.ept, device=target.device.type, draft_ms=method.pricing.ms_here)
    if choice.tree is not None:
        if choice.built is not None:
            console.print(f"[yellow]note[/] {method.name}: no {family} tree for {hardware} {dtype} yet; built it now "
                          f"from {escape(str(choice.inputs.profile))} and {escape(str(choice.inputs.acceptance))} "
                          f"(as `specbench build-tree` does): size {choice.tree.size}, filed as "
                          f"{escape(store.said_where(choice.built))}")
        return choice.tree, choice.source
    said = f"auto_tree_said_{family}_{dtype}"
    if not target.extras.get(said):  # once per model and method (tree sweeps, batch sizes)
        target.extras[said] = True
        console.print(f"[yellow]note[/] {method.name}: --tree auto has no tree for this hardware; using a "
                      f"size-{DEFAULT_SIZE} tree. {escape(choice.why)}{escape(choice.unused)}")
    return build(DEFAULT_SIZE), choice.fallback_source(DEFAULT_SIZE)
