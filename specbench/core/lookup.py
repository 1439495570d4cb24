"""Which profile, tree, acceptance file or recommendation a command reads, and the record of what a run used.

Files are searched in store.sources() order (working directory, user cache, shipped in the checkout). Each file found
carries flags read from it:
- a profile: `disturbed` (measured while other processes used the machine: its `contention.disturbed`),
  `estimated` (a roofline, not a measurement), `compiled` (taken under `--compile`);
- a tree: `disturbed` (built from a disturbed profile: its `latency_profile.disturbed`), `estimated`;
- a recommendation: `unconfirmed` (a prediction, never measured beside `ar`).
A disturbed profile or tree is skipped (the next source is tried) unless allowed (`--allow-disturbed-profile`), with
one line naming it and why, once per file. A compiled run looks for the compiled profile, an eager run for the eager
one (their file names differ); a compiled run without a compiled profile reads the eager one, flagged and said
(docs/models-and-hardware.md); a compiled curve filed under the plain name carries its `compiled` flag wherever used.
A run starts a ledger (`start`): every file it used, with its source, flags and what it was used for, and every file
it skipped go into run.yaml's `data_files` and report.md's settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.markup import escape

from ..progress import console
from . import store

PROFILE, TREE, ACCEPTANCE, RECOMMENDATION = "profile", "tree", "acceptance", "recommendation"
ALLOW_FLAG = "--allow-disturbed-profile"
# The same for every command of a process: a machine that is always busy (a shared CI runner, the test suite, which
# runs on every core and so flags every profile it measures).
ALLOW_ENV = "SPECBENCH_ALLOW_DISTURBED_PROFILE"
EAGER_FOR_COMPILED = "eager, standing in for compiled"


@dataclass(frozen=True)
class Found:
    """One data file: its kind, path, source (store.sources' name) and flags, the flags' reasons in words."""

    kind: str
    path: Path
    source: str
    flags: tuple[str, ...] = ()
    why: str = ""

    @property
    def disturbed(self) -> bool:
        return "disturbed" in self.flags

    def said(self) -> str:
        flags = f"; {', '.join(self.flags)}" if self.flags else ""
        return f"{store.relative_to_cwd(self.path)} ({self.source}{flags})"

    def with_flag(self, flag: str) -> Found:
        return Found(self.kind, self.path, self.source, (*self.flags, flag), self.why)


@dataclass
class _Ledger:
    allow_disturbed: bool = False
    quiet: bool = False  # `specbench list`: skips recorded, not said (its table says them)
    compiled: bool = False  # a `--compile` run: --tree auto reads and files compiled profiles and trees
    used: dict = field(default_factory=dict)  # path -> entry (purposes merged)
    skipped: dict = field(default_factory=dict)  # path -> entry
    said: set = field(default_factory=set)


_ledger = _Ledger()
_flags_cache: dict[tuple[str, str, float], tuple[tuple[str, ...], str]] = {}


def start(allow_disturbed: bool = False, quiet: bool = False) -> None:
    """A new ledger (a run, a command): nothing used or skipped yet; disturbed files allowed or not."""
    global _ledger
    _ledger = _Ledger(allow_disturbed=allow_disturbed, quiet=quiet)


def compiled_run(on: bool | None = None) -> bool:
    """Whether this ledger's run decodes under `--compile` (set once by run/compiled.check_model): its `--tree auto`
    builds from the compiled profile and files `@compiled` trees apart from eager decoding's."""
    if on is not None:
        _ledger.compiled = on
    return _ledger.compiled


def allow_disturbed(on: bool) -> None:
    """Let disturbed profiles and trees be used (`--allow-disturbed-profile`), keeping the ledger."""
    _ledger.allow_disturbed = on


def disturbed_allowed() -> bool:
    """--allow-disturbed-profile, or ALLOW_ENV set to anything but 0 / empty."""
    return _ledger.allow_disturbed or os.environ.get(ALLOW_ENV, "0") not in ("", "0")


def _allowed_by() -> str:
    return ALLOW_FLAG if _ledger.allow_disturbed else f"{ALLOW_ENV} being set"


def describe(kind: str, path: str | Path) -> Found:
    """A data file with its source and flags (an unreadable file: no flags; its reader says what is wrong)."""
    path = Path(path)
    flags, why = _flags(kind, path)
    return Found(kind, path, store.source_of(path), flags, why)


def copies(kind: str, relative: str | Path) -> list[Found]:
    """Every copy of `relative` in the sources, in search order, each described."""
    return [describe(kind, root / relative) for _, root in store.sources() if (root / relative).is_file()]


def find(kind: str, relative: str | Path, use_for: str | None = None, compiled: bool | None = None) -> Found | None:
    """The first copy of `relative` a run may use: a disturbed profile or tree is skipped unless allowed (said once,
    recorded); with `compiled` True, an eager profile filed under the compiled name is skipped too. `use_for`: record
    it as used."""
    for found in copies(kind, relative):
        if kind == PROFILE and compiled and "compiled" not in found.flags:
            skip(found, "an eager profile filed under the compiled name")
            continue
        if found.disturbed and not disturbed_allowed():
            skip(found, f"{found.why}; {ALLOW_FLAG} uses it")
            continue
        if use_for:
            use(found, use_for)
        return found
    return None


def find_profile(hardware: str, model: str, dtype: str, placement: str = "", compiled: bool = False,
                 use_for: str | None = None) -> Found | None:
    """This hardware's profile of the model in a dtype and placement: for a compiled run the compiled one (filed as
    <model>-<dtype>@compiled.yaml, or a compiled curve filed under the plain name in a folder of its own, as
    benchmarks/compile_methods.sh files it), else the eager one, flagged EAGER_FOR_COMPILED and said once; for an
    eager run the plain name's (flagged `compiled` when a compiled curve was filed there); never a disturbed one
    unasked."""
    if compiled:
        found = find(PROFILE, store.profile_file(hardware, model, dtype, "compiled"), use_for, compiled=True)
        if found is not None:
            return found
        eager = find(PROFILE, store.profile_file(hardware, model, dtype, placement))
        if eager is None:
            return None
        if "compiled" in eager.flags:  # a compiled curve filed under the plain name: what was asked for
            if use_for:
                use(eager, use_for)
            return eager
        eager = eager.with_flag(EAGER_FOR_COMPILED)
        _say_once(("compiled", str(eager.path)),
                  f"[yellow]note[/] no compiled profile of {model} {dtype} for {hardware}: {escape(eager.said())} "
                  f"stands in (its L(n) is eager decoding's); `specbench profile --compile --dtype {dtype}` measures "
                  "it")
        if use_for:
            use(eager, use_for)
        return eager
    return find(PROFILE, store.profile_file(hardware, model, dtype, placement), use_for)


def use(found: Found, purpose: str) -> None:
    """Record a file as used by this run for `purpose` (purposes of one file are merged)."""
    key = path_key(found.path)
    entry = _ledger.used.setdefault(key, {"kind": found.kind, "path": store.relative_to_cwd(found.path),
                                          "source": found.source, "flags": list(found.flags), "used_for": []})
    for flag in found.flags:
        if flag not in entry["flags"]:
            entry["flags"].append(flag)
    if "disturbed" in found.flags and "note" not in entry:
        entry["note"] = f"{found.why}; used because of {_allowed_by()}"
    if purpose not in entry["used_for"]:
        entry["used_for"].append(purpose)


def note_used(kind: str, path: str | Path, purpose: str, unless_recorded: bool = False) -> None:
    """Record a file the run was pointed at (a recommendation, a --tree PATH) as used; `unless_recorded`: only when
    the ledger does not hold it yet."""
    if Path(path).is_file() and not (unless_recorded and path_key(path) in _ledger.used):
        use(describe(kind, path), purpose)


def path_key(path: str | Path) -> str:
    """A file's identity in the ledger: its resolved path."""
    try:
        return str(Path(path).resolve())
    except OSError:
        return str(path)


def skip(found: Found, why: str) -> None:
    """Record a file skipped, and say it once in one line."""
    _ledger.skipped.setdefault(path_key(found.path), {"kind": found.kind, "path": store.relative_to_cwd(found.path),
                                                 "source": found.source, "why": why})
    _say_once(("skip", path_key(found.path)),
              f"[yellow]skipped[/] {found.kind} {escape(found.said())}: {escape(why)}")


def record() -> dict:
    """run.yaml's `data_files`: what the run used (kind, path, source, flags, used_for) and what it skipped."""
    return {"used": list(_ledger.used.values()), "skipped": list(_ledger.skipped.values())}


def skipped_why(path: str | Path) -> str | None:
    """Why this ledger skipped `path`, or None when it did not."""
    entry = _ledger.skipped.get(path_key(path))
    return entry["why"] if entry else None


def survey(kind: str, folder: str | Path, pattern: str = "*.yaml") -> dict[str, list[Found]]:
    """Every file matching `pattern` in `folder` (relative: profiles/<hardware>, trees/<model>) of any source, by
    name, with its copies in search order (`specbench list`)."""
    names = sorted({p.name for _, root in store.sources() for p in (root / folder).glob(pattern) if p.is_file()})
    return {name: copies(kind, Path(folder) / name) for name in names}


def say_once(key, text: str) -> None:
    """Say `text` once per ledger (a run, a command) for `key`; nothing in a quiet one."""
    _say_once(key, text)


def _say_once(key, text: str) -> None:
    if _ledger.quiet:
        return
    if key not in _ledger.said:
        _ledger.said.add(key)
        console.print(text)


def _flags(kind: str, path: Path) -> tuple[tuple[str, ...], str]:
    try:
        stamp = path.stat().st_mtime
    except OSError:
        return (), ""
    key = (kind, str(path.resolve()), stamp)
    if key not in _flags_cache:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            data = None
        _flags_cache[key] = flags_of(kind, data if isinstance(data, dict) else {})
    return _flags_cache[key]


def flags_of(kind: str, data: dict) -> tuple[tuple[str, ...], str]:
    """(flags, their reasons in words) of a data file's content."""
    flags, why = [], []
    if kind == PROFILE:
        load = data.get("contention") if isinstance(data.get("contention"), dict) else {}
        if load.get("disturbed"):
            flags.append("disturbed")
            why.append(f"measured while other processes used {float(load.get('foreign_cpu') or 0):.2f} cores "
                       f"(steal {float(load.get('steal') or 0):.0%})")
        if data.get("source") == "estimated":
            flags.append("estimated")
        if data.get("placement") == "compiled" or isinstance(data.get("compile"), dict):
            flags.append("compiled")
    elif kind == TREE:
        profile = data.get("latency_profile") if isinstance(data.get("latency_profile"), dict) else {}
        if profile.get("disturbed"):
            flags.append("disturbed")
            why.append("built from a profile measured on a disturbed machine"
                       + (f" ({profile['file']})" if profile.get("file") else ""))
        if data.get("source") == "estimated":
            flags.append("estimated")
    elif kind == RECOMMENDATION:
        if not isinstance(data.get("measured"), (int, float)):
            flags.append("unconfirmed")
            why.append("predicted only, never measured beside ar")
    return tuple(flags), "; ".join(why)
