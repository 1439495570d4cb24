"""The C++ of the bfloat16 panels linear through AMX tiles (Intel's Advanced Matrix Extensions, where the CPU and
the compiler have them), placed by native_source.py before its `panels` operator, which calls it. Apart from the
vector kernel so that each file stays small.

A bfloat16 panel is already an AMX B tile's layout: [K / 2, 16, 2], each column's weights at k and k + 1 side by
side, so 32 k's of one panel are one 16 x 64-byte tile, 1 KB contiguous. A tile of 4 panels (64 columns) and a block
of up to 16 rows: 4 accumulator tiles of 16 x 16 floats, one tile of x (the rows' 32 k's), the panels' B tiles
loaded in turn, one tdpbf16ps each (16 x 16 x 32 multiply-adds). The arithmetic is no longer the limit at any row
count up to 16 (the widening vector kernel's was from 4 rows on: benchmarks/RESULTS-cpu.md, stop 66); the weights'
stream is. Each row's sums come from its own row of x only, so a row's output does not depend on the rows beside
it. Products of bfloat16 pairs are exact; the sums are float32 (inputs and outputs below float32's normal range
taken as 0, as the instruction defines). Only where K is a multiple of 32 (the tiles' depth); else the vector kernel."""

# amx::ready() (the process may use the tiles) and amx::all_rows(x, rows, K, packed, N, out), in specbench_panels
AMX = r"""
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <mutex>
#include <sys/syscall.h>
#include <unistd.h>
#define SPECBENCH_AMX 1

namespace specbench_panels::amx {
// Linux lends a thread AMX's tile data only once the process asks (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA)
inline bool ready() {
  static std::once_flag once;
  static bool granted = false;
  std::call_once(once, [] { granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0; });
  return granted;
}

struct alignas(64) Config {  // ldtilecfg's 64-byte layout, palette 1
  uint8_t palette = 1, start = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: the sums of 4 panels (R x 16 floats); 4: x (R rows x 32 k's); 5, 6: the panels' 32 k's, in turn
inline void configure(int64_t R) {
  Config c;
  for (int t = 0; t < 4; ++t) { c.rows[t] = R; c.colsb[t] = 64; }
  c.rows[4] = R; c.colsb[4] = 64;
  for (int t = 5; t < 7; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
  _tile_loadconfig(&c);
}

// the sums of tile g (an accumulator) -> out's R rows, columns [n, n + 16) (fewer past N)
inline void store(const float* sums, int64_t R, float* out, int64_t N, int64_t n) {
  const int64_t take = std::min<int64_t>(16, N - n);
  for (int64_t r = 0; r < R; ++r) std::memcpy(out + r * N + n, sums + r * 16, take * sizeof(float));
}

// G panels from p (G = 4, or 1 for the last ones) x R rows (x: its first, row stride K) -> out (row stride N); with
// `soon` each panel's next 32 k's (1 KB, 16 lines) are prefetched while these run (121 linears in 0.80-0.96 of the
// time without it at 1-16 rows, the most where the machine's memory was contended: benchmarks/RESULTS-cpu.md, stop 67)
template <int G>
inline void tile_rows(const uint16_t* x, int64_t R, int64_t K, const uint16_t* P, int64_t p, float* out, int64_t N,
                      bool soon) {
  _tile_zero(0);
  if constexpr (G == 4) { _tile_zero(1); _tile_zero(2); _tile_zero(3); }
  const uint16_t* w = P + p * K * 16;  // panel p: K / 2 pairs of k's x 16 columns x 2
  for (int64_t k = 0; k < K; k += 32) {
    if (soon)
      for (int g = 0; g < G; ++g)
        for (int l = 0; l < 16; ++l) __builtin_prefetch(w + (g * K + k + 32) * 16 + 32 * l, 0, 3);
    _tile_loadd(4, x + k, K * 2);
    _tile_loadd(5, w + k * 16, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (G == 4) {
      _tile_loadd(6, w + (K + k) * 16, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, w + (2 * K + k) * 16, 64);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(6, w + (3 * K + k) * 16, 64);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  alignas(64) float sums[16 * 16];
  _tile_stored(0, sums, 64); store(sums, R, out, N, p * 16);
  if constexpr (G == 4) {
    _tile_stored(1, sums, 64); store(sums, R, out, N, (p + 1) * 16);
    _tile_stored(2, sums, 64); store(sums, R, out, N, (p + 2) * 16);
    _tile_stored(3, sums, 64); store(sums, R, out, N, (p + 3) * 16);
  }
}

// x [rows, K] bfloat16 (K a multiple of 32), packed [ceil(N / 16), K, 16] -> out [rows, N] float32 sums. Tiles of
// 4 panels split between the threads; each tile's row blocks (16 rows, the last fewer) one after another, so a
// tile's weights come from memory once. `ahead`: the first block's pass prefetches its weights (tile_rows' `soon`)
inline void all_rows(const uint16_t* x, int64_t rows, int64_t K, const uint16_t* P, int64_t N, float* out,
                     bool ahead) {
  const int64_t panels = (N + 15) / 16;
  at::parallel_for(0, (panels + 3) / 4, 1, [&](int64_t a, int64_t e) {
    int64_t configured = -1;
    for (int64_t t = a; t < e; ++t)
      for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t R = std::min<int64_t>(16, rows - r0);
        if (R != configured) { configure(R); configured = R; }
        if (4 * t + 4 <= panels) tile_rows<4>(x + r0 * K, R, K, P, 4 * t, out + r0 * N, N, ahead && r0 == 0);
        else for (int64_t q = 4 * t; q < panels; ++q) tile_rows<1>(x + r0 * K, R, K, P, q, out + r0 * N, N, false);
      }
    if (configured >= 0) _tile_release();
  });
}
}  // namespace specbench_panels::amx
#endif
"""
