"""Decoding methods: a registry (name -> class) filled by the @register decorator in each method file."""

from __future__ import annotations

from .base import REGISTRY, DecodeMethod, Generation, MethodOptions, get_method, register  # noqa: F401

# Importing a method module registers it. Adding a method is one file and one line here.
from . import ar, pld  # noqa: F401,E402
