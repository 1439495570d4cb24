"""One-state trees (Medusa's, and every method whose candidates at a depth do not depend on a prompt-token state):
build-tree's choice of the n most probable candidates, n maximising tau(n) / L_fp(1 + n), and its tree file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core import store
from ..core.tree_file import TreeFile
from .host_work import HostPrice
from .profile import LatencyProfile
from .treesearch import CandidateTree, static_candidates


def compiled_field(profile: LatencyProfile) -> dict:
    """{"compiled": True} for a curve taken under --compile (profile --compile; a tree a compiled run decodes with)."""
    return {"compiled": True} if profile.compiled else {}


@dataclass
class CandidateCurve:
    sizes: list[int]
    tau: list[float]
    latency_ms: list[float]
    speedup: list[float]
    best: CandidateTree

    @property
    def best_index(self) -> int:
        return self.sizes.index(self.best.size)


def candidate_curve(acc, profile: LatencyProfile, max_size: int, kv_length: int,
                    draft_ms: Callable[[int], float] | None = None, host: HostPrice | None = None) -> CandidateCurve:
    """tau(n) = 1 + f(best n candidates), latency L_fp(1 + n) (+ draft_ms(depth of the tree): the drafter's own
    cost per step, for draft-model methods; + `host`'s host work at width 1 + n, and ar's beside L_fp(1)),
    speedup(n) = tau(n) L_fp(1) / latency(n)."""
    l1 = profile.latency_ms(1, kv_length)
    base = l1 + (host.ar_ms(l1) if host else 0.0)
    curve = CandidateCurve([], [], [], [], best=None)  # type: ignore[arg-type]
    best_speedup = -1.0
    for n in range(1, max_size + 1):
        tree = static_candidates(acc, n)
        depth = max(len(p) for p in tree.paths)
        latency = profile.latency_ms(1 + n, kv_length) + (draft_ms(depth) if draft_ms else 0.0)
        latency += host.step_ms(1 + n, l1) if host else 0.0
        speedup = tree.tau * base / latency
        curve.sizes.append(n)
        curve.tau.append(round(tree.tau, 4))
        curve.latency_ms.append(round(latency, 3))
        curve.speedup.append(round(speedup, 4))
        if speedup > best_speedup:
            best_speedup, curve.best = speedup, tree
    return curve


def candidate_tree_file(curve: CandidateCurve, method: str, model: str, profile: LatencyProfile,
                        acceptance_source: str, kv_length: int) -> TreeFile:
    i = curve.best_index
    extra = {
        "predicted_speedup": curve.speedup[i],
        "latency_profile": {"hardware": profile.hardware, "source": profile.source, "dtype": profile.dtype,
                            "kv_length": kv_length, "identity": profile.identity,
                            **compiled_field(profile)},
        "acceptance": store.relative_to_cwd(acceptance_source),  # a shipped tree names the repo's file
        "curves": {"size": curve.sizes, "tau": curve.tau, "latency_ms": curve.latency_ms, "speedup": curve.speedup},
    }
    return TreeFile({0: [(p, 0) for p in curve.best.paths]}, 0, model=model, hardware=profile.hardware,
                    dtype=profile.dtype, method=method, source=profile.source, predicted_tau=curve.best.tau,
                    built_by="specbench build-tree: one-state tree of the n most probable candidates, n maximising "
                             "tau(n) / L_fp(1 + n)", extra=extra)
