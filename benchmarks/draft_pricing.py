"""Benchmark: what a drafting method's tree is priced at, the bare drafter forward (`estimate`'s time, the
acceptance file's draft_forward_ms) against the step's own drafting as a run pays it (DraftPricing.ms_here: the
pending pairs, the tree's widths, top-k, gathers and host copies), and the predicted speedup of the run's tree
(`--tree auto`) under each, from this hardware's latency profile (issue 44 §2).

Compare the predictions with a run's measured speedups (`specbench run --tree auto`, report.md's measured-vs-
predicted table); the profile and this script must be measured on the same quiet machine.

    python benchmarks/draft_pricing.py [--model smollm2-135m] [--methods eagle,parallelspec,medusa] [--threads N]
"""

from __future__ import annotations

import argparse

import torch

from specbench.core.model.load import dtype_name, load_model
from specbench.methods import get_method
from specbench import families
from specbench.planning.batch_choice import local_profile
from specbench.planning.buildtree import predict


def bare_ms(method) -> float:
    """One bare drafting forward, as `estimate` times it (the price before issue 44)."""
    guesser, target = method.guesser, method.target
    if hasattr(guesser, "art"):
        from specbench.methods.eagle import artifact as fd

        return fd.forward_ms(guesser.art.drafter, 1 + guesser.art.drafter.mask_tokens)
    from specbench.methods.medusa import artifact as mh

    return mh.heads_ms(guesser.heads.heads, target.model.get_output_embeddings(), target.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--methods", default="eagle,parallelspec,medusa")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.model, args.dtype, "cpu")
    profile = local_profile(target)
    print(f"model {target.name}, {dtype_name(target.dtype)}, threads {torch.get_num_threads()}, profile "
          f"{profile.hardware if profile else None}")
    print(f"{'method':>13} {'tree':>10} {'bare ms':>8} {'step ms':>8} {'ratio':>6} {'pred (bare)':>11} "
          f"{'pred (step)':>11} {'tau':>5}")
    for name in args.methods.split(","):
        method = get_method(name)(target, {"tree": "auto"})
        tf = method.batch_tree.tree_file
        tree = tf.tree(0)
        # both on the profile's clock (DraftPricing.clock: profile L(1) over the target's forward timed now)
        bare, step = bare_ms(method) * method.pricing.clock(), method.pricing.ms_here(tree)
        said = {}
        for label, ms in (("bare", bare), ("step", step)):
            said[label] = predict(tf, method.acceptance, profile, draft_ms=families.get(method.family).cost_law(ms)) if profile \
                else {"predicted_speedup": float("nan"), "predicted_tau": float("nan")}
        print(f"{name:>13} {f'{tf.size}/d{tree.depth}':>10} {bare:8.2f} {step:8.2f} {step / bare:6.2f} "
              f"{said['bare']['predicted_speedup']:11.3f} {said['step']['predicted_speedup']:11.3f} "
              f"{said['step']['predicted_tau']:5.2f}", flush=True)


if __name__ == "__main__":
    main()
