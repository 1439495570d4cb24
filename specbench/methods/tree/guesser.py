"""What a tree family guesses with: its Guesser, the artefact role. It loads the artefact for a run (what the
step and the tree choice read of it: the token distances guessed, ensemble copies, the embedding table of the inputs
attached to nodes, its source) and scores it for `specbench estimate` without a method (scorer), and names the two
other roles its family pairs it with: the tree shapes it takes (shapes_type, shapes.py: the tree choice's questions)
and the decode-time proposer (proposer_type, proposer.py: what the step calls). The three never call each other
through a method: the method (method.py) builds them and passes each what it needs."""

from __future__ import annotations

import torch

from .pricing import GuessScorer
from .proposer import Proposer
from .shapes import TreeShapes


class Guesser:
    """A family's artefact, loaded for one run on `target` from `--artifact` (None: the default one)."""

    family: str  # its declaration's name (specbench/families/): tree shape, cost law, files, scorer, trainer
    artifact: str  # what the method needs beside the target, for `specbench list methods`
    node_inputs = "prompt tokens"  # what a tree's nodes carry, in the tree choice's messages
    shapes_type: type[TreeShapes] = TreeShapes
    proposer_type: type[Proposer] = Proposer

    rows: int  # token distances guessed (rows of the acceptance file)
    ept: int = 1  # ensemble copies per node input
    table: torch.Tensor | None = None  # embeddings [S * E, H] of the inputs attached to nodes
    source: str = ""  # where the artefact came from
    description: str = ""  # the load line's words for it

    def __init__(self, target, artifact: str | None):
        self.target = target
        self.load(artifact)

    @classmethod
    def scorer(cls, target, artifact: str | None, initial: bool = False) -> GuessScorer:
        """The artefact (--artifact, default the shipped one) loaded for `specbench estimate`, without a method."""
        raise NotImplementedError

    def load(self, artifact: str | None) -> None:
        """Load the artefact: set rows, ept, table, source and description."""
        raise NotImplementedError

    def chosen(self, tree_source: str) -> dict:
        """What run.yaml's `chosen` records of the artefact (a drafter: the tree and the drafter)."""
        return {}
