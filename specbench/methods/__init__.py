"""Decoding methods: a registry (name -> class) filled by the @register decorator in each method file.

Every module in this package is imported here, so adding a method is one new file with one @register line.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import (  # noqa: F401
    REGISTRY,
    DecodeMethod,
    Generation,
    MethodOptions,
    get_method,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base" and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
