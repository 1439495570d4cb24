"""`suffix`: suffix decoding, trees drafted from suffix indexes of the prompt, the output and earlier outputs
(methods/suffix/). Draft-free: nothing runs beside the target's forward."""

from .record import Family

FAMILY = Family("suffix", "draft-free", "specbench.methods.suffix.method")
