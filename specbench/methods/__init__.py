"""Decoding methods: a registry (name -> class) filled by the @register decorator of each method.

One module or folder per method family: ar.py and pld.py (training-free), suffix/ and lookahead/ (training-free,
tree-verified), sd/ (a drafter model; pearl/ reuses its drafting), and the tree methods, which share tree/ (the
step, the tree each batch size decodes with) and each keep their guesser, artefact and training recipe in a folder
of their own: ppd/, medusa/, eagle/ (the feature drafter), parallelspec/ (eagle's feature drafter with [MASK]
inputs), eagle3/, hidden_transfer/. Each family is declared in specbench/families/, which names the module whose
import registers its methods; importing this package imports them in the families' order (the order of
`specbench list methods`). Adding a method: a module or folder here with one @register'd class, and its family's
declaration.
"""

from __future__ import annotations

import importlib

from .. import families
from .base import REGISTRY, DecodeMethod, Generation, get_method, register  # noqa: F401
from .options import Option, OptionValues, all_options, split_by_method  # noqa: F401


def add_family(family: families.Family) -> None:
    """Register a family: its declaration (specbench/families/) and, by importing the module it names, its methods."""
    families.register(family)
    importlib.import_module(family.methods)


for _family in list(families.FAMILIES.values()):  # the registry's order is `specbench list methods`' order
    add_family(_family)
