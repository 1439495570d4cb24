"""`lookahead`: lookahead decoding, n-grams from Jacobi iterations verified in the same forward
(methods/lookahead/)."""

from .record import Family

FAMILY = Family("lookahead", "draft-free", "specbench.methods.lookahead.method", shaped=True)
