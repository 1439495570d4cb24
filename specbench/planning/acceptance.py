"""`specbench estimate --method F`: top-k accuracy of a family's guesses at each token distance against the model's
own greedy continuation (PPD §5.2, Fig. 6 and Table 2), and the per-rank probabilities the tree construction reads
(PPD §4.2: "all the probabilities used above can be approximated on a validation dataset"). Each family scores its
own guesses (its declaration's scorer: methods/<family>/scoring.py); this module tabulates and files them, and
prices a family's drafting per step from the time `estimate` wrote (its declaration's cost law).

Token distance d (the paper's "@d"): after the last accepted token x_i the target's own logits give x_{i+1};
guess d guesses x_{i+1+d}.
acceptance/<model>/<family>.yaml:
  topk_accuracy[d-1][k-1]  P(x_{i+1+d} is among prompt token d's top-k guesses), k = 1..10
  per_rank[d-1][r]         P(x_{i+1+d} is its rank-r guess) (unconditional, as in the authors' trees)
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from .. import families
from ..core import lookup, store
from ..core.machine.hardware import hardware_slug
from ..core.model.load import LoadedModel, dtype_name, model_slug
from ..core.profile_file import LatencyProfile, load_profile
from ..core.machine.timing import now, since
from ..data import datasets as ds
from ..data.trainsets import refuse_as_benchmark
from ..train.selfdistill import greedy_continuations, render
from ..errors import SpecbenchError
from ..progress import progress_bar

TOP_K = 10
# Used when no estimate exists yet (e.g. random test models): a plausible decay over ranks and distances.
GENERIC_PER_RANK = [[round(0.45 * 0.5 ** d / (r + 1) ** 1.5, 5) for r in range(TOP_K)] for d in range(8)]


def default_path(model: str, method: str = "ppd") -> Path:
    """acceptance/<model key>/<method>.yaml (key: model_slug), where build-tree and run look."""
    return store.acceptance_file(model_slug(model), method)


def read_per_rank(path: str | Path, rows: int) -> list[list[float]]:
    """per_rank rows for distances 1..rows from an acceptance file (clear errors naming the file); a
    speculation_profile.json gives its conditional rates as rank 0's, zeros beyond its positions."""
    if str(path).endswith(".json"):
        from ..core.acceptance_profile import read

        return read(str(path)).per_rank_rows(rows, TOP_K)
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"acceptance file {path}: cannot read it ({exc})") from exc
    table = data.get("per_rank") if isinstance(data, dict) else None
    if not (isinstance(table, list) and table and all(isinstance(r, list) and r for r in table)
            and all(isinstance(x, (int, float)) and 0 <= x <= 1 for r in table for x in r)):
        raise SpecbenchError(f"acceptance file {path}: `per_rank` must be a list of rows of probabilities in [0, 1]")
    if len(table) < rows:
        raise SpecbenchError(f"acceptance file {path}: {len(table)} per_rank rows, need {rows} (one per prompt "
                             "token); re-run `specbench estimate` with the artefact you use")
    return [list(map(float, r)) for r in table[:rows]]


def estimate_with(target: LoadedModel, score, rows: int, data: str, limit: int, new_tokens: int,
                  data_file: str | None, method: str, artifact: str, extra: dict | None = None) -> dict:
    """Accuracy table of any guesser: score(ids, start) -> ranks [positions, rows] (planning/head_accuracy's layout)
    on the target's greedy references to the first `limit` prompts of `data`."""
    t0 = now()
    refuse_as_benchmark(data)
    _, prompts = ds.load_prompts(data, limit, data_file)
    rendered = [render(target, p) for p in prompts]
    conts = greedy_continuations(target, rendered, new_tokens, label="greedy references")
    ranks = []
    with progress_bar() as bar:
        task = bar.add_task(f"scoring {method} guesses", total=len(prompts), info="")
        for ids, cont in zip(rendered, conts):
            if len(cont) >= 3:
                ranks.append(score(ids + cont, len(ids) - 1))
            bar.update(task, advance=1)
    if not ranks:
        raise SpecbenchError(f"{data}: no continuation was long enough to score; raise --max-new-tokens")
    topk, per_rank, counted = tabulate(torch.cat(ranks), rows)
    extra = dict(extra or {})
    if "draft_forward_ms" in extra:  # where it was timed: draft_scale moves it to another machine's prediction
        extra["draft_forward_hardware"] = hardware_slug(target.device)
    return {
        "method": method, "model": target.spec, "dtype": dtype_name(target.dtype), "artifact": artifact,
        **extra, "data": data, "prompts": len(prompts), "new_tokens": new_tokens, "positions": counted,
        "seconds": round(since(t0), 1), "topk_accuracy": topk, "per_rank": per_rank,
    }


def tabulate(r: torch.Tensor, rows: int) -> tuple[list, list, list]:
    """ranks [P, rows] -> (topk_accuracy, per_rank, positions counted) per distance."""
    topk, per_rank, counted = [], [], []
    for d in range(rows):
        col = r[:, d][r[:, d] >= 0]
        counted.append(int(col.numel()))
        per_rank.append([round(float((col == k).float().mean()), 5) for k in range(TOP_K)])
        topk.append([round(float((col < k + 1).float().mean()), 5) for k in range(TOP_K)])
    return topk, per_rank, counted


def write(result: dict, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        from ..core.random_weights import WARNING, is_random

        warn = f"# {WARNING.format(spec=result['model']).replace('**', '')}\n" if is_random(result.get("model")) else ""
        path.write_text(f"# specbench estimate: {result['method']} accuracy per token distance (rows @1, @2, ...)\n"
                        + warn + yaml.safe_dump(result, sort_keys=False, default_flow_style=None, width=160))
    except OSError as exc:
        raise SpecbenchError(f"cannot write {path}: {exc.strerror or exc}") from exc


def drafting(method: str) -> families.Family | None:
    """The family's declaration when its drafting costs more than the target's forward (a drafter or heads of its
    own, priced by its cost law), else None."""
    family = families.find(method)
    return family if family is not None and family.drafts_with_model else None


def draft_cost(method: str, path: Path | None, profile: LatencyProfile | None = None, kv_length: int = 512):
    """depth -> the drafting milliseconds per step of a method whose guesses cost more than the target's forward
    (eagle: the pending pairs, then one drafter forward per inner depth; parallelspec: one forward; medusa: its heads
    and their logits on the accepted node), from the time `estimate` wrote into its acceptance file, moved to
    `profile`'s machine and dtype (draft_scale); None for other methods, no file, or an older file without
    `draft_forward_ms`."""
    family = drafting(method)
    if family is None or path is None:
        return None
    ms, _ = moved_draft_ms(method, read_fields(path), profile, kv_length)
    return None if ms is None else family.cost_law(ms)


def moved_draft_ms(method: str, data: dict, profile: LatencyProfile | None, kv_length: int = 512
                   ) -> tuple[float | None, str | None]:
    """(one drafting forward's ms on `profile`'s machine and dtype, what draft_scale did to get it there or None)
    from an acceptance file's fields; (None, None) for a method that drafts nothing or a file without
    `draft_forward_ms`."""
    ms = data.get("draft_forward_ms")
    if drafting(method) is None or not isinstance(ms, (int, float)):
        return None, None
    factor, moved = draft_scale(data, profile, kv_length) if profile is not None else (1.0, None)
    return ms * factor, moved


def draft_scale(data: dict, profile: LatencyProfile, kv_length: int = 512) -> tuple[float, str | None]:
    """(factor, what was done) taking the drafter's forward time from the machine and dtype `estimate` timed it on
    (`draft_forward_hardware`, `dtype`) to `profile`'s: the ratio of the target's 1-token forwards on the two (their
    profiles), since the drafter is a slice of the same kind of network (a decoder layer or heads, and the LM head).
    (1, None) when both are the same or the file does not say where it was timed (older files); (1, a note) when
    that machine has no profile of the model and dtype to scale by."""
    hardware, dtype = data.get("draft_forward_hardware"), data.get("dtype")
    if not hardware or (hardware, dtype) == (profile.hardware, profile.dtype):
        return 1.0, None
    hit = lookup.find_profile(hardware, profile.model, dtype)  # a disturbed one skipped unless allowed
    there = hit.path if hit else None
    if there is None:
        return 1.0, (f"the drafter's forward time was measured on {hardware} {dtype}, which has no {profile.model} "
                     f"profile to scale it by: used as measured on {profile.hardware} {profile.dtype}")
    factor = profile.latency_ms(1, kv_length) / load_profile(there).latency_ms(1, kv_length)
    return factor, (f"the drafter's forward time was measured on {hardware} {dtype}: scaled x{factor:.2f} to "
                    f"{profile.hardware} {profile.dtype} (the target's 1-token forward on each, their profiles)")


def read_fields(path: Path) -> dict:
    """An acceptance file's fields (a clear error for an unreadable file or one that is not a mapping)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"{path}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise SpecbenchError(f"{path}: not an acceptance file (a YAML mapping)")
    return data
