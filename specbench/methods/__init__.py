"""Decoding methods: a registry (name -> class) filled by the @register decorator in each method file.

Every module in this package is imported here, so adding a method is one new file with one @register line; its
options are declared on the class (`option_specs`, see options.py).
"""

from __future__ import annotations

import importlib
import pkgutil

from . import ar, tree  # noqa: F401  (first: the registry's order is ar, the tree methods, then the rest)
from .base import REGISTRY, DecodeMethod, Generation, get_method, register  # noqa: F401
from .options import Option, OptionValues, all_options, split_by_method  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "options") and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
