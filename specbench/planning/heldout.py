"""Held-out top-1 per draft position of a trained artefact (`specbench train eval`, and every `train` command of a
tree method when it finishes): how often its first guess for draft position d is the target's own greedy token, on
prompts the artefact never trained on.

Held-out prompts: the first `prompts` of each source the artefact was trained on (trainers skip the first
`held_out` of each; the metadata says how many). References: the target's greedy replies to them (selfdistill, the
same cache as training data), `new_tokens` long. Scoring is `specbench estimate`'s (the method's GuessScorer: ranks
of the true token per distance at every reply position), so `top1_heldout` of one source equals estimate's top-1
column on the same prompts. Draft position d guesses the token d + 1 after the last accepted one (the target's own
logits give the first), as in the acceptance files.

Metadata written (beside the training-sample numbers): top1_heldout [positions] (every source's positions pooled),
top1_heldout_by_source {source: [positions]}, heldout {prompts, new_tokens, positions scored}.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import yaml

from ..core.model.load import LoadedModel
from ..core.structured import read_structured
from ..core.machine.timing import now, since
from ..errors import SpecbenchError
from ..progress import progress_bar
from ..train.selfdistill import source_names, training_data
from .acceptance import tabulate

PROMPTS = 30  # held-out prompts per source (estimate scores alpaca-eval's first 30 too)
NEW_TOKENS = 64  # reference length (estimate's default)
META_FILES = ("eagle.yaml", "parallelspec.yaml", "eagle3.yaml", "medusa.yaml", "hidden-transfer.yaml", "ppd.yaml")


def meta_file(folder: Path) -> Path:
    """The artefact's metadata file in its folder (SpecbenchError when there is none)."""
    found = [folder / name for name in META_FILES if (folder / name).is_file()]
    if not found:
        raise SpecbenchError(f"{folder}: no artefact metadata ({', '.join(META_FILES)}); give the folder of a "
                             "trained eagle, parallelspec, eagle3, medusa, hidden-transfer or ppd artefact")
    return found[0]


def read(folder: Path) -> dict:
    path = meta_file(folder)
    meta = read_structured(path, str(path))
    if not isinstance(meta, dict):
        raise SpecbenchError(f"{path}: expected a mapping of metadata fields")
    return meta


def training_split(meta: dict, path: Path) -> tuple[list[str], int]:
    """(sources, prompts held out of each) the artefact was trained with, from its `data` entry (older metadata:
    `prompts: "A..B ..."`, A prompts held out); a --data-file run names its file, itself a source."""
    data = meta.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise SpecbenchError(f"{path}: no `data` entry naming the training sources; give --dataset and --held-out")
    spans = [entry.get("prompts") for entry in (data.get("sources") or {}).values() if isinstance(entry, dict)]
    spans = spans or [data.get("prompts")]
    first = [int(m.group(1)) for s in spans if isinstance(s, str) and (m := re.match(r"\s*(\d+)\s*\.\.", s))]
    if not first:
        raise SpecbenchError(f"{path}: cannot tell from `data` which prompts were held out; give --held-out")
    return source_names(data["name"]), min(first)


def check_held_out(sources: list[str], trained: list[str], held_out: int, prompts: int, path: Path) -> None:
    """Refuse held-out prompts that were trained on: prompts of a training source past its held-out ones."""
    overlap = [name for name in sources if name in trained and prompts > held_out]
    if overlap:
        raise SpecbenchError(f"{path} trained on prompts {held_out}.. of {', '.join(overlap)}: --eval-prompts "
                             f"{prompts} would score prompts it trained on; use at most {held_out}")


def heldout_top1(target: LoadedModel, score, rows: int, sources: list[str], prompts: int = PROMPTS,
                 new_tokens: int = NEW_TOKENS) -> dict:
    """Top-1 per draft position (1..rows) of a guesser, score(ids, start) -> ranks [positions, rows] (estimate's
    GuessScorer.ranks), on the target's greedy replies to the first `prompts` prompts of each source."""
    t0 = now()
    by_source, pooled, counted = {}, [], {}
    for name in sources:
        data = training_data(target, name, 0, prompts, new_tokens, min_reply=3, training=False)[0]
        ranks = []
        with progress_bar() as bar:
            task = bar.add_task(f"held-out top-1 ({name})", total=len(data.sequences), info="")
            for seq, first in data.sequences:
                ranks.append(score(seq, first - 1))  # guesses after every position from the prompt's last token
                bar.update(task, advance=1)
        if not ranks:
            continue
        topk, _, positions = tabulate(torch.cat(ranks), rows)
        by_source[name] = [row[0] for row in topk]
        counted[name] = positions[0]
        pooled += ranks
    if not pooled:
        raise SpecbenchError("no held-out reply was long enough to score; raise --max-new-tokens")
    topk, _, positions = tabulate(torch.cat(pooled), rows)
    return {
        "top1_heldout": [row[0] for row in topk], "top1_heldout_by_source": by_source,
        "heldout": {"prompts": f"0..{prompts - 1} of each source (never trained on)", "new_tokens": new_tokens,
                    "positions": positions, "seconds": round(since(t0), 1)},
    }


def record(folder: Path, result: dict) -> Path:
    """Write the result into the artefact's metadata, after its training-sample agreement (or at the end)."""
    path = meta_file(folder)
    meta = {k: v for k, v in read(folder).items() if k not in result}
    anchor = next((k for k in ("top1_agreement_untrained", "top1_agreement_at_start",
                                   "top1_agreement_train_sample") if k in meta), None)
    out = {}
    for k, v in meta.items():
        out[k] = v
        if k == anchor:
            out.update(result)
    if anchor is None:
        out.update(result)
    path.write_text(yaml.safe_dump(out, sort_keys=False))
    return path
