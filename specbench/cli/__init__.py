"""The `specbench` command line: one thin module per command group, each parsing options, calling one function of
the stage that owns the work, and printing. Importing the modules registers their commands on `app`; `specbench
--help` lists them in workflow order (app.WORKFLOW). None of them imports torch at module level."""

from . import estimate, info, merge, plan, recommend, report, run, train, train_eval, trees  # noqa: F401 (registration)
from . import map as _map  # noqa: F401, E402 (registration; `map` the command, not the builtin)
from .app import app, main  # noqa: F401
