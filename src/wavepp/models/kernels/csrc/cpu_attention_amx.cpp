// Causal attention over a paged KV cache with both products on AMX tiles (bf16 in, fp32
// accumulation) and an online softmax between them in AVX-512.
//
// Work is split by (group of chunks, KV head). A group is one chunk, or chunks whose block
// tables start with the same cached blocks (cascade): that shared prefix is packed once and
// every member's queries read it. For each item the keys and values it reads are copied once
// from the cache into the tiles' layouts:
//
//   K  for S = Q K^T, B operand: per 16 keys and 32 dims, 16 rows of dim pairs x 16 keys x 2
//      (a 32-bit transpose of the keys' rows)
//   V  for O = P V, B operand: per 32 keys and 16 dims, 16 rows of key pairs x 16 dims x 2
//
// The queries of a KV head's G grouped heads are stacked token-major (row = token * G + g) in
// blocks of 16 rows (one A tile). For each block, keys are taken KB at a time: the scores
// [16 x KB] go to an fp32 buffer, each row's softmax is updated online (running max m, sum l,
// the accumulator rescaled by exp(m_old - m_new)), its probabilities are rounded to bf16 as the
// A operand of P V, and P V's [16 x Dv] is added to the accumulator. Row r (token t) sees keys
// [0, num_cached + t]; the rest of its scores, and the zero padding of a segment to 32 keys,
// get probability 0. The output is acc / l rounded to bf16.
//
// exp(x) = 2^t: t = x log2(e), 2^(t - round(t)) by a degree-5 polynomial and the integer part
// into the exponent (vscalefps); within 2e-7 of exp, far below the bf16 rounding of P.
//
// Built only where the compiler targets AMX-BF16 (-march=native on such a CPU); elsewhere
// `available()` is false and the callers use another kernel. The process asks the kernel for
// the AMX tile state once (arch_prctl ARCH_REQ_XCOMP_PERM), as Linux requires.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define WAVEPP_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

#ifdef WAVEPP_AMX

constexpr int64_t kMaxKeysPerStep = 2048;   // keys per online-softmax step, at most
constexpr int64_t kRows = 32;            // query rows per block: two A tiles

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile used is 16 rows of 64 bytes: tmm0 A, tmm1-3 B, tmm4-7 C (16 x 16 fp32).
void load_tile_config() {
  TileConfig config;
  for (int i = 0; i < 8; ++i) {
    config.colsb[i] = 64;
    config.rows[i] = 16;
  }
  _tile_loadconfig(&config);
}

bool request_amx() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

inline uint16_t float_to_bf16(float f) {   // round to nearest even, as torch's conversion
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// 2^t for finite t <= ~0 (below -150 the result is 0): a degree-4 polynomial for 2^f,
// f = t - round(t) in [-1/2, 1/2] (a least-squares fit, relative error 3e-6: far below P's bf16 rounding, 2e-3).
inline __m512 exp2_finite(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.00956051f), f, _mm512_set1_ps(0.05591704f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24024981f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69312197f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99999919f));
  return _mm512_scalef_ps(p, n);
}

// A horizontal reduction of 16 vectors at once: lane i of the result is op over v[i]'s lanes.
// Four halving steps (256-, 128-, 64-, 32-bit halves) leave the rows out of order; one
// permute puts them back.
template <typename Op>
inline __m512 reduce16(__m512 v[16], Op op) {
  for (int i = 0; i < 8; ++i)
    v[i] = op(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
  for (int i = 0; i < 4; ++i)
    v[i] = op(_mm512_shuffle_f32x4(v[i], v[i + 4], 0x88), _mm512_shuffle_f32x4(v[i], v[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)
    v[i] = op(_mm512_shuffle_ps(v[i], v[i + 2], 0x44), _mm512_shuffle_ps(v[i], v[i + 2], 0xEE));
  const __m512 r = op(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
  // lane j holds row (0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15)[j]: put row i in lane i
  const __m512i lanes = _mm512_set_epi32(15, 13, 14, 12, 7, 5, 6, 4, 11, 9, 10, 8, 3, 1, 2, 0);
  return _mm512_permutexvar_ps(lanes, r);
}
inline __m512 reduce16_add(__m512 v[16]) {
  return reduce16(v, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}

// exps of one row of scores against `reference * c` (its max, or a smaller reference; see
// step): P in bf16 (0 from `visible` to nb), returns the vector of partial sums, or, where a
// visible score passes `limit`, a vector with a negative lane (the caller redoes the row).
constexpr float kLazyExp = 8.0f;

inline __m512 one_pass(const float* row, uint16_t* prow, int64_t visible, int64_t nb, __m512 vc,
                       float reference_c, float limit) {
  const __m512 vmc = _mm512_set1_ps(-reference_c), vlimit = _mm512_set1_ps(limit);
  const int64_t full = visible / 32 * 32;
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  __m512 hi = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < full; j += 32) {
    const __m512 a = _mm512_loadu_ps(row + j), b = _mm512_loadu_ps(row + j + 16);
    hi = _mm512_max_ps(hi, _mm512_max_ps(a, b));
    const __m512 e0 = exp2_finite(_mm512_fmadd_ps(a, vc, vmc));
    const __m512 e1 = exp2_finite(_mm512_fmadd_ps(b, vc, vmc));
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
    _mm512_storeu_si512(prow + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  for (int64_t j = full; j < nb; j += 32) {   // the tail: masked, then zeros to nb
    const int64_t n0 = std::clamp<int64_t>(visible - j, 0, 16), n1 = std::clamp<int64_t>(visible - j - 16, 0, 16);
    const __mmask16 k0 = __mmask16((1u << n0) - 1u), k1 = __mmask16((1u << n1) - 1u);
    const __m512 a = _mm512_loadu_ps(row + j), b = _mm512_loadu_ps(row + j + 16);
    hi = _mm512_mask_max_ps(hi, k0, hi, a);
    hi = _mm512_mask_max_ps(hi, k1, hi, b);
    const __m512 e0 = _mm512_maskz_mov_ps(k0, exp2_finite(_mm512_fmadd_ps(a, vc, vmc)));
    const __m512 e1 = _mm512_maskz_mov_ps(k1, exp2_finite(_mm512_fmadd_ps(b, vc, vmc)));
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
    _mm512_storeu_si512(prow + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  if (_mm512_cmp_ps_mask(hi, vlimit, _CMP_GT_OQ)) return _mm512_set1_ps(-1.0f);
  return _mm512_add_ps(s0, s1);
}

inline float row_max(const float* row, int64_t visible) {
  __m512 hi = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 mask = visible - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (visible - j)) - 1u);
    hi = _mm512_mask_max_ps(hi, mask, hi, _mm512_maskz_loadu_ps(mask, row + j));
  }
  return _mm512_reduce_max_ps(hi);
}

// Where one operand's rows live: row i of a segment is at base + slots[i] * slot_stride.
struct Rows {
  const uint16_t* base;
  const int64_t* slots;
  int64_t slot_stride;   // in elements
};

// 16 x 16 32-bit transpose: r[k] = row k in, r[p] = column p out (unpacks, then lane shuffles).
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {   // r[i + j]: column 4 lane + j of rows i .. i + 3, lane by lane
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8) {   // rows h .. h + 7
    for (int j = 0; j < 4; ++j) {
      t[h + j] = _mm512_shuffle_i32x4(r[h + j], r[h + 4 + j], 0x88);       // columns j, j + 8
      t[h + 4 + j] = _mm512_shuffle_i32x4(r[h + j], r[h + 4 + j], 0xdd);   // j + 4, j + 12
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

// K rows [0, n) of dimension d -> B tiles of S = Q K^T, keys padded with zeros to np (a
// multiple of 32) and dims to dq (a multiple of 32). dst: np / 16 * dq / 32 tiles of 512.
void pack_keys(const Rows& src, int64_t n, int64_t np, int64_t d, int64_t dq, uint16_t* dst) {
  const int64_t slices = dq / 32, words = d / 2;
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t kb = 0; kb < np / 16; ++kb) {
    for (int64_t s = 0; s < slices; ++s) {
      uint32_t* tile = out + (kb * slices + s) * 256;   // [16 dim pairs][16 keys]
      const int64_t w0 = s * 16, count = std::clamp<int64_t>(words - w0, 0, 16);
      const __mmask16 mask = __mmask16((1u << count) - 1u);
      __m512i r[16];
      for (int64_t k = 0; k < 16; ++k) {
        const int64_t key = kb * 16 + k;
        r[k] = key < n ? _mm512_maskz_loadu_epi32(mask, reinterpret_cast<const uint32_t*>(
                                                             src.base + src.slots[key] * src.slot_stride) + w0)
                       : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int64_t p = 0; p < 16; ++p) _mm512_storeu_si512(tile + p * 16, r[p]);
    }
  }
}

// V rows [0, n) of dimension dv -> B tiles of O = P V: per 32 keys and 16 dims, 16 rows of key
// pairs x 16 dims x 2. Keys padded with zeros to np (a multiple of 32), dims to dvp (of 16).
void pack_values(const Rows& src, int64_t n, int64_t np, int64_t dv, int64_t dvp, uint16_t* dst) {
  const int64_t slices = dvp / 16;
  // interleave a's 16 values with b's: a0 b0 a1 b1 ... (b in the upper half of the pair)
  const __m512i index = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                         39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  for (int64_t kk = 0; kk < np / 32; ++kk) {
    for (int64_t p = 0; p < 16; ++p) {
      const int64_t k0 = kk * 32 + 2 * p, k1 = k0 + 1;
      const uint16_t* a = k0 < n ? src.base + src.slots[k0] * src.slot_stride : nullptr;
      const uint16_t* b = k1 < n ? src.base + src.slots[k1] * src.slot_stride : nullptr;
      for (int64_t s = 0; s < slices; ++s) {
        const int64_t d0 = s * 16, count = std::max<int64_t>(0, std::min<int64_t>(16, dv - d0));
        const __mmask32 mask = __mmask32((1u << count) - 1u);
        const __m512i va = a ? _mm512_maskz_loadu_epi16(mask, a + d0) : _mm512_setzero_si512();
        const __m512i vb = b ? _mm512_maskz_loadu_epi16(mask, b + d0) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + ((kk * slices + s) * 16 + p) * 32, _mm512_permutex2var_epi16(va, index, vb));
      }
    }
  }
}

struct Segment {          // a run of packed keys: context positions [start, start + n)
  const uint16_t* keys;   // packed as pack_keys
  const uint16_t* values; // packed as pack_values
  int64_t start, n, np;
};

struct Block {            // 16 query rows (row = token * G + g) of one chunk
  int64_t chunk, row0;
  int64_t limit[kRows];   // row r sees context positions [0, limit[r]); 0 for padding rows
  int64_t last;           // the largest limit
};

// Every buffer a tile loads from or stores to starts on a cache line: a tile row of 64 bytes
// then reads one line, not two. (malloc's 16-byte alignment leaves that to chance, and the
// chance differs from process to process: measured, a misaligned process ran its tile
// products up to 1.5x slower.)
template <typename T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(std::size_t n) {
    void* ptr = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (ptr == nullptr) throw std::bad_alloc();
    return static_cast<T*>(ptr);
  }
  void deallocate(T* ptr, std::size_t) { std::free(ptr); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};
template <typename T>
using Buffer = std::vector<T, LineAligned<T>>;

struct Scratch {
  Buffer<uint16_t> shared_k, shared_v, own_k, own_v, q, p;
  Buffer<float> s, acc, part, m, l, m_new, sum;
  std::vector<Block> blocks;
};

Scratch& scratch() {   // the calling thread's buffers, kept from call to call
  thread_local Scratch w;
  return w;
}

// Keys [k0, k0 + nb) of `seg` for one block of rows: S = Q K^T on tiles, the online softmax
// (m, l of the block's rows updated, P in bf16), acc = acc * exp(m_old - m_new) + P V.
// kb: the most keys a step takes (the S and P buffers' rows).
void step(const Segment& seg, int64_t k0, int64_t nb, const Block& b, const uint16_t* q, float* m, float* l,
          float* acc, int64_t dq, int64_t dvp, int64_t kb, float c, Scratch& w) {
  const int64_t slices = dq / 32, vslices = dvp / 16;
  // row strides of S (fp32) and P (bf16) one cache line past kb: rows a power of two apart
  // would share an L1 set
  const int64_t ls = kb + 16, lp = kb + 32;
  float* s = w.s.data();
  uint16_t* p = w.p.data();
  float* part = w.part.data();
  float* m_new = w.m_new.data();
  float* sum = w.sum.data();
  // S = Q K^T, 32 rows x 32 keys a step: A tiles 0, 1 (rows 0-15, 16-31), B tiles 2, 3 (keys
  // 0-15, 16-31), C tiles 4-7; each B tile loaded serves both row tiles
  for (int64_t g = 0; g < nb; g += 32) {
    const uint16_t* kt = seg.keys + ((k0 + g) / 16) * slices * 512;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t x = 0; x < slices; ++x) {
      _tile_loadd(0, q + x * 32, dq * 2);
      _tile_loadd(1, q + 16 * dq + x * 32, dq * 2);
      _tile_loadd(2, kt + x * 512, 64);
      _tile_loadd(3, kt + (slices + x) * 512, 64);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    _tile_stored(4, s + g, ls * 4);
    _tile_stored(5, s + g + 16, ls * 4);
    _tile_stored(6, s + 16 * ls + g, ls * 4);
    _tile_stored(7, s + 16 * ls + g + 16, ls * 4);
  }
  // the softmax in one pass over the scores: each row's exps are taken against a reference
  // max, the larger of its running max and its first 32 visible scores of this step, not the
  // step's true max. The exps may then exceed 1, by up to 2^kLazyExp: fp32 and bf16 hold that,
  // and acc and l carry the same factor, which cancels. A row whose scores rise further (the
  // pass checks its maxima as it goes) is redone against its true max. P is 0 where not
  // visible; the 16 rows' sums are reduced together.
  const __m512 vc = _mm512_set1_ps(c);
  for (int r0 = 0; r0 < kRows; r0 += 16) {
    alignas(64) __m512 part_sum[16];
    for (int i = 0; i < 16; ++i) {
      const int r = r0 + i;
      const int64_t visible = std::clamp<int64_t>(b.limit[r] - seg.start - k0, 0, std::min(nb, seg.n - k0));
      const float* row = s + r * ls;
      uint16_t* prow = p + r * lp;
      if (visible == 0) {
        std::memset(prow, 0, nb * 2);
        m_new[r] = m[r];
        part_sum[i] = _mm512_setzero_ps();
        continue;
      }
      const int64_t first = std::min<int64_t>(visible, 32);
      const __mmask16 f0 = __mmask16((1u << std::min<int64_t>(first, 16)) - 1u);
      const __mmask16 f1 = __mmask16((1u << std::max<int64_t>(first - 16, 0)) - 1u);
      const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      const __m512 head = _mm512_max_ps(_mm512_mask_loadu_ps(lowest, f0, row), _mm512_mask_loadu_ps(lowest, f1, row + 16));
      float reference = std::max(m[r], _mm512_reduce_max_ps(head));
      __m512 total = one_pass(row, prow, visible, nb, vc, reference * c, reference + kLazyExp / c);
      if (_mm512_cmp_ps_mask(total, _mm512_setzero_ps(), _CMP_LT_OQ)) {   // a score rose past the margin
        reference = std::max(m[r], row_max(row, visible));
        total = one_pass(row, prow, visible, nb, vc, reference * c, std::numeric_limits<float>::infinity());
      }
      m_new[r] = reference;
      part_sum[i] = total;
    }
    _mm512_storeu_ps(sum + r0, reduce16_add(part_sum));
  }
  // alpha = exp(m_old - m_new) (0 while a row has seen nothing), l = l * alpha + sum
  alignas(64) float alpha[kRows];
  for (int h = 0; h < kRows; h += 16) {
    const __m512 mo = _mm512_loadu_ps(m + h), mn = _mm512_loadu_ps(m_new + h);
    const __mmask16 seen = _mm512_cmp_ps_mask(mo, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ);
    const __m512 a = _mm512_maskz_mov_ps(seen, exp2_finite(_mm512_max_ps(_mm512_mul_ps(_mm512_sub_ps(mo, _mm512_maskz_mov_ps(seen, mn)), _mm512_set1_ps(c)), _mm512_set1_ps(-126.0f))));
    _mm512_store_ps(alpha + h, a);
    _mm512_storeu_ps(l + h, _mm512_fmadd_ps(_mm512_loadu_ps(l + h), a, _mm512_loadu_ps(sum + h)));
    _mm512_storeu_ps(m + h, mn);
  }
  // part = P V for these keys: 32 rows x 32 output dims a pass (A tiles 0, 1: P's rows 0-15,
  // 16-31; B tiles 2, 3: dims o, o + 16; C tiles 4-7), the last pass 16 dims where dvp % 32
  const uint16_t* vt = seg.values + (k0 / 32) * vslices * 512;
  for (int64_t o = 0; o < vslices; o += 2) {
    const bool two = vslices - o >= 2;
    _tile_zero(4);
    _tile_zero(6);
    if (two) { _tile_zero(5); _tile_zero(7); }
    for (int64_t x = 0; x < nb / 32; ++x) {
      _tile_loadd(0, p + x * 32, lp * 2);
      _tile_loadd(1, p + 16 * lp + x * 32, lp * 2);
      const uint16_t* v = vt + (x * vslices + o) * 512;
      _tile_loadd(2, v, 64);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(6, 1, 2);
      if (two) {
        _tile_loadd(3, v + 512, 64);
        _tile_dpbf16ps(5, 0, 3);
        _tile_dpbf16ps(7, 1, 3);
      }
    }
    _tile_stored(4, part + o * 16, dvp * 4);
    _tile_stored(6, part + 16 * dvp + o * 16, dvp * 4);
    if (two) { _tile_stored(5, part + o * 16 + 16, dvp * 4); _tile_stored(7, part + 16 * dvp + o * 16 + 16, dvp * 4); }
  }
  for (int r = 0; r < kRows; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    float* ar = acc + r * dvp;
    const float* pr = part + r * dvp;
    for (int64_t d = 0; d < dvp; d += 16)
      _mm512_storeu_ps(ar + d, _mm512_fmadd_ps(_mm512_loadu_ps(ar + d), a, _mm512_loadu_ps(pr + d)));
  }
}

// Blocks [b0, b1) of the scratch attend to `seg`, KB keys at a time: every block takes a
// step over the same keys before the next KB are read, so those stay in the L1 cache.
void attend_segment(const Segment& seg, int64_t b0, int64_t b1, int64_t dq, int64_t dvp, int64_t kb, float c,
                    Scratch& w) {
  int64_t seg_end = 0;
  for (int64_t b = b0; b < b1; ++b) seg_end = std::max(seg_end, std::min(seg.n, w.blocks[b].last - seg.start));
  for (int64_t k0 = 0; k0 < seg_end; k0 += kb) {
    for (int64_t b = b0; b < b1; ++b) {
      const Block& block = w.blocks[b];
      const int64_t end = std::min(seg.n, block.last - seg.start);
      if (k0 >= end) continue;
      const int64_t nb = std::min(kb, round_up(end - k0, 32));
      step(seg, k0, nb, block, w.q.data() + b * kRows * dq, w.m.data() + b * kRows, w.l.data() + b * kRows,
           w.acc.data() + b * kRows * dvp, dq, dvp, kb, c, w);
    }
  }
}

#endif  // WAVEPP_AMX

bool amx_ready() {
#ifdef WAVEPP_AMX
  static const bool ready = request_amx();
  return ready;
#else
  return false;
#endif
}

// query [T, H, D], key_cache [S, KVH, D], value_cache [S, KVH, Dv] (bf16; the last dim
// contiguous, other strides free), out [T, H, Dv] bf16 contiguous. context_slots: every
// chunk's context slots, chunk c's at [context_starts[c], context_starts[c + 1]); its tokens
// are [token_starts[c], token_starts[c + 1]) at positions num_cached[c] + i. Groups: members
// [group_starts[g], group_starts[g + 1]) of `members` share their first group_prefix[g]
// context slots (0: a group of one chunk, nothing shared).
void attention(const torch::Tensor& query, const torch::Tensor& key_cache, const torch::Tensor& value_cache,
               const torch::Tensor& context_slots, const torch::Tensor& token_starts,
               const torch::Tensor& context_starts, const torch::Tensor& num_cached,
               const torch::Tensor& group_starts, const torch::Tensor& members,
               const torch::Tensor& group_prefix, double scale, torch::Tensor& out, int64_t keys_per_step) {
  TORCH_CHECK(amx_ready(), "the AMX attention kernel does not run on this machine");
#ifdef WAVEPP_AMX
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&query, &key_cache, &value_cache, &out}) {
    TORCH_CHECK(t->scalar_type() == torch::kBFloat16 && t->device().is_cpu() && t->dim() == 3 && t->stride(2) == 1,
                "AMX attention: bf16 CPU tensors [rows, heads, dim] with the last dim contiguous");
  }
  for (const torch::Tensor* t : {&context_slots, &token_starts, &context_starts, &num_cached, &group_starts, &members, &group_prefix}) {
    TORCH_CHECK(t->scalar_type() == torch::kInt64 && t->is_contiguous() && t->device().is_cpu(), "AMX attention: int64 index tensors");
  }
  TORCH_CHECK(out.is_contiguous(), "AMX attention: out must be contiguous");
  const int64_t heads = query.size(1), d = query.size(2), kv_heads = key_cache.size(1), dv = value_cache.size(2);
  TORCH_CHECK(heads % kv_heads == 0 && key_cache.size(2) == d && d % 2 == 0 && out.size(2) == dv &&
                  out.size(1) == heads && value_cache.size(1) == kv_heads,
              "AMX attention: shapes do not agree");
  const int64_t group = heads / kv_heads, dq = round_up(d, 32), dvp = round_up(dv, 16);
  const int64_t num_groups = group_starts.numel() - 1;
  const auto* q_base = reinterpret_cast<const uint16_t*>(query.data_ptr());
  const auto* k_base = reinterpret_cast<const uint16_t*>(key_cache.data_ptr());
  const auto* v_base = reinterpret_cast<const uint16_t*>(value_cache.data_ptr());
  auto* o_base = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t* slots = context_slots.data_ptr<int64_t>();
  const int64_t* tok = token_starts.data_ptr<int64_t>();
  const int64_t* ctx = context_starts.data_ptr<int64_t>();
  const int64_t* cached = num_cached.data_ptr<int64_t>();
  const int64_t* gs = group_starts.data_ptr<int64_t>();
  const int64_t* mem = members.data_ptr<int64_t>();
  const int64_t* gp = group_prefix.data_ptr<int64_t>();
  const int64_t qs0 = query.stride(0), qs1 = query.stride(1);
  const int64_t ks0 = key_cache.stride(0), ks1 = key_cache.stride(1);
  const int64_t vs0 = value_cache.stride(0), vs1 = value_cache.stride(1);
  const float c = float(scale) * 1.44269504088896341f;

  // keys per step: K and V of a step (2 * kb * (dq + dvp) bytes) within about 32 KiB of L1
  // (keys_per_step > 0: that many, rounded up to 32, for tests and tuning)
  const int64_t kb = keys_per_step > 0 ? std::clamp<int64_t>(round_up(keys_per_step, 32), 32, kMaxKeysPerStep)
                                       : kMaxKeysPerStep;

  at::parallel_for(0, num_groups * kv_heads, 1, [&](int64_t begin, int64_t end) {
    load_tile_config();
    Scratch& w = scratch();
    w.p.resize(kRows * (kb + 32));
    w.s.resize(kRows * (kb + 16));
    w.part.resize(kRows * dvp);
    w.m_new.resize(kRows);
    w.sum.resize(kRows);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t g = item / kv_heads, h = item % kv_heads;
      const int64_t prefix = gp[g];
      // the blocks of 16 rows of every member, their queries packed
      w.blocks.clear();
      for (int64_t mi = gs[g]; mi < gs[g + 1]; ++mi) {
        const int64_t chunk = mem[mi], rows = (tok[chunk + 1] - tok[chunk]) * group;
        for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
          Block b{chunk, r0, {}, 0};
          for (int64_t r = 0; r < kRows; ++r) {
            b.limit[r] = r0 + r < rows ? cached[chunk] + (r0 + r) / group + 1 : 0;
            b.last = std::max(b.last, b.limit[r]);
          }
          w.blocks.push_back(b);
        }
      }
      const int64_t num_blocks = int64_t(w.blocks.size());
      w.q.assign(num_blocks * kRows * dq, uint16_t(0));
      w.acc.assign(num_blocks * kRows * dvp, 0.0f);
      w.m.assign(num_blocks * kRows, -std::numeric_limits<float>::infinity());
      w.l.assign(num_blocks * kRows, 0.0f);
      for (int64_t b = 0; b < num_blocks; ++b) {
        const Block& block = w.blocks[b];
        for (int64_t r = 0; r < kRows && block.limit[r] > 0; ++r) {
          const int64_t row = block.row0 + r, t = tok[block.chunk] + row / group, head = h * group + row % group;
          std::memcpy(w.q.data() + (b * kRows + r) * dq, q_base + t * qs0 + head * qs1, d * 2);
        }
      }
      if (prefix > 0) {   // the group's shared prefix, packed once, attended to by every block
        const int64_t np = round_up(prefix, 32);
        w.shared_k.resize(np / 16 * dq / 32 * 512);
        w.shared_v.resize(np / 32 * dvp / 16 * 512);
        const int64_t* first = slots + ctx[mem[gs[g]]];
        pack_keys(Rows{k_base + h * ks1, first, ks0}, prefix, np, d, dq, w.shared_k.data());
        pack_values(Rows{v_base + h * vs1, first, vs0}, prefix, np, dv, dvp, w.shared_v.data());
        const Segment shared{w.shared_k.data(), w.shared_v.data(), 0, prefix, np};
        for (int64_t b = 0; b < num_blocks; ++b) attend_segment(shared, b, b + 1, dq, dvp, kb, c, w);
      }
      int64_t b0 = 0;
      for (int64_t mi = gs[g]; mi < gs[g + 1]; ++mi) {   // each member's own keys
        const int64_t chunk = mem[mi];
        int64_t b1 = b0;
        while (b1 < num_blocks && w.blocks[b1].chunk == chunk) ++b1;
        const int64_t own = ctx[chunk + 1] - ctx[chunk] - prefix, np = round_up(own, 32);
        w.own_k.resize(np / 16 * dq / 32 * 512);
        w.own_v.resize(np / 32 * dvp / 16 * 512);
        const int64_t* own_slots = slots + ctx[chunk] + prefix;
        pack_keys(Rows{k_base + h * ks1, own_slots, ks0}, own, np, d, dq, w.own_k.data());
        pack_values(Rows{v_base + h * vs1, own_slots, vs0}, own, np, dv, dvp, w.own_v.data());
        const Segment mine{w.own_k.data(), w.own_v.data(), prefix, own, np};
        for (int64_t b = b0; b < b1; ++b) attend_segment(mine, b, b + 1, dq, dvp, kb, c, w);
        b0 = b1;
      }
      for (int64_t b = 0; b < num_blocks; ++b) {   // out = acc / l, in bf16
        const Block& block = w.blocks[b];
        for (int64_t r = 0; r < kRows && block.limit[r] > 0; ++r) {
          const int64_t row = block.row0 + r, t = tok[block.chunk] + row / group, head = h * group + row % group;
          const float inv = 1.0f / w.l[b * kRows + r];
          const float* a = w.acc.data() + (b * kRows + r) * dvp;
          uint16_t* o = o_base + (t * heads + head) * dv;
          for (int64_t x = 0; x < dv; ++x) o[x] = float_to_bf16(a[x] * inv);
        }
      }
    }
    _tile_release();
  });
#endif
}

// The addresses of the calling thread's tile buffers (after a call has sized them), for the
// test that they start on cache lines.
std::vector<int64_t> scratch_addresses() {
  std::vector<int64_t> out;
#ifdef WAVEPP_AMX
  Scratch& w = scratch();
  for (const void* ptr : {static_cast<const void*>(w.shared_k.data()), static_cast<const void*>(w.shared_v.data()),
                          static_cast<const void*>(w.own_k.data()), static_cast<const void*>(w.own_v.data()),
                          static_cast<const void*>(w.q.data()), static_cast<const void*>(w.p.data()),
                          static_cast<const void*>(w.s.data()), static_cast<const void*>(w.acc.data()),
                          static_cast<const void*>(w.part.data())})
    if (ptr != nullptr) out.push_back(reinterpret_cast<int64_t>(ptr));
#endif
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &amx_ready, "whether the AMX attention kernel runs on this machine");
  // the GIL is released while a kernel runs: the leader and I/O threads of a stage process
  // go on beside it
  m.def("attention", &attention, "causal attention over a paged KV cache on AMX tiles",
        py::call_guard<py::gil_scoped_release>());
  m.def("scratch_addresses", &scratch_addresses, "the calling thread's tile buffers' addresses");
}
