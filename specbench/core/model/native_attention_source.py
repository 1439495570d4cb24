"""The C++ of the native library's attention (native_linear builds it with the linears into one library):
`specbench_native::attention`, a compiled forward's float32 or bfloat16 attention over the static cache
(native_attention.py says where it runs and why). It defines its operator in the library's namespace
(TORCH_LIBRARY_FRAGMENT) inside a C++ namespace of its own, after its vector helpers (native_vectors_source.py). Kept
apart from the Python that calls it so that the builder imports no caller.

A unit of work is (batch, key / value head, chunk of keys); its R = query heads per key head x query rows share the
chunk's keys and values. Few rows (R <= 6: a decode step's) score 16 keys at a time row by row, the 16 sums folded
together (not 16 horizontal sums). More rows read each block of 32 keys once for all of them: the block transposed
in registers, scores 6 rows a pass (dot_rows: 12 sums in registers; 30 layers' attention at 4-16 query rows took
0.90-0.93 of the time of 16 keys x 4 rows a pass, float32 and bfloat16, a Zen 5 EPYC, stop 70). The values are
weighted 6 rows a pass (head dim 64; 3 at 128). At 8 query rows of SmolLM2 (R = 24) over 520 keys the transposed
blocks took 30 layers' attention from 2.6 to 1.9 ms (benchmarks/RESULTS-cpu.md, stop 60). Both read the keys and
values a software prefetch ahead (AHEAD keys). Inside the embedded model's compiled forward over 512 keys, 30
layers' attention took 1.51-1.87 ms before the folds and the prefetch and 1.23-1.32 after at one token, 2.78-3.28
and 2.04-2.20 at four (the AMX Xeon, paired rounds; benchmarks/RESULTS-cpu.md, stop 64). In bfloat16, 8 rows or more
score on AMX tiles where the CPU has them (native_attention_amx_source.py): 30 layers at 4-16 query rows in
0.82-0.85 of the time (stop 67)."""

from .native_attention_amx_source import ATTENTION_AMX
from .native_vectors_source import VECTORS

# specbench_native::attention(query, key, value, mask, scale) -> [B, Q, H, D]
ATTENTION = VECTORS + r"""
namespace specbench_attention {
// keys a software prefetch runs ahead of the reads (a unit reads its chunk of a layer's cache once: a cold stream)
constexpr int64_t AHEAD = 32;

// One unit of work: batch b, key / value head g, the cache's keys [k0, k1), and its R = groups x Q query rows (row
// r = j Q + i: query head g groups + j, query position i); the pointers are batch b's (key and value: head g's). T:
// the cache's and mask's element, float or uint16_t (bfloat16, widened to float as it is read); the query is float
template <typename T>
struct Unit {
  const float* q; int64_t qs_h, qs_q;  // query [H, Q, D] strides
  const T* k; const T* v; int64_t ks_k, vs_k;  // key / value [C, D] strides
  const T* m; int64_t ms_q, ms_k;  // additive mask [Q, C] strides
  int64_t g, groups, Q, k0, k1;
  float scale;
  int64_t rows() const { return groups * Q; }
  const float* query(int64_t r) const { return q + (g * groups + r / Q) * qs_h + (r % Q) * qs_q; }
  const T* mask(int64_t r) const { return m + (r % Q) * ms_q; }
  const T* key(int64_t t) const { return k + t * ks_k; }  // cache position t
  const T* value(int64_t t) const { return v + t * vs_k; }
};

// a software prefetch of one key's or value's D elements, a cache line at a time
template <int DV, typename T>
inline void prefetch_row(const T* p) {
  for (int64_t b = 0; b < DV * 16 * (int64_t)sizeof(T); b += 64) __builtin_prefetch((const char*)p + b, 0, 3);
}

// scores s[0, n) -> e^(s - max) in place; *mx = the max, *sm = the sum. Every key masked with -inf: *mx = -inf,
// *sm = 0, s all 0 (the chunk gives the row nothing, and no NaN from -inf - -inf)
inline void normalise(float* s, int64_t n, float* mx, float* sm) {
  v16 top = splat(-INFINITY);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) { const v16 x = ld(s + t); top = x > top ? x : top; }  // vectors: no serial chain
  float best = -INFINITY;
  for (int j = 0; j < 16; ++j) best = std::max(best, top[j]);
  for (; t < n; ++t) best = std::max(best, s[t]);
  if (best == -INFINITY) {
    *mx = -INFINITY;
    *sm = 0;
    std::memset(s, 0, n * sizeof(float));
    return;
  }
  v16 total = v16{};
  for (t = 0; t + 16 <= n; t += 16) { v16 e = vexp(ld(s + t) - best); st(s + t, e); total += e; }
  if (t < n) {  // the last < 16 scores as one vector (its padding e^-inf = 0), not one e^x vector each
    alignas(64) float tail[16];
    for (int j = 0; j < 16; ++j) tail[j] = t + j < n ? s[t + j] : -INFINITY;
    const v16 e = vexp(ld(tail) - best);
    for (int64_t j = 0; t + j < n; ++j) s[t + j] = e[j];
    total += e;
  }
  *mx = best;
  *sm = hsum(total);
}

// Per row of a unit: its query, its mask, its scores, its output sums, its scores at the current key block. Made once
// per thread's share of the units, not once a unit (the decode step's hot path)
template <typename T>
struct RowPointers {
  std::vector<const float*> query;
  std::vector<const T*> mask;
  std::vector<float*> scores, acc, out;
  std::vector<uint16_t> packed;  // bfloat16 query rows packed into AMX B tiles (amx_scores), reused unit to unit
  explicit RowPointers(int64_t R) : query(R), mask(R), scores(R), acc(R), out(R) {}
};

template <int DV, int RR, typename T>
inline void value_rows(const Unit<T>& u, const float* const* w, float* const* out);

// Every row's weighted values (value_rows), 6 rows a pass at head dim 64 and 3 at 128: 24 sums in registers, each value
// read once a pass. 4 and 2 rows a pass (16 sums) took 4-8% longer over 30 layers at 2-16 query rows (a Zen 5 EPYC,
// float32; benchmarks/RESULTS-cpu.md, stop 69). A row's sums keep the keys' order whatever rows run beside it
template <int DV, typename T>
inline void weigh_values(const Unit<T>& u, float* const* scores, float* const* acc) {
  constexpr int RV = DV <= 4 ? 6 : 3;
  const int64_t R = u.rows();
  for (int64_t r = 0; r < R; r += RV) {
    const float* const* w = (const float* const*)&scores[r];
    switch (std::min<int64_t>(RV, R - r)) {
      case 1: value_rows<DV, 1, T>(u, w, &acc[r]); break;
      case 2: value_rows<DV, 2, T>(u, w, &acc[r]); break;
      case 3: value_rows<DV, 3, T>(u, w, &acc[r]); break;
      case 4: value_rows<DV, (RV >= 4 ? 4 : 1), T>(u, w, &acc[r]); break;
      case 5: value_rows<DV, (RV >= 5 ? 5 : 1), T>(u, w, &acc[r]); break;
      default: value_rows<DV, RV, T>(u, w, &acc[r]); break;
    }
  }
}

// unit() for a few rows (R <= 6: a block of keys would be transposed for too few rows). Scores 16 keys at a time,
// row by row (the block stays in L1 after the first row reads it): each key's 16 lane-wise partial products in
// registers, then one fold for the 16 sums (sums16: the same sums, in the same order, as a dot product each); the
// values read once for up to 6 rows (weigh_values)

template <int DV, typename T>
void unit_rows(const Unit<T>& u, float* mx, float* sm, float* acc, float* scores, RowPointers<T>& rows) {
  constexpr int D = DV * 16;
  const int64_t n = u.k1 - u.k0, R = u.rows();
  for (int64_t r = 0; r < R; ++r) {
    rows.scores[r] = scores + r * n;
    rows.acc[r] = acc + r * D;
  }
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t nt = std::min<int64_t>(16, n - t0);
    const T* keys[16];
    for (int64_t t = 0; t < 16; ++t) keys[t] = u.key(u.k0 + t0 + std::min(t, nt - 1));  // (past the end: never stored)
    for (int64_t t = 0; t < 16 && t0 + AHEAD + t < n; ++t)  // the block AHEAD keys on, asked for now
      prefetch_row<DV>(u.key(u.k0 + t0 + AHEAD + t));
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = u.query(r);
      v16 q[DV], p[16];
      for (int d = 0; d < DV; ++d) q[d] = ld(qr + 16 * d);
      for (int t = 0; t < 16; ++t) {
        v16 a = q[0] * ld(keys[t]);
        for (int d = 1; d < DV; ++d) a += q[d] * ld(keys[t] + 16 * d);
        p[BITREV[t]] = a;  // (so that key t's sum comes out in lane t)
      }
      const v16 dots = sums16(p);
      const T* mr = u.mask(r);
      float* s = rows.scores[r] + t0;
      if (nt == 16 && u.ms_k == 1) st(s, dots * u.scale + ld(mr + u.k0 + t0));  // (a whole block, a dense mask)
      else for (int64_t t = 0; t < nt; ++t) s[t] = dots[t] * u.scale + tof(mr[(u.k0 + t0 + t) * u.ms_k]);
    }
  }
  for (int64_t r = 0; r < R; ++r) normalise(rows.scores[r], n, mx + r, sm + r);  // a dead row's weights all 0
  weigh_values<DV, T>(u, rows.scores.data(), rows.acc.data());
}

// Scores of RR query rows against a block of 32 keys transposed (kt[d * 32 + t]): s[i] = (q_i . k_t) * scale + mask,
// each dot product one chain of multiply-adds in d's order (the same order for a row whatever rows run beside it).
// dot_rows: the sums of 6 rows x 32 keys in 12 registers, each d two loads of the block and six of the rows' query
// for 12 multiply-adds (16 keys x 4 rows a pass had 20 loads for 16). Not inlined: one kernel, float32's, for both
// dtypes (inlined into score_rows GCC kept one of the block's two vectors on the stack for bfloat16's, 5% slower)
template <int DV, int RR>
__attribute__((noinline)) void dot_rows(const float* kt, const float* const* qr, float (*dots)[32]) {
  v16 lo[RR], hi[RR];
  const float* q[RR];
  for (int i = 0; i < RR; ++i) { lo[i] = v16{}; hi[i] = v16{}; q[i] = qr[i]; }
  for (int d = 0; d < DV * 16; ++d) {
    const v16 a = ld(kt + d * 32), b = ld(kt + d * 32 + 16);
    for (int i = 0; i < RR; ++i) {
      const float x = q[i][d];
      lo[i] += a * x;
      hi[i] += b * x;
    }
  }
  for (int i = 0; i < RR; ++i) { st(dots[i], lo[i]); st(dots[i] + 16, hi[i]); }
}

template <int DV, int RR, typename T>
inline void score_rows(const float* kt, const float* const* qr, const T* const* mr, int64_t ms_k, int64_t key0,
                       int64_t nt, float scale, float* const* out) {
  alignas(64) float dots[RR][32];
  dot_rows<DV, RR>(kt, qr, dots);
  for (int i = 0; i < RR; ++i) {
    if (nt == 32 && ms_k == 1) {  // (a whole block, a dense mask)
      st(out[i], ld(dots[i]) * scale + ld(mr[i] + key0));
      st(out[i] + 16, ld(dots[i] + 16) * scale + ld(mr[i] + key0 + 16));
    } else {
      for (int64_t t = 0; t < nt; ++t) out[i][t] = dots[i][t] * scale + tof(mr[i][(key0 + t) * ms_k]);
    }
  }
}

// The weighted values of RR rows: o_i = sum over the chunk's keys t, in order, of w_i[t] v_t (o_i in registers)
template <int DV, int RR, typename T>
inline void value_rows(const Unit<T>& u, const float* const* w, float* const* out) {
  v16 o[RR][DV];
  for (int i = 0; i < RR; ++i) for (int d = 0; d < DV; ++d) o[i][d] = v16{};
  for (int64_t t = 0; t < u.k1 - u.k0; ++t) {
    const T* vr = u.value(u.k0 + t);
    if (t + AHEAD < u.k1 - u.k0) prefetch_row<DV>(vr + AHEAD * u.vs_k);
    v16 vv[DV];
    for (int d = 0; d < DV; ++d) vv[d] = ld(vr + 16 * d);
    for (int i = 0; i < RR; ++i) {
      const float x = w[i][t];
      for (int d = 0; d < DV; ++d) o[i][d] += vv[d] * x;
    }
  }
  for (int i = 0; i < RR; ++i) for (int d = 0; d < DV; ++d) st(out[i] + 16 * d, o[i][d]);
}

""" + ATTENTION_AMX + r"""
// unit() for many rows. The rows share the chunk's keys and values, so each is read once for a block of rows (not
// once a row): scores 32 keys at a time, the block transposed, 6 rows a pass; the values 6 (head dim 64) or 3 (128)
// rows a pass.
template <int DV, typename T>
void unit_blocks(const Unit<T>& u, float* mx, float* sm, float* acc, float* scores, RowPointers<T>& rows) {
  constexpr int D = DV * 16;
  const int64_t n = u.k1 - u.k0, R = u.rows();
  auto &qr = rows.query, &mr = rows.mask;
  auto &sr = rows.scores, &ar = rows.acc, &out = rows.out;
  for (int64_t r = 0; r < R; ++r) {
    qr[r] = u.query(r);
    mr[r] = u.mask(r);
    sr[r] = scores + r * n;
    ar[r] = acc + r * D;
  }
  bool tiles = false;  // bfloat16 scores of many rows on AMX tiles, where the CPU has them
#if defined(SPECBENCH_AMX)
  if constexpr (std::is_same_v<T, uint16_t>) {
    tiles = R >= AMX_ROWS && specbench_panels::amx::ready();
    if (tiles) amx_scores<DV>(u, sr.data(), mr.data(), rows.packed);
  }
#endif
  alignas(64) float kt[D * 32];
  for (int64_t t0 = 0; t0 < n && !tiles; t0 += 32) {
    const int64_t nt = std::min<int64_t>(32, n - t0);
    for (int64_t t = 0; t < 32 && t0 + AHEAD + t < n; ++t)
      prefetch_row<DV>(u.key(u.k0 + t0 + AHEAD + t));
    for (int half = 0; half < 2; ++half)
      for (int c = 0; c < DV; ++c) {  // head dims [16 c, 16 c + 16) of keys [16 half, 16 half + 16)
        v16 block[16];
        for (int64_t t = 0; t < 16; ++t)  // (past the chunk's end: its last key again, never stored)
          block[t] = ld(u.key(u.k0 + t0 + std::min<int64_t>(16 * half + t, nt - 1)) + 16 * c);
        transpose16(block);
        for (int j = 0; j < 16; ++j) st(kt + (16 * c + j) * 32 + 16 * half, block[j]);
      }
    for (int64_t r = 0; r < R; ++r) out[r] = sr[r] + t0;
    const int64_t key0 = u.k0 + t0;
    for (int64_t r = 0; r < R; r += 6) {
      switch (std::min<int64_t>(6, R - r)) {
        case 1: score_rows<DV, 1, T>(kt, &qr[r], &mr[r], u.ms_k, key0, nt, u.scale, &out[r]); break;
        case 2: score_rows<DV, 2, T>(kt, &qr[r], &mr[r], u.ms_k, key0, nt, u.scale, &out[r]); break;
        case 3: score_rows<DV, 3, T>(kt, &qr[r], &mr[r], u.ms_k, key0, nt, u.scale, &out[r]); break;
        case 4: score_rows<DV, 4, T>(kt, &qr[r], &mr[r], u.ms_k, key0, nt, u.scale, &out[r]); break;
        case 5: score_rows<DV, 5, T>(kt, &qr[r], &mr[r], u.ms_k, key0, nt, u.scale, &out[r]); break;
        default: score_rows<DV, 6, T>(kt, &qr[r], &mr[r], u.ms_k, key0, nt, u.scale, &out[r]); break;
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) normalise(sr[r], n, mx + r, sm + r);  // a dead row's weights all 0
  weigh_values<DV, T>(u, sr.data(), ar.data());
}

// One unit: for each of its R query rows, the chunk's max score, the sum of e^(score - max), and the unnormalised
// output sum e^(score - max) v
template <int DV, typename T>
void unit(const Unit<T>& u, float* mx, float* sm, float* acc, float* scores, RowPointers<T>& rows) {
  if (u.rows() <= 6) unit_rows<DV, T>(u, mx, sm, acc, scores, rows);
  else unit_blocks<DV, T>(u, mx, sm, acc, scores, rows);
}

// query [B, H, Q, D], key / value [B, KVH, C, D] (a static cache), mask additive [B or 1, 1, Q, C], all of T ->
// [B, Q, H, D] of T. Its buffers are the library's own (no tensor but the output: each tensor made or converted here
// is a call through the dispatcher, 30 layers a forward)
template <int DV, typename T>
at::Tensor run(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
               double scale_) {
  constexpr int D = DV * 16;
  const int64_t B = query.size(0), H = query.size(1), Q = query.size(2), KVH = key.size(1), C = key.size(2);
  const int64_t groups = H / KVH, R = groups * Q;
  const float scale = (float)scale_;
  // the query as float, [B, H, Q, D] dense (a few rows, from any strides)
  std::vector<float> qbuf(B * H * Q * D);
  const T* qsrc = static_cast<const T*>(query.const_data_ptr());
  const int64_t qs0 = query.stride(0), qs1 = query.stride(1), qs2 = query.stride(2), qs3 = query.stride(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Q; ++i) {
        const T* src = qsrc + b * qs0 + h * qs1 + i * qs2;
        float* dst = qbuf.data() + ((b * H + h) * Q + i) * D;
        if (qs3 == 1) for (int d = 0; d < D; d += 16) st(dst + d, ld(src + d));
        else for (int64_t d = 0; d < D; ++d) dst[d] = tof(src[d * qs3]);
      }
  const float* qp = qbuf.data();
  const T* kp = static_cast<const T*>(key.const_data_ptr());
  const T* vp = static_cast<const T*>(value.const_data_ptr());
  const T* mp = static_cast<const T*>(mask.const_data_ptr());
  const int64_t ms_b = mask.size(0) == 1 ? 0 : mask.stride(0), ms_q = mask.size(2) == 1 ? 0 : mask.stride(2);
  const int64_t ms_k = mask.stride(3);
  // the keys any row of batch b may see: [first visible, last visible + 1) (keys past it are masked to the dtype's
  // lowest, or -inf: skipping them changes no sum, since their weight is exactly 0). bfloat16's lowest, widened: it
  // is above float32's, so both dtypes' masked keys are at or below it
  const float lowest = static_cast<float>(std::numeric_limits<c10::BFloat16>::lowest());
  std::vector<int64_t> lo(B, C), hi(B, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Q; ++i) {
      const T* mr = mp + b * ms_b + i * ms_q;
      int64_t a = 0, z = C;
      while (a < C && tof(mr[a * ms_k]) <= lowest) ++a;
      while (z > a && tof(mr[(z - 1) * ms_k]) <= lowest) --z;
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
  std::vector<float> mx(B * KVH * chunks * R), sm(B * KVH * chunks * R), acc(B * KVH * chunks * R * D);
  float* mxp = mx.data(); float* smp = sm.data(); float* accp = acc.data();
  at::parallel_for(0, B * KVH * chunks, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> scores(R * width);
    RowPointers<T> rows(R);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / (KVH * chunks), g = (u / chunks) % KVH, c = u % chunks;
      const int64_t k0 = lo[b] + c * width, k1 = std::min(hi[b], k0 + width);
      float* mxu = mxp + u * R; float* smu = smp + u * R; float* accu = accp + u * R * D;
      if (k1 <= k0) { for (int64_t r = 0; r < R; ++r) { mxu[r] = -INFINITY; smu[r] = 0; } continue; }
      const Unit<T> one{qp + b * H * Q * D, Q * D, D,
                     kp + b * key.stride(0) + g * key.stride(1), vp + b * value.stride(0) + g * value.stride(1),
                     key.stride(2), value.stride(2), mp + b * ms_b, ms_q, ms_k, g, groups, Q, k0, k1, scale};
      unit<DV, T>(one, mxu, smu, accu, scores.data(), rows);
    }
  });
  auto out = at::empty({B, Q, H, D}, query.options());
  T* op = static_cast<T*>(out.data_ptr());
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
        T* dst = op + ((b * Q + i) * H + h) * D;
        for (int d = 0; d < DV; ++d) store(dst + 16 * d, o[d] / total);
      }
  return out;
}

// float32 throughout, or bfloat16: the query, cache and mask read as they are (widened to float32 as read), the scores,
// softmax and sums in float32, each output rounded to bfloat16 once
at::Tensor attention(const at::Tensor& query, const at::Tensor& key_, const at::Tensor& value_, const at::Tensor& mask,
                     double scale) {
  const auto dtype = query.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && key_.scalar_type() == dtype &&
              value_.scalar_type() == dtype && mask.scalar_type() == dtype,
              "specbench_native::attention: float32 or bfloat16 (query, key, value and mask alike)");
  TORCH_CHECK(query.dim() == 4 && key_.dim() == 4 && mask.dim() == 4 && mask.size(1) == 1 &&
              mask.size(3) == key_.size(2) && query.size(1) % key_.size(1) == 0,
              "specbench_native::attention: query [B, H, Q, D], key / value [B, KVH, C, D], mask [B or 1, 1, Q, C]");
  const auto key = key_.stride(3) == 1 ? key_ : key_.contiguous();  // the cache as it is, where its rows are dense
  const auto value = value_.stride(3) == 1 ? value_ : value_.contiguous();
  const int64_t D = query.size(3);
  TORCH_CHECK(D == 64 || D == 128, "specbench_native::attention: head dim 64 or 128 only");
  if (dtype == at::kFloat) return D == 64 ? run<4, float>(query, key, value, mask, scale)
                                          : run<8, float>(query, key, value, mask, scale);
  return D == 64 ? run<4, uint16_t>(query, key, value, mask, scale) : run<8, uint16_t>(query, key, value, mask, scale);
}
}  // namespace specbench_attention

TORCH_LIBRARY_FRAGMENT(specbench_native, m) {
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(specbench_native, CPU, m) { m.impl("attention", &specbench_attention::attention); }
"""
