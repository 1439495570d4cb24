"""The serving view of a run, from records.csv (and serving.json for server runs): what a user of a deployed engine
reads. Per method x dataset x load level (batch size / concurrency and batching):

  ttft_pQ_s      the Q-th percentile over requests (prompt turns) of the time to first token
  tpot_pQ_ms     the Q-th percentile over requests of the time per output token after the first
  itl_pQ_ms      the Q-th percentile of every inter-token gap of every request, pooled (as vLLM's `bench serve`
                 defines ITL: vllm/benchmarks/serve.py, calculate_metrics, extends one list with each request's
                 gaps; one gap per streamed chunk after the first, so a chunk of several accepted tokens is one
                 gap). The gaps are records.csv's itl_gaps_ms; rows without them (older runs) fall back to the
                 percentile over requests of each request's own percentile, and the report says so
  request_throughput   requests / sum wall_s (a row's wall_s is its share of its batch's or phase's time, so the sum
                       is the time the level took)
  output_throughput    new tokens / sum wall_s (tokens/s in total, every request together)
  tokens_per_s_per_user  new tokens / sum latency_s (each request's own end-to-end time; a user's view)
  goodput        requests meeting the SLO (ttft <= ttft_ms and tpot <= tpot_ms) / sum wall_s; empty without --slo
  failed         requests that failed after their retries (server runs, serving.json); they are in no other column

Q is 50, 90 and 99. Rows without streaming times (runs older than these columns) give empty cells.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..run.results import with_batch_columns
from .markdown import markdown_table

SERVING_FILE = "serving.json"  # written by backends/openai_server.py
QUANTILES = (50, 90, 99)
SERVING_COLUMNS = (["method", "dataset", "batch_size", "batching", "requests", "failed"]
                   + [f"ttft_p{q}_s" for q in QUANTILES] + [f"tpot_p{q}_ms" for q in QUANTILES]
                   + [f"itl_p{q}_ms" for q in QUANTILES]
                   + ["request_throughput", "output_throughput", "tokens_per_s_per_user", "goodput"])
# the serving columns summary.csv carries (summary.py)
SUMMARY_SERVING = ["ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms"]


def percentile(values, q: float) -> float:
    """The q-th percentile (linear interpolation) of the finite values; NaN when there are none."""
    arr = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(np.percentile(arr, q)) if arr.size else math.nan


def pooled_gaps(g: pd.DataFrame) -> np.ndarray | None:
    """Every inter-token gap (ms) of the rows, pooled over requests (records.csv's itl_gaps_ms), or None where the
    rows do not keep their gaps (records from before the column)."""
    if "itl_gaps_ms" not in g:
        return None
    # a cell of one gap reads back from CSV as a number, an empty cell as NaN
    cells = [str(c) for c in g.itl_gaps_ms if not (c is None or (isinstance(c, float) and math.isnan(c)))
             and str(c).strip()]
    if not cells and pd.to_numeric(g.get("itl_p50_ms"), errors="coerce").notna().any():
        return None  # percentiles but no gaps: an older record's
    return np.array([float(v) for c in cells for v in c.split()], dtype=float)


def itl_percentile(g: pd.DataFrame, q: float) -> float:
    """The q-th percentile of the pooled gaps; for records without their gaps, that of each request's own q-th."""
    gaps = pooled_gaps(g)
    if gaps is None:
        return percentile(g[f"itl_p{q}_ms"], q) if f"itl_p{q}_ms" in g else math.nan
    return float(np.percentile(gaps, q)) if gaps.size else math.nan


def goodput(g: pd.DataFrame, slo: dict) -> float:
    """Requests per second that met the SLO (ttft_ms, tpot_ms: either may be absent; a request without a tpot, one
    token long, meets any tpot limit) over the rows' time; NaN without an SLO."""
    if not slo or g.empty:
        return math.nan
    ok = pd.Series(True, index=g.index)
    if "ttft_ms" in slo:
        ok &= pd.to_numeric(g.ttft_s, errors="coerce") * 1e3 <= slo["ttft_ms"]
    if "tpot_ms" in slo:
        tpot = pd.to_numeric(g.tpot_ms, errors="coerce")
        ok &= tpot.isna() | (tpot <= slo["tpot_ms"])
    seconds = g.wall_s.sum()
    return float(ok.sum() / seconds) if seconds > 0 else math.nan


def serving_numbers(g: pd.DataFrame) -> dict:
    """summary.csv's serving columns of one summary row (SUMMARY_SERVING); NaN for records without them."""
    out = {}
    for column, unit in (("ttft", "s"), ("tpot", "ms"), ("itl", "ms")):
        for q in (50, 99):
            source = "ttft_s" if column == "ttft" else "tpot_ms"
            if column == "itl":
                value = itl_percentile(g, q)
            else:
                value = percentile(g[source], q) if source in g else math.nan
            out[f"{column}_p{q}_{unit}"] = round(value, 4) if math.isfinite(value) else math.nan
    return out


def read_serving(run_dir: Path) -> dict:
    """serving.json of a server run ({} for specbench's own runs)."""
    path = Path(run_dir) / SERVING_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def serving_table(records: pd.DataFrame, slo: dict | None = None, failed: list[dict] | None = None) -> pd.DataFrame:
    """One row per method x dataset x batch size x batching (SERVING_COLUMNS)."""
    records = with_batch_columns(records)
    rows = []
    for (method, dataset, size, mode), g in records.groupby(["method", "dataset", "batch_size", "batching"],
                                                            sort=False):
        seconds = g.wall_s.sum()
        latency = pd.to_numeric(g.get("latency_s", g.wall_s), errors="coerce").fillna(g.wall_s)
        row = {"method": method, "dataset": dataset, "batch_size": int(size), "batching": mode, "requests": len(g),
               "failed": sum(1 for f in failed or [] if f.get("server") == method and f.get("dataset") == dataset
                             and f.get("level") == mode and int(f.get("batch_size", 1)) == int(size))}
        for q in QUANTILES:
            for name, column in (("ttft", "ttft_s"), ("tpot", "tpot_ms")):
                unit = "s" if name == "ttft" else "ms"
                row[f"{name}_p{q}_{unit}"] = percentile(g[column], q) if column in g else math.nan
            row[f"itl_p{q}_ms"] = itl_percentile(g, q)
        row.update(request_throughput=len(g) / seconds if seconds > 0 else math.nan,
                   output_throughput=g.new_tokens.sum() / seconds if seconds > 0 else math.nan,
                   tokens_per_s_per_user=g.new_tokens.sum() / latency.sum() if latency.sum() > 0 else math.nan,
                   goodput=goodput(g, slo or {}))
        rows.append(row)
    table = pd.DataFrame(rows, columns=SERVING_COLUMNS)
    return table.round({c: 4 for c in SERVING_COLUMNS[6:]})


def load_levels(table: pd.DataFrame) -> int:
    """The most load levels (batch sizes, concurrencies, Poisson rates) any method x dataset ran at."""
    if table.empty:
        return 0
    return int(table.groupby(["method", "dataset"], sort=False).size().max())


def level_label(batching: str, size: int) -> str:
    """A point's load level as the plot writes it: `B=4` (a batch of 4), `4 in flight` (a server's closed loop)."""
    return f"{size} in flight" if batching == "closed" else f"B={size}"


def plot_throughput_latency(table: pd.DataFrame, path: Path, title: str = "", engine: str = "") -> bool:
    """throughput_latency.png: tok/s per user (x) against tok/s in total (y), one line per method and dataset across
    its load levels (batch size / concurrency, labelled at each point; Poisson levels as separate markers). Not
    drawn (False) when no method ran at two load levels: at one level per method, one request at a time, both axes
    are the same number (the summary's tok/s), and the plot would say nothing."""
    import matplotlib.pyplot as plt

    from .plots import set_title

    if load_levels(table) < 2:
        path.unlink(missing_ok=True)  # a redrawn report: no stale plot of an earlier layout
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for (method, dataset), g in table.groupby(["method", "dataset"], sort=False):
        g = g.sort_values("batch_size")
        name = f"{engine + ' ' if engine else ''}{method} ({dataset})"
        closed = g[~g.batching.astype(str).str.startswith("poisson")]
        line = ax.plot(closed.tokens_per_s_per_user, closed.output_throughput, marker="o", label=name)[0]
        for _, r in closed.iterrows():
            ax.annotate(level_label(str(r.batching), int(r.batch_size)),
                        (r.tokens_per_s_per_user, r.output_throughput), xytext=(3, 3), textcoords="offset points",
                        fontsize=7)
        for _, r in g[g.batching.astype(str).str.startswith("poisson")].iterrows():
            ax.scatter([r.tokens_per_s_per_user], [r.output_throughput], marker="^", color=line.get_color())
            ax.annotate(str(r.batching), (r.tokens_per_s_per_user, r.output_throughput), xytext=(3, -9),
                        textcoords="offset points", fontsize=7)
    ax.set_xlabel("tokens / s per user (each request's tokens over its own time)")
    ax.set_ylabel("tokens / s in total")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    set_title(ax, title, 6)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def section(records: pd.DataFrame, run_dir: Path, meta: dict, title: str = "") -> list[str]:
    """report.md's serving section: the percentile table, throughput and goodput per load level, the
    throughput-latency plot, and for server runs the acceptance the server exposed and the failed requests."""
    if "ttft_s" not in records or pd.to_numeric(records.ttft_s, errors="coerce").isna().all():
        return []
    serving = read_serving(run_dir)
    slo = serving.get("slo") or {}
    table = serving_table(records, slo, serving.get("failed"))
    engine = (meta.get("engine") or {}).get("name", "") if isinstance(meta.get("engine"), dict) else ""
    drawn = plot_throughput_latency(table, Path(run_dir) / "throughput_latency.png", title, engine)
    shown = table if slo else table.drop(columns="goodput")
    md = ["## Serving: time to first token, inter-token latency, throughput", "",
          "Per request (a prompt turn): `ttft` time to first token, `tpot` time per output token after the first, "
          "`itl` inter-token latency; ttft and tpot: p50 / p90 / p99 over the requests; itl: over every gap of every "
          "request pooled, as vLLM's `bench serve` reports it" + ("" if pooled_gaps(records) is not None else
                                                                  " (these records keep no gaps: of each request's "
                                                                  "own percentile)") + ". "
          "`request_throughput` and `output_throughput` (tokens/s in total) over the time the level took; "
          "`tokens_per_s_per_user` over each request's own time. Tokens that arrive together (a draft accepted in "
          "one verification, a chunk of several tokens) are one gap: a speculative engine's itl is a verification "
          "step's time, above its tpot by about its tokens per step.", ""]
    if serving:
        md += ["Measured from this machine's side of the connection (network and the server's queue included); "
               "`batch_size` is the concurrency (closed loop, `closed`; 1: one at a time, `-`), 0 for an open loop "
               "(`poisson@R`: R requests per second, seeded Poisson arrivals).", ""]
    if slo:
        limits = ", ".join(f"{k.split('_')[0]} <= {v:g} ms" for k, v in slo.items())
        md += [f"`goodput`: requests per second meeting the SLO ({limits}).", ""]
    md += [markdown_table(shown), ""]
    md += ["![throughput against latency](throughput_latency.png)", "",
           "Each point is a load level (`B=N`: a batch of N; `N in flight`: N requests at a time to a server); the "
           "further right, the faster for each user; the higher, the more tokens in total.", ""] if drawn else [
        "One load level per method: tokens/s per user and in total are the same number here, so no "
        "throughput-latency plot (`--batch-size 1,4,16`, or a server's `--concurrency 1,4,16`, draws one).", ""]
    md += acceptance_lines(serving) + failed_lines(serving)
    return md


def acceptance_lines(serving: dict) -> list[str]:
    """The speculative-decoding counts each server exposed per load level, or "not exposed by this server"."""
    phases = serving.get("phases") or []
    if not phases:
        return []
    rows = []
    for p in phases:
        a = p.get("acceptance")
        known = isinstance(a, dict)
        rows.append({"server": p["server"], "batching": p["batching"], "batch_size": p["batch_size"],
                     "source": a.get("source") if known else "-",
                     "drafted": a.get("drafted") if known else "not exposed by this server",
                     "accepted": a.get("accepted") if known else "-",
                     "acceptance_rate": a.get("acceptance_rate") if known else "-",
                     "acceptance_length": a.get("acceptance_length") if known else "-",
                     "per_position": " ".join(str(v) for v in a.get("per_position", [])) if known else "-"})
    return ["### Acceptance the server exposed", "",
            "vLLM: its /metrics spec_decode counters, differenced around each level; SGLang: each response's "
            "meta_info (spec_verify_ct, accepted tokens); llama.cpp's llama-server: each response's timings "
            "(draft_n, draft_n_accepted). `acceptance_length`: tokens per verification, the bonus token included "
            "(1 + accepted / verifications).", "", markdown_table(pd.DataFrame(rows)), ""]


def failed_lines(serving: dict) -> list[str]:
    """The requests that failed after their retries, with the server's or the socket's error."""
    failed = serving.get("failed") or []
    if not failed:
        return []
    shown = pd.DataFrame(failed)[["server", "level", "batch_size", "dataset", "prompt_id", "turn", "tries", "error"]]
    return [f"### Failed requests: {len(failed)}", "",
            f"Each was tried {serving.get('retries', '?')} times (no answer, a timeout, HTTP 5xx or 429 are retried) "
            "and is left out of every number above.", "", markdown_table(shown.head(50)), ""]
