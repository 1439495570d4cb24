"""`specbench env` and `specbench list methods|datasets|profiles|trees|host-work`: what this machine is, what is
available and which data files a run here would read."""

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


def _files_table(title: str, rows) -> Table:
    table = Table(title=title)
    for col in ("file", "source", "flags", "for", "a run here"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.path, r.source, r.flags, r.what, r.status)
    return table


@list_app.command("profiles")
def list_profiles(
    model: Annotated[str, typer.Option(help="Model spec (its file-name key picks the files).")] = "smollm2-135m",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    allow_disturbed_profile: Annotated[bool, typer.Option("--allow-disturbed-profile", help="Show what a run given "
                                       "--allow-disturbed-profile would use.")] = False,
):
    """Latency profiles a run here would use, in the order searched (working directory, user cache, shipped), with
    their flags, and those it skips (measured on a disturbed machine) or never reaches."""
    from ..core.listing import profiles
    from ..core.machine.hardware import hardware_slug
    from ..core.model.load import model_slug, resolve_device

    hardware = hardware_slug(resolve_device(device))
    rows = profiles(hardware, model_slug(model), allow_disturbed_profile)
    out.print(_files_table(f"profiles of {model_slug(model)} (this hardware: {hardware})", rows))
    if not rows:
        out.print(f"No profile of {model_slug(model)} in any source: `specbench profile --model {model}` measures "
                  "one.")


@list_app.command("trees")
def list_trees(
    model: Annotated[str, typer.Option(help="Model spec (its file-name key picks the files).")] = "smollm2-135m",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    dtype: Annotated[str, typer.Option(metavar="D[,D...]", help="The dtypes a run would decode in.")]
    = "float32,bfloat16",
    allow_disturbed_profile: Annotated[bool, typer.Option("--allow-disturbed-profile", help="Show what a run given "
                                       "--allow-disturbed-profile would use.")] = False,
):
    """Tree files a run's --tree auto would take here, per method and dtype, in the order searched (working
    directory, user cache, shipped), with their flags, and those it skips (built from a disturbed profile) or never
    reaches."""
    from ..core.listing import trees
    from ..core.machine.hardware import hardware_slug
    from ..core.model.load import model_slug, resolve_device

    hardware = hardware_slug(resolve_device(device))
    dtypes = tuple(d.strip() for d in dtype.split(",") if d.strip())
    rows = trees(hardware, model_slug(model), dtypes, allow_disturbed_profile)
    out.print(_files_table(f"trees of {model_slug(model)} (this hardware: {hardware}; dtypes {', '.join(dtypes)})",
                           rows))
    if not rows:
        out.print(f"No tree of {model_slug(model)} in any source: `specbench build-tree --model {model}` builds one.")


@list_app.command("host-work")
def list_host_work(
    model: Annotated[str, typer.Option(help="Model spec (its file-name key picks the figures).")] = "smollm2-135m",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
):
    """Host work a decode step pays outside its forwards, as this machine's runs filed it, which predictions here
    add to each tree step's and ar's price (docs/trees.md, "Host work in the price")."""
    from ..core.machine.hardware import hardware_slug
    from ..core.model.load import model_slug, resolve_device
    from ..planning import host_work

    hardware, key = hardware_slug(resolve_device(device)), model_slug(model)
    rows = host_work.filed(hardware, key)
    table = Table(title=f"host work of {key} (this hardware: {hardware}), in ar forwards")
    for col in ("dtype", "decoding", "method", "figures", "host ms a step / ar's forward, by verify width", "latest"):
        table.add_column(col, overflow="fold")
    for r in rows:
        at = ", ".join(f"{w:g}: {v:.3f}" for w, v in r.law.knots)
        table.add_row(r.dtype, r.decoding, r.method, str(r.law.points), at, f"{r.latest} {r.run}")
    out.print(table)
    where = host_work.where()
    if not rows:
        out.print(f"Nothing filed for {key} here yet: a `specbench run` of a tree or chain method beside ar files it "
                  f"({where}).")
    else:
        out.print(f"Filed in {where}; delete it to start afresh.")
    if not host_work.enabled():
        out.print("SPECBENCH_HOST_WORK=0: runs here neither file nor read these figures.")
