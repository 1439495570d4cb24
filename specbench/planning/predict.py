"""`specbench recommend`, the prediction half: every tree method's speedup over `ar` on this hardware, from files
only (no decoding). For each method: its artefact, this hardware's latency profile, its acceptance file and the
tree `--tree auto` would take (built now as build-tree would when the profile and acceptance file exist:
autotree.py), then buildtree.predict: tau = 1 + R(T) from the acceptance file, speedup = tau L(1) /
(expected verify latency + the drafter's cost per step), as in run.yaml's predicted column. The drafting is priced
as a run pays it where that was measured (drafting_price: the tree's own timing, else one recommend took on the
loaded target), else from the acceptance file's bare drafter forward, said so (Prediction.draft_price). A method
that lacks a file says which and the command that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.markup import escape

from ..core import store
from ..core.model.load import model_slug
from ..core.tree_file import find_auto_tree
from ..errors import SpecbenchError
from ..progress import console
from . import autotree, host_work, tree_choice
from .acceptance import draft_cost, drafting, read_per_rank
from .buildtree import predict
from .profile import load_profile

KV_LENGTH = 512  # the KV length run.yaml's predictions use (buildtree.predict's default)


@dataclass(frozen=True)
class Candidate:
    """A tree method to predict: its name, its family (artefact folder, acceptance file, trees) and tree shape."""

    method: str
    family: str
    one_state: bool


@dataclass
class Prediction:
    method: str
    tree: str = ""  # the tree file `--tree auto` takes here ("" when unavailable)
    size: int | None = None
    predicted_tau: float | None = None
    predicted_speedup: float | None = None
    why_not: str = ""  # why no prediction: the missing file and the command that makes it
    built: bool = False  # the tree was built now (autotree)
    draft_price: str = ""  # where the drafting's price per step came from ("" where the method drafts nothing)

    @property
    def available(self) -> bool:
        return self.predicted_speedup is not None


def artifact_meta(model_key: str, family: str) -> Path | None:
    """The method's artefact metadata (artifacts/<model>/<family>/<family>.yaml: working directory, then shipped)."""
    meta = f"{family}.yaml"
    path = store.find_artifact_dir(model_key, family, meta) / meta
    return path if path.is_file() else None


def predict_one(cand: Candidate, model_spec: str, hardware: str, dtype: str, device: str,
                timed_ms: float | None = None) -> Prediction:
    """One method's predicted speedup here, or why there is none (SpecbenchErrors of bad files become the reason).
    `timed_ms`: one drafting forward of this method's tree, timed now on the loaded target as the step drafts it
    (recommend.price_drafting), for a tree that does not record its own (drafting_price)."""
    key = model_slug(model_spec)
    out = Prediction(cand.method)
    meta = artifact_meta(key, cand.family)
    if meta is None:
        out.why_not = (f"no trained artefact ({store.artifact_dir(key, cand.family)}): "
                       f"`specbench train {cand.family} --model {model_spec}`")
        return out
    found = autotree.inputs(model_spec, cand.family, hardware, dtype)
    if not found.ready:
        out.why_not = "; ".join(autotree.missing_commands(model_spec, cand.family, hardware, dtype, device)[:-1])
        return out
    try:
        choice = tree_choice.choose(model_spec, cand.family, hardware, dtype, one_state=cand.one_state,
                                    rows=_guessed(meta, found.acceptance), ept=_ept(meta), device=device)
        if choice.tree is None:
            raise SpecbenchError(choice.why)
        tree, source = choice.tree, choice.source
        if choice.built is not None:  # recorded as --tree auto finds it from now on
            out.built = True
            console.print(f"[dim]{cand.method}: no tree for {hardware} {dtype} yet; built it now from "
                          f"{escape(str(choice.inputs.profile))}: filed as {escape(store.said_where(choice.built))}[/]")
            tree, source = find_auto_tree(key, cand.family, hardware, dtype) or (None, "")
            if tree is None:
                raise SpecbenchError(f"the tree built at {choice.built} is not the one --tree auto takes")
        rows = _rows(found.acceptance) if tree.prompt_tokens == 0 else tree.prompt_tokens
        acc = read_per_rank(found.acceptance, rows)
        profile = load_profile(found.profile)
        cost, out.draft_price = drafting_price(cand.family, tree, found.acceptance, profile, timed_ms)
        said = predict(tree, acc, profile, KV_LENGTH, _ept(meta), cost, host_work.for_profile(profile, cand.family))
    except SpecbenchError as exc:
        out.why_not = str(exc)
        return out
    out.tree, out.size = source.split(" (built for ")[0], said["size"]  # the path (`run --tree` takes it)
    out.predicted_tau, out.predicted_speedup = said["predicted_tau"], said["predicted_speedup"]
    return out


def tree_draft_cost(family: str, tree):
    """depth -> drafting ms per step from the drafting forward a run timed on this hardware and dtype as it built
    `tree` (its `draft_forward_ms`), or None: a tree built from files only is priced by the acceptance file's time,
    moved here (draft_cost). The two can differ many times over (benchmarks/RESULTS-gpu.md)."""
    ms, drafts = tree.extra.get("draft_forward_ms"), drafting(family)
    return drafts.cost_law(ms) if drafts is not None and isinstance(ms, (int, float)) else None


def drafting_price(family: str, tree, acceptance: Path, profile, timed_ms: float | None = None):
    """(depth -> drafting ms per step or None, where that price comes from) for a tree's prediction, in this order:
    1. the tree's `draft_forward_ms`: the step's own drafting timed by the run (or recommend) that built it;
    2. `timed_ms`: the step's drafting of this tree timed now on the loaded target (DraftPricing.ms_here);
    3. the acceptance file's bare drafter forward (`estimate`'s time), moved here (draft_cost). A run's step pays
       more than that bare forward (pending rows, the tree's widths, top-k, gathers, host syncs) by a
       factor that differs per family and machine (benchmarks/draft_pricing.py), so it is used as it is and the
       source says the prediction is optimistic rather than guessing a factor.
    Both timed prices are on the profile's clock (DraftPricing.clock), as the profile's L(n) they sit beside."""
    drafts = drafting(family)
    if drafts is None:
        return None, ""
    if (cost := tree_draft_cost(family, tree)) is not None:
        ms = tree.extra["draft_forward_ms"]
        return cost, f"{ms:.2f} ms per drafting forward, the step's drafting timed as the tree was built"
    if timed_ms is not None:
        return drafts.cost_law(timed_ms), (f"{timed_ms:.2f} ms per drafting forward, the step's drafting of this "
                                            "tree timed now on the loaded target")
    cost = draft_cost(family, acceptance, profile, KV_LENGTH)
    if cost is None:
        return None, f"not priced: {acceptance} has no draft_forward_ms (the prediction leaves drafting out)"
    return cost, (f"{cost(1):.2f} ms per drafting forward, {acceptance}'s bare drafter forward moved here: a run's "
                  "step pays more, so this prediction is optimistic")


def predict_all(cands: list[Candidate], model_spec: str, hardware: str, dtype: str, device: str,
                timed: dict[str, float] | None = None) -> list[Prediction]:
    """Every candidate's prediction, best predicted speedup first, unavailable ones last (in the given order);
    `timed`: method -> its drafting forward timed now (predict_one's `timed_ms`)."""
    timed = timed or {}
    preds = [predict_one(c, model_spec, hardware, dtype, device, timed.get(c.method)) for c in cands]
    return sorted(preds, key=lambda p: -(p.predicted_speedup or 0.0) if p.available else float("inf"))


def _rows(path: Path) -> int:
    try:
        return len((yaml.safe_load(Path(path).read_text()) or {}).get("per_rank") or []) or 1
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise SpecbenchError(f"{path}: cannot read its per_rank rows ({exc})") from exc


def _guessed(meta: Path, acceptance: Path) -> int:
    """Token distances the artefact guesses (ppd's prompt tokens, hidden-transfer's transfer layers), at most the
    acceptance file's rows: the prompt tokens m a dynamic tree is built for, as the run's method would."""
    rows = _rows(acceptance)
    try:
        data = yaml.safe_load(meta.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return rows
    if not isinstance(data, dict):  # a list, a scalar: nothing to read
        return rows
    layers = data.get("transfer_layers")
    count = data.get("prompt_tokens") or (len(layers) if isinstance(layers, list) else 0)
    return min(count, rows) if isinstance(count, int) and count > 0 else rows


def _ept(meta: Path) -> int:
    """Ensemble tokens per prompt token of a ppd artefact (1 for every other artefact)."""
    try:
        value = (yaml.safe_load(meta.read_text()) or {}).get("ept", 1)
    except (OSError, yaml.YAMLError, AttributeError):
        return 1
    return value if isinstance(value, int) and value >= 1 else 1
