"""The C++ of the native library's own kernels (native_linear builds it with its packed linear into one library):
`specbench_native::panels`, a linear on weights packed in 16-column panels (panel_linear.py says why and how), and
`specbench_native::attention`, a compiled forward's float32 attention over the static cache (native_attention.py).
Each defines its operators in the library's namespace (TORCH_LIBRARY_FRAGMENT) inside a C++ namespace of its own.
Kept apart from the Python that calls them so that the builder imports no caller (no import cycle)."""

# specbench_native::panels(x, packed, out_features, bias) -> [..., out_features]
PANELS = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace specbench_panels {
typedef float v16 __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, two AVX2 ones
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // the same, read from any float's address

// columns [16 p, 16 p + 16 G) of R rows: for every k, each panel's 16 weights times each row's x[k], summed in k's
// order (the same sums for a row whatever R and G are: a row's output never depends on the rows beside it)
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
      if (take == 16) { *(v16u*)(out + r * N + n) = acc[g][r]; continue; }
      float s[16];
      __builtin_memcpy(s, &acc[g][r], 64);
      for (int64_t j = 0; j < take; ++j) out[r * N + n + j] = s[j];
    }
  }
}

template <int G>
inline void block_rows(int64_t R, const float* x, int64_t K, const float* P, int64_t p, float* out, int64_t N) {
  switch (R) {
    case 1: panel_rows<1, G>(x, K, P, p, out, N); break;
    case 2: panel_rows<2, G>(x, K, P, p, out, N); break;
    case 3: panel_rows<3, G>(x, K, P, p, out, N); break;
    case 4: panel_rows<4, G>(x, K, P, p, out, N); break;
    case 5: panel_rows<5, G>(x, K, P, p, out, N); break;
    case 6: panel_rows<6, G>(x, K, P, p, out, N); break;
    case 7: panel_rows<7, G>(x, K, P, p, out, N); break;
    default: panel_rows<8, G>(x, K, P, p, out, N); break;
  }
}

// every row block [start[b], start[b + 1]) over each tile of G panels before the next tile: a tile's weights come
// from memory once, the later blocks read them from the cache (rows in passes over the whole weight read it once a
// pass: 16 rows of the LM head took 2.0x 8 rows' time, benchmarks/RESULTS-cpu.md, stop 60); tiles split between the
// threads
template <int G>
void tiles(const float* x, const int64_t* start, int64_t blocks, int64_t K, const float* P, int64_t N, float* out) {
  const int64_t panels = (N + 15) / 16;
  at::parallel_for(0, (panels + G - 1) / G, 1, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) {
      const int64_t p = t * G;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = start[b], R = start[b + 1] - r0;
        if (p + G <= panels) block_rows<G>(R, x + r0 * K, K, P, p, out + r0 * N, N);
        else for (int64_t q = p; q < panels; ++q) block_rows<1>(R, x + r0 * K, K, P, q, out + r0 * N, N);
      }
    }
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
    if (four) tiles<4>(xp + s * K, start, blocks, K, wp, N, op + s * N);
    else tiles<3>(xp + s * K, start, blocks, K, wp, N, op + s * N);
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

# specbench_native::attention(query, key, value, mask, scale) -> [B, Q, H, D]
ATTENTION = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace specbench_attention {
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int i16v __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

inline v16 ld(const float* p) { return *(const v16u*)p; }
inline void st(float* p, v16 v) { *(v16u*)p = v; }
inline v16 splat(float x) { return v16{} + x; }

inline float hsum(v16 v) {  // a fixed order: halves, quarters, then pairs
  v8 a, b; std::memcpy(&a, &v, 32); std::memcpy(&b, (const char*)&v + 32, 32);
  v8 s = a + b;
  v4 c, d; std::memcpy(&c, &s, 16); std::memcpy(&d, (const char*)&s + 16, 16);
  v4 t = c + d;
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

template <int DV>  // head dim / 16
inline float dot(const float* a, const float* b) {
  v16 acc = ld(a) * ld(b);
  for (int i = 1; i < DV; ++i) acc += ld(a + 16 * i) * ld(b + 16 * i);
  return hsum(acc);
}

// One unit: batch b, key / value head g, keys [k0, k1): for each of its R = groups * Q query rows, the chunk's max
// score, the sum of e^(score - max), and the unnormalised output sum e^(score - max) v.
template <int DV>
void unit(const float* q, int64_t qs_b, int64_t qs_h, int64_t qs_q,  // query [B, H, Q, D] strides
          const float* k, int64_t ks_b, int64_t ks_h, int64_t ks_k,  // key [B, KVH, C, D] strides
          const float* v, int64_t vs_b, int64_t vs_h, int64_t vs_k,  // value's
          const float* m, int64_t ms_b, int64_t ms_q, int64_t ms_k,  // additive mask strides
          int64_t b, int64_t g, int64_t groups, int64_t Q, int64_t k0, int64_t k1, float scale,
          float* mx, float* sm, float* acc, float* scores) {
  constexpr int D = DV * 16;
  const int64_t n = k1 - k0;
  for (int64_t j = 0; j < groups; ++j) {
    const int64_t h = g * groups + j;
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t r = j * Q + i;
      const float* qr = q + b * qs_b + h * qs_h + i * qs_q;
      const float* mr = m + b * ms_b + i * ms_q;
      float* s = scores + r * n;
      float best = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t key = k0 + t;
        s[t] = dot<DV>(qr, k + b * ks_b + g * ks_h + key * ks_k) * scale + mr[key * ms_k];
        best = std::max(best, s[t]);
      }
      if (best == -INFINITY) {  // every key of the chunk masked with -inf: the chunk gives this row nothing
        mx[r] = -INFINITY;
        sm[r] = 0;
        continue;
      }
      v16 total = v16{};
      int64_t t = 0;
      for (; t + 16 <= n; t += 16) { v16 e = vexp(ld(s + t) - best); st(s + t, e); total += e; }
      float tail = 0;
      for (; t < n; ++t) { v16 e = vexp(splat(s[t] - best)); s[t] = e[0]; tail += e[0]; }
      v16 o[DV];
      for (int d = 0; d < DV; ++d) o[d] = v16{};
      for (int64_t u = 0; u < n; ++u) {
        const float* vr = v + b * vs_b + g * vs_h + (k0 + u) * vs_k;
        const float w = s[u];
        for (int d = 0; d < DV; ++d) o[d] += ld(vr + 16 * d) * w;
      }
      mx[r] = best;
      sm[r] = hsum(total) + tail;
      for (int d = 0; d < DV; ++d) st(acc + r * D + 16 * d, o[d]);
    }
  }
}

// query [B, H, Q, D], key / value [B, KVH, C, D] (a static cache), mask additive [B or 1, 1, Q, C] -> [B, Q, H, D]
template <int DV>
at::Tensor run(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
               double scale_) {
  constexpr int D = DV * 16;
  const int64_t B = query.size(0), H = query.size(1), Q = query.size(2), KVH = key.size(1), C = key.size(2);
  const int64_t groups = H / KVH, R = groups * Q;
  const float scale = (float)scale_;
  const float* qp = query.data_ptr<float>();
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  const int64_t ms_b = mask.size(0) == 1 ? 0 : mask.stride(0), ms_q = mask.size(2) == 1 ? 0 : mask.stride(2);
  const int64_t ms_k = mask.stride(3);
  // the keys any row of batch b may see: [first visible, last visible + 1) (keys past it are masked to the dtype's
  // lowest: skipping them changes no sum, since their weight is exactly 0)
  const float lowest = std::numeric_limits<float>::lowest();
  std::vector<int64_t> lo(B, C), hi(B, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Q; ++i) {
      const float* mr = mp + b * ms_b + i * ms_q;
      int64_t a = 0, z = C;
      while (a < C && mr[a * ms_k] <= lowest) ++a;
      while (z > a && mr[(z - 1) * ms_k] <= lowest) --z;
      if (a < z) { lo[b] = std::min(lo[b], a); hi[b] = std::max(hi[b], z); }
    }
  int64_t span = 1;
  for (int64_t b = 0; b < B; ++b) {
    if (hi[b] <= lo[b]) { lo[b] = 0; hi[b] = C; }  // (no row sees any key: every key, as SDPA would)
    span = std::max(span, hi[b] - lo[b]);
  }
  const int64_t threads = at::get_num_threads();
  int64_t chunks = std::max<int64_t>(1, (2 * threads + B * KVH - 1) / (B * KVH));  // >= 2 units a thread
  chunks = std::min<int64_t>(chunks, (span + 31) / 32);
  const int64_t width = (span + chunks - 1) / chunks;
  auto f32 = query.options();
  auto mx = at::empty({B, KVH, chunks, R}, f32), sm = at::empty({B, KVH, chunks, R}, f32);
  auto acc = at::empty({B, KVH, chunks, R, D}, f32);
  float* mxp = mx.data_ptr<float>(); float* smp = sm.data_ptr<float>(); float* accp = acc.data_ptr<float>();
  at::parallel_for(0, B * KVH * chunks, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> scores(R * width);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / (KVH * chunks), g = (u / chunks) % KVH, c = u % chunks;
      const int64_t k0 = lo[b] + c * width, k1 = std::min(hi[b], k0 + width);
      float* mxu = mxp + u * R; float* smu = smp + u * R; float* accu = accp + u * R * D;
      if (k1 <= k0) { for (int64_t r = 0; r < R; ++r) { mxu[r] = -INFINITY; smu[r] = 0; } continue; }
      unit<DV>(qp, query.stride(0), query.stride(1), query.stride(2), kp, key.stride(0), key.stride(1), key.stride(2),
               vp, value.stride(0), value.stride(1), value.stride(2), mp, ms_b, ms_q, ms_k, b, g, groups, Q, k0, k1,
               scale, mxu, smu, accu, scores.data());
    }
  });
  auto out = at::empty({B, Q, H, D}, f32);
  float* op = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < KVH; ++g)
      for (int64_t r = 0; r < R; ++r) {
        const int64_t j = r / Q, i = r % Q, h = g * groups + j;
        const int64_t base = (b * KVH + g) * chunks;
        float best = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c) best = std::max(best, mxp[(base + c) * R + r]);
        v16 o[DV];
        for (int d = 0; d < DV; ++d) o[d] = v16{};
        float total = 0;
        for (int64_t c = 0; c < chunks; ++c) {
          if (smp[(base + c) * R + r] == 0) continue;  // an empty chunk: its sums were never written
          const float w = std::exp(mxp[(base + c) * R + r] - best);
          total += w * smp[(base + c) * R + r];
          const float* a = accp + ((base + c) * R + r) * D;
          for (int d = 0; d < DV; ++d) o[d] += ld(a + 16 * d) * w;
        }
        float* dst = op + ((b * Q + i) * H + h) * D;
        for (int d = 0; d < DV; ++d) st(dst + 16 * d, o[d] / total);
      }
  return out;
}

at::Tensor attention(const at::Tensor& query_, const at::Tensor& key_, const at::Tensor& value_,
                     const at::Tensor& mask, double scale) {
  TORCH_CHECK(query_.scalar_type() == at::kFloat && key_.scalar_type() == at::kFloat &&
              value_.scalar_type() == at::kFloat && mask.scalar_type() == at::kFloat,
              "specbench_native::attention: float32 only");
  TORCH_CHECK(query_.dim() == 4 && key_.dim() == 4 && mask.dim() == 4 && mask.size(1) == 1 &&
              mask.size(3) == key_.size(2) && query_.size(1) % key_.size(1) == 0,
              "specbench_native::attention: query [B, H, Q, D], key / value [B, KVH, C, D], mask [B or 1, 1, Q, C]");
  const auto query = query_.contiguous();  // (small) the rows read in order
  const auto key = key_.stride(3) == 1 ? key_ : key_.contiguous();  // the cache as it is, where its rows are dense
  const auto value = value_.stride(3) == 1 ? value_ : value_.contiguous();
  const int64_t D = query.size(3);
  if (D == 64) return run<4>(query, key, value, mask, scale);
  if (D == 128) return run<8>(query, key, value, mask, scale);
  TORCH_CHECK(false, "specbench_native::attention: head dim 64 or 128 only");
}
}  // namespace specbench_attention

TORCH_LIBRARY_FRAGMENT(specbench_native, m) {
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(specbench_native, CPU, m) { m.impl("attention", &specbench_attention::attention); }
"""
