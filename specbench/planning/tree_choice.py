"""Which tree a tree family decodes with under `--tree auto`, for (model, family, hardware, dtype, batch size): the
one find / build-here / explain sequence that a run (batch 1 and each batch size B), `--tree-sizes`' `auto`,
`recommend` and `predict` share.

1. find: the tree file build-tree filed for this family, hardware and dtype (core/tree_file.find_auto_tree: this
   hardware's, else the family's shipped default; at B > 1 the -b<B> file only, the family and dtype matching);
2. build here: with this hardware's latency profile and the family's acceptance file, build-tree's own code builds
   and files it now (autotree.build_here), where step 1 finds it next time;
3. explain: no tree, and why: the build's error, or the files that are missing and the commands that make them
   (autotree.missing_commands).
The caller says what happens without a tree (a run decodes with a default-size tree or batch 1's; a prediction
has none)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core import lookup
from ..core.model.load import model_slug
from ..core.tree_file import TreeFile, find_auto_tree, other_trees, read_tree_file
from ..errors import SpecbenchError
from . import autotree


@dataclass(frozen=True)
class Choice:
    """A tree chosen for --tree auto, or why there is none."""

    model_spec: str
    family: str
    hardware: str
    dtype: str
    tree: TreeFile | None
    source: str = ""  # the file it was read from (with a note when it was built for other hardware)
    built: Path | None = None  # the file step 2 built and filed now
    failed: str = ""  # step 2 was tried and failed: why
    missing: list[str] = field(default_factory=list)  # step 2 lacked files: each missing file and its command
    inputs: autotree.Inputs | None = None  # the profile and acceptance file step 2 reads (found or not)

    @property
    def why(self) -> str:
        """Why there is no tree, in words (the build's error, else the missing files with their commands)."""
        return self.failed or "; ".join(self.missing)

    @property
    def unused(self) -> str:
        """The family's trees for this model on other hardware or dtypes, which --tree auto does not take here (''
        when there are none): the only trees a note about the missing one should name."""
        others = other_trees(model_slug(self.model_spec), self.family, self.hardware, self.dtype)
        return f" ({self.family} trees for other hardware or dtypes, not used here: {', '.join(others)})" \
            if others else ""

    def fallback_source(self, size: int) -> str:
        """Where a run's tree came from when there is none to take: a tree of `size` built without the profile."""
        return f"built, size {size} (no {self.family} tree for {self.hardware} {self.dtype}{self.unused}: {self.why})"


def find(model_spec: str, family: str, hardware: str, dtype: str, batch_size: int = 1) -> tuple[TreeFile, str] | None:
    """Step 1: the tree file build-tree filed for this family, hardware, dtype and batch size, with where it came
    from, or None. A `--compile` run takes only a tree built for compiled decoding (its @compiled file), else it
    builds one from the compiled profile (step 2)."""
    if batch_size == 1 and not lookup.compiled_run():
        return find_auto_tree(model_slug(model_spec), family, hardware, dtype)
    # searched by its path inside a data root in every source, a disturbed one skipped unless allowed (core/lookup)
    hit = lookup.find(lookup.TREE, autotree.tree_relative(model_spec, family, hardware, dtype, batch_size))
    if hit is None:
        return None
    tree = read_tree_file(hit.path)
    if tree.method != family or tree.dtype not in ("any", dtype):
        return None
    lookup.use(hit, f"{family} --tree auto at batch size {batch_size}")
    return tree, str(hit.path)


def choose(model_spec: str, family: str, hardware: str, dtype: str, batch_size: int = 1, *, one_state: bool,
           rows: int, ept: int = 1, device: str = "cpu", draft_ms: Callable[[], float | None] | None = None,
           can_build: bool = True) -> Choice:
    """Steps 1-3 for (model, family, hardware, dtype, batch size). `rows`, `ept`: what the family's artefact guesses
    (autotree.build_here); `draft_ms()`: one drafting forward timed here, asked only when a tree is built;
    `can_build` False skips step 2 (no L(B, w) for this batch size: the caller says why)."""
    at = (model_spec, family, hardware, dtype)
    found = find(*at, batch_size)
    if found is not None:
        return Choice(*at, found[0], found[1])
    inputs = autotree.inputs(*at)
    if not can_build:
        return Choice(*at, None, inputs=inputs)
    if not inputs.ready:
        return Choice(*at, None, missing=autotree.missing_commands(*at, device), inputs=inputs)
    try:
        built = autotree.build_here(model_spec, family, one_state, hardware, dtype, rows, ept, batch_size=batch_size,
                                    draft_ms=draft_ms() if draft_ms is not None else None)
    except SpecbenchError as exc:
        return Choice(*at, None, failed=f"building it from {inputs.profile} and {inputs.acceptance} failed: {exc}",
                      inputs=inputs)
    at_b = f" at batch size {batch_size}" if batch_size > 1 else ""
    lookup.note_used(lookup.TREE, built.path, f"{family} --tree auto{at_b} (built now)")
    return Choice(*at, read_tree_file(built.path), str(built.path.resolve()), built.path, inputs=inputs)
