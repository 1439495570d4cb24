"""--resume bookkeeping: the run folder (refusing to mix runs), what a resumed run must match (options and
environment, with the refusal messages naming what changed), which prompts are already done, and run.yaml's
`complete` flag."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from ..core.store import RunFolder
from ..errors import SpecbenchError
from ..progress import console
from .config import RunConfig
from .results import RECORD_COLUMNS, Record, with_batch_columns


class Interrupted(SpecbenchError):
    """Ctrl-C during a run (specbench's own or an engine's): what was kept and how to continue; exit code 130."""

    exit_code = 130

    def __init__(self, out: Path, kept: int,
                 whole: str = "only whole prompts are kept: every method of a prompt, written together"):
        kept_text = f"{kept} records kept in {out}" if kept else f"no results yet in {out}"
        super().__init__(f"Interrupted: {kept_text}. Continue with the same command plus --resume ({whole}).")
        self.out = out
        self.kept = kept


def prepare_out(cfg: RunConfig) -> Path:
    """Create the run directory, refusing to mix runs: an existing run continues only with --resume."""
    out = Path(cfg.out)
    from ..core.model.tensor_parallel import is_writer

    # --tp: the other ranks write a fresh scratch folder of their own (tensor_parallel.rank_out); rank 0's is the run
    if cfg.resume and is_writer() and not RunFolder(out).meta.exists():
        raise SpecbenchError(f"--resume: {out} is not a run folder (it holds no run.yaml). Pass --out with the folder "
                             "of the run to continue, or drop --resume to start a new run there.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SpecbenchError(f"cannot write to --out {out}: {exc.strerror or exc}. Choose a writable folder.") from exc
    run_file = RunFolder(out).meta
    if run_file.exists():
        if not cfg.resume:
            if recorded(out):
                raise SpecbenchError(f"{out} already holds a run. Pass --resume to continue it, or choose another "
                                     "--out.")
            console.print(f"[dim]{out} holds a run that recorded no results: starting afresh there[/]")
            for stale in (run_file, RunFolder(out).records, RunFolder(out).tokens, RunFolder(out).timeline):
                stale.unlink(missing_ok=True)
            return out
        old = yaml.safe_load(run_file.read_text()) or {}
        settings = plain(cfg.settings())
        for key in set(LATER_SETTINGS) - set(old.get("settings") or {}):  # a run from before the option
            settings.pop(key, None)
        old_settings = dict(old.get("settings") or {})
        extended = not settings.get("shard") and limit_extended(old_settings.get("limit"), settings["limit"])
        if extended:  # the one option a resumed run may change
            old_settings.pop("limit"), settings.pop("limit")
        changed = differences(old_settings, settings)
        if changed:
            raise SpecbenchError(f"--resume: the options differ from the run in {out}: {'; '.join(changed)}. "
                                 "Resume with the same options (a larger --limit is the one change allowed), or "
                                 "choose another --out.")
        if extended and old.get("complete"):  # the run finished its old limit: the new prompts are still to run
            old["complete"] = False
            run_file.write_text(yaml.safe_dump(old, sort_keys=False))
    return out


def limit_extended(old, new) -> bool:
    """A resumed run's --limit grows (N -> M > N, or N -> all): it keeps the first N prompts and runs the rest."""
    return old is not None and old != new and (new is None or new > old)


def recorded(out: Path) -> bool:
    """The run in `out` wrote at least one record (records.csv holds a row beneath its header)."""
    path = RunFolder(out).records
    if not path.exists():
        return False
    with path.open() as f:
        return sum(1 for line, _ in zip(f, range(2)) if line.strip()) > 1


# options newer than some run folders: an older run resumes with any value
LATER_SETTINGS = ("retime", "compile", "allow_disturbed_profile", "recommendation")


def missing_folders(path: Path) -> list[Path]:
    """The folders of `path` that do not exist yet, deepest first (what creating it would make)."""
    return [p for p in (path, *path.parents) if not p.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders a refused run created, deepest first, as long as they hold nothing."""
    for folder in folders:
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return


# What the numbers depend on besides the options: a resumed run must match the interrupted one in all of them.
ENVIRONMENT_KEYS = ("device", "device_type", "hardware", "identity", "dtype", "cpu_linear", "attention", "torch",
                    "transformers", "threads")


def refuse_other_environment(out: Path, env: dict) -> None:
    """--resume: refuse when kernels, library versions, hardware, dtype, device or threads changed, naming them."""
    old = (yaml.safe_load(RunFolder(out).meta.read_text()) or {}).get("environment") or {}
    changed = differences({k: old.get(k) for k in ENVIRONMENT_KEYS}, plain({k: env.get(k) for k in ENVIRONMENT_KEYS}))
    if changed:
        hint = " (SPECBENCH_CPU_LINEAR chooses the CPU kernels)" if any("cpu_linear" in c for c in changed) else ""
        raise SpecbenchError(f"--resume: the run in {out} was measured in another environment: {'; '.join(changed)}"
                             f"{hint}. Mixing them would mix two sets of numbers; resume where it started, or "
                             "choose another --out.")
    if old.get("git") != env.get("git"):
        console.print(f"[yellow]note[/] resuming with specbench {env.get('git')} (the run started with "
                      f"{old.get('git')})")


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for every (nested) key whose value differs."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a} -> {b}")
    return out


def plain(obj):
    """Settings as YAML-safe plain data (paths and tuples become strings and lists)."""
    return yaml.safe_load(yaml.safe_dump(obj if not isinstance(obj, dict) else
                                         {k: (str(v) if isinstance(v, Path) else v) for k, v in obj.items()}))


class Done:
    """The (method, dataset, prompt, batch size, batching) groups a resumed run keeps: every turn recorded."""

    def __init__(self, keys: set[tuple] = frozenset()):
        self.keys = set(keys)

    def has(self, method: str, dataset: str, prompt_id: str, batch_size: int = 1, batching: str = "-") -> bool:
        return (method, dataset, prompt_id, batch_size, batching) in self.keys

    def __len__(self) -> int:
        return len(self.keys)


DONE_KEY = ["method", "dataset", "prompt_id", "batch_size", "batching"]


def drop_incomplete(out: Path, turns: dict[tuple[str, str], int]) -> Done:
    """Keep only (method, dataset, prompt, batch size, batching) groups with every turn recorded in records.csv;
    return those. `turns`: (dataset, prompt id) -> the prompt's turn count."""
    path = RunFolder(out).records
    if not path.exists() or path.stat().st_size == 0:  # an empty file: the run was stopped before its header
        keep_tokens(out, set())
        return Done()
    df = pd.read_csv(path, dtype={"prompt_id": str, "batching": str}, keep_default_na=False)
    if df.empty:
        keep_tokens(out, set())
        return Done()
    df = with_batch_columns(df)  # runs from before batching: batch 1
    counts = df.groupby(DONE_KEY)["turn"].nunique()
    done = {key for key, n in counts.items() if n >= turns.get((key[1], key[2]), 1)}
    keep = df[[tuple(k) in done for k in zip(*(df[c] for c in DONE_KEY))]]
    for column in RECORD_COLUMNS:
        if column not in keep:
            keep = keep.assign(**{column: getattr(Record, column, "")})
    keep[RECORD_COLUMNS].to_csv(path, index=False)
    keep_tokens(out, done)
    return Done(done)


def keep_tokens(out: Path, done: set[tuple]) -> None:
    """tokens.jsonl to match the kept records: rows of dropped groups, torn lines and the earlier copy of a row
    written twice (a process killed between a row's tokens and its record) are left out."""
    path = RunFolder(out).tokens
    if not path.exists():
        return
    rows: dict[tuple, str] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            group = (row["method"], row["dataset"], str(row["prompt_id"]), int(row.get("batch_size", 1)),
                     str(row.get("batching", "-")))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
        if group in done:
            rows.pop(group + (int(row["turn"]),), None)
            rows[group + (int(row["turn"]),)] = line
    path.write_text("".join(line + "\n" for line in rows.values()))


def finished(out: Path) -> bool:
    """run.yaml says every planned prompt of the run in `out` finished (mark_complete). Never under torchrun (--tp):
    only rank 0 holds the folder, and a rank that stopped here would leave the others waiting for it to load the
    model; there the ranks load, agree that nothing is left (done, from rank 0) and finish together."""
    from ..core.model.tensor_parallel import launched_ranks

    if launched_ranks() > 1:
        return False
    path = RunFolder(out).meta
    return path.exists() and bool((yaml.safe_load(path.read_text()) or {}).get("complete"))


def mark_complete(out: Path) -> None:
    """run.yaml says whether every planned prompt finished (a report of an interrupted run says it is partial)."""
    path = RunFolder(out).meta
    meta = yaml.safe_load(path.read_text()) or {}
    meta["complete"] = True
    path.write_text(yaml.safe_dump(meta, sort_keys=False))
