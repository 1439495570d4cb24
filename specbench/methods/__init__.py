"""Decoding methods: a registry (name -> class) filled by the @register decorator of each method.

One module or folder per method family: ar.py and pld.py (training-free), sd/ (a drafter model; pearl/ reuses its
drafting), and the tree methods, which share tree/ (the step, the tree plan) and each keep their guesser, artefact
and training recipe in a folder of their own: ppd/, medusa/, eagle/ (the feature drafter), parallelspec/ (eagle's
feature drafter with [MASK] inputs), hidden_transfer/. Importing a family registers its methods; the order below is
the registry's order (`specbench list methods`). Adding a method: a module or folder here with one @register'd class, and one line below.
"""

from __future__ import annotations

# isort: off
from . import ar  # noqa: F401  (each import registers the module's methods)
from .ppd import guesser as _ppd  # noqa: F401
from .medusa import guesser as _medusa  # noqa: F401
from .eagle import guesser as _eagle  # noqa: F401
from .parallelspec import guesser as _parallelspec  # noqa: F401
from .hidden_transfer import guesser as _hidden_transfer  # noqa: F401
from . import pld  # noqa: F401
from .sd import method as _sd  # noqa: F401
from .pearl import method as _pearl  # noqa: F401
# isort: on
from .base import REGISTRY, DecodeMethod, Generation, get_method, register  # noqa: F401
from .options import Option, OptionValues, all_options, split_by_method  # noqa: F401
