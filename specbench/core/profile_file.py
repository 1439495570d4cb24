"""The latency profile file (profiles/<hardware>/<model>-<dtype>.yaml): LatencyProfile and its one reader, load_profile, which validates the YAML and names the file and field it rejects. Read here in core, so --dtype auto (core/model/load.py) and the planning commands parse a profile the same way.

Batch sizes: `curves` is L(1, w), one row per forward (every profile has it). `batch_curves` (optional, written by
`specbench profile --batch-size`) adds L(B, w) for B > 1: one forward of B rows of w new tokens each, every row on
its own KV cache of kv_length tokens; each batch size has its own widths. A file without it is a batch-1 profile,
as every profile before batch sizes was; at_batch(B) gives any batch size's curve as a LatencyProfile of its own,
so everything that reads L(w) (tree search, predictions) reads L(B, w) unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import SpecbenchError


@dataclass
class LatencyProfile:
    """Latency curves of one (hardware, model, dtype): ms per forward, for each KV length and input width."""

    model: str
    dtype: str
    hardware: str  # slug of the hardware identity, e.g. cpu-amd-epyc-avx2-2c or nvidia-h100-80gb-hbm3
    source: str  # measured | estimated
    widths: list[int]
    curves: dict[int, dict[str, list[float]]]  # kv_length -> {"median_ms": [...], "p10_ms": [...], "p90_ms": [...]}
    meta: dict = field(default_factory=dict)  # device name, identity (core/machine/hardware.py), threads, versions, ...
    batches: dict[int, BatchCurve] = field(default_factory=dict)  # B > 1 -> L(B, w) (absent: batch 1 only)

    @property
    def identity(self) -> dict | None:
        """The full hardware identity it was measured on (None in estimated profiles)."""
        return self.meta.get("identity")

    @property
    def compiled(self) -> bool:
        """Measured under `--compile` (its placement, or its compile block)."""
        meta = self.meta or {}
        return meta.get("placement") == "compiled" or isinstance(meta.get("compile"), dict)

    @property
    def batch_sizes(self) -> list[int]:
        """Batch sizes this profile has a curve for (1 always: `curves`)."""
        return [1, *sorted(self.batches)]

    def at_batch(self, batch_size: int) -> LatencyProfile | None:
        """L(B, w) as a profile of its own (widths, curves; meta["batch_size"] = B), None when B was not measured.
        B = 1 is this profile."""
        if batch_size == 1:
            return self
        curve = self.batches.get(batch_size)
        if curve is None:
            return None
        return LatencyProfile(self.model, self.dtype, self.hardware, self.source, list(curve.widths),
                              curve.curves, {**self.meta, "batch_size": batch_size})

    def latency_ms(self, width: float, kv_length: int | None = None) -> float:
        """Median latency at `width` (linear interpolation between measured widths; clamped at the ends; linear
        extrapolation beyond the widest), on the curve of the nearest measured KV length."""
        kv = min(self.curves, key=lambda k: abs(k - kv_length)) if kv_length is not None else min(self.curves)
        ys, xs = self.curves[kv]["median_ms"], self.widths
        if width <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if width <= x1:
                return y0 + (y1 - y0) * (width - x0) / (x1 - x0)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (width - xs[-1])

    def to_yaml(self) -> str:
        data = {"kind": "latency-profile", "model": self.model, "dtype": self.dtype, "hardware": self.hardware,
                "source": self.source, "widths": self.widths,
                "curves": [{"kv_length": kv, **c} for kv, c in sorted(self.curves.items())]}
        if self.batches:  # absent at batch 1 only: the file is then exactly what it was before batch sizes
            data["batch_curves"] = [{"batch_size": b, "kv_length": kv, "widths": list(self.batches[b].widths), **c}
                                    for b in sorted(self.batches) for kv, c in sorted(self.batches[b].curves.items())]
        data.update({k: v for k, v in self.meta.items() if k not in data and k != "batch_size"})
        return yaml.safe_dump(data, sort_keys=False)


@dataclass
class BatchCurve:
    """L(B, w) of one batch size B > 1: ms per forward of B rows of w new tokens each, per KV length (per row)."""

    widths: list[int]  # new tokens per row
    curves: dict[int, dict[str, list[float]]]  # kv_length -> {"median_ms": [...], "p10_ms": [...], "p90_ms": [...]}


def _float_list(value, path, name) -> list[float]:
    if not isinstance(value, list) or not value or not all(isinstance(v, (int, float)) for v in value):
        raise SpecbenchError(f"{path}: field {name!r} must be a non-empty list of numbers")
    return [float(v) for v in value]


def load_profile(path: str | Path) -> LatencyProfile:
    """Read and validate a profiles/*.yaml file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecbenchError(f"profile not found: {path} (make one with `specbench profile`)") from None
    except yaml.YAMLError as exc:
        raise SpecbenchError(f"{path}: malformed YAML ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != "latency-profile":
        raise SpecbenchError(f"{path}: not a latency profile (expected `kind: latency-profile`)")
    for key in ("model", "dtype", "hardware", "widths", "curves"):
        if key not in data:
            raise SpecbenchError(f"{path}: missing field {key!r}")
    widths = _widths(data["widths"], path, "widths")
    curves = {}
    if not isinstance(data["curves"], list) or not data["curves"]:
        raise SpecbenchError(f"{path}: field 'curves' must be a non-empty list")
    for i, curve in enumerate(data["curves"]):
        if not isinstance(curve, dict) or "kv_length" not in curve or "median_ms" not in curve:
            raise SpecbenchError(f"{path}: curves[{i}] needs kv_length and median_ms")
        median = _float_list(curve["median_ms"], path, f"curves[{i}].median_ms")
        if len(median) != len(widths):
            raise SpecbenchError(f"{path}: curves[{i}].median_ms has {len(median)} values for {len(widths)} widths")
        curves[int(curve["kv_length"])] = {k: [float(x) for x in curve.get(k, median)]
                                           for k in ("median_ms", "p10_ms", "p90_ms")}
    meta = {k: v for k, v in data.items() if k not in ("kind", "model", "dtype", "hardware", "source", "widths",
                                                      "curves", "batch_curves")}
    return LatencyProfile(str(data["model"]), str(data["dtype"]), str(data["hardware"]),
                          str(data.get("source", "measured")), widths, curves, meta,
                          _batch_curves(data.get("batch_curves"), path))


def _widths(value, path, name) -> list[int]:
    widths = [int(w) for w in _float_list(value, path, name)]
    if widths != sorted(set(widths)) or widths[0] < 1:
        raise SpecbenchError(f"{path}: field {name!r} must be increasing positive integers")
    return widths


def _batch_curves(value, path) -> dict[int, BatchCurve]:
    """`batch_curves` (absent in batch-1 profiles): one entry per batch size B > 1 and KV length, each with its
    own widths; the entries of one B must share their widths."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise SpecbenchError(f"{path}: field 'batch_curves' must be a list")
    out: dict[int, BatchCurve] = {}
    for i, entry in enumerate(value):
        name = f"batch_curves[{i}]"
        if not isinstance(entry, dict) or not {"batch_size", "kv_length", "widths", "median_ms"} <= set(entry):
            raise SpecbenchError(f"{path}: {name} needs batch_size, kv_length, widths and median_ms")
        size = entry["batch_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 2:
            raise SpecbenchError(f"{path}: {name}.batch_size must be an integer >= 2 (batch 1 is `curves`)")
        widths = _widths(entry["widths"], path, f"{name}.widths")
        median = _float_list(entry["median_ms"], path, f"{name}.median_ms")
        if len(median) != len(widths):
            raise SpecbenchError(f"{path}: {name}.median_ms has {len(median)} values for {len(widths)} widths")
        curve = out.setdefault(size, BatchCurve(widths, {}))
        if curve.widths != widths:
            raise SpecbenchError(f"{path}: {name}.widths differ from another entry of batch size {size}")
        curve.curves[int(entry["kv_length"])] = {k: [float(x) for x in entry.get(k, median)]
                                                 for k in ("median_ms", "p10_ms", "p90_ms")}
    return out
