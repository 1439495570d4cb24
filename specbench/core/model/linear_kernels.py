"""The linear layers' kernel inside a compiled CPU forward (`--compile`, core/model/compile.py), chosen per width
bucket by a short measurement on this machine.

Why: inductor calls MKL's GEMM for every F.linear (x [w, K] @ W^T, W [N, K]). Its sgemm re-packs the big operand W
on every call from a few rows on, so a compiled forward of 4 tokens costs far more than the weights' bytes explain;
on AMD CPUs its one-row path (a GEMV) reads the weights at half the speed of oneDNN's. Candidates, each a float32-exact
linear (the same sums, another order):
- `mkl`: F.linear, inductor's default;
- `transposed`: (W @ x^T)^T: the big W is the streamed A operand and only the w x K input is packed;
- `onednn`: oneDNN's linear on the weight packed once (cpu_kernels.prepack's layout), a custom op inside the graph
  (inductor lowers the packed op itself only for frozen weights; here the weights stay graph inputs);
- `panel`: specbench's own C++ kernel on the weight packed in 16-column panels (panel_linear.py), float32, where the
  native library is built: at 1-4 rows it reads the weights near the machine's streaming bandwidth;
- `panel-ahead`: the same with software prefetches: the first row block's pass asks for its weights ahead of its
  reads, each thread prefetches its next tile while a tile's row blocks run (the next tile alone: 8-16% faster at
  12-32 rows on the AMX Xeon, 3-12% slower on the Zen 5 EPYC; with the first pass's too, 5-20% faster at 2-16 rows
  and in bfloat16 on AMX tiles on the AMX Xeon: benchmarks/RESULTS-cpu.md, stops 60, 62 and 67);
- `panel-dot` (bfloat16, where the native build has AVX512-BF16 and AMX tiles are not used): `panel-ahead` with each
  pair of k's summed by one vdpbf16ps (its order and rounding, not the pairwise multiply-adds'): 0.79x the time of
  `panel-ahead` over the embedded model's linears at 16 rows on a Zen 5 EPYC, 1.00-1.05x at 1-8 (stop 69).
The first three at the run's dtype in bfloat16 (oneDNN through AVX512-BF16 / AMX where the CPU has them; the weight
packed here when it is not already).

The choice: for every bucket (powers of two up to 64 rows) each candidate runs over every linear layer of the model
once per round (one forward's linears, on inputs of that many rows; of a model over 1 GiB of linear weights, a 1 GiB
slice holding every shape), rounds alternating the candidates' order, and the
fastest median wins. Cached (unless other work ran beside the measurement: then it serves the run that made it)
per hardware key, dtype, thread count and the model's linear shapes in <user cache>/
linear_kernels/; a width runs at the choice of the smallest measured bucket holding it (the widest beyond them).
$SPECBENCH_COMPILE_LINEAR = one of KERNELS sets that kernel for every width instead (auto: measured).
The choice is made at trace time (each bucket is its own static graph), so the compiled graph holds only its kernel.
Where it lives: in the compiled step's own model (core/model/compile_graph.py: a twin of the module tree sharing
every tensor, its linear layers ChosenLinear); the packed copies in a table weak-keyed by layer. No attribute or forward of the model's
own modules is set: its eager forwards are untouched.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import weakref
from collections import Counter
from typing import Optional

import torch
import torch.nn.functional as F
import yaml

from .. import store
from . import cpu_kernels, native_linear, panel_linear
from ..machine import contention
from ...errors import SpecbenchError

ENV = "SPECBENCH_COMPILE_LINEAR"
KERNELS = ("mkl", "transposed", "onednn", "panel", "panel-ahead", "panel-dot")
# the panels kernels: their (`ahead`, `dot`) (panel_linear.linear)
PANELS = {"panel": (False, False), "panel-ahead": (True, False), "panel-dot": (True, True)}
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
ROUNDS = 5
MEASURE_BYTES = 2**30  # weights one measured pass reads at most (timed_set)
PACK_ROWS_HINT = 8  # the row count oneDNN's packed layout is tuned for (cpu_kernels.PACK_ROWS_HINT)

_PACKED: list[Optional[torch.Tensor]] = []  # packed weights the custom op reads, by index
# linear layer -> its index into _PACKED: a table of its own, weak-keyed, so nothing is stored on the layer; an entry
# (and its packed copy) goes with its layer
_PACK_INDEX: "weakref.WeakKeyDictionary[torch.nn.Linear, int]" = weakref.WeakKeyDictionary()


@torch.library.custom_op("specbench::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], index: int) -> torch.Tensor:
    """x [..., K] @ weight^T + bias through oneDNN on _PACKED[index] (weight's packed copy; weight itself is passed so
    the graph reads it where the model keeps it)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), _PACKED[index], bias, "none", [], "")


@packed_linear.register_fake
def _(x, weight, bias, index):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


# the kernels: (weight [N, K], bias [N] or None, x [..., K], the weight's pack index or None) -> [..., N]
def _mkl(weight, bias, x, index):
    return F.linear(x, weight, bias)


def _transposed(weight, bias, x, index):
    flat = x.reshape(-1, x.shape[-1])  # [w, K]
    out = torch.mm(weight, flat.t()).t()  # [N, K] @ [K, w] -> [w, N]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def native_ready() -> bool:
    """Whether native_linear's C++ op runs the packed linears (built and loaded on the first call); the first call
    that finds it loaded puts every copy packed before then into its table at its own index (keep() puts the later
    ones). Whoever loaded the library (the panels' check loads it at float32, choose() at any dtype), a copy packed
    before the load is in the table before the op reads it: a bfloat16 `profile --compile` once packed first, loaded
    second, and the op found an empty table."""
    if not native_linear.ready():
        return False
    if not _SYNCED:
        for index, packed in enumerate(_PACKED):
            if packed is not None:
                native_linear.put(index, packed)
        _SYNCED.append(True)
    return True


_SYNCED: list[bool] = []  # [True] once native_ready() put _PACKED's copies into the loaded library's table


def _onednn(weight, bias, x, index):
    if native_ready():  # the C++ op: no Python between the compiled graph and oneDNN (native_linear.py)
        return native_linear.linear(x, bias, index, weight.shape[0])
    return packed_linear(x, weight, bias, index)


KERNEL = {"mkl": _mkl, "transposed": _transposed, "onednn": _onednn}


def apply(kernel: str, m: torch.nn.Linear, x: torch.Tensor, panels: torch.Tensor | None = None) -> torch.Tensor:
    """Layer `m` on x [..., K] through `kernel` (KERNELS); the panels kernels (PANELS) read `panels`, the layer's
    weight in panels (panel_linear.copy_of(m) where not given)."""
    if kernel in PANELS:
        packed = panel_linear.copy_of(m) if panels is None else panels
        return panel_linear.linear(x, packed, m.out_features, m.bias, *PANELS[kernel])
    return KERNEL[kernel](m.weight, m.bias, x, pack_index(m))


def for_rows(choice: dict[int, str], rows: int) -> str:
    """The kernel of a forward of `rows` rows: the choice of the smallest measured bucket holding it (the widest
    bucket's beyond them)."""
    fits = [b for b in sorted(choice) if b >= rows]
    return choice[fits[0] if fits else max(choice)]


def runs_panels(choice: dict[int, str]) -> bool:
    """Whether some bucket of `choice` runs a panels kernel (so the weights need their copy in panels)."""
    return any(k in PANELS for k in choice.values())


def linears(model) -> list[torch.nn.Linear]:
    """The model's plain nn.Linear layers on a CPU (each once)."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]


def candidates(dtype: torch.dtype) -> tuple[str, ...]:
    """Kernels worth measuring at `dtype`: oneDNN's packed linear where this torch has it, for float32 and bfloat16;
    the panels (with and without the next tile's prefetch) in float32 and bfloat16 where the native library is
    built."""
    onednn = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
              and (dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())))
    panels = panel_linear.available(dtype)
    # panel-dot: bfloat16 on a CPU whose native build has AVX512-BF16's dot products (else the same as panel-ahead)
    dot = panels and dtype == torch.bfloat16 and panel_linear.dot_pairs()
    kinds = tuple(k for k in PANELS if k != "panel-dot" or dot) if panels else ()
    return ("mkl", "transposed") + (("onednn",) if onednn else ()) + kinds


def shape_key(layers: list[torch.nn.Linear]) -> str:
    """A short digest of the layers' (out, in) shapes and counts: a choice belongs to the shapes it was timed on."""
    shapes = Counter((m.out_features, m.in_features, m.bias is not None) for m in layers)
    return hashlib.sha1(repr(sorted(shapes.items())).encode()).hexdigest()[:10]


def cache_file(hardware: str, dtype: torch.dtype, threads: int, shapes: str) -> "os.PathLike":
    name = f"{hardware}-{str(dtype).removeprefix('torch.')}-{threads}t-{shapes}.yaml"
    return store.user_cache() / "linear_kernels" / name


def _pack(layers: list[torch.nn.Linear]) -> None:
    """Give every layer an index into _PACKED holding its weight packed for oneDNN (cpu_kernels.prepack's copy where
    it made one; packed here otherwise), kept in _PACK_INDEX (the layer itself is not touched)."""
    for m in layers:
        if m in _PACK_INDEX:
            continue
        packed = cpu_kernels.packed_copy(m)
        if packed is None:
            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), PACK_ROWS_HINT)
        _PACK_INDEX[m] = keep(packed)
        weakref.finalize(m, _free, _PACK_INDEX[m])


def keep(packed: torch.Tensor) -> int:
    """A packed copy's index into _PACKED (and, at the same index, native_linear's table)."""
    _PACKED.append(packed)
    native_linear.put(len(_PACKED) - 1, packed)
    return len(_PACKED) - 1


def _free(index: int) -> None:
    if index < len(_PACKED):
        _PACKED[index] = None
    native_linear.free(index)


def _unpack(layers: list[torch.nn.Linear]) -> None:
    """Drop the layers' packed copies made or taken here (their next _pack packs again)."""
    for m in layers:
        index = _PACK_INDEX.pop(m, None)
        if index is not None:
            _free(index)


def pack_index(m: torch.nn.Linear) -> int | None:
    return _PACK_INDEX.get(m)


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
    panels = {id(m): panel_linear.pack(m.weight) for m in layers} if PANELS.keys() & set(kernels) else {}

    def call(kernel: str, m: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return apply(kernel, m, x, panels.get(id(m)))

    for rows in buckets:
        inputs = {k: torch.randn(1, rows, k, generator=gen).to(dtype) for k in {m.in_features for m in layers}}
        taken: dict[str, list[float]] = {k: [] for k in kernels}
        for kernel in kernels:  # untimed: first calls (oneDNN's primitive cache, MKL's buffers)
            for m in layers:
                call(kernel, m, inputs[m.in_features])
        for r in range(rounds):
            for kernel in (kernels if r % 2 == 0 else kernels[::-1]):
                t0 = time.perf_counter()
                for m in layers:
                    call(kernel, m, inputs[m.in_features])
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
    if not cpu_kernels.room_for_copies(model):  # no room for a copy in panels
        kernels = tuple(k for k in kernels if k not in PANELS)
    forced = os.environ.get(ENV, "auto").strip().lower()
    if forced != "auto":
        if forced not in KERNELS:
            raise SpecbenchError(f"${ENV}={forced!r}: use auto, {', '.join(KERNELS)}")
        if forced not in kernels:
            raise SpecbenchError(f"${ENV}={forced}: that kernel is not available here for {dtype} (candidates: "
                                 f"{', '.join(kernels)})")
        if forced == "onednn":
            _pack(layers)
        return {"source": f"${ENV}", "choice": {b: forced for b in BUCKETS}}
    from ..machine.hardware import hardware_slug

    path = cache_file(hardware_slug(torch.device("cpu")), dtype, torch.get_num_threads(), shape_key(layers))
    if "onednn" in kernels:
        _pack(layers)
    native = native_linear.library_path().name if native_linear.ready() else None  # its name holds its source's hash
    cached = _read(path, kernels, native)
    if cached is not None:
        return {**cached, "source": f"cached {path}"}
    before = contention.snapshot()
    times = measure(layers, kernels)
    load = contention.between(before, contention.snapshot())
    found = {"choice": {b: min(t, key=t.get) for b, t in times.items()}, "kernels": list(kernels), "native": native,
             "times_ms": times,
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


def _read(path, kernels, native: str | None) -> dict | None:
    try:
        data = yaml.safe_load(path.read_text())
        choice = {int(b): str(k) for b, k in data["choice"].items()}
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError, AttributeError):
        return None
    if not choice or data.get("kernels") != list(kernels):  # measured among other candidates: measure again
        return None
    if data.get("native") != native:  # measured with other native kernels (another build of their C++): again
        return None
    return {**data, "choice": choice}


class ChosenLinear(torch.nn.Module):
    """A linear layer of the compiled graph's own model (compile_graph.py): the model's nn.Linear, untouched, run through
    the kernel its bucket chose. Traced by torch.compile at a static shape: the bucket's kernel is picked here, in
    Python, once per graph; an eager call (the compiled step run uncompiled) is the layer's own forward."""

    def __init__(self, linear: torch.nn.Linear, choice: dict[int, str], own_panels: bool = True):
        super().__init__()
        self.linear = linear
        self.choice = choice
        self.index = pack_index(linear)  # its weight's packed copy in _PACKED (oneDNN), or None
        # its weight in panels where a bucket runs them (a graph input like the weight; a fused member reads its group's)
        wanted = own_panels and runs_panels(choice)
        self.register_buffer("panels", panel_linear.copy_of(linear) if wanted else None, persistent=False)

    weight = property(lambda self: self.linear.weight)
    bias = property(lambda self: self.linear.bias)
    in_features = property(lambda self: self.linear.in_features)
    out_features = property(lambda self: self.linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            kernel = for_rows(self.choice, x.numel() // x.shape[-1])
            if kernel in PANELS:
                return panel_linear.linear(x, self.panels, self.out_features, self.linear.bias, *PANELS[kernel])
            return KERNEL[kernel](self.linear.weight, self.linear.bias, x, self.index)
        return self.linear(x)


def use(model, device: torch.device) -> dict:
    """The measured choice for the model's CPU linear layers (their packed copies made where oneDNN is a candidate),
    as run.yaml's compile block says it; {} where nothing is chosen. The compiled step's own model
    (core/model/compile_graph.graph_model) runs it inside its graphs."""
    found = choose(model, device)
    if not found:
        return {}
    onednn = "onednn" in found["choice"].values() or runs_panels(found["choice"])  # the native library's ops
    if onednn:
        native_ready()  # built and loaded now, before any graph traces it; the copies choose packed kept in its table
    return {"source": found["source"], "choice": found["choice"],
            **({"operator": native_linear.status()} if onednn else {}),
            **({"times_ms": found["times_ms"]} if "times_ms" in found else {})}
