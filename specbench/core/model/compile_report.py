"""run.yaml's `compile:` block of one model's compile state (core/model/compile.py): its settings, its cache and
buckets, every shape it compiled with the seconds of its first call (compile plus one forward), and how many decode
forwards ran compiled and eagerly after warm-up."""

from __future__ import annotations

from .compile_wait import output_name


def block(state) -> dict:
    """run.yaml's `compile:` block of a compile state (compile.Compiled): the settings, the cache, every compiled
    shape's seconds, what ran eagerly."""
    return {**state.settings, "device": str(state.device),
            "capacity": state.kv.capacity, "buckets": sorted({b for s in state.buckets.values() for b in s}),
            **({"batch_buckets": {b: sorted({w for s in t.values() for w in s})
                                  for b, t in sorted(state.batch_buckets.items())}} if state.batch_buckets else {}),
            "shapes": [{"width": w, "inputs": "embeddings" if e else "tokens", "mask": "tree" if m else "causal",
                        "output": output_name(h), "seconds": round(s, 3)}
                       for (w, e, m, h), s in sorted(state.shapes.items())]
            + [{"batch": b, "width": w, "inputs": "embeddings" if e else "tokens",
                "mask": "tree" if m else "causal", "output": output_name(h), "seconds": round(s, 3)}
               for (b, w, e, m, h), s in sorted(state.batch_shapes.items())]
            + [{"batch": k[0] if len(k) == 6 else 1, "width": k[-5], "inputs": "embeddings" if k[-4] else "tokens",
                "mask": "tree" if k[-3] else "causal", "output": output_name(k[-2]),
                "layer_edits": [list(e) for e in k[-1]], "seconds": round(s, 3)}
               for k, s in state.edit_shapes.items()],
            "seconds": round(sum(state.shapes.values()) + sum(state.batch_shapes.values())
                             + sum(state.edit_shapes.values()), 3),
            "compiled_steps": state.compiled_steps,
            "eager_steps": state.eager_steps,
            **({"grown_to": state.grown} if state.grown else {})}
