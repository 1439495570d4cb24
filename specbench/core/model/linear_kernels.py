"""The linear layers' kernel inside a compiled CPU forward (`--compile`, core/model/compile.py), chosen per width
bucket by a short measurement on this machine.

Why: inductor calls MKL's GEMM for every F.linear (x [w, K] @ W^T, W [N, K]). Its sgemm re-packs the big operand W
on every call from a few rows on, so a compiled forward of 4 tokens costs far more than the weights' bytes explain;
on AMD CPUs its one-row path (a GEMV) reads the weights at half the speed of oneDNN's. Candidates, each a float32-exact
linear (the same sums, another order):
- `mkl`: F.linear, inductor's default;
- `transposed`: (W @ x^T)^T: the big W is the streamed A operand and only the w x K input is packed;
- `onednn`: oneDNN's linear on the weight packed once (cpu_kernels.prepack's layout), a custom op inside the graph
  (inductor lowers the packed op itself only for frozen weights; here the weights stay graph inputs).
The same three at the run's dtype in bfloat16 (oneDNN through AVX512-BF16 / AMX where the CPU has them; the weight
packed here when it is not already).

The choice: for every bucket (powers of two up to 64 rows) each candidate runs over every linear layer of the model
once per round (one forward's linears, on inputs of that many rows; of a model over 1 GiB of linear weights, a 1 GiB
slice holding every shape), rounds alternating the candidates' order, and the
fastest median wins. Cached (unless other work ran beside the measurement: then it serves the run that made it)
per hardware key, dtype, thread count and the model's linear shapes in <user cache>/
linear_kernels/; a width runs at the choice of the smallest measured bucket holding it (the widest beyond them).
$SPECBENCH_COMPILE_LINEAR = mkl, transposed or onednn sets one kernel for every width instead (auto: measured).
The choice is made at trace time (each bucket is its own static graph), so the compiled graph holds only its kernel.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import types
from collections import Counter
from typing import Optional

import torch
import torch.nn.functional as F
import yaml

from .. import store
from ..machine import contention
from ...errors import SpecbenchError

ENV = "SPECBENCH_COMPILE_LINEAR"
KERNELS = ("mkl", "transposed", "onednn")
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
ROUNDS = 5
MEASURE_BYTES = 2**30  # weights one measured pass reads at most (timed_set)
BEFORE = "_specbench_forward_before"  # a Linear's own forward (instance attribute or none) while a choice is in use
PACK_ROWS_HINT = 8  # the row count oneDNN's packed layout is tuned for (cpu_kernels.PACK_ROWS_HINT)

_PACKED: list[Optional[torch.Tensor]] = []  # packed weights the custom op reads, by the index a module keeps


@torch.library.custom_op("specbench::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], index: int) -> torch.Tensor:
    """x [..., K] @ weight^T + bias through oneDNN on _PACKED[index] (weight's packed copy; weight itself is passed so
    the graph reads it where the model keeps it)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), _PACKED[index], bias, "none", [], "")


@packed_linear.register_fake
def _(x, weight, bias, index):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _mkl(module, x):
    return F.linear(x, module.weight, module.bias)


def _transposed(module, x):
    flat = x.reshape(-1, x.shape[-1])  # [w, K]
    out = torch.mm(module.weight, flat.t()).t()  # [N, K] @ [K, w] -> [w, N]
    if module.bias is not None:
        out = out + module.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _onednn(module, x):
    return packed_linear(x, module.weight, module.bias, module._specbench_pack_index)


KERNEL = {"mkl": _mkl, "transposed": _transposed, "onednn": _onednn}


def for_rows(choice: dict[int, str], rows: int) -> str:
    """The kernel of a forward of `rows` rows: the choice of the smallest measured bucket holding it (the widest
    bucket's beyond them)."""
    fits = [b for b in sorted(choice) if b >= rows]
    return choice[fits[0] if fits else max(choice)]


def linears(model) -> list[torch.nn.Linear]:
    """The model's plain nn.Linear layers on a CPU (each once)."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]


def candidates(dtype: torch.dtype) -> tuple[str, ...]:
    """Kernels worth measuring at `dtype`: oneDNN's packed linear where this torch has it, for float32 and bfloat16."""
    onednn = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
              and (dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())))
    return KERNELS if onednn else ("mkl", "transposed")


def shape_key(layers: list[torch.nn.Linear]) -> str:
    """A short digest of the layers' (out, in) shapes and counts: a choice belongs to the shapes it was timed on."""
    shapes = Counter((m.out_features, m.in_features, m.bias is not None) for m in layers)
    return hashlib.sha1(repr(sorted(shapes.items())).encode()).hexdigest()[:10]


def cache_file(hardware: str, dtype: torch.dtype, threads: int, shapes: str) -> "os.PathLike":
    name = f"{hardware}-{str(dtype).removeprefix('torch.')}-{threads}t-{shapes}.yaml"
    return store.user_cache() / "linear_kernels" / name


def _pack(layers: list[torch.nn.Linear]) -> None:
    """Give every layer an index into _PACKED holding its weight packed for oneDNN (cpu_kernels.prepack's copy where
    it made one; packed here otherwise)."""
    for m in layers:
        if getattr(m, "_specbench_pack_index", None) is not None:
            continue
        packed = getattr(m, "_specbench_packed", None)
        if packed is None:
            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), PACK_ROWS_HINT)
        m._specbench_pack_index = len(_PACKED)
        _PACKED.append(packed)


def _unpack(layers: list[torch.nn.Linear]) -> None:
    for m in layers:
        index = getattr(m, "_specbench_pack_index", None)
        if index is not None:
            _PACKED[index] = None
            m._specbench_pack_index = None


def timed_set(layers: list[torch.nn.Linear], budget: int = MEASURE_BYTES) -> list[torch.nn.Linear]:
    """The layers a measurement passes over: one of every shape, then the rest in model order while their weights
    stay within `budget` bytes (every layer of a small model; a slice of a large one, still far beyond the caches)."""
    chosen, shapes, total = [], set(), 0
    for m in layers:
        shape = (m.out_features, m.in_features)
        if shape not in shapes:
            shapes.add(shape)
            chosen.append(m)
            total += m.weight.numel() * m.weight.element_size()
    for m in layers:
        size = m.weight.numel() * m.weight.element_size()
        if any(m is c for c in chosen):
            continue
        if total + size > budget:
            break
        chosen.append(m)
        total += size
    return chosen


@torch.inference_mode()
def measure(layers: list[torch.nn.Linear], kernels, buckets=BUCKETS, rounds: int = ROUNDS) -> dict[int, dict]:
    """bucket -> {kernel: median ms of one pass over the layers (timed_set) at that many rows}, rounds alternating
    the order."""
    layers = timed_set(layers)
    dtype = layers[0].weight.dtype
    gen = torch.Generator().manual_seed(0)
    times: dict[int, dict] = {}
    for rows in buckets:
        inputs = {k: torch.randn(1, rows, k, generator=gen).to(dtype) for k in {m.in_features for m in layers}}
        taken: dict[str, list[float]] = {k: [] for k in kernels}
        for kernel in kernels:  # untimed: first calls (oneDNN's primitive cache, MKL's buffers)
            for m in layers:
                KERNEL[kernel](m, inputs[m.in_features])
        for r in range(rounds):
            for kernel in (kernels if r % 2 == 0 else kernels[::-1]):
                t0 = time.perf_counter()
                for m in layers:
                    KERNEL[kernel](m, inputs[m.in_features])
                taken[kernel].append((time.perf_counter() - t0) * 1e3)
        times[rows] = {k: round(statistics.median(v), 3) for k, v in taken.items()}
    return times


def choose(model, device: torch.device) -> dict:
    """The choice for `model`'s linear layers on this CPU: {"source", "choice": {bucket: kernel}, "times_ms"} (times
    only where measured); packs the weights when oneDNN is a candidate. Nothing for a model with no CPU linear
    layers or on another device ({} then)."""
    layers = linears(model)
    if torch.device(device).type != "cpu" or not layers:
        return {}
    dtype = layers[0].weight.dtype
    kernels = candidates(dtype)
    forced = os.environ.get(ENV, "auto").strip().lower()
    if forced != "auto":
        if forced not in KERNELS:
            raise SpecbenchError(f"${ENV}={forced!r}: use auto, {', '.join(KERNELS)}")
        if forced not in kernels:
            raise SpecbenchError(f"${ENV}={forced}: oneDNN's packed linear is not available here for {dtype}")
        if forced == "onednn":
            _pack(layers)
        return {"source": f"${ENV}", "choice": {b: forced for b in BUCKETS}}
    from ..machine.hardware import hardware_slug

    path = cache_file(hardware_slug(torch.device("cpu")), dtype, torch.get_num_threads(), shape_key(layers))
    if "onednn" in kernels:
        _pack(layers)
    cached = _read(path, kernels)
    if cached is not None:
        return {**cached, "source": f"cached {path}"}
    before = contention.snapshot()
    times = measure(layers, kernels)
    load = contention.between(before, contention.snapshot())
    found = {"choice": {b: min(t, key=t.get) for b, t in times.items()}, "times_ms": times,
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": ROUNDS,
             "foreign_cpu": load["foreign_cpu"]}
    if contention.disturbed(load):  # a busy machine's choice serves this run only: the next one measures again
        return {**found, "source": "measured now (disturbed: not cached)"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(found, sort_keys=False))
    except OSError:
        pass  # an unwritable cache measures again next time
    return {**found, "source": "measured now"}


def _read(path, kernels) -> dict | None:
    try:
        data = yaml.safe_load(path.read_text())
        choice = {int(b): str(k) for b, k in data["choice"].items()}
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError, AttributeError):
        return None
    if not choice or not set(choice.values()) <= set(kernels):
        return None
    return {**data, "choice": choice}


def _chosen_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # traced by torch.compile at a static shape: the bucket's kernel is picked here, in Python, once per graph
    if torch.compiler.is_compiling():
        return KERNEL[for_rows(self._specbench_linear_choice, x.numel() // x.shape[-1])](self, x)
    before = self.__dict__.get(BEFORE)  # eager (the prefill, a counted eager step): the layer's own forward
    return before(x) if before is not None else F.linear(x, self.weight, self.bias)


def use(model, device: torch.device) -> dict:
    """Route the model's CPU linear layers through the measured choice inside compiled graphs (their eager calls
    unchanged); returns what run.yaml's compile block says of it ({} where nothing is chosen)."""
    found = choose(model, device)
    if not found:
        return {}
    for m in linears(model):
        if BEFORE in m.__dict__:
            continue
        m.__dict__[BEFORE] = m.__dict__.get("forward")
        m._specbench_linear_choice = found["choice"]
        m.forward = types.MethodType(_chosen_forward, m)
    return {"source": found["source"], "choice": found["choice"],
            **({"times_ms": found["times_ms"]} if "times_ms" in found else {})}


def restore(model) -> None:
    """Give the model's linear layers back their own forward and drop packed copies made here."""
    layers = linears(model)
    for m in layers:
        if BEFORE not in m.__dict__:
            continue
        before = m.__dict__.pop(BEFORE)
        if before is None:
            del m.forward
        else:
            m.forward = before
        del m._specbench_linear_choice
    _unpack(layers)
