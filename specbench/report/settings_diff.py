"""What two runs' numbers depend on (hardware identity, model, dtype, kernels, threads, settings) and where they
differ. One comparison for both uses: `report NEW --baseline OLD` refuses on a difference (ci/baseline.py), and
`report A B` warns (report/comparison.py).

A run's facts are a mapping: hardware (the key, e.g. cpu-amd-epyc-avx512bf16-2c), identity (the chip under the
key), model, dtype, environment (run.yaml's), settings (run.yaml's, options per method included; None when
unknown). Only what both sides state is compared.
"""

from __future__ import annotations

from ..core.machine.hardware import IDENTITY_FIELDS, brief

# settings that pick which rows exist (rows are matched by method x dataset), or that run.yaml records resolved
# elsewhere (dtype, device, threads: in environment), are not compared as settings; --retime changes which timings
# are kept (quiet ones), not what is measured, so a run may compare with a baseline from before it
NOT_COMPARED = {"methods", "datasets", "model", "dtype", "device", "threads", "options", "retime"}
ENVIRONMENT_COMPARED = ("cpu_linear", "attention", "threads", "device_type")


def facts_of(meta: dict) -> dict:
    """A run's facts from its run.yaml (read_meta); settings None when run.yaml has none."""
    env = meta.get("environment") or {}
    return {"hardware": env.get("hardware"), "identity": env.get("identity"), "dtype": env.get("dtype"),
            "model": (meta.get("model") or {}).get("spec") or (meta.get("settings") or {}).get("model"),
            "environment": env, "settings": meta.get("settings")}


def differences(new: dict, old: dict, names: tuple[str, str] = ("this run", "baseline")) -> list[str]:
    """'<what>: <new value> (<names[0]>) vs <old value> (<names[1]>)' for each fact the two runs state and differ
    in: hardware key (and, under one key, the chip's identity fields), model, dtype, kernels and threads, every
    setting but NOT_COMPARED, and the options of each method both ran."""
    out = []

    def differ(label: str, a, b) -> None:
        if a is not None and b is not None and a != b:
            out.append(f"{label}: {brief(a)} ({names[0]}) vs {brief(b)} ({names[1]})")

    differ("hardware", new.get("hardware"), old.get("hardware"))
    mine, theirs = new.get("identity"), old.get("identity")
    if mine and theirs and new.get("hardware") == old.get("hardware"):  # same key, another chip underneath
        for key in IDENTITY_FIELDS:
            differ(f"hardware {key}", mine.get(key), theirs.get(key))
    differ("model", new.get("model"), old.get("model"))
    differ("dtype", new.get("dtype"), old.get("dtype"))
    env_a, env_b = new.get("environment") or {}, old.get("environment") or {}
    for key in ENVIRONMENT_COMPARED:
        differ(key, env_a.get(key), env_b.get(key))
    a_set, b_set = new.get("settings"), old.get("settings")
    if a_set is not None and b_set is not None:
        for key in sorted((set(a_set) | set(b_set)) - NOT_COMPARED, key=str):
            differ(f"--{key.replace('_', '-')}", a_set.get(key), b_set.get(key))
        a, b = a_set.get("options") or {}, b_set.get("options") or {}
        for method in sorted(set(a) & set(b)):  # a method only one run has is a new or gone row, not a difference
            for key in sorted(set(a[method] or {}) | set(b[method] or {})):
                differ(f"{method} --{key.replace('_', '-')}", (a[method] or {}).get(key), (b[method] or {}).get(key))
    return out
