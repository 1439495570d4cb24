"""`specbench build-tree`: PPD's hardware-aware dynamic sparse tree (PPD §4.2, "Hardware-awareness", Fig. 8).

For every size n: the best dynamic tree (treesearch.search) and its tau(n) = 1 + R(T) (hardware-independent);
its expected forward latency sum_k pi_k L_fp(width_k) from the latency profile of the chosen hardware
(hardware-dependent; width_k = the input width of state k's tree); speedup(n) = tau(n) L_fp(1) / that latency
(relative to `ar`: one token per single-token forward). The chosen size maximises speedup(n).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core import lookup, store
from ..families import tree_stem
from ..core.machine.hardware import hardware_slug
from ..core.model.load import auto_dtype, model_config, model_slug
from ..core.tree_file import TreeFile
from ..errors import SpecbenchError
from ..progress import status
from .acceptance import read_per_rank
from .build_draft_cost import acceptance_rows, draft_cost_here, scaled
from .candidate_trees import CandidateCurve, candidate_curve, candidate_tree_file, compiled_field
from .host_work import HostPrice, for_profile
from .latency_estimate import GPU_CHOICES, resolve_profile
from .profile import LatencyProfile
from .treesearch import (
    DynamicTree,
    StateTree,
    amortized,
    f_value,
    random_tree,
    search,
    static_tree,
)


def forward_width(tree: DynamicTree, state: int, m: int, ept: int) -> int:
    """Input width of one state's forward: root + candidates + every prompt input (the root carries m)."""
    t = tree.trees[state]
    return 1 + len(t.paths) + (m + sum(t.prompt_tokens)) * ept


def expected_latency_ms(tree: DynamicTree, m: int, ept: int, profile: LatencyProfile, kv_length: int) -> float:
    return sum(p * profile.latency_ms(forward_width(tree, k, m, ept), kv_length)
               for k, p in zip(range(1, m + 1), tree.pi))


def expected_width(tree: DynamicTree, m: int, ept: int) -> float:
    """The verify forward's mean input width over the states, sum_k pi_k width_k (the width host work is priced at)."""
    return sum(p * forward_width(tree, k, m, ept) for k, p in zip(range(1, m + 1), tree.pi))


@dataclass
class SizeCurve:
    sizes: list[int]
    tau: list[float]
    latency_ms: list[float]
    speedup: list[float]
    static_tau: list[float]
    random_tau: list[float]
    best: DynamicTree

    @property
    def best_index(self) -> int:
        return self.sizes.index(self.best.size)


def size_curve(acc, m: int, profile: LatencyProfile, max_size: int, kv_length: int, ept: int = 1,
               sizes: list[int] | None = None, host: HostPrice | None = None) -> SizeCurve:
    """tau(n), latency(n) and speedup(n) for every size; the best tree by predicted speedup. `host`: the step's and
    ar's host work (host_work.py), added to both where this machine's runs measured it."""
    sizes = sizes or list(range(2, max_size + 1))
    l1 = profile.latency_ms(1, kv_length)
    base = l1 + (host.ar_ms(l1) if host else 0.0)
    curve = SizeCurve([], [], [], [], [], [], best=None)  # type: ignore[arg-type]
    best_speedup = -1.0
    for n in sizes:
        tree = search(acc, m, n)
        latency = expected_latency_ms(tree, m, ept, profile, kv_length)
        latency += host.step_ms(expected_width(tree, m, ept), l1) if host else 0.0
        speedup = tree.tau * base / latency
        curve.sizes.append(n)
        curve.tau.append(round(tree.tau, 4))
        curve.latency_ms.append(round(latency, 3))
        curve.speedup.append(round(speedup, 4))
        curve.static_tau.append(round(static_tree(acc, m, n).tau, 4))
        curve.random_tau.append(round(sum(random_tree(acc, m, n, seed).tau for seed in range(4)) / 4, 4))
        if speedup > best_speedup:
            best_speedup, curve.best = speedup, tree
    return curve


def tree_file(curve: SizeCurve, m: int, model: str, profile: LatencyProfile, acceptance_source: str,
              kv_length: int, method: str = "ppd") -> TreeFile:
    best = curve.best
    i = curve.best_index
    states = {k: list(zip(t.paths, t.prompt_tokens)) for k, t in best.trees.items()}
    extra = {
        "predicted_speedup": curve.speedup[i],
        "stationary_distribution": [round(p, 4) for p in best.pi],
        "latency_profile": {"hardware": profile.hardware, "source": profile.source, "dtype": profile.dtype,
                            "kv_length": kv_length, "identity": profile.identity,
                            **compiled_field(profile)},
        "acceptance": store.relative_to_cwd(acceptance_source),  # a shipped tree names the repo's file
        "curves": {"size": curve.sizes, "tau": curve.tau, "latency_ms": curve.latency_ms,
                   "speedup": curve.speedup, "static_tau": curve.static_tau, "random_tau": curve.random_tau},
    }
    return TreeFile(states, m, model=model, hardware=profile.hardware, dtype=profile.dtype, method=method,
                    built_by="specbench build-tree: PPD dynamic sparse tree, size maximising tau(n) / L_fp(n)",
                    source=profile.source, predicted_tau=best.tau, extra=extra)


def plot(curve: SizeCurve, profile: LatencyProfile, path: Path) -> None:
    """Two panels: tau(n) of dynamic / static / random trees (Fig. 8a) and predicted speedup(n) (Fig. 8b)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(curve.sizes, curve.tau, label="dynamic sparse tree")
    left.plot(curve.sizes, curve.static_tau, label="static (all prompt tokens)", linestyle="--")
    left.plot(curve.sizes, curve.random_tau, label="random (mean of 4)", linestyle=":")
    left.set_xlabel("tree size n")
    left.set_ylabel("predicted tau (tokens per forward)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.plot(curve.sizes, curve.speedup, color="C3")
    right.axvline(curve.best.size, color="grey", linestyle="--", linewidth=1)
    right.axhline(1.0, color="black", linewidth=0.8)  # ar: below this line a tree loses to plain decoding
    right.annotate("ar (1.0)", (curve.sizes[0], 1.0), xytext=(2, 3), textcoords="offset points", fontsize=7)
    right.set_xlabel("tree size n")
    right.set_ylabel("predicted speedup over ar")
    label = " (source: estimated)" if profile.source == "estimated" else ""
    right.set_title(f"{profile.hardware} {profile.dtype}{label}: best n = {curve.best.size}", fontsize=9)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def predict(tree: TreeFile, acc, profile: LatencyProfile | None, kv_length: int = 512, ept: int = 1,
            draft_ms: Callable[[int], float] | None = None, host: HostPrice | None = None) -> dict:
    """Predicted tau and speedup of a tree file (any size; what `run --tree-sizes` compares measurements with).

    tau = 1 + R(T) from the acceptance table; speedup = tau L_fp(1) / sum_k pi_k L_fp(width_k) from `profile`
    (None when there is no profile for the hardware and dtype); one-state trees add draft_ms(depth), the drafter's
    cost per step of draft-model methods (eagle, parallelspec). `host` adds the step's host work at the tree's mean
    verify width and ar's to L(1) (host_work.py). `verify_width`: that mean width, which a run's host work is
    filed at.
    """
    m = tree.prompt_tokens
    if m == 0:  # a one-state tree without prompt inputs (medusa): tau = 1 + f, width = root + candidates
        paths = [tuple(p) for p, _ in tree.states[0]]
        tau = 1.0 + f_value(paths, acc)
        out = {"size": tree.size, "predicted_tau": round(tau, 4), "predicted_speedup": None, "profile": None,
               "verify_width": 1 + len(paths)}
        if profile is not None:
            depth = max((len(p) for p in paths), default=0)
            verify = profile.latency_ms(1 + len(paths), kv_length)
            latency = verify + (draft_ms(depth) if draft_ms else 0.0)
            out.update(_speedup_fields(tau, latency, profile, kv_length, host, 1 + len(paths), verify))
        return out
    states = {k: StateTree([tuple(p) for p, _ in nodes], [c for _, c in nodes]) for k, nodes in tree.states.items()}
    R, pi = amortized(states, acc, m)
    dyn = DynamicTree(tree.size, states, R, [float(x) for x in pi])
    width = expected_width(dyn, m, ept)
    out = {"size": tree.size, "predicted_tau": round(dyn.tau, 4), "predicted_speedup": None, "profile": None,
           "verify_width": round(width, 3)}
    if profile is not None:
        verify = expected_latency_ms(dyn, m, ept, profile, kv_length)
        out.update(_speedup_fields(dyn.tau, verify, profile, kv_length, host, width, verify))
    return out


def _speedup_fields(tau: float, step_ms: float, profile: LatencyProfile, kv_length: int,
                    host: HostPrice | None = None, width: float = 1.0, verify_ms: float | None = None) -> dict:
    """predict()'s speedup fields from a step's expected ms (verify forward + drafting, the profile's clock):
    predicted_step_ms beside ar_step_ms = L(1), which report.md sets against a run's measured ms per step, and the
    verify forward's part of it (predicted_forward_ms); with `host`, each plus its host work (predicted_host_ms,
    ar_host_ms; `host_price` says where it comes from)."""
    ar_ms = profile.latency_ms(1, kv_length)
    out = {} if verify_ms is None else {"predicted_forward_ms": round(verify_ms, 4)}
    if host is not None:
        step_host, ar_host = host.step_ms(width, ar_ms), host.ar_ms(ar_ms)
        step_ms, ar_ms = step_ms + step_host, ar_ms + ar_host
        out.update(predicted_host_ms=round(step_host, 4), ar_host_ms=round(ar_host, 4), host_price=host.said())
    return {"predicted_speedup": round(tau * ar_ms / step_ms, 4), "predicted_step_ms": round(step_ms, 4),
            "ar_step_ms": round(ar_ms, 4), "profile": f"{profile.hardware} {profile.dtype} ({profile.source})", **out}


# ------------------------------------------------------------------ `specbench build-tree`: the choices, then the tree

# Widths the latency curve is read at (a preset's roofline estimate is computed for exactly these).
PROFILE_WIDTHS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


@dataclass
class BuildTreeRequest:
    """What `specbench build-tree` was asked for (its options, unchecked)."""

    model: str
    family: str  # the tree method's family (acceptance/<model>/<family>.yaml, the tree file's `method`)
    one_state: bool  # its tree has one state (the n best candidates), not PPD's dynamic states
    families: tuple[str, ...]  # every family build-tree takes (for the error naming them)
    gpu: str
    dtype: str
    prompt_tokens: int
    max_size: int
    kv_length: int
    ept: int
    acceptance: Path | None  # None: the model's acceptance file in the store
    out: Path | None  # None: trees/<model>/<stem>.yaml
    batch_size: int = 1  # B: the tree is chosen from L(B, w) (the profile's batch curve) and filed as <stem>-b<B>
    draft_forward_ms: float | None = None  # one drafting forward timed here by the run building it (--tree auto)
    max_depth: int | None = None  # one-state trees: the depths the run's artefact drafts (None: the file's rows)


@dataclass
class BuiltTree:
    """What build-tree made and what the command prints: the curve, the tree file and the plot it wrote."""

    family: str
    model: str  # the model's file-name key
    profile: LatencyProfile
    curve: SizeCurve | CandidateCurve
    path: Path
    plot: Path | None  # the size-curve plot (dynamic trees only)
    host_price: str | None = None  # where the curve's host work a step came from (host_work.py); None: unpriced


def build_tree(req: BuildTreeRequest) -> BuiltTree:
    """Check the request, choose the dtype, acceptance file, latency profile and output file, search the tree of
    the best predicted speedup and write it (and, for dynamic trees, its plot)."""
    if req.gpu not in GPU_CHOICES and not req.gpu.endswith((".yaml", ".yml")):
        raise SpecbenchError(f"unknown --gpu {req.gpu!r}: use one of {', '.join(GPU_CHOICES)} or a profile .yaml "
                             "path")
    dtype = build_dtype(req.dtype, req.gpu,
                        lambda: str(auto_dtype(req.model, torch.device("cpu"))[0]).removeprefix("torch."))
    slug = model_slug(req.model)  # the model's file-name key: acceptance/, profiles/ and trees/ all use it
    if req.family not in req.families:
        raise SpecbenchError(f"build-tree --method {req.family}: choose one of {', '.join(req.families)}")
    shelved = store.acceptance_file(slug, req.family)
    acc_path = req.acceptance or store.find(shelved) or shelved
    if not acc_path.exists():
        raise SpecbenchError(f"no acceptance estimates at {acc_path}: run `specbench estimate --method {req.family} "
                             f"--model {req.model}` first, or pass --acceptance FILE")
    m = req.prompt_tokens
    if m < 1:
        raise SpecbenchError("--prompt-tokens must be at least 1")
    if req.max_size < max(2, m):
        raise SpecbenchError(f"--max-size {req.max_size} is smaller than the {m} prompt tokens (and every candidate "
                             "needs at least one prompt token: size >= 2)")
    if req.batch_size < 1:
        raise SpecbenchError(f"--batch-size must be at least 1 (got {req.batch_size})")
    acc = read_per_rank(acc_path, m)
    local = hardware_slug(torch.device("cpu"))
    measured = None
    if req.gpu == "cpu":  # this CPU's own profile, from the first source that has a usable one (core/lookup.py)
        hit = lookup.find_profile(local, slug, dtype)
        measured = hit.path if hit else None
        skipped = [f for f in lookup.copies(lookup.PROFILE, store.profile_file(local, slug, dtype)) if f.disturbed]
        if measured is None and skipped:
            raise SpecbenchError(f"--gpu cpu: {skipped[0].said()} was measured on a disturbed machine ("
                                 f"{skipped[0].why}): re-run `specbench profile --model {req.model} --dtype {dtype}` "
                                 f"on a quiet machine, or pass {lookup.ALLOW_FLAG} to build from it anyway")
    full = resolve_profile(req.gpu, slug, model_config(req.model), dtype, local, PROFILE_WIDTHS, spec=req.model,
                           root=measured.parent.parent if measured else store.profiles_dir(),
                           batch_sizes=(req.batch_size,))
    profile = batch_curve(full, req.batch_size, req.model)  # L(B, w); batch 1: the profile itself
    stem = store.batch_stem(tree_stem(req.family, f"{profile.hardware}-{profile.dtype}"), req.batch_size)
    path = req.out or store.filed(store.tree_file(slug, stem))
    host = for_profile(profile, req.family)  # this machine's runs' host work, where they measured it (batch 1)
    if req.one_state:
        rows = acceptance_rows(acc_path)  # every depth the estimate measured,
        if req.max_depth:  # but no deeper than the run's artefact drafts (its heads, masks + 1)
            rows = min(rows, req.max_depth)
        acc = read_per_rank(acc_path, rows)
        draft_ms, moved = draft_cost_here(req.family, acc_path, full, req.kv_length, req.draft_forward_ms)
        if draft_ms is not None and req.batch_size > 1:
            # the drafter's per-step cost at batch B: assumed to grow with B as the target's 1-token forward does
            grow = profile.latency_ms(1, req.kv_length) / full.latency_ms(1, req.kv_length)
            draft_ms = scaled(draft_ms, grow)
        with status(f"Choosing the best candidate tree of sizes 1..{req.max_size}"):
            curve = candidate_curve(acc, profile, req.max_size, req.kv_length, draft_ms, host)
        result = candidate_tree_file(curve, req.family, slug, profile, str(acc_path), req.kv_length)
        if moved:
            result.extra["draft_cost"] = moved  # the drafter was timed on another machine or dtype, or as built
        if req.draft_forward_ms is not None and draft_ms is not None:
            # the timed forward itself: recommend prices this hardware's tree with it (planning/predict.py)
            result.extra["draft_forward_ms"] = round(req.draft_forward_ms, 4)
    else:
        with status(f"Searching dynamic sparse trees of sizes 2..{req.max_size}"):
            curve = size_curve(acc, m, profile, req.max_size, req.kv_length, req.ept, host=host)
        result = tree_file(curve, m, slug, profile, str(acc_path), req.kv_length, req.family)
    if (full.meta.get("contention") or {}).get("disturbed"):  # runs skip this tree unless allowed (core/lookup.py)
        result.extra["latency_profile"]["disturbed"] = True
        source = req.gpu if req.gpu.endswith((".yaml", ".yml")) else measured
        if source:
            result.extra["latency_profile"]["file"] = store.data_relative(source)
    if host is not None:  # the curve's prices include host work (host_work.py)
        result.extra["host_price"] = host.said()
    if req.batch_size > 1:  # which curve chose it: speedups are over ar at the same batch size
        result.extra["batch_size"] = req.batch_size
        result.extra["latency_profile"]["batch_size"] = req.batch_size
        result.built_by += f", at batch size {req.batch_size} (L(B, w): B rows of w tokens per forward)"
    result.write(path)
    drawn = None
    if not req.one_state:
        drawn = path.with_suffix(".png")
        plot(curve, profile, drawn)
    return BuiltTree(req.family, slug, profile, curve, path, drawn, host.said() if host else None)


def edge_note(curve, max_size: int) -> str:
    """A warning when the chosen size is the largest the search tried: the best may lie beyond --max-size ("" when
    the curve turned down inside the range)."""
    if len(curve.sizes) < 2 or curve.best.size != curve.sizes[-1]:
        return ""
    return (f"the chosen size {curve.best.size} is the largest searched: the predicted speedup was still rising "
            f"there, so a larger tree may be better; `--max-size {2 * max(max_size, curve.best.size)}` searches "
            "further (a flat latency curve, such as a GPU's or a roofline estimate's, keeps rewarding width)")


def batch_curve(profile: LatencyProfile, batch_size: int, model: str) -> LatencyProfile:
    """The profile's L(B, w) as a profile of its own (at_batch); a profile without batch size B is refused with the
    command that measures it (a tree from batch 1's curve filed as batch B's would be taken for one)."""
    view = profile.at_batch(batch_size)
    if view is None:
        have = ", ".join(map(str, profile.batch_sizes))
        compiled = " --compile" if profile.meta.get("placement") == "compiled" else ""  # its own curve's kind
        raise SpecbenchError(f"the {profile.hardware} {profile.dtype} profile of {model} has no batch size "
                             f"{batch_size} (it has {have}): `specbench profile --model {model} --dtype "
                             f"{profile.dtype}{compiled} --batch-size 1,{batch_size}` on that hardware measures "
                             "L(B, w)")
    return view


def build_dtype(dtype: str, gpu: str, cpu_auto: Callable[[], str]) -> str:
    """The dtype a tree is built for: auto is bfloat16 for GPUs and, for cpu, what `run --dtype auto` picks on this
    CPU (`cpu_auto`, asked only then); short names spelled out."""
    auto = cpu_auto() if gpu == "cpu" else "bfloat16"
    name = {"auto": auto, "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    if name not in ("float32", "bfloat16", "float16"):
        raise SpecbenchError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return name
