"""A tree's prediction at the context a run decodes at (the aim: a prediction within 5% of the measured
step).

build-tree searches trees on one KV length of the profile (512 by default), but a run's forwards attend over its
own contexts, and the width's cost grows with the context, so a tree priced at 512 is priced dearer than it runs
in turns with shorter contexts (the measured gap: benchmarks/RESULTS-cpu.md). Here the step's and `ar`'s expected ms are read on the two profile curves around the
run's mean context (prompt + half the new tokens: core/machine/roofline.mean_context) and interpolated linearly in
the KV length; outside the measured lengths, the nearest curve.
"""

from __future__ import annotations

from .buildtree import predict


def predict_at_context(tree, acc, profile, context: float | None, ept: int = 1, draft_ms=None, host=None) -> dict:
    """buildtree.predict at `context` KV entries (None: its default KV length), with `kv_length` saying where;
    `host`: the host work priced in (planning/host_work.py)."""
    if profile is None or context is None or not profile.curves:
        return predict(tree, acc, profile, ept=ept, draft_ms=draft_ms, host=host)
    kvs = sorted(profile.curves)
    lo = max([k for k in kvs if k <= context], default=kvs[0])
    hi = min([k for k in kvs if k >= context], default=kvs[-1])
    a = predict(tree, acc, profile, lo, ept, draft_ms, host)
    if hi == lo or a.get("predicted_step_ms") is None:
        return {**a, "kv_length": int(lo)}
    b = predict(tree, acc, profile, hi, ept, draft_ms, host)
    f = (context - lo) / (hi - lo)
    step = a["predicted_step_ms"] + f * (b["predicted_step_ms"] - a["predicted_step_ms"])
    ar = a["ar_step_ms"] + f * (b["ar_step_ms"] - a["ar_step_ms"])
    parts = {k: round(a[k] + f * (b[k] - a[k]), 4) for k in ("predicted_forward_ms", "predicted_host_ms", "ar_host_ms")
             if k in a and k in b}
    return {**a, **parts, "predicted_speedup": round(a["predicted_tau"] * ar / step, 4),
            "predicted_step_ms": round(step, 4), "ar_step_ms": round(ar, 4), "kv_length": int(round(context))}
