"""`specbench env` and `specbench list methods|datasets`: what this machine is and what is available."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..progress import out
from .app import app, list_app


@app.command()
def env(device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
        key: Annotated[bool, typer.Option("--key", help="Print only the hardware key that runs, profiles and trees "
                                                        "are keyed by (for scripts: e.g. a CI artefact name).")]
        = False,
        measure_bandwidth: Annotated[bool, typer.Option("--measure-bandwidth", help="Measure the memory bandwidth "
                                                        "again (a few seconds), replacing the one cached for this "
                                                        "hardware key: do it on a quiet machine.")] = False):
    """Print the hardware and software that results will be recorded with."""
    from ..core.machine.hardware import describe, hardware_slug
    from ..core.model.load import resolve_device

    if key:
        print(hardware_slug(resolve_device(device)))  # plain stdout: no table, no colour, for $(specbench env --key)
        return
    from ..core.machine import bandwidth as bw

    resolved = resolve_device(device)
    table = Table(title="specbench environment", show_header=False)
    for key, value in describe(resolved).items():
        table.add_row(key, str(value))
    # the roofline's bandwidth (report/roofline.py): cached per hardware key, measured once (a few seconds)
    table.add_row("memory_bandwidth", bw.describe(bw.bandwidth(resolved, remeasure=measure_bandwidth)))
    out.print(table)


@list_app.command("methods")
def list_methods():
    """Decoding methods: name, kind, what they need, lossless or lossy, whether they decode batches."""
    from ..methods import REGISTRY

    table = Table(title="methods")
    for col in ("name", "kind", "needs", "exactness", "batch > 1", "what it does", "options (specbench run)"):
        table.add_column(col)
    for name, cls in REGISTRY.items():
        options = "\n".join(f"{o.flag} {cls.unset_text.get(o.name, o.default_text)}" for o in cls.option_specs)
        table.add_row(name, cls.kind, " + ".join(cls.needs), "lossless" if cls.lossless else "lossy",
                      "padded, unpadded" if cls.batchable else "-", cls.summary, options or "-")
    out.print(table)


@list_app.command("datasets")
def list_datasets():
    """Benchmark datasets: where each is found and how many prompts it has."""
    from ..data import datasets as ds

    table = Table(title="datasets")
    for col in ("name", "description", "sources (in the order tried)"):
        table.add_column(col)
    for name in ds.dataset_names():
        spec = ds.get_spec(name)
        sources = "\n".join(f"{place}: {state}" for place, state in ds.describe_sources(spec))
        table.add_row(name, spec.description, sources)
    from ..data.trainsets import SOURCES

    for name, (description, _) in SOURCES.items():
        table.add_row(name, f"{description} (training only: `train --dataset`)", "built in, offline")
    out.print(table)
