"""The tree shapes a family's artefact takes (the tree choice's questions, batch_trees.py): a tree of a size
searched from per-rank probabilities, the refusal of a tree the artefact cannot guess, a tree's layouts per state,
and `--tree dynamic`'s shape. The defaults are PPD's (a dynamic sparse tree over the states of the inputs attached
to nodes); CandidateShapes is the one-state candidate tree of the families whose candidates at a depth need no such
state."""

from __future__ import annotations

from ...core.tree import Tree
from ...core.tree_file import TreeFile
from ...errors import SpecbenchError
from .layout import TreeLayout
from .batch_trees import candidate_tree, searched_tree


class TreeShapes:
    """A family's trees, for the artefact `guesser` (guesser.py: its rows, ept, table and source) of method `name`."""

    def __init__(self, guesser, name: str):
        self.guesser, self.name = guesser, name

    def searched_tree(self, acc, size: int, model_name: str, source: str) -> TreeFile:
        """The family's tree of `size` from per-rank probabilities: PPD's dynamic sparse tree by default."""
        return searched_tree(acc, self.guesser.rows, size, model_name, source)

    def check_tree(self, tree_file: TreeFile, where: str) -> None:
        """Refuse a tree this artefact cannot guess (SpecbenchError naming both): more node inputs than it has."""
        rows = self.guesser.rows
        if tree_file.prompt_tokens > rows:
            raise SpecbenchError(f"tree ({where}) uses {tree_file.prompt_tokens} {self.guesser.node_inputs} "
                                 f"but the artefact ({self.guesser.source}) has {rows}; use a tree built for {rows} "
                                 f"(`specbench build-tree --method {self.name}`)")

    def layouts(self, tree_file: TreeFile, device) -> dict:
        """state -> TreeLayout; state 0 is the prefill (and the step after a node that carried no node inputs)."""
        table, ept, m = self.guesser.table, self.guesser.ept, tree_file.prompt_tokens
        layouts = {k: TreeLayout(tree_file.tree(k, ept), table, device) for k in tree_file.states}
        layouts[0] = TreeLayout(Tree((), (m,), ept), table, device)
        return layouts

    def dynamic_shape(self, tree_file: TreeFile) -> tuple[int, int, int] | None:
        """--tree dynamic's shape for a static tree of its size: (candidates, depth, top-k); None: no dynamic tree."""
        return None


class CandidateShapes(TreeShapes):
    """One state: the `size` most probable candidate paths, no node inputs; at most `max_depth()` deep."""

    def searched_tree(self, acc, size, model_name, source):
        return candidate_tree(acc, self.guesser.rows, size, model_name, source, self.guesser.family)

    def max_depth(self) -> tuple[int, str] | None:
        """(the deepest tree the artefact guesses, why in words), or None: no limit beyond the searched rows."""
        return None

    def check_tree(self, tf, where):
        if tf.prompt_tokens or set(tf.states) != {0}:
            raise SpecbenchError(f"tree ({where}) is a {tf.method} tree with prompt tokens; {self.name} needs "
                                 f"a one-state tree without them (`specbench build-tree --method {self.name}`)")
        limit = self.max_depth()
        if limit is not None and tf.tree(0).depth > limit[0]:
            raise SpecbenchError(f"tree ({where}) is {tf.tree(0).depth} deep but {limit[1]}; use a tree at most "
                                 f"{limit[0]} deep (`specbench build-tree --method {self.name}`)")
