"""`specbench recommend`: which method to use for a model on this machine. Every lossless tree method's speedup is
predicted from files (planning/predict.py: no decoding; a drafting method's missing tree is first built as
`run --tree auto` builds it, and each tree's drafting is priced as a run's step pays it, timed here:
price_drafting), the best `confirm` of them (and `pld`, `suffix` and `lookahead`, which need nothing: predicted from
their acceptance estimates where the model has them, measured either way) are measured beside `ar` in one short
run (run/benchmark.py), and the pick is made by paired comparison with intervals (run/pick.py: the simplest method
within the noise of the fastest; in bf16 a lossless or explained one), or the best predicted with `confirm` 0 (`ar`
itself when nothing beats it).
The pick is written to DIR/recommendation.yaml and filed at recommendations/<model>/<hardware>.yaml, which
`run --method auto` reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
import yaml

from ..core import lookup, store
from ..core.machine.hardware import hardware_slug
from ..core.model.naming import resolve_device, resolve_dtype
from ..core.model.load import auto_dtype, dtype_name, model_config, model_slug
from ..errors import SpecbenchError
from ..methods import REGISTRY
from ..planning.predict import Candidate, Prediction, predict_all
from . import pick as picking
from .config import RunConfig, results_root
from .results import with_batch_columns

MEASURED_ONLY = ("pld", "suffix", "lookahead")  # need nothing and no model predicts them: measured whenever anything is
DRAFTER_METHODS = ("sd", "pearl")  # no acceptance model predicts them either: measured when a drafter exists
# the chain methods: predicted from `specbench estimate --method M`'s acceptance file where the model has one
# (planning/chain_plan.py), else measured only, for these reasons
NOT_PREDICTED = {"pld": "no acceptance estimate of prompt lookup for this model (`specbench estimate --method pld`): "
                        "measured only (beside the confirmed methods)",
                 "suffix": "no acceptance estimate of suffix decoding for this model (`specbench estimate --method "
                           "suffix`): measured only (beside the confirmed methods)",
                 "lookahead": "no measured shapes of lookahead decoding for this model (`specbench estimate "
                              "--method lookahead`): measured only (beside the confirmed methods)",
                 "sd": "no acceptance estimate of sd for this model (`specbench estimate --method sd`): measured "
                       "only, when the model has a drafter",
                 "pearl": "no acceptance estimate of pearl for this model (`specbench estimate --method pearl`): "
                          "measured only, when the model has a drafter"}


@dataclass
class RecommendRequest:
    model: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "auto"
    dataset: str = "gsm8k"
    confirm: int = 2
    limit: int = 5
    max_new_tokens: int = 64
    out: Path | None = None
    data_file: str | None = None
    threads: int | None = None
    allow_disturbed_profile: bool = False  # use profiles and trees measured on a disturbed machine (core/lookup.py)
    compile: bool = False  # pick for `run --compile`: compiled profile and trees, a compiled confirming run


def recommendation_file(model: str, hardware: str, compiled: bool = False) -> Path:
    """recommendations/<model>/<hardware>.yaml; a pick for compiled decoding (`recommend --compile`, read by
    `run --method auto --compile`) <hardware>@compiled.yaml, apart from eager decoding's."""
    return store.recommendation_file(model, f"{hardware}@compiled" if compiled else hardware)


@dataclass
class Row:
    """One line of recommend's table: a method, what it would run with, its prediction and measurement."""

    method: str
    tree: str = ""
    size: int | None = None
    predicted: float | None = None
    measured: float | None = None
    lossless: float | None = None  # share of prompt turns matching ar (T = 0)
    why_not: str = ""
    measured_lo: float | None = None  # 95% interval of `measured` (prompts resampled: run/pick.py)
    measured_hi: float | None = None
    explained: float | None = None  # share of prompt turns matching ar or differing by a near-tie (T = 0)
    draft_price: str = ""  # where the prediction's drafting price came from (planning/predict.drafting_price)


@dataclass
class Result:
    pick: Row
    rows: list[Row]
    hardware: str
    dtype: str
    device: str
    out: Path
    run: Path | None
    filed: Path | None  # None: a measured recommendation was kept (write)
    notes: list[str] = field(default_factory=list)


def here(model: str, dtype: str, device: str) -> tuple[torch.device, str, str]:
    """(device, hardware key, dtype name) as `run` would choose them (--dtype auto: auto_dtype)."""
    dev = resolve_device(device)
    dt = auto_dtype(model, dev)[0] if dtype == "auto" else resolve_dtype(dtype, dev)
    return dev, hardware_slug(dev), dtype_name(dt)


def candidates() -> list[Candidate]:
    """The lossless tree methods of the registry (not the `-typical` variants), in registry order."""
    return [Candidate(name, cls.family, cls.one_state) for name, cls in REGISTRY.items()
            if cls.kind == "tree" and cls.lossless and not getattr(cls, "typical", False)]


def recommend(req: RecommendRequest) -> Result:
    if req.confirm < 0 or req.limit < 1 or req.max_new_tokens < 1:
        raise SpecbenchError("--confirm must be >= 0, --limit and --max-new-tokens >= 1")
    model_config(req.model)  # an unknown model is refused here (its config; no weights), not filed as "use ar"
    lookup.start(req.allow_disturbed_profile)
    lookup.compiled_run(req.compile)  # predictions from the compiled profile and @compiled trees
    dev, hardware, dtype = here(req.model, req.dtype, req.device)
    timed = price_drafting(req, candidates(), hardware, dtype)
    preds = predict_all(candidates(), req.model, hardware, dtype, dev.type, timed)
    rows = [Row("ar", predicted=1.0)] + [_row(p) for p in preds]
    measurable = measured_only(req.model)
    rows += [_chain_row(m, req, measurable, hardware, dtype) for m in NOT_PREDICTED if m in REGISTRY]
    out = req.out or results_root() / time.strftime("recommend-%Y%m%d-%H%M%S")
    confirm = [p.method for p in preds if p.available][: req.confirm]
    run_dir, why = None, []
    if req.confirm:
        confirm += measurable
        run_dir = _confirm(req, confirm, dtype, out / "run")
        pick, why = choose_measured(rows, confirming_records(run_dir), dtype)
    else:
        pick = max((r for r in rows if r.predicted is not None), key=lambda r: r.predicted)
        unseen = [m for m in NOT_PREDICTED if m in REGISTRY]
        why = [f"not confirmed: {pick.method} is the best prediction; {', '.join(unseen)} were not considered (no "
               "model predicts them, and --confirm 0 measures nothing); `specbench recommend --confirm 2` measures "
               "them beside the best predicted"]
    result = Result(pick, rows, hardware, dtype, str(dev), out, run_dir, store.filed(recommendation_file(
        model_slug(req.model), hardware, req.compile)))
    result.notes += why + profile_notes(req.model, hardware, dtype) + [
        f"{p.method}'s drafting: {p.draft_price}" for p in preds if p.available and p.draft_price]
    write(result, req)
    return result


def measured_only(model: str) -> list[str]:
    """The methods no model predicts that a confirming run measures: pld, suffix and lookahead always, sd and pearl when
    the model has a drafter artefact (artifacts/<model>/drafter here or shipped: what `run --method sd` would load)."""
    from ..methods.sd.drafter import is_artifact

    key = model_slug(model)
    drafter = any(is_artifact(p) for p in (store.artifact_dir(key, "drafter"),
                                            store.shipped_artifacts() / key / "drafter"))
    return [m for m in (*MEASURED_ONLY, *(DRAFTER_METHODS if drafter else ())) if m in REGISTRY]


def _chain_row(method: str, req: RecommendRequest, measurable: list[str], hardware: str, dtype: str) -> Row:
    """A chain method's row: predicted from its estimated acceptance (planning/chain_plan.py) where this model has
    an acceptance file and this hardware a profile, else measured only (or why not)."""
    from ..planning.chain_plan import predict_here

    chain, _ = predict_here(method, req.model, hardware, dtype)
    if chain is not None:
        return Row(method, chain.label, chain.size, chain.speedup)
    return Row(method, why_not=_unpredicted_why(method, req, measurable))


def _unpredicted_why(method: str, req: RecommendRequest, measurable: list[str]) -> str:
    """Why a method no model predicts has no number in the table (nothing when the confirming run measures it)."""
    if req.confirm and method in measurable:
        return ""
    if method not in measurable:
        return (f"no drafter for {req.model}: `specbench train drafter --model {req.model}` makes one, then "
                "recommend measures it")
    return f"{NOT_PREDICTED[method]}; --confirm 0 left it out"


def price_drafting(req: RecommendRequest, cands: list[Candidate], hardware: str, dtype: str) -> dict[str, float]:
    """method -> one drafting forward's ms, the step's drafting of its tree timed here, for the methods that draft
    with a network (eagle, parallelspec, medusa), so each tree is priced as a run pays it:
    - a tree this hardware lacks is built as `run --tree auto` builds it, by the method itself on the loaded
      target, which times its drafting and records it in the tree (draft_forward_ms; the prediction reads it there);
    - a tree found without draft_forward_ms (shipped in trees/, or built from files alone) has its drafting timed
      now by the method set up on it (DraftPricing.ms_here: the pending rows, the tree's widths, top-k, gathers
      and host copies, on the profile's clock), returned here.
    Otherwise the prediction would price the drafting from the acceptance file's bare drafter forward, which misses
    what a run's step pays by a factor that differs per family and machine
    (benchmarks/draft_pricing.py measures it) and moves between machines as the target's forward does, which a
    drafter's share does not (RESULTS-gpu.md). The confirming run then takes the same trees. Loads the target
    only when a tree is missing or unpriced and could be set up; a method that cannot be set up is left to the
    prediction, which says why or that it priced the bare forward."""
    from ..core.model.load import load_model
    from ..core.tree_file import find_auto_tree
    from ..planning import autotree
    from ..planning.acceptance import drafting
    from ..planning.predict import artifact_meta

    key = model_slug(req.model)

    def unpriced(cand: Candidate) -> bool:
        hit = find_auto_tree(key, cand.family, hardware, dtype)
        return hit is None or not isinstance(hit[0].extra.get("draft_forward_ms"), (int, float))

    todo = [c for c in cands if drafting(c.family) is not None and artifact_meta(key, c.family) is not None
            and autotree.inputs(req.model, c.family, hardware, dtype).ready and unpriced(c)]
    if not todo:
        return {}
    if req.threads:
        torch.set_num_threads(req.threads)
    target = load_model(req.model, dtype, req.device)
    timed = {}
    for cand in todo:
        try:
            method = REGISTRY[cand.method](target)  # --tree auto: this hardware's tree, built (and timed) if missing
            if unpriced(cand):  # found as it was: time the step's drafting of it now
                ms = method.pricing.ms_here(method.tree_file.tree(0) if method.one_state else None)
                if ms is not None:
                    timed[cand.method] = ms
        except SpecbenchError:
            pass
    return timed


def profile_notes(model: str, hardware: str, dtype: str) -> list[str]:
    """A warning when the profile the predictions rest on was measured on a busy machine (profile.py's guard): used
    because --allow-disturbed-profile asked for it, or skipped (the predictions then lack it)."""
    copies = lookup.copies(lookup.PROFILE, store.profile_file(hardware, model_slug(model), dtype))
    found = next((f for f in copies if f.disturbed), None)
    if found is None or (not lookup.disturbed_allowed() and any(not f.disturbed for f in copies)):
        return []
    if lookup.disturbed_allowed():
        return [f"{found.said()} was {found.why}: predictions (and trees built on it) may be wrong; re-run "
                "`specbench profile` on a quiet machine"]
    return [f"{found.said()} was skipped ({found.why}): re-run `specbench profile` on a quiet machine, or pass "
            f"{lookup.ALLOW_FLAG}"]


def _row(p: Prediction) -> Row:
    return Row(p.method, p.tree, p.size, p.predicted_speedup, why_not=p.why_not,
               draft_price=p.draft_price if p.available else "")


def _confirm(req: RecommendRequest, methods: list[str], dtype: str, out: Path) -> Path:
    from .benchmark import run

    cfg = RunConfig(methods=("ar", *methods), datasets=(req.dataset,), model=req.model, dtype=dtype,
                    device=req.device, limit=req.limit, max_new_tokens=req.max_new_tokens, warmup=1,
                    threads=req.threads, data_file=req.data_file, out=out,
                    allow_disturbed_profile=req.allow_disturbed_profile, compile=req.compile)
    return run(cfg)  # records only: the command writes the report (cli/recommend.py), as `specbench run` does


def confirming_records(run_dir: Path) -> pd.DataFrame:
    """The confirming run's batch-1 records (refused without ar's)."""
    try:
        df = with_batch_columns(pd.read_csv(store.RunFolder(run_dir).records, dtype={"lossless": str, "prompt_id": str},
                                            keep_default_na=False))
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SpecbenchError(f"{run_dir}: cannot read the confirming run's records.csv ({exc})") from exc
    df = df[df.batch_size == 1]
    if not (df.method == "ar").any():
        raise SpecbenchError(f"{run_dir}: the confirming run has no ar records")
    return df


def choose_measured(rows: list[Row], records: pd.DataFrame, dtype: str) -> tuple[Row, list[str]]:
    """Fill in each row's measurement (speedup over ar with its interval, lossless and explained shares), then pick
    by paired comparison (run/pick.py); returns the picked row and the notes that say why."""
    measured = picking.measure(records)
    for row in rows:
        m = measured.get(row.method)
        if m is not None:
            row.measured, row.measured_lo, row.measured_hi = m.speedup, m.low, m.high
            row.lossless, row.explained = m.lossless, m.explained
    cost = {r.method: (0 if r.method == "ar" or r.method in MEASURED_ONLY else 1 + bool(r.tree), r.size)
            for r in rows}
    chosen, why = picking.choose({k: v for k, v in measured.items() if any(r.method == k for r in rows)}, records,
                                 dtype, cost)
    return next(r for r in rows if r.method == chosen), why


def as_dict(result: Result, req: RecommendRequest) -> dict:
    pick = result.pick
    return {
        "method": pick.method, "tree": store.data_relative(pick.tree) if pick.tree else None, "gamma": None,
        "dtype": result.dtype,
        "predicted": pick.predicted, "measured": pick.measured,
        "confirmed": result.run is not None,  # False: the best prediction, never measured beside ar here
        "not_considered": [r.method for r in result.rows if r.predicted is None and r.measured is None] or None,
        "measured_interval": [pick.measured_lo, pick.measured_hi] if pick.measured_lo is not None else None,
        "hardware": result.hardware,
        "device": result.device, "model": req.model, "model_key": model_slug(req.model),
        "run": store.relative_to_cwd(result.run) if result.run else None,
        "confirmed_on": {"dataset": req.dataset, "prompts": req.limit, "max_new_tokens": req.max_new_tokens}
        if result.run else None,
        "methods": [_row_dict(r) for r in result.rows],
        "notes": result.notes or None,
    }


def _row_dict(row: Row) -> dict:
    """A table row as the recommendation records it: set fields only, its tree path relative (data_relative)."""
    data = {k: v for k, v in vars(row).items() if v not in (None, "")}
    if row.tree:
        data["tree"] = store.data_relative(row.tree)
    return data


def write(result: Result, req: RecommendRequest) -> None:
    """DIR/recommendation.yaml, and the filed copy `run --method auto` reads, unless this run only predicted and the
    filed one was measured (a prediction does not replace a measurement; result.filed becomes None, with a note)."""
    text = ("# specbench recommend: the method to use for this model on this hardware (`specbench run --method "
            "auto` runs it)\n" + yaml.safe_dump(as_dict(result, req), sort_keys=False, width=120))
    if not req.confirm and _measured(result.filed):
        result.notes.append(f"kept {store.relative_to_cwd(result.filed)}: it was measured, and this run only "
                            f"predicted (--confirm 0); `specbench run --method auto --recommendation "
                            f"{store.relative_to_cwd(result.out / 'recommendation.yaml')}` follows this one")
        result.filed = None
    for path in (result.out / "recommendation.yaml", result.filed):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as exc:
            raise SpecbenchError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _measured(path: Path) -> bool:
    """Whether a filed recommendation holds a measured ratio (a confirming run's)."""
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return False  # unreadable: replaced
    return isinstance(data, dict) and isinstance(data.get("measured"), (int, float))


# ------------------------------------------------------------------------------------- `run --method auto`

@dataclass
class Choice:
    """What `run --method auto` runs: the recommended method ([] for ar alone), its options, dtype, and a line."""

    methods: list[str]
    options: dict
    dtype: str
    said: str
    confirmed: bool = True  # False: the recommendation was a prediction only (recommend --confirm 0)
    path: str | None = None  # the recommendation file followed (run.yaml's data_files names it)


def read_choice(model: str, device: str, path: Path | None, dtype: str = "auto", compiled: bool = False) -> Choice:
    """The recommendation for this model and hardware (`path`, else recommendations/<model>/<hardware>.yaml, or
    <hardware>@compiled.yaml for `run --compile`); a clear error that says to run `specbench recommend` when there is
    none."""
    dev = resolve_device(device)
    hardware = hardware_slug(dev)
    found = None if path else lookup.find(lookup.RECOMMENDATION, recommendation_file(model_slug(model), hardware,
                                                                                    compiled))
    where = path or (found.path if found else None)
    if where is None or not Path(where).is_file():
        looked = path or recommendation_file(model_slug(model), hardware, compiled)
        again = " --compile" if compiled else ""
        raise SpecbenchError(f"--method auto: no recommendation for {model} on {hardware}{' (compiled)' * compiled} "
                             f"(looked for {looked}); run `specbench recommend --model {model}{again}` first, or "
                             "pass --recommendation FILE")
    try:
        data = yaml.safe_load(Path(where).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecbenchError(f"recommendation {where}: cannot read it ({exc})") from exc
    if not isinstance(data, dict) or data.get("method") not in (*REGISTRY, "ar"):
        raise SpecbenchError(f"recommendation {where}: `method` must name a registered method")
    method = data["method"]
    tree = data.get("tree") if method != "ar" and REGISTRY[method].kind == "tree" else None
    options = {"tree": str(tree)} if tree else {}  # relative: core.tree_file.resolve_tree finds it in the checkout
    if data.get("gamma"):
        options["gamma"] = data["gamma"]
    other = "" if data.get("hardware") == hardware else f" [made on {data.get('hardware')}, not this hardware]"
    numbers = ", ".join(f"{k} {data[k]:.2f}x" for k in ("predicted", "measured")
                        if isinstance(data.get(k), (int, float)))
    said = (f"--method auto: {method} ({data.get('dtype')}{', ' + numbers if numbers else ''}) from "
            f"{lookup.describe(lookup.RECOMMENDATION, where).said()}{other}")
    confirmed = isinstance(data.get("measured"), (int, float))
    if not confirmed:
        unseen = ", ".join(data.get("not_considered") or []) or "the methods no model predicts"
        said += (f"; NOT CONFIRMED: a prediction never measured here, and {unseen} were not considered "
                 f"(`specbench recommend --model {model}` measures them)")
    return Choice([] if method == "ar" else [method], options,
                  (data.get("dtype") or "auto") if dtype == "auto" else dtype, said, confirmed, str(where))
