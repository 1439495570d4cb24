"""report.md's last sections: the settings the run used and the environment it ran in, from run.yaml, written for
a reader: no `None` entries, no Python reprs (lists joined with commas, mappings as "key value" pairs, booleans as
yes / no, each method's options on a line of their own)."""

from __future__ import annotations

SKIPPED_IDENTITY = ("kind",)  # said by the device type already


def plain(value, joiner: str = ", ") -> str | None:
    """A run.yaml value as text, or None when there is nothing to say (None, empty list or mapping); a list inside
    a mapping is joined with '+' (isa avx2+avx512f), so that the mapping's own commas stay readable."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set)):
        said = [p for p in (plain(v) for v in value) if p is not None]
        return joiner.join(said) or None
    if isinstance(value, dict):
        said = [f"{k} {p}" for k, p in ((k, plain(v, "+")) for k, v in value.items()) if p is not None]
        return ", ".join(said) or None
    text = str(value).strip()
    return text or None


def _items(mapping: dict, skip: tuple = ()) -> list[str]:
    return [f"- {k}: {p}" for k, p in ((k, plain(v)) for k, v in mapping.items() if k not in skip) if p is not None]


def settings_section(meta: dict) -> list[str]:
    """## Settings: run.yaml's settings (options per method on their own lines); [] without settings."""
    settings = meta.get("settings") or {}
    if not settings:
        return []
    # a server's options (concurrency, timeout, ...) apply to --engine openai only: elsewhere they are defaults never used
    server = ("engine_options",) if settings.get("engine", "specbench") != "openai" else ()
    md = ["## Settings", ""] + _items(settings, skip=("options", *server))
    for method, options in (settings.get("options") or {}).items():
        said = plain(options)
        if said:
            md.append(f"- {method} options: {said}")
    for label, chose in (meta.get("chosen") or {}).items():  # what a method chose or how it ran, in words
        md += [f"- {label} {key}: {value}" for key, value in (chose or {}).items() if isinstance(value, str)]
    return md + data_file_lines(meta.get("data_files")) + [""]


def data_file_lines(files: dict | None) -> list[str]:
    """run.yaml's data_files as settings lines: each profile, tree, acceptance file and recommendation the run
    used (path, source, flags, what for), then each one it skipped and why (core/lookup.py)."""
    if not isinstance(files, dict):
        return []
    md = []
    for entry in files.get("used") or []:
        flags = "".join(f"; {f}" for f in entry.get("flags") or [])
        note = f" ({entry['note']})" if entry.get("note") else ""
        md.append(f"- {entry.get('kind')} used: `{entry.get('path')}` ({entry.get('source')}{flags}), for "
                  f"{', '.join(entry.get('used_for') or []) or '-'}{note}")
    for entry in files.get("skipped") or []:
        md.append(f"- {entry.get('kind')} skipped: `{entry.get('path')}` ({entry.get('source')}): {entry.get('why')}")
    return md


def environment_section(meta: dict) -> list[str]:
    """## Environment: the model, the hardware key and identity, library versions, how memory was measured."""
    env = dict(meta.get("environment") or {})
    model = meta.get("model") or {}
    if not env and not model:
        return []
    md = ["## Environment", ""]
    if model.get("name") or model.get("spec"):
        source = f" ({model['source']})" if model.get("source") else ""
        md.append(f"- model: {model.get('name') or model.get('spec')}{source}")
    identity = env.pop("identity", None)
    md += _items(env)
    if isinstance(identity, dict):
        said = plain({k: v for k, v in identity.items() if k not in SKIPPED_IDENTITY})
        if said:
            md.append(f"- identity: {said}")
    if meta.get("peak_memory"):
        md.append(f"- peak memory (`peak_mem_mb`): {meta['peak_memory']}")
    return md + [""]
