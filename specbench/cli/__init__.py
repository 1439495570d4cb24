"""The `specbench` command line: one thin module per command group, each parsing options, calling one function of
the stage that owns the work, and printing. Importing the modules registers their commands on `app` in the order
`specbench --help` lists them."""

from . import info, run, merge, trees, report, estimate, train, train_eval, recommend  # noqa: F401  (registration order)
from .app import app, main  # noqa: F401
