"""One rank of `specbench run --tp 2`, launched by tests/test_tensor_parallel.py under torchrun (two gloo ranks on
CPU, random:tiny). It calls the benchmark as cli/run.py does (rank 0 writes --out, the other rank a scratch folder)
and adds what a test needs to provoke the ranks into disagreeing:
  --stop-after K   every rank stops after K prompts, as a Ctrl-C between prompts would (the run is then resumed);
  --busy-rank R    rank R's /proc readings say the machine was busy on every turn (another rank's view of the
                   noise must not decide whether the ranks re-time);
  units            the collective helpers on their own, without a model.
Each rank writes what it saw to OUT.rank<R>.json for the test to read (rank 0's run folder holds the records)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["run", "units"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int, default=0)
    parser.add_argument("--busy-rank", type=int, default=-1)
    parser.add_argument("--retime", type=int, default=0)
    args = parser.parse_args()
    return units(args.out) if args.what == "units" else run(args)


def run(args) -> int:
    from specbench.core.machine import contention
    from specbench.core.model import tensor_parallel as tp
    from specbench.errors import SpecbenchError
    from specbench.run import benchmark
    from specbench.run.config import RunConfig
    from specbench.run.runner import Runner

    seen: dict = {"rank": tp.rank(), "pid": os.getpid(), "siblings": []}
    if args.stop_after:
        finish, finished = Runner.finish_prompt, []

        def finish_then_stop(self, *a, **k):
            finish(self, *a, **k)
            finished.append(1)
            if len(finished) == args.stop_after:
                raise KeyboardInterrupt

        Runner.finish_prompt = finish_then_stop
    if tp.rank() == args.busy_rank:
        between = contention.between

        def busy(before, after):
            return {**between(before, after), "foreign_cpu": 1.5}

        contention.between = busy
    snapshot = contention.snapshot

    def watched():
        now = snapshot()
        seen["siblings"] = sorted(set(seen["siblings"]) | set(now.siblings))
        return now

    contention.snapshot = watched
    cfg = RunConfig(methods=("ar", "pld"), datasets=(args.data,), model="random:tiny", device="cpu", limit=4,
                    max_new_tokens=16, warmup=0, retime=args.retime, threads=1, out=tp.rank_out(args.out),
                    resume=args.resume, tp=2)
    try:
        benchmark.run(cfg)
        seen["ended"] = "complete"
    except benchmark.Interrupted:
        seen["ended"] = "interrupted"
    except SpecbenchError as exc:
        seen["ended"] = f"refused: {exc}"
    records = Path(cfg.out) / "records.csv"  # each rank's own rows (the other rank's are in its scratch folder)
    if records.exists():
        import pandas as pd

        rows = pd.read_csv(records, dtype=str, keep_default_na=False)
        seen["tries"] = sorted(zip(rows.method, rows.prompt_id, rows.turn, rows.timing_tries))
    Path(f"{args.out}.rank{tp.rank()}.json").write_text(json.dumps(seen))
    return 0


def units(out: Path) -> int:
    """The helpers with a process group of their own: rank 0's value reaches every rank, rank 0's refusal too, a
    drafting time is rank 0's, and a difference between the ranks is refused on every rank, naming them."""
    import torch.distributed as dist

    from specbench.core.model import tensor_parallel as tp
    from specbench.errors import SpecbenchError
    from specbench.methods.tree.pricing import DraftPricing

    dist.init_process_group("gloo")
    me = tp.rank()
    seen: dict = {"value": tp.from_writer({"rank": me})}

    def refuse():
        raise SpecbenchError("rank 0 refuses")

    try:
        tp.on_writer(refuse)
    except SpecbenchError as exc:
        seen["refusal"] = str(exc)

    # a drafting that takes a different time on each rank
    seen["draft_ms"] = DraftPricing(lambda tree: 1.0 + me).ms_here()
    try:
        tp.same_on_every_rank({"ppd": f"tree-{me}"}, "the trees")
    except SpecbenchError as exc:
        seen["differ"] = str(exc)
    tp.same_on_every_rank({"ppd": "tree"}, "the trees")
    Path(f"{out}.rank{me}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
