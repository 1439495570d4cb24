"""The vector helpers of the native library's attention (native_attention_source.py), in its C++ namespace: 16-float
vectors (GCC's vector extension: one AVX-512 register, or two AVX2 ones) read from floats or widened from bfloat16, a
horizontal sum in a fixed order, e^x, the folds that sum 16 keys' partial dot products at once (each in the
horizontal sum's order), and a 16 x 16 transpose in registers. Apart from the kernel so that each file stays
small."""

# the attention's includes, its namespace's vector types and helpers (ATTENTION follows it in the library's source)
VECTORS = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specbench_attention {
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int i16v __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

inline v16 ld(const float* p) { return *(const v16u*)p; }
// 16 bfloat16 (uint16_t: a bfloat16 cache's keys or values) widened exactly to floats (a float's top 16 bits); with
// AVX-512 one widening load and a shift (the vector extension's form compiled to two 256-bit halves and a merge, which
// made the panels' bfloat16 read slower per weight than float32's, stop 63)
inline v16 ld(const uint16_t* p) {
#if defined(__AVX512F__)
  const __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16);
  return (v16)_mm512_castsi512_ps(wide);
#else
  typedef uint16_t h16u __attribute__((vector_size(32), aligned(2)));
  typedef uint32_t w16 __attribute__((vector_size(64)));
  const w16 wide = __builtin_convertvector(*(const h16u*)p, w16) << 16;
  v16 out; std::memcpy(&out, &wide, 64);
  return out;
#endif
}
inline void st(float* p, v16 v) { *(v16u*)p = v; }
inline v16 splat(float x) { return v16{} + x; }

// one element as float: float itself, or a bfloat16 (its bits the float's top half)
inline float tof(float x) { return x; }
inline float tof(uint16_t x) { const uint32_t bits = (uint32_t)x << 16; float f; std::memcpy(&f, &bits, 4); return f; }

// 16 floats stored as they are, or each rounded to bfloat16 once (to nearest, ties to even: c10::BFloat16's rounding)
inline void store(float* p, v16 v) { st(p, v); }
inline void store(uint16_t* p, v16 v) {
  for (int j = 0; j < 16; ++j) p[j] = c10::BFloat16(v[j]).x;
}

// a fixed order: halves, quarters, then pairs (shuffles, not copies through memory: a copy's address kept a running
// sum of normalise in memory, a store and a reload every step)
inline float hsum(v16 v) {
  const v8 s = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 t = __builtin_shufflevector(s, s, 0, 1, 2, 3) + __builtin_shufflevector(s, s, 4, 5, 6, 7);
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// e^x for 16 floats (Cephes' single-precision polynomial after x = n ln2 + r, |r| <= ln2 / 2; ~1 ulp); exactly 0
// below -87.3 (a masked score: the softmax gives it no weight, as SDPA's does)
inline v16 vexp(v16 x) {
  const v16 lo = splat(-87.3f);
  v16 z = x < lo ? lo : x;
  z = z > splat(88.3f) ? splat(88.3f) : z;
  v16 t = z * 1.44269504088896341f + 12582912.0f;  // round to nearest through the float's mantissa
  v16 n = t - 12582912.0f;
  v16 r = z - n * 0.693359375f - n * -2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  i16v e = (__builtin_convertvector(n, i16v) + 127) << 23;
  v16 scale; std::memcpy(&scale, &e, 64);
  v16 out = p * scale;
  return x < lo ? v16{} : out;
}

// The 16 lane-wise partial dot products p[t] of 16 keys -> one vector of their sums (lane j holds p[BITREV[j]]'s),
// each summed in hsum's order (halves, quarters, then pairs): a tree of 15 two-vector steps, each adding lanes j and
// j + S of every 2S-lane block of two vectors (S = 8, 4, 2, 1), not 16 separate horizontal sums
#define RL(j) (((j) % (2 * S) < S) ? (j) : 16 + (j) - S)
#define RH(j) (((j) % (2 * S) < S) ? (j) + S : 16 + (j))
template <int S>
inline v16 fold(v16 x, v16 y) {
  return __builtin_shufflevector(x, y, RL(0), RL(1), RL(2), RL(3), RL(4), RL(5), RL(6), RL(7), RL(8), RL(9), RL(10),
                                 RL(11), RL(12), RL(13), RL(14), RL(15)) +
         __builtin_shufflevector(x, y, RH(0), RH(1), RH(2), RH(3), RH(4), RH(5), RH(6), RH(7), RH(8), RH(9), RH(10),
                                 RH(11), RH(12), RH(13), RH(14), RH(15));
}
#undef RL
#undef RH

inline v16 sums16(const v16* p) {
  v16 b[8], c[4];
  for (int i = 0; i < 8; ++i) b[i] = fold<8>(p[2 * i], p[2 * i + 1]);
  for (int i = 0; i < 4; ++i) c[i] = fold<4>(b[2 * i], b[2 * i + 1]);
  return fold<1>(fold<2>(c[0], c[1]), fold<2>(c[2], c[3]));
}

// sums16's lane j holds the sum of p[BITREV[j]]: each fold interleaves its two vectors' halves, so the lanes come out
// in bit-reversed order; p[BITREV[t]] = key t's partial products puts key t's sum in lane t (a reversal undoes itself)
constexpr int BITREV[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

// a 16 x 16 block (16 rows of 16 floats) transposed in registers: at s = 8, 4, 2, 1 each pair of rows (i, i + s)
// swaps its off-diagonal s-wide pieces (64 two-register shuffles in all)
#define SB_LO(j) (((j) & S) ? 16 + (j) - S : (j))
#define SB_HI(j) (((j) & S) ? 16 + (j) : (j) + S)
template <int S>
inline void swap_pieces(v16* r) {
  for (int i = 0; i < 16; ++i) {
    if (i & S) continue;
    const v16 a = r[i], b = r[i + S];
    r[i] = __builtin_shufflevector(a, b, SB_LO(0), SB_LO(1), SB_LO(2), SB_LO(3), SB_LO(4), SB_LO(5), SB_LO(6),
                                   SB_LO(7), SB_LO(8), SB_LO(9), SB_LO(10), SB_LO(11), SB_LO(12), SB_LO(13),
                                   SB_LO(14), SB_LO(15));
    r[i + S] = __builtin_shufflevector(a, b, SB_HI(0), SB_HI(1), SB_HI(2), SB_HI(3), SB_HI(4), SB_HI(5), SB_HI(6),
                                       SB_HI(7), SB_HI(8), SB_HI(9), SB_HI(10), SB_HI(11), SB_HI(12), SB_HI(13),
                                       SB_HI(14), SB_HI(15));
  }
}
#undef SB_LO
#undef SB_HI

inline void transpose16(v16* r) { swap_pieces<8>(r); swap_pieces<4>(r); swap_pieces<2>(r); swap_pieces<1>(r); }
}  // namespace specbench_attention
"""
