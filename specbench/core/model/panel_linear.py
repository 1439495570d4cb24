"""A linear of a few rows on weights packed in 16-column panels: specbench's own CPU kernel (native_linear's C++
`panels`), one of the candidates a compiled CPU forward chooses per width bucket (linear_kernels.py).

Why: at 1-4 rows a linear reads its weight once and does little else, so it should run at the machine's streaming
bandwidth. oneDNN's packed linear spends ~10 us a call before it reads (its primitive, its threads), so the small
matrices of a small model read at 28-35 GB/s where the machine streams 42-46: a 576 x 576 float32 weight took 44-47 us
through oneDNN against 34 us here, the 49152 x 576 LM head 2.53 against 2.39 ms (benchmarks/RESULTS-cpu.md, stop 59).
From 8 rows on oneDNN's blocked GEMM wins, and the measurement picks it there.

How: the weight W [N, K] is copied once into panels [ceil(N / 16), K, 16] (panel p holds W[16 p : 16 p + 16]^T, the
last one zero-padded), one contiguous stream per panel. For each k, a panel's 16 weights times each row's x[k] add
into a 16-float vector register: 4 panels at a time at up to 4 rows (independent sums hide the multiply-add's
latency), 2 at 5-8 rows, rows in passes of 8, panels split between the threads. A row's sums run in k's order
whatever rows sit beside it, so a token's output is the same at every width. Float32 only, and only where the native
library is built (`available`). The copies: one per layer, the fused groups' one per group (fused_linears.py), kept
weak-keyed by layer, made only for a compiled step whose choice runs this kernel (memory_need counts them).
"""

from __future__ import annotations

import weakref

import torch

from . import native_linear

PANEL = 16  # output columns per panel: one 16-float vector

# specbench_native::panels (native_linear builds it into the library with the other operators)
SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace specbench_panels {
typedef float v16 __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, two AVX2 ones
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // the same, read from any float's address

// columns [16 p, 16 p + 16 G) of R rows: for every k, each panel's 16 weights times each row's x[k], summed in k's
// order (the same sums for a row whatever R is: a row's output never depends on the rows beside it)
template <int R, int G>
inline void panel_rows(const float* x, int64_t K, const float* P, int64_t p, float* out, int64_t N) {
  v16 acc[G][R];
  for (int g = 0; g < G; ++g) for (int r = 0; r < R; ++r) acc[g][r] = v16{};
  const float* w = P + p * K * 16;
  for (int64_t k = 0; k < K; ++k) {
    v16 wv[G];
    for (int g = 0; g < G; ++g) wv[g] = *(const v16u*)(w + (g * K + k) * 16);
    for (int r = 0; r < R; ++r) {
      const float xs = x[r * K + k];
      for (int g = 0; g < G; ++g) acc[g][r] += wv[g] * xs;
    }
  }
  for (int g = 0; g < G; ++g) {
    const int64_t n = (p + g) * 16, take = std::min<int64_t>(16, N - n);
    for (int r = 0; r < R; ++r) {
      float s[16];
      __builtin_memcpy(s, &acc[g][r], 64);
      for (int64_t j = 0; j < take; ++j) out[r * N + n + j] = s[j];
    }
  }
}

// R rows over all panels, split between the threads; G panels at a time (independent sums to hide FMA latency)
template <int R>
void panel_pass(const float* x, int64_t K, const float* P, int64_t N, float* out) {
  constexpr int G = R <= 4 ? 4 : 2;
  at::parallel_for(0, (N + 15) / 16, 8, [&](int64_t a, int64_t b) {
    int64_t p = a;
    for (; p + G <= b; p += G) panel_rows<R, G>(x, K, P, p, out, N);
    for (; p < b; ++p) panel_rows<R, 1>(x, K, P, p, out, N);
  });
}

at::Tensor panels(const at::Tensor& x_, const at::Tensor& packed, int64_t out_features,
                  const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "specbench_native::panels: float32 only, packed contiguous");
  const auto x = x_.contiguous();
  const int64_t K = x.size(-1), rows = x.numel() / K, N = out_features;
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == K && packed.size(2) == 16 && packed.size(0) * 16 >= N,
              "specbench_native::panels: packed is not [ceil(N / 16), K, 16]");
  auto shape = x.sizes().vec();
  shape.back() = N;
  auto out = at::empty(shape, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; r += 8) {  // 8 rows a pass: more would spill the accumulators
    const float* xr = xp + r * K;
    float* o = op + r * N;
    switch (std::min<int64_t>(8, rows - r)) {
      case 1: panel_pass<1>(xr, K, wp, N, o); break;
      case 2: panel_pass<2>(xr, K, wp, N, o); break;
      case 3: panel_pass<3>(xr, K, wp, N, o); break;
      case 4: panel_pass<4>(xr, K, wp, N, o); break;
      case 5: panel_pass<5>(xr, K, wp, N, o); break;
      case 6: panel_pass<6>(xr, K, wp, N, o); break;
      case 7: panel_pass<7>(xr, K, wp, N, o); break;
      default: panel_pass<8>(xr, K, wp, N, o); break;
    }
  }
  if (bias.has_value()) out.add_(*bias);
  return out;
}
}  // namespace specbench_panels

TORCH_LIBRARY_FRAGMENT(specbench_native, m) {
  m.def("panels(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
}
TORCH_LIBRARY_IMPL(specbench_native, CPU, m) { m.impl("panels", &specbench_panels::panels); }
"""

_COPIES: "weakref.WeakKeyDictionary[torch.nn.Linear, torch.Tensor]" = weakref.WeakKeyDictionary()


def available(dtype: torch.dtype) -> bool:
    """Whether the kernel runs at `dtype` here: float32, with the native library built and loaded."""
    return dtype == torch.float32 and native_linear.ready()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> panels [ceil(N / 16), K, 16], float32, contiguous; the padded columns zero."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    with torch.no_grad():
        padded = weight.detach().new_zeros(panels * PANEL, k, dtype=torch.float32)
        padded[:n] = weight.detach()
        return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def copy_of(layer: torch.nn.Linear) -> torch.Tensor:
    """The layer's packed copy (made once, kept while the layer lives)."""
    if layer not in _COPIES:
        _COPIES[layer] = pack(layer.weight)
    return _COPIES[layer]


def group_copy(members: list[torch.nn.Linear]) -> torch.Tensor:
    """The members' weights concatenated ([sum of out, K]) and packed (once per group, kept with its first member)."""
    head = members[0]
    if head not in _COPIES:
        _COPIES[head] = pack(torch.cat([m.weight.detach() for m in members]))
    return _COPIES[head]


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) -> [..., out_features] on W's packed copy."""
    return torch.ops.specbench_native.panels(x, packed, out_features, bias)


def fake(x, packed, out_features, bias):
    return x.new_empty(*x.shape[:-1], out_features)


def drop(layers) -> None:
    """Forget the layers' copies (tests; a copy otherwise goes with its layer)."""
    for m in layers:
        _COPIES.pop(m, None)
