"""`pld`: prompt lookup decoding, drafts copied from the prompt (methods/pld.py)."""

from .record import Family

FAMILY = Family("pld", "draft-free", "specbench.methods.pld")
