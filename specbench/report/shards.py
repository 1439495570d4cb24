"""report.md's shard table of a merged sharded run (run/merge.py): hardware key, prompts and ar tok/s per shard."""

from __future__ import annotations

import pandas as pd

from .markdown import markdown_table

COLUMNS = ["shard", "hardware", "device", "threads", "prompts", "records", "ar_tokens_per_s", "complete", "folder"]


def shard_section(meta: dict) -> list[str]:
    """report.md's per-shard table (hardware key, prompts, ar tok/s); nothing for a run that was not sharded."""
    shards = meta.get("shards")
    if not shards:
        return []
    keys = sorted({str(s.get("hardware")) for s in shards})
    return ["## Shards", "",
            f"Merged from {len(shards)} shard(s) on hardware {', '.join(keys)}. Each shard ran ar beside every method "
            "on its own prompts and device(s), so every speedup above is a same-device ratio; `ar_tokens_per_s` "
            "shows how the shards' machines compare.", "",
            markdown_table(pd.DataFrame(shards).reindex(columns=COLUMNS)), ""]

