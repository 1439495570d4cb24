"""Which tree a tree method decodes with: `--tree auto|PATH|size=N` (core/tree.py's resolve_tree), the per-rank
acceptance it predicts and searches with (acceptance/<model>/<family>.yaml, else a generic table and a note), and
the trees built on the spot: PPD's searched dynamic tree, the static candidate tree, the `--gamma` chain."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from ...core import store
from ...core.machine.hardware import hardware_slug
from ...core.model.load import dtype_name, model_slug
from ...core.tree import TreeFile, other_trees, read_tree_file, resolve_tree
from ...errors import SpecbenchError
from ...planning import autotree
from ...planning.acceptance import GENERIC_PER_RANK, read_per_rank
from ...planning.treesearch import search, static_candidates
from ...progress import console

DEFAULT_SIZE = 16


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
    relative = store.acceptance_file(model_name, family)
    acc_path = store.find(relative)
    acc = read_per_rank(acc_path, rows) if acc_path else GENERIC_PER_RANK[:rows]
    source = str(acc_path) if acc_path else (
        f"a generic acceptance table, not {target.spec}'s (no {relative}: "
        f"`specbench estimate --method {family} --model {target.spec}` measures it)")
    said = f"generic_acceptance_said_{family}"
    if acc_path is None and not target.extras.get(said):  # once per model and method (tree sweeps)
        target.extras[said] = True
        console.print(f"[yellow]note[/] {method.name}: predicted tau and tree search use {escape(source)}")
    return acc, acc_path, source


def resolve(method, build, model_name: str, rows: int = 0, ept: int = 1,
            spec: str | None = None) -> tuple[TreeFile, str]:
    """--tree auto | PATH | size=N (or `spec` instead of --tree) -> (tree file, where it came from); `build(size)`
    makes a searched tree. With
    `--tree auto` and no tree file for this hardware: built now from this hardware's profile and the method's
    acceptance file (build-tree's code; filed where build-tree files it), else the default size and a note naming
    the commands that make this method's tree here. `rows`: token distances the artefact guesses."""
    target = method.target
    hardware, dtype = hardware_slug(target.device), dtype_name(target.dtype)

    def missing() -> tuple[TreeFile, str]:
        return auto_tree(method, build, hardware, dtype, rows, ept)

    return resolve_tree(spec or method.options.tree, model_name, method.family, hardware, dtype, build, DEFAULT_SIZE,
                        target.spec, missing)


def auto_tree(method, build, hardware: str, dtype: str, rows: int, ept: int) -> tuple[TreeFile, str]:
    """This hardware's tree, built and filed now when its profile and the method's acceptance file exist; else the
    default-size tree, and a note with the commands that make the missing files (only the files that matter)."""
    target, family = method.target, method.family
    found = autotree.inputs(target.spec, family, hardware, dtype)
    if found.ready:
        try:
            built = autotree.build_here(target.spec, family, method.one_state, hardware, dtype, rows, ept,
                                        draft_ms=method.guesser.draft_ms_here())
        except SpecbenchError as exc:
            reason = f"building it from {found.profile} and {found.acceptance} failed: {exc}"
        else:
            tree = read_tree_file(built.path)
            console.print(f"[yellow]note[/] {method.name}: no {family} tree for {hardware} {dtype} yet; built it now "
                          f"from {escape(str(found.profile))} and {escape(str(found.acceptance))} (as `specbench "
                          f"build-tree` does): size {tree.size}, filed as {escape(str(built.path))}")
            return tree, str(built.path.resolve())
    else:
        reason = "; ".join(autotree.missing_steps(target.spec, family, hardware, dtype, target.device.type))
    others = other_trees(model_slug(target.spec), family, hardware, dtype)
    unused = f" ({family} trees for other hardware or dtypes, not used here: {', '.join(others)})" if others else ""
    tree = build(DEFAULT_SIZE)
    source = f"built, size {DEFAULT_SIZE} (no {family} tree for {hardware} {dtype}{unused}: {reason})"
    said = f"auto_tree_said_{family}_{dtype}"
    if not target.extras.get(said):  # once per model and method (tree sweeps, batch sizes)
        target.extras[said] = True
        console.print(f"[yellow]note[/] {method.name}: --tree auto has no tree for this hardware; using a "
                      f"size-{DEFAULT_SIZE} tree. {escape(reason)}{escape(unused)}")
    return tree, source
