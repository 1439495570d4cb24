"""`python -m specbench ...` (and `torchrun --nproc-per-node N -m specbench ... --tp N`)."""

from .cli import main

main()
