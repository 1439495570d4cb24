"""The feature drafters side by side (issue 14's per-drafter numbers): own parameters, training time, top-1 agreement
per drafted position (from each artefact's training sample), and one drafting forward's time beside the target's
own forward at width 1, measured here in one process. `eagle` drafts d tokens with d forwards of 1 row,
`parallelspec` with one forward of k + 1 rows, so the last column is the drafting time of a 4-token draft.

    python benchmarks/feature_drafters.py artifacts/smollm2-135m/eagle artifacts/smollm2-135m/parallelspec ...
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specbench.core.models import load_model
from specbench.drafters import feature_drafter as fd


@torch.inference_mode()
def target_forward_ms(target, context: int = 256, repeats: int = 20) -> float:
    """Median ms of one target forward of 1 token on a cache of `context` tokens (ar's step)."""
    from specbench.core.cache import crop_to, new_cache

    cache = new_cache(target.model)
    ids = torch.randint(0, 1000, (1, context), device=target.device)
    target.model(input_ids=ids, past_key_values=cache, use_cache=True)
    one = ids[:, :1]
    times = []
    for _ in range(repeats + 3):
        t0 = time.perf_counter()
        target.model(input_ids=one, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - t0)
        crop_to(cache, context)
    return 1000 * sorted(times[3:])[len(times[3:]) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="+", help="feature drafter folders (eagle or parallelspec)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    target = load_model(args.model, args.dtype, "cpu")
    base = target_forward_ms(target)
    print(f"target forward, 1 token on 256 cached: {base:.2f} ms ({torch.get_num_threads()} threads)")
    print("| drafter | masks k | own parameters | training | top-1 agreement by position | forward, 1 row | "
          "forward, k+1 rows | 4-token draft |")
    print("|---|---|---|---|---|---|---|---|")
    for folder in args.artifacts:
        method = "parallelspec" if (Path(folder) / fd.META_FILES["parallelspec"]).is_file() else "eagle"
        art = fd.load(folder, target, method)
        d, k = art.drafter, art.drafter.mask_tokens
        one, wide = fd.forward_ms(d, 1), fd.forward_ms(d, k + 1)
        draft4 = 4 * one if k == 0 else wide
        meta = art.meta
        print(f"| {method} ({folder}) | {k} | {d.parameter_count():,} | {meta.get('train_seconds', '?')} s, "
              f"{meta.get('steps', '?')} steps | {meta.get('top1_agreement_train_sample')} | {one:.2f} ms "
              f"({one / base:.0%} of the target's) | {wide:.2f} ms | {draft4:.2f} ms |")


if __name__ == "__main__":
    main()
