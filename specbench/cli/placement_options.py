"""The placement options every model-loading command shares (core/model/placement.py parses them): --device-map,
--max-memory, --tp for the target, and --drafter-device-map / --drafter-max-memory for a separate drafter model."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def target_placement(*args, **kwargs):
    """core/model/placement.target_placement, imported when a command runs (it imports torch; help must not)."""
    from ..core.model.placement import target_placement as place

    return place(*args, **kwargs)


def drafter_placement(*args, **kwargs):
    """core/model/placement.drafter_placement, imported when a command runs."""
    from ..core.model.placement import drafter_placement as place

    return place(*args, **kwargs)


PANEL = "Placement (several devices)"

DeviceMap = Annotated[Optional[str], typer.Option(
    "--device-map", metavar="auto|balanced|sequential|FILE.json", rich_help_panel=PANEL, show_default="one device",
    help="Spread the target's layers over devices with accelerate: auto / balanced / sequential fill the GPUs "
         "(then CPU, then disk) under --max-memory; a JSON file maps module names to 0, cuda:1, cpu or disk.")]
MaxMemory = Annotated[Optional[str], typer.Option(
    "--max-memory", metavar="DEV=SIZE,...", rich_help_panel=PANEL, show_default="no caps",
    help="Per-device caps for --device-map, e.g. 0=20GiB,1=20GiB,cpu=64GiB (alone: implies --device-map auto).")]
DrafterDeviceMap = Annotated[Optional[str], typer.Option(
    "--drafter-device-map", metavar="auto|balanced|sequential|FILE.json", rich_help_panel=PANEL,
    show_default="one device",
    help="--device-map for a separate --drafter model (sd, pearl).")]
DrafterMaxMemory = Annotated[Optional[str], typer.Option(
    "--drafter-max-memory", metavar="DEV=SIZE,...", rich_help_panel=PANEL, show_default="no caps",
    help="--max-memory for a separate --drafter model.")]
TensorParallel = Annotated[int, typer.Option(
    "--tp", metavar="N", rich_help_panel=PANEL,
    help="Tensor parallelism over N processes (transformers tp_plan=auto); launch with "
         "`torchrun --nproc-per-node N -m specbench ...`. Rank 0 writes the files.")]
