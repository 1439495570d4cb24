"""`pearl`: drafter and target run at the same time (methods/pearl/); it uses sd's drafter."""

from .record import Family

FAMILY = Family("pearl", "draft-model", "specbench.methods.pearl.method")
