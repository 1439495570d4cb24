"""`ar`: the autoregressive baseline (methods/ar.py)."""

from .record import Family

FAMILY = Family("ar", "baseline", "specbench.methods.ar")
