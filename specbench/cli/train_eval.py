"""`specbench train eval ARTEFACT`: held-out top-1 per draft position of a trained artefact (planning/heldout.py),
written into its metadata; the train commands of tree methods call `evaluate` when they finish."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from .. import families
from ..errors import SpecbenchError
from ..progress import console
from .app import train_app
from .placement_options import DeviceMap, MaxMemory, target_placement

EvalPrompts = Annotated[int, typer.Option(help="Held-out prompts per training source scored when training ends "
                                               "(top1_heldout in the metadata); 0: none.")]


def evaluate(folder: Path, model: str | None = None, dtype: str = "auto", device: str = "auto", prompts: int = 30,
             new_tokens: int = 64, data: str | None = None, held_out: int | None = None, placement=None,
             write: bool = True) -> dict:
    """Score the artefact in `folder` on held-out prompts of its training sources (or `data`) and, with `write`,
    record the result in its metadata; returns the result. model: default the one its metadata names."""
    from ..core.model.load import load_model
    from ..planning import heldout
    from ..train.selfdistill import check_sources

    if prompts < 1:
        raise SpecbenchError(f"--eval-prompts must be at least 1 (got {prompts})")
    if new_tokens < 3:
        raise SpecbenchError(f"--max-new-tokens must be at least 3 (got {new_tokens})")
    folder = Path(folder)
    meta = heldout.read(folder)
    path = heldout.meta_file(folder)
    method = meta.get("method") or path.stem  # <method>.yaml; early-exit heads are Medusa heads at a middle layer
    family = families.find(method)  # early-exit heads are Medusa heads at a middle layer (an alias)
    if family is None or not family.scorer:
        raise SpecbenchError(f"{path}: method {method!r} has no held-out top-1 check; it covers "
                             f"{', '.join(f.name for f in families.FAMILIES.values() if f.scorer)}")
    method = family.name
    try:
        trained, skipped = heldout.training_split(meta, path)
    except SpecbenchError:
        if not (data and held_out is not None):
            raise
        trained, skipped = [], held_out  # training data unknown: the user vouches for --dataset and --held-out
    sources = check_sources(data) if data else trained
    heldout.check_held_out(sources, trained, skipped if held_out is None else held_out, prompts, path)
    target = load_model(model or meta.get("model") or "smollm2-135m", dtype, device, placement=placement)
    target.model.requires_grad_(False)
    scorer = families.load(family.scorer)(target, str(folder), False)
    result = heldout.heldout_top1(target, scorer.ranks, scorer.rows, sources, prompts, new_tokens)
    if write:
        heldout.record(folder, result)
    console.print(f"{method} {escape(str(folder))}: held-out top-1 per draft position {result['top1_heldout']} "
                  + " ".join(f"({name} {v})" for name, v in result["top1_heldout_by_source"].items())
                  + (f"; written to {escape(str(path))}" if write else ""))
    return result


@train_app.command("eval", aliases={"--prompts": "--eval-prompts"})  # its name before the train commands' own
def train_eval(
    artifact: Annotated[Path, typer.Argument(help="A trained artefact's folder (eagle, parallelspec, medusa, "
                                                  "hidden-transfer or ppd).")],
    model: Annotated[Optional[str], typer.Option(show_default="the one its metadata names", help="The target model "
                                                 "spec it was trained for.")] = None,
    prompts: Annotated[int, typer.Option("--eval-prompts", help="Held-out prompts per source (at most the prompts "
                                         "the artefact held out).")] = 30,
    new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Greedy reference length per prompt.")] = 64,
    data: Annotated[Optional[str], typer.Option("--dataset", show_default="its own training sources", help="Score "
                                                "on these sources (their first --eval-prompts prompts) instead.")]
    = None,
    held_out: Annotated[Optional[int], typer.Option(show_default="read from its metadata", help="Prompts of each "
                                                    "training source the artefact held out (with --dataset, needed "
                                                    "when the metadata does not say).")] = None,
    write: Annotated[bool, typer.Option(help="Write top1_heldout into the artefact's metadata.")] = True,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<i>")] = "auto",
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
):
    """Held-out top-1 per draft position: how often the artefact's first guess is the target's own greedy token,
    on the first prompts of each training source, which training left out."""
    evaluate(artifact, model, dtype, device, prompts, new_tokens, data, held_out,
             target_placement(device_map, max_memory), write)
