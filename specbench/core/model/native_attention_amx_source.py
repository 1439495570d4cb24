"""The C++ of bfloat16 attention's scores on AMX tiles (where the CPU and the compiler have them and the process may
use them: the panels' `amx::ready`, native_amx_source.py), placed by native_attention_source.py inside its namespace
before the many-rows path, which calls it. Apart from the vector code so that each file stays small.

Why: at 8 query rows or more a unit's scores and weighted values are multiply-adds the vector units run at their
peak, and at 16 rows of the embedded model attention was 5.7 ms of a 20.5 ms compiled bfloat16 forward
(benchmarks/RESULTS-cpu.md, stop 67). The scores of 16 keys against 16 query rows are one tile product: the keys as
they sit in the cache are an A tile (16 keys x 32 of their dims: 16 rows of 64 bytes at the cache's key stride), the
query rows packed once per unit into B tiles ([16 pairs of dims][16 rows][2]), the sums a 16 x 16 float32 tile
[key][row], transposed in registers into each row's 16 scores. The products of bfloat16 pairs are exact and the sums
float32 (in the instruction's order, not the vector path's: the same class of rounding as a float32 dot product).
Each score comes from its own key and query row only, so a row's scores do not depend on the rows beside it."""

# amx_scores<DV>(unit, rows' score pointers (at the unit's first key), rows' mask pointers, a buffer for the packed
# query), in specbench_attention
ATTENTION_AMX = r"""
#if defined(SPECBENCH_AMX)
constexpr int64_t AMX_ROWS = 8;  // a unit of this many rows or more scores on the tiles (bfloat16 only)

// tiles 0-3: the scores of 16 keys x up to 4 groups of 16 rows; 4: 16 keys' 32 dims; 5: a group's 32 dims
inline void configure_scores() {
  specbench_panels::amx::Config c;
  for (int t = 0; t < 6; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
  _tile_loadconfig(&c);
}

// scores[r][t] = (q_r . k_t) * scale + mask for the unit's R rows and keys [k0, k1) (r < R: out[r] at key k0); `qb`
// the thread's buffer for the packed query (its capacity kept from unit to unit: no allocation a unit)
template <int DV>
void amx_scores(const Unit<uint16_t>& u, float* const* out, const uint16_t* const* mr, std::vector<uint16_t>& qb) {
  constexpr int S = DV / 2;  // steps of 32 dims
  const int64_t R = u.rows(), n = u.k1 - u.k0, G = (R + 15) / 16;
  // B tiles: group g, step s -> [16 pairs of dims][16 rows][2] (rows past R zero); the query is exact bfloat16 widened
  qb.assign(G * S * 512, 0);
  for (int64_t r = 0; r < R; ++r) {
    const float* q = u.query(r);
    uint16_t* dst = qb.data() + (r / 16) * S * 512 + (r % 16) * 2;
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < 32; ++i) {
        uint32_t bits;
        std::memcpy(&bits, q + 32 * s + i, 4);
        dst[s * 512 + (i / 2) * 32 + (i % 2)] = (uint16_t)(bits >> 16);
      }
  }
  configure_scores();
  alignas(64) uint16_t tail[16 * DV * 16];  // the chunk's last < 16 keys, zero-padded (never read past the cache)
  alignas(64) float sums[16 * 16];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t nt = std::min<int64_t>(16, n - t0);
    const uint16_t* keys = u.key(u.k0 + t0);
    int64_t stride = u.ks_k * 2;
    if (nt < 16) {
      std::memset(tail, 0, sizeof(tail));
      for (int64_t t = 0; t < nt; ++t) std::memcpy(tail + t * DV * 16, u.key(u.k0 + t0 + t), DV * 32);
      keys = tail;
      stride = DV * 32;
    }
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const int64_t gs = std::min<int64_t>(4, G - g0);
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int s = 0; s < S; ++s) {
        _tile_loadd(4, keys + 32 * s, stride);
        const uint16_t* b = qb.data() + (g0 * S + s) * 512;
        _tile_loadd(5, b, 64); _tile_dpbf16ps(0, 4, 5);
        if (gs > 1) { _tile_loadd(5, b + S * 512, 64); _tile_dpbf16ps(1, 4, 5); }
        if (gs > 2) { _tile_loadd(5, b + 2 * S * 512, 64); _tile_dpbf16ps(2, 4, 5); }
        if (gs > 3) { _tile_loadd(5, b + 3 * S * 512, 64); _tile_dpbf16ps(3, 4, 5); }
      }
      for (int64_t g = g0; g < g0 + gs; ++g) {
        switch (g - g0) {  // (a tile's number is an immediate)
          case 0: _tile_stored(0, sums, 64); break;
          case 1: _tile_stored(1, sums, 64); break;
          case 2: _tile_stored(2, sums, 64); break;
          default: _tile_stored(3, sums, 64); break;
        }
        v16 block[16];  // [key][row] -> [row][key]
        for (int t = 0; t < 16; ++t) block[t] = ld(sums + 16 * t);
        transpose16(block);
        for (int64_t i = 0; i < 16 && 16 * g + i < R; ++i) {
          const int64_t r = 16 * g + i;
          const v16 s = block[i] * u.scale;
          if (nt == 16 && u.ms_k == 1) { st(out[r] + t0, s + ld(mr[r] + u.k0 + t0)); continue; }
          for (int64_t t = 0; t < nt; ++t) out[r][t0 + t] = s[t] + tof(mr[r][(u.k0 + t0 + t) * u.ms_k]);
        }
      }
    }
  }
  _tile_release();
}
#endif
"""
