"""The C++ of the native library's panels linear (native_linear builds it with its packed linear and attention,
native_attention_source.py, into one library): `specbench_native::panels`, a linear on weights packed in 16-column
panels (panel_linear.py says why and how). It defines its operator in the library's namespace
(TORCH_LIBRARY_FRAGMENT) inside a C++ namespace of its own. Kept apart from the Python that calls it so that the
builder imports no caller (no import cycle). bfloat16 goes through AMX tiles where it can (native_amx_source.py), and
with `dot` through AVX512-BF16's pair dot products where the build has them (the measured choice's `panel-dot`)."""

from .native_amx_source import AMX

# specbench_native::panels(x, packed, out_features, bias, ahead=False, dot=False) -> [..., out_features];
# specbench_native::panels_dot() -> whether `dot` has its path in this build
PANELS = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cstring>
#include <memory>
#include <type_traits>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace specbench_panels {
typedef float v16 __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, two AVX2 ones
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // the same, read from any float's address
typedef uint32_t w16 __attribute__((vector_size(64)));
typedef uint32_t w16u __attribute__((vector_size(64), aligned(2)));  // 32 bfloat16 weights as 16 pairs, any address
// how far ahead of its reads a pass prefetches its own weights (`ahead`): 2 KB of each panel's stream. 16-48 lines
// measured alike (the AMX Xeon, 2-8 rows: 0.88-0.97 of the time without; 1.02-1.04 at one float32 row, where the
// measured choice keeps `panel`)
constexpr int64_t SOON_LINES = 32;

// bfloat16 weights summed with AVX512-BF16's pair dot products (vdpbf16ps), where the CPU has them and AMX is not
// used: the same packed panels as uint16_t's, x given as bfloat16 pairs (built once a call in panels())
struct DotPairs { uint16_t bits; };
#if defined(__AVX512BF16__)
constexpr bool DOT_PAIRS = true;  // (panels_dot(): whether `dot` takes this path in this build)
#else
constexpr bool DOT_PAIRS = false;
#endif
template <typename W>
constexpr bool is_bf16 = std::is_same_v<W, uint16_t> || std::is_same_v<W, DotPairs>;

// a panel's k's as packed: float32 K; bfloat16 K rounded up to pairs (its panel holds, per pair of k's, each
// column's two weights side by side: [K / 2, 16, 2]; an odd K's last pair padded with 0)
template <typename W>
constexpr int64_t packed_k(int64_t K) { return is_bf16<W> ? K + (K & 1) : K; }

// columns [16 p, 16 p + 16 G) of R rows: for every k, each panel's 16 weights (W: float, or uint16_t holding
// bfloat16; DotPairs: bfloat16 summed a pair of k's at a time by vdpbf16ps) times each row's x[k], summed in float32
// in k's order (the same sums for a row whatever R and G are: a
// row's output never depends on the rows beside it); meanwhile `lines` cache lines from `pre` on are prefetched
// into L2, evenly over the k's (0: none), and with `soon` > 0 each panel's weights `soon` elements past the ones read
// (the same stream, SOON_LINES cache lines on: a pass that sums several rows a line asks for its lines too late for
// the hardware prefetcher alone, so its stream ran slower than a one-row pass's)
template <int R, int G, typename W>
inline void panel_rows(const float* x, int64_t K, const W* P, int64_t p, float* out, int64_t N,
                       const W* pre, int64_t lines, int64_t soon) {
  v16 acc[G][R];
  for (int g = 0; g < G; ++g) for (int r = 0; r < R; ++r) acc[g][r] = v16{};
  const W* w = P + p * packed_k<W>(K) * 16;
  int64_t due = 0;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<W, DotPairs>) {
    // x's pair of k's at slot k of its row (bfloat16: k low, k + 1 high), times each column's pair, both
    // products added to the column's float32 sum in one instruction (its order and rounding, not the loop's below)
    const int64_t KP = packed_k<W>(K);
    for (int64_t k = 0; k < KP; k += 2) {
      due += 2 * lines;
      while (due >= K) { due -= K; __builtin_prefetch(pre, 0, 2); pre += 32; }
      if (soon) for (int g = 0; g < G; ++g) __builtin_prefetch(w + (g * KP + k) * 16 + soon, 0, 3);
      __m512bh wv[G];
      for (int g = 0; g < G; ++g) wv[g] = (__m512bh)_mm512_loadu_si512((const void*)(w + (g * KP + k) * 16));
      for (int r = 0; r < R; ++r) {
        uint32_t bits;
        __builtin_memcpy(&bits, x + r * K + k, 4);
        const __m512bh xs = (__m512bh)_mm512_set1_epi32((int)bits);
        for (int g = 0; g < G; ++g) acc[g][r] = (v16)_mm512_dpbf16_ps((__m512)acc[g][r], wv[g], xs);
      }
    }
  } else
#endif
  if constexpr (std::is_same_v<W, uint16_t>) {
    // bfloat16, a pair of k's at a time: one 64-byte read holds each column's weights at k and k + 1 as one 32-bit
    // lane; k's are the low halves shifted up, k + 1's the high halves masked (both exact floats), added in k's order
    // (2 vector operations a 32 weights, where a widening read took 4: the bfloat16 panels ran at ~2.5x float32's
    // cost a weight in the cache)
    const int64_t KP = packed_k<W>(K);
    for (int64_t k = 0; k < KP; k += 2) {
      due += 2 * lines;
      while (due >= K) { due -= K; __builtin_prefetch(pre, 0, 2); pre += 32; }
      if (soon) for (int g = 0; g < G; ++g) __builtin_prefetch(w + (g * KP + k) * 16 + soon, 0, 3);
      v16 lo[G], hi[G];
      for (int g = 0; g < G; ++g) {
        const w16 pair = *(const w16u*)(w + (g * KP + k) * 16);
        lo[g] = (v16)(pair << 16);
        hi[g] = (v16)(pair & 0xFFFF0000u);
      }
      for (int r = 0; r < R; ++r) {
        const float x0 = x[r * K + k];
        for (int g = 0; g < G; ++g) acc[g][r] += lo[g] * x0;
        if (k + 1 < K) {  // (an odd K's padding: never added)
          const float x1 = x[r * K + k + 1];
          for (int g = 0; g < G; ++g) acc[g][r] += hi[g] * x1;
        }
      }
    }
  } else for (int64_t k = 0; k < K; ++k) {
    due += lines;
    while (due >= K) { due -= K; __builtin_prefetch(pre, 0, 2); pre += 64 / sizeof(W); }
    if (soon) for (int g = 0; g < G; ++g) __builtin_prefetch(w + (g * K + k) * 16 + soon, 0, 3);
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
      if (take == 16) { *(v16u*)(out + r * N + n) = acc[g][r]; continue; }
      float s[16];
      __builtin_memcpy(s, &acc[g][r], 64);
      for (int64_t j = 0; j < take; ++j) out[r * N + n + j] = s[j];
    }
  }
}

template <int G, typename W>
inline void block_rows(int64_t R, const float* x, int64_t K, const W* P, int64_t p, float* out, int64_t N,
                       const W* pre = nullptr, int64_t lines = 0, int64_t soon = 0) {
  switch (R) {
    case 1: panel_rows<1, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    case 2: panel_rows<2, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    case 3: panel_rows<3, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    case 4: panel_rows<4, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    case 5: panel_rows<5, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    case 6: panel_rows<6, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    case 7: panel_rows<7, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
    default: panel_rows<8, G, W>(x, K, P, p, out, N, pre, lines, soon); break;
  }
}

// every row block [start[b], start[b + 1]) over each tile of G panels before the next tile: a tile's weights come
// from memory once, the later blocks read them from the cache (rows in passes over the whole weight read it once a
// pass: 16 rows of the LM head took 2.0x 8 rows' time, benchmarks/RESULTS-cpu.md, stop 60); tiles split between the
// threads. `ahead`: the software prefetches: the first block's pass asks for its own weights SOON_LINES lines before
// it reads them, and where a tile has two blocks or more the thread's next tile is prefetched meanwhile, a share in
// each block's pass, so the later passes' sums overlap the next weights' stream
template <int G, typename W>
void tiles(const float* x, const int64_t* start, int64_t blocks, int64_t K, const W* P, int64_t N, float* out,
           bool ahead) {
  const int64_t panels = (N + 15) / 16;
  const bool prefetch = ahead && blocks >= 2;
  at::parallel_for(0, (panels + G - 1) / G, 1, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) {
      const int64_t p = t * G;
      // the next tile's cache lines (a panel is K rows of 16 weights: K lines of float32, K / 2 of bfloat16), 0 for
      // a thread's last tile
      const int64_t next = prefetch && t + 1 < e
          ? (std::min(panels, p + 2 * G) - std::min(panels, p + G)) * packed_k<W>(K) * (int64_t)sizeof(W) / 4 : 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = start[b], R = start[b + 1] - r0;
        const int64_t l0 = next * b / blocks, l1 = next * (b + 1) / blocks;
        const W* pre = P + (p + G) * packed_k<W>(K) * 16 + l0 * (64 / sizeof(W));
        const int64_t soon = ahead && b == 0 ? SOON_LINES * (int64_t)(64 / sizeof(W)) : 0;
        if (p + G <= panels) block_rows<G, W>(R, x + r0 * K, K, P, p, out + r0 * N, N, pre, l1 - l0, soon);
        else for (int64_t q = p; q < panels; ++q) block_rows<1, W>(R, x + r0 * K, K, P, q, out + r0 * N, N);
      }
    }
  });
}

template <typename W>
void all_rows(const float* xp, int64_t rows, int64_t K, const W* wp, int64_t N, float* op, bool ahead) {
  // A tile is 4 panels while its weights stay small enough to be read again from the cache (4 K 64 bytes <= 256 KB)
  // and every thread gets 16 tiles or more (else one thread's extra tile shows), rows in blocks of up to 4 or 7 (up
  // to 28 sums in registers); else 3 panels, blocks of up to 8 (24 sums). Blocks as even as possible (11 rows: 6 + 5).
  const int64_t panels = (N + 15) / 16;
  const bool four = rows <= 4 || (K * 4 * 64 <= 256 * 1024 && panels >= 4 * 16 * at::get_num_threads());
  const int64_t most = rows <= 4 ? 4 : four ? 7 : 8;
  int64_t start[65];
  for (int64_t s = 0; s < rows; s += 64 * most) {  // 64 blocks a pass at most (a prefill's hundreds of rows)
    const int64_t n = std::min(rows - s, 64 * most), blocks = (n + most - 1) / most;
    for (int64_t b = 0; b <= blocks; ++b) start[b] = n * b / blocks;
    if (four) tiles<4, W>(xp + s * K, start, blocks, K, wp, N, op + s * N, ahead);
    else tiles<3, W>(xp + s * K, start, blocks, K, wp, N, op + s * N, ahead);
  }
}

}  // namespace specbench_panels
""" + AMX + r"""
namespace specbench_panels {
// float32: x, packed and the output float32. bfloat16: x and packed bfloat16; x widened to float32 once, the sums
// float32, the bias added to them, each output rounded to bfloat16 once (as oneDNN's bfloat16 linear does); the
// widening and rounding here, not as tensor ops around the kernel (a call on a 576 x 576 weight is ~30 us: two
// conversions through the dispatcher are a share of it)
bool panels_dot() { return DOT_PAIRS; }

at::Tensor panels(const at::Tensor& x_, const at::Tensor& packed, int64_t out_features,
                  const std::optional<at::Tensor>& bias, bool ahead, bool dot) {
  const auto dtype = packed.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && x_.scalar_type() == dtype && packed.is_contiguous(),
              "specbench_native::panels: float32 or bfloat16 (x and packed alike), packed contiguous");
  const auto x = x_.contiguous();
  const int64_t K = x.size(-1), rows = x.numel() / K, N = out_features;
  const int64_t KP = dtype == at::kFloat ? K : packed_k<uint16_t>(K);
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == KP && packed.size(2) == 16 && packed.size(0) * 16 >= N,
              "specbench_native::panels: packed is not [ceil(N / 16), K (bfloat16: K rounded up to even), 16]");
  auto shape = x.sizes().vec();
  shape.back() = N;
  auto out = at::empty(shape, x.options());
  if (dtype == at::kFloat) {
    all_rows<float>(x.data_ptr<float>(), rows, K, packed.data_ptr<float>(), N, out.data_ptr<float>(), ahead);
    if (bias.has_value()) out.add_(*bias);
    return out;
  }
  std::unique_ptr<float[]> sums(new float[rows * N]);
  const at::BFloat16* xb = x.data_ptr<at::BFloat16>();
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
#if defined(SPECBENCH_AMX)
  if (K % 32 == 0 && amx::ready()) {
    amx::all_rows(reinterpret_cast<const uint16_t*>(xb), rows, K, wb, N, sums.get(), ahead);
  } else
#endif
#if defined(__AVX512BF16__)
  if (dot) {
    // x as bfloat16 pairs in float-sized slots, row stride K as the kernel indexes x: slot k (even) of a row holds
    // its k (low half) and k + 1 (high half; 0 past an odd K), the odd slots unused
    std::unique_ptr<float[]> xp(new float[rows * K]);
    const uint16_t* xs = reinterpret_cast<const uint16_t*>(xb);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < K; k += 2) {
        const uint32_t bits = xs[r * K + k] | (k + 1 < K ? (uint32_t)xs[r * K + k + 1] << 16 : 0u);
        __builtin_memcpy(xp.get() + r * K + k, &bits, 4);
      }
    all_rows<DotPairs>(xp.get(), rows, K, reinterpret_cast<const DotPairs*>(wb), N, sums.get(), ahead);
  } else
#endif
  {
    std::unique_ptr<float[]> xf(new float[rows * K]);
    for (int64_t i = 0; i < rows * K; ++i) xf[i] = static_cast<float>(xb[i]);
    all_rows<uint16_t>(xf.get(), rows, K, wb, N, sums.get(), ahead);
  }
  at::Tensor b32 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* bp = bias.has_value() ? b32.data_ptr<float>() : nullptr;
  at::BFloat16* ob = out.data_ptr<at::BFloat16>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < N; ++n) ob[r * N + n] = at::BFloat16(sums[r * N + n] + (bp ? bp[n] : 0.0f));
  return out;
}
}  // namespace specbench_panels

TORCH_LIBRARY_FRAGMENT(specbench_native, m) {
  m.def("panels(Tensor x, Tensor packed, int out_features, Tensor? bias, bool ahead=False, bool dot=False) -> Tensor");
  m.def("panels_dot() -> bool", &specbench_panels::panels_dot);
}
TORCH_LIBRARY_IMPL(specbench_native, CPU, m) { m.impl("panels", &specbench_panels::panels); }
"""
