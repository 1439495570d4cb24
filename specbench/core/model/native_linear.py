"""The compiled CPU forward's own C++ operators (core/model/linear_kernels.py, fused_linears.py, panel_linear.py):
the packed oneDNN linear, so that the compiled graph's C++ wrapper calls it without entering Python, and `panels`,
a linear of a few rows on weights packed in 16-column panels (panel_linear.py says why).

Why: the packed linear is a custom op (inductor lowers oneDNN's own op only for frozen weights, and here the weights
stay graph inputs). Written in Python, each of a forward's 121 calls (SmolLM2, q/k/v and gate/up fused) goes from
the C++ wrapper through the dispatcher into Python and back: ~5 us a call more than a C++ kernel, ~0.6 ms a forward
(benchmarks/RESULTS-cpu.md, stop 58).

How: a few lines of C++ (LINEAR_SOURCE) define `specbench_native::linear(x, bias, index, out_features)`, oneDNN's
`mkldnn::_linear_pointwise` on the packed weight kept at `index` of a table of the library's own, and
`specbench_native::put(index, packed)` / `drop(index)`; the panels (native_source.py) and attention
(native_attention_source.py) add their operators to the same library (source()). The table mirrors
linear_kernels._PACKED index for index (`put`: every packed copy is kept in both, at the same index;
linear_kernels.native_ready puts the copies packed before the library loaded). The library is built once per
source, torch version, C++ ABI and CPU kind (-march=native: the key names the CPU's flags) with the C++ compiler
inductor itself needs on a CPU (g++ / c++), into <user cache>/native/, and loaded with torch.ops.load_library.
Where it cannot be built or loaded (no compiler, an error), or with $SPECBENCH_COMPILE_NATIVE=0, the Python op runs
as before; `status()` says which, and why (run.yaml's compile block).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

from . import native_attention_source, native_source

ENV = "SPECBENCH_COMPILE_NATIVE"  # 0: the Python custom op
LINEAR_SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>
#include <vector>

namespace {
std::vector<at::Tensor>& table() { static std::vector<at::Tensor> packed; return packed; }

// the packed weight of linear_kernels._PACKED[index], kept at the same index
void put(int64_t index, const at::Tensor& packed) {
  if ((int64_t)table().size() <= index) table().resize(index + 1);
  table()[index] = packed;
}
void drop(int64_t index) { if (index < (int64_t)table().size()) table()[index] = at::Tensor(); }

// x [..., K] @ W^T (+ bias) through oneDNN on the packed W kept at `index`: [..., out_features]
at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& bias, int64_t index, int64_t out_features) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x.contiguous());
  stack.emplace_back(table().at(index));
  stack.emplace_back(bias.has_value() ? c10::IValue(*bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  op.callBoxed(&stack);
  return stack[0].toTensor();
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(specbench_native, m) {
  m.def("put(int index, Tensor packed) -> ()", &put);
  m.def("drop(int index) -> ()", &drop);
  m.def("linear(Tensor x, Tensor? bias, int index, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(specbench_native, CPU, m) { m.impl("linear", &linear); }
"""

_STATE: dict = {"loaded": None, "why": ""}  # loaded: None (not tried), True or False; why: the reason it is not


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def source() -> str:
    """The library's C++: the packed linear (LINEAR_SOURCE), the panels (native_source.py) and attention
    (native_attention_source.py); each defines its own operators in the one namespace (TORCH_LIBRARY_FRAGMENT)."""
    return "\n".join((LINEAR_SOURCE, native_source.PANELS, native_attention_source.ATTENTION))


def _cpu_flags() -> str:
    """The CPU's feature flags (/proc/cpuinfo's first `flags` line; '' elsewhere): a library built with -march=native
    belongs to the CPU it was built on (a user cache shared between machines builds one per CPU kind)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def library_path() -> Path:
    from ..store import user_cache

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha1(f"{source()}{torch.__version__}{abi}{_cpu_flags()}".encode()).hexdigest()[:12]
    return user_cache() / "native" / f"specbench_native-{key}.so"


def build_library(path: Path, text: str) -> None:
    """Compile the C++ `text` into the shared library `path` with the native library's flags (source() for the
    library itself; benchmarks/attention_ab.py builds two revisions of the attention the same way). Raises
    RuntimeError with the compiler's last lines on failure."""
    from torch.utils import cpp_extension

    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or c++) on PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    cpp = path.with_name(f"{path.stem}.{os.getpid()}.cpp")  # files of this process's own: two builds never mix
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    cpp.write_text(text)
    libs = cpp_extension.library_paths()
    # -march=native: the panels' vector code for this CPU (the library's key names the CPU's flags); -fopenmp: ATen's
    # parallel_for, on the OpenMP runtime torch already loaded (the same soname, so one thread pool)
    command = [compiler, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++20", "-w",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *[f"-I{p}" for p in cpp_extension.include_paths()], str(cpp), "-o", str(part),
               *[f"-L{p}" for p in libs], "-lc10", "-ltorch_cpu", "-ltorch", *[f"-Wl,-rpath,{p}" for p in libs]]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-400:]}")
        os.replace(part, path)  # whole or not at all: a concurrent run never loads half a file
    finally:
        cpp.unlink(missing_ok=True)
        part.unlink(missing_ok=True)


def ready() -> bool:
    """Whether the C++ op runs the packed linears (built and loaded on the first call; not with $ENV=0)."""
    if os.environ.get(ENV, "1").strip() == "0":
        _STATE["why"] = f"${ENV}=0"
        return False
    if _STATE["loaded"] is None:
        try:
            path = library_path()
            if not path.exists():
                build_library(path, source())
            torch.ops.load_library(str(path))
            torch.library.register_fake("specbench_native::linear")(_fake)
            torch.library.register_fake("specbench_native::panels")(_fake_panels)
            torch.library.register_fake("specbench_native::attention")(_fake_attention)
            _STATE["loaded"] = True
        except (RuntimeError, OSError) as error:
            _STATE["loaded"], _STATE["why"] = False, str(error).splitlines()[0][:200]
    return bool(_STATE["loaded"])


def loaded() -> bool:
    """Whether the library is loaded already (ready() without trying to build or load it)."""
    return bool(_STATE["loaded"])


def _fake(x, bias, index, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


def _fake_panels(x, packed, out_features, bias, ahead=False, dot=False):
    return x.new_empty(*x.shape[:-1], out_features)


def _fake_attention(query, key, value, mask, scale):
    b, heads, q, d = query.shape
    return query.new_empty(b, q, heads, d)  # [B, Q, H, D]


def put(index: int, packed: torch.Tensor) -> None:
    """Keep `packed` (linear_kernels._PACKED[index]) at the same index of the library's table, where it is loaded."""
    if _STATE["loaded"]:
        torch.ops.specbench_native.put(index, packed)


def free(index: int) -> None:
    if _STATE["loaded"]:
        torch.ops.specbench_native.drop(index)


def linear(x: torch.Tensor, bias: torch.Tensor | None, index: int, out_features: int) -> torch.Tensor:
    return torch.ops.specbench_native.linear(x, bias, index, out_features)


def status() -> str:
    """run.yaml's word on the packed linears' operator: native (C++), or python and why."""
    return "native (C++)" if ready() else f"python ({_STATE['why'] or 'not built'})"
