"""`specbench plan`: what each tree method would give a model before anything is trained, from its shape, a latency
curve (a measured profile, or a GPU preset's roofline estimate: latency_estimate.py) and acceptance figures (the
papers' published tables: acceptance/published/<model>/, or a folder `specbench estimate` wrote).

Per method: the tree build-tree would choose (buildtree.size_curve for dynamic trees, candidate_curve for one-state
ones), its predicted tau and speedup over `ar`, the drafter's cost per step, and memory at the run's context:
  speedup(n) = tau(n) L(1) / (sum_k pi_k L(width_k) + drafting ms per step)      (buildtree.py's formulas)
  drafting ms = L(1) x drafter share, share = the drafter's weights in decoder layers (its layers, extra matrices
      and the LM head it reads, over one target layer's weights) / the target's (layers + its LM head): the drafter
      is a slice of the same kind of network, on the same curve (as acceptance.draft_scale argues), paid once per
      drafted depth or once per step as the family declares (families/record.Family.cost_law).
  memory = target weights + drafter or heads + KV cache (2 x layers x KV heads x head dim x context, the drafter's
      own layer included) in the run's dtype.
Each family's drafter weights, memory parts and tree shape come from its declaration (specbench/families/).
Nothing here is measured on the planned model: the plan says so, and says which profile and acceptance it rests on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import families
from ..core import store
from ..errors import SpecbenchError
from .acceptance import read_fields, read_per_rank
from .buildtree import PROFILE_WIDTHS, build_dtype, size_curve, tree_file
from .candidate_trees import candidate_curve, candidate_tree_file
from .latency_estimate import GPU_CHOICES, ModelShape, drafting_forward_ms, resolve_profile
from .profile import LatencyProfile

PUBLISHED = Path(store.ACCEPTANCE) / "published"


def chain_methods() -> tuple[str, ...]:
    """The chain families plan covers from their estimated acceptance (chain_plan.py): pld, sd, pearl."""
    return tuple(f.name for f in families.FAMILIES.values() if f.kind in ("draft-free", "draft-model"))


def tree_methods() -> tuple[str, ...]:
    """The tree families plan covers: dynamic sparse trees first, then one-state trees of the best candidates."""
    return tuple(sorted(families.tree_families(), key=lambda name: families.get(name).one_state))



@dataclass
class PlanRequest:
    model: str
    gpu: str = "a100"
    dtype: str = "auto"
    acceptance: str = "published"  # published | published:<model> | a folder of <method>.yaml files
    methods: tuple[str, ...] = field(default_factory=tree_methods)
    kv_length: int = 512  # the KV length whose latency curve is read (as build-tree and recommend)
    context: int = 2048  # the run's context: prompt + new tokens, for the KV cache's memory
    max_size: int = 128
    out: Path | None = None
    sizes: dict = field(default_factory=dict)  # method -> the tree size to price instead of the best (a run's)


@dataclass
class MethodPlan:
    """One row of the plan: a method, its tree, prediction and memory, and the paper's measurement beside it."""

    method: str
    tree: str = ""
    size: int | None = None
    tau: float | None = None
    speedup: float | None = None
    draft_ms: float | None = None  # drafting milliseconds per step at the chosen tree
    step_ms: float | None = None  # a decode step's ms at the chosen tree: verify forward + drafting
    ar_ms: float | None = None  # ar's step, L(1) at the KV length read
    memory_gb: dict = field(default_factory=dict)  # target, drafter, kv, total
    paper: dict = field(default_factory=dict)  # the acceptance file's published measurement (speedup, tau, gpu)
    acceptance: str = ""
    unverified: bool = False  # its acceptance file says the paper's figures were recalled, not checked (verified: false)
    why_not: str = ""


@dataclass
class Plan:
    model: str
    model_key: str
    dtype: str
    profile: LatencyProfile
    acceptance: str
    rows: list[MethodPlan]
    out: Path
    random_weights: bool
    notes: list[str] = field(default_factory=list)

    @property
    def pick(self) -> MethodPlan | None:
        """The first of `ranked`: the fastest on checked acceptance, an unchecked row only when no row is checked."""
        return next((r for r in self.ranked if r.speedup is not None), None)

    @property
    def ranked(self) -> list[MethodPlan]:
        """Rows with a prediction, those on checked acceptance first (fastest first), then those whose acceptance was
        recalled and not checked (fastest first), then the rows without a prediction."""
        return sorted(self.rows, key=lambda r: (r.speedup is None, r.unverified, -(r.speedup or 0.0)))


def acceptance_folder(spec: str, model_key: str) -> Path:
    """The folder of <method>.yaml files `--acceptance` names (a clear error listing what is published)."""
    if spec == "published" or spec.startswith("published:"):
        key = spec.partition(":")[2] or model_key
        found = None
        for method in tree_methods():  # the default family's file first, as the published folders are laid out
            hit = store.find(PUBLISHED / key / f"{method}.yaml")
            if hit is not None:
                found = hit.parent
                break
        if found is None:
            have = sorted({p.parent.name for root in store.roots() for p in (root / PUBLISHED).glob("*/*.yaml")})
            raise SpecbenchError(f"--acceptance {spec}: no published acceptance for {key} (published: "
                                 f"{', '.join(have) or 'none'}). Borrow one knowingly with --acceptance "
                                 f"published:{have[0] if have else 'MODEL'}, or pass a folder `specbench estimate` "
                                 "wrote (acceptance/<model>/)")
        return found
    folder = Path(spec)
    if not folder.is_dir():
        raise SpecbenchError(f"--acceptance {spec}: not `published`, `published:MODEL` or a folder of acceptance "
                             "files (acceptance/<model>/ as `specbench estimate` writes it; <method>.json: a "
                             "speculation_profile.json, e.g. a run's speculation_profiles/)")
    return folder


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def drafter_layers(method: str, shape: ModelShape, fields: dict) -> float:
    """The drafter's weights read per drafting forward, in target decoder layers (module docstring); 0 where the
    guesses ride in the target's forward."""
    read = families.get(method).drafter_read
    return read(shape, fields) / shape.weights_per_layer if read is not None else 0.0


def memory_gb(method: str, shape: ModelShape, params: int, fields: dict, dtype: str, context: int) -> dict:
    """Target weights, drafter or heads (own weights only: a feature drafter shares the target's embeddings and LM
    head), KV cache at `context` (the drafter's own layers included) in GB of the run's dtype."""
    b = _bytes(dtype)
    per_token = 2 * shape.kv_heads * shape.head_dim * b  # K and V of one layer
    family = families.get(method)
    extra = family.drafter_weights(shape, fields) if family.drafter_weights is not None else 0.0
    out = {"target": params * b, "drafter": extra * b,
           "kv": (shape.layers + family.drafter_kv_layers) * per_token * context}
    out["total"] = sum(out.values())
    return {k: round(v / 1e9, 3) for k, v in out.items()}


def plan(req: PlanRequest) -> Plan:
    from ..core.machine.hardware import hardware_slug
    from ..core.model.load import model_config, model_slug
    from ..core.model.presets import parameter_count

    import torch

    if req.gpu not in GPU_CHOICES and not req.gpu.endswith((".yaml", ".yml")):
        raise SpecbenchError(f"unknown --gpu {req.gpu!r}: use one of {', '.join(GPU_CHOICES)} or a profile .yaml "
                             "path")
    if req.context < 1 or req.kv_length < 1 or req.max_size < 2:
        raise SpecbenchError("--context and --kv-length must be >= 1, --max-size >= 2")
    known = tree_methods() + chain_methods()
    unknown = [m for m in req.methods if m not in known]
    if unknown:
        raise SpecbenchError(f"--methods: {', '.join(unknown)} not a tree method nor a chain method plan covers; "
                             f"choose from {', '.join(known)}")
    key = model_slug(req.model)
    config = model_config(req.model)
    dtype = build_dtype(req.dtype, req.gpu, lambda: "bfloat16")
    folder = acceptance_folder(req.acceptance, key)
    local = hardware_slug(torch.device("cpu"))
    profile = resolve_profile(req.gpu, key, config, dtype, local, PROFILE_WIDTHS, spec=req.model)
    shape = ModelShape.from_config(config)
    try:
        params = parameter_count(config.to_dict())
    except (KeyError, TypeError):  # a config parameter_count cannot read: layers and an untied LM head
        params = int(shape.layers * shape.weights_per_layer + 2 * shape.vocab * shape.hidden)
    out = req.out or Path("results") / f"plan-{key}-{profile.hardware}-{dtype}"
    result = Plan(req.model, key, dtype, profile, store.relative_to_cwd(folder), [], out,
                  req.model.startswith("random:"))
    for method in req.methods:
        result.rows.append(_plan_one(method, key, folder, shape, params, profile, dtype, req, out / "trees"))
    if profile.source == "estimated":
        result.notes.append(f"latency: a roofline estimate of {profile.meta.get('chip', req.gpu)} from its published "
                            "peak rates (planning/latency_estimate.py), not a measurement")
    result.notes += flatter_notes(result.rows, profile)
    unchecked = [r.method for r in result.rows if r.unverified]
    if unchecked:
        result.notes.append(f"acceptance of {', '.join(unchecked)}: recalled, not checked against the paper's table "
                            "(its file says verified: false): treat its row as a rough guide")
    if folder.parent.name == "published" and folder.name != key:
        result.notes.append(f"acceptance borrowed from {folder.name}'s published tables, not measured on {key}")
    write(result, req)
    return result


FLATTER = 1.1  # a preset's prediction this far above the paper's measurement on the same chip is called out


def flatter_notes(rows: list[MethodPlan], profile: LatencyProfile) -> list[str]:
    """On a GPU preset (an estimated profile), the rows predicted well above what their paper measured on the same
    chip: the preset's curve is flatter than that hardware's (verifying many tokens costs about what one does on a
    roofline, with an assumed fixed cost per forward), so its speedups are an upper bound there."""
    if profile.source != "estimated":
        return []
    chip, key = str(profile.meta.get("chip", profile.hardware)), str(profile.hardware).lower()  # key: a100, h100
    widths = profile.widths
    kv = min(profile.curves) if profile.curves else 512
    slope = profile.latency_ms(max(widths), kv) / profile.latency_ms(1, kv) if widths else float("nan")
    out = []
    for r in rows:
        paper, gpu = r.paper.get("speedup"), str(r.paper.get("gpu", "")).lower()
        if r.speedup is None or not isinstance(paper, (int, float)) or key not in gpu:
            continue
        if r.speedup > FLATTER * paper:
            out.append(f"{r.method}: predicted {r.speedup:.2f}x on the {key} preset ({chip}) against {paper:.2f}x the paper "
                       f"measured ({r.paper.get('gpu')}): the preset's curve is flatter than that hardware's (L("
                       f"{max(widths)}) = {slope:.2f} x L(1) on its roofline), so its speedup is an upper bound; "
                       "a measured profile (`specbench profile` on the GPU) prices the verify width as it is")
    return out


def _plan_one(method: str, key: str, folder: Path, shape: ModelShape, params: int, profile: LatencyProfile, dtype: str,
              req: PlanRequest, trees: Path) -> MethodPlan:
    row = MethodPlan(method)
    path = folder / f"{method}.yaml"
    if not path.is_file() and (folder / f"{method}.json").is_file():  # a speculation_profile.json (here or elsewhere)
        path = folder / f"{method}.json"
    if not path.is_file():
        shown = store.relative_to_cwd(path)
        row.why_not = f"no {shown} (the paper gives no acceptance table: see the folder's README.md)" \
            if folder.parent.name == "published" else f"no {shown}: `specbench estimate --method {method}` writes it"
        return row
    fields = read_fields(path)
    row.acceptance = store.relative_to_cwd(path)
    row.unverified = (fields.get("source") or {}).get("verified") is False
    row.paper = dict((fields.get("published") or {}).get("measured") or {})
    row.memory_gb = memory_gb(method, shape, params, fields, dtype, req.context)
    if method in chain_methods():  # a chain: its fastest draft length (chain_plan.py)
        from .chain_plan import plan_chain

        try:
            share = fields.get("drafter_share") if isinstance(fields.get("drafter_share"), (int, float)) else 0.0
            chain = plan_chain(method, path, fields, profile, req.kv_length,
                               drafter_layers=share * params / shape.weights_per_layer)
        except SpecbenchError as exc:  # this row cannot be priced (say why); the other rows still plan
            row.why_not = str(exc)
            return row
        row.tree, row.size, row.tau, row.speedup, row.draft_ms = (chain.label, chain.size, chain.tau,
                                                                   chain.speedup, chain.draft_ms)
        row.ar_ms = round(profile.latency_ms(1, req.kv_length), 3)
        row.step_ms = round(chain.tau * row.ar_ms / chain.speedup, 3) if chain.speedup else None
        return row
    rows = len(fields.get("per_rank") or fields.get("conditional_accept_rates") or [])
    acc = read_per_rank(path, rows)
    trees.mkdir(parents=True, exist_ok=True)
    if not families.get(method).one_state:
        m = fields.get("prompt_tokens") or len(fields.get("transfer_layers") or []) or rows
        wanted = req.sizes.get(method)
        curve = size_curve(acc, m, profile, req.max_size, req.kv_length, fields.get("ept") or 1,
                           sizes=sorted(set(_sizes(req.max_size, m)) | ({wanted} if wanted and wanted >= m else set())))
        made = tree_file(curve, m, key, profile, str(path), req.kv_length, method)
    else:
        read = drafter_layers(method, shape, fields)
        share = read / (shape.layers + shape.vocab * shape.hidden / shape.weights_per_layer)
        forward_ms = drafting_forward_ms(profile, req.kv_length, share, read)
        draft = families.get(method).cost_law(forward_ms)
        curve = candidate_curve(acc, profile, req.max_size, req.kv_length, draft)
        made = candidate_tree_file(curve, method, key, profile, str(path), req.kv_length)
        row.draft_ms = round(draft(max(len(p) for p in curve.best.paths)), 3)
        made.extra["draft_forward_ms"] = round(forward_ms, 4)
    i = curve.best_index
    wanted = req.sizes.get(method)
    if wanted in curve.sizes:  # a run's tree size: priced on the same curve (the tree file stays the best one)
        i = curve.sizes.index(wanted)
    row.size, row.tau, row.speedup = curve.sizes[i], round(curve.tau[i], 3), round(curve.speedup[i], 3)
    row.step_ms, row.ar_ms = round(curve.latency_ms[i], 3), round(profile.latency_ms(1, req.kv_length), 3)
    tree_path = trees / f"{method}-{profile.hardware}-{dtype}.yaml"
    made.write(tree_path)
    row.tree = store.relative_to_cwd(tree_path)
    return row


def _sizes(max_size: int, m: int) -> list[int]:
    """Tree sizes searched for a dynamic tree: every size to 32, then every 4th (the search is the slow part)."""
    low = max(2, m)
    return sorted({*range(low, min(max_size, 32) + 1), *range(36, max_size + 1, 4)})


def as_dict(result: Plan) -> dict:
    pick = result.pick
    return {
        "kind": "plan", "model": result.model, "model_key": result.model_key, "random_weights": result.random_weights,
        "method": pick.method if pick else "ar", "tree": pick.tree if pick else None,
        "predicted": pick.speedup if pick else 1.0, "measured": None, "dtype": result.dtype,
        "hardware": result.profile.hardware, "profile_source": result.profile.source,
        "acceptance": result.acceptance,
        "methods": [{k: v for k, v in vars(r).items() if v not in (None, "", {}, [])} for r in result.rows],
        "notes": result.notes or None,
    }


def write(result: Plan, req: PlanRequest) -> None:
    text = ("# specbench plan: predicted, not measured (this model's methods are not trained and nothing ran); "
            "the methods' trees are under trees/\n"
            + yaml.safe_dump(as_dict(result), sort_keys=False, width=120))
    try:
        result.out.mkdir(parents=True, exist_ok=True)
        (result.out / "plan.yaml").write_text(text)
    except OSError as exc:
        raise SpecbenchError(f"cannot write {result.out / 'plan.yaml'}: {exc.strerror or exc}") from exc
