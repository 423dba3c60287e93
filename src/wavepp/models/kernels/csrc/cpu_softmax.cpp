// Row softmax over attention score tiles, with the causal mask applied inside.
//
// scores: [..., rows, L], contiguous, fp32 or bf16, overwritten with the probabilities.
// With causal_rows = n > 0 the rows come in blocks of n query rows whose last row sees every
// key: row i of a block (i = row % n) sees keys [0, L - n + i] and the rest of its row is
// written as 0; with n = 0 every row sees all L keys.
//
// exp(x) = 2^t, t = x log2(e) = n + f with n = round(t): a degree-5 polynomial for 2^f and n
// put into the exponent. The inputs are scores minus their row max, so x <= 0. The rounding
// of t costs 4e-8 |t| relative, the polynomial 1.5e-7: within 1e-6 of exp where |t| < 20
// (values above 1e-6 of the row's max), 5e-6 at fp32's smallest normal. The portable loops
// are plain so that the compiler vectorizes them (-O3 -march=native, -fopenmp-simd for the
// reductions); no -ffast-math: -inf scores must stay -inf.

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

inline float bf16_to_float(uint16_t h) { return __builtin_bit_cast(float, uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {   // round to nearest even, as torch's conversion
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float load(const float* p) { return *p; }
inline float load(const uint16_t* p) { return bf16_to_float(*p); }
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = float_to_bf16(v); }
inline float rounded(float, float v) { return v; }        // v as stored in the tile's dtype
inline float rounded(uint16_t, float v) { return bf16_to_float(float_to_bf16(v)); }

// 2^f for f in [-1/2, 1/2]: a degree-5 fit of the relative error (1.5e-7 with these fp32
// coefficients).
constexpr float kExp2[6] = {1.0000001192092896f, 0.6931469440460205f, 0.24022120237350464f,
                            0.05550713464617729f, 0.00967553723603487f, 0.001327644451521337f};
constexpr float kLog2e = 1.44269504088896341f;

inline float exp2_poly(float f) {
  float p = __builtin_fmaf(kExp2[5], f, kExp2[4]);
  p = __builtin_fmaf(p, f, kExp2[3]);
  p = __builtin_fmaf(p, f, kExp2[2]);
  p = __builtin_fmaf(p, f, kExp2[1]);
  return __builtin_fmaf(p, f, kExp2[0]);
}

inline float exp_nonpositive(float x) {
  // t = x / ln2 = n + f, n = round(t) by the 1.5 * 2^23 shifter; 2^n into the exponent bits,
  // valid down to n = -126: below that (x < -87.3) the result is 0
  const float t = std::max(x * kLog2e, -126.0f);          // -inf -> -126
  const float shifter = 12582912.0f;
  const float ts = t + shifter;
  const int32_t n = __builtin_bit_cast(int32_t, ts) - __builtin_bit_cast(int32_t, shifter);
  const float p = exp2_poly(t - (ts - shifter));
  const float scale = __builtin_bit_cast(float, (n + 127) << 23);
  return x * kLog2e < -126.0f ? 0.0f : p * scale;
}

// One row of `length` scores of which [0, visible) are seen. normalize: probabilities; else
// exp(s - max), with the max and the sum of the stored values written to *row_max, *row_sum.
template <typename T>
void softmax_row(T* row, int64_t length, int64_t visible, bool normalize, float* buffer,
                 float* row_max, float* row_sum) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < visible; ++j) m = std::max(m, load(row + j));
  // The sum in double: a vector of fp32 partial sums (8 lanes with AVX2) adds 200 terms in a
  // lane for a 1,600-key row, 2-4e-6 off torch's cascade sum (measured on an AVX2 EPYC); the
  // double lanes cost a conversion per score, beside the exp.
  double s = 0.0;
  if (m == -std::numeric_limits<float>::infinity()) {     // no finite score: NaN, as torch
    for (int64_t j = 0; j < visible; ++j) store(row + j, std::numeric_limits<float>::quiet_NaN());
    s = std::numeric_limits<double>::quiet_NaN();
  } else if (normalize) {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < visible; ++j) {
      const float e = exp_nonpositive(load(row + j) - m);
      buffer[j] = e;
      s += e;
    }
    const float inv = float(1.0 / s);
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) store(row + j, buffer[j] * inv);
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < visible; ++j) {
      const float e = exp_nonpositive(load(row + j) - m);
      store(row + j, e);
      s += rounded(T(), e);
    }
  }
#pragma omp simd
  for (int64_t j = visible; j < length; ++j) store(row + j, 0.0f);
  if (row_max) *row_max = m;
  if (row_sum) *row_sum = float(s);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define WAVEPP_AVX512 1

// The same row with AVX-512: 16 scores a step, the tail under a mask. exp as above, with
// round(t) by vrndscaleps and 2^n applied by vscalefps, which also takes the result through
// fp32's subnormals to 0 (t clamped to -151: 2^-151 rounds to 0, as exp(-inf) is).
inline __m512 exp16_nonpositive(__m512 x) {
  const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _mm512_set1_ps(-151.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(kExp2[5]);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[4]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[3]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[2]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[1]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[0]));
  return _mm512_scalef_ps(p, n);
}

inline __m512 load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
inline __m512 load16(const uint16_t* p, __mmask16 k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}
inline void store16(float* p, __m512 v, __mmask16 k) { _mm512_mask_storeu_ps(p, k, v); }
inline __m256i to_bf16(__m512 v) {
#if defined(__AVX512BF16__)
  return (__m256i)_mm512_cvtneps_pbh(v);
#else   // round to nearest even by integer arithmetic
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(sum, 16));
#endif
}
inline void store16(uint16_t* p, __m512 v, __mmask16 k) { _mm256_mask_storeu_epi16(p, k, to_bf16(v)); }
inline __m512 rounded16(const float*, __m512 v) { return v; }
inline __m512 rounded16(const uint16_t*, __m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
}
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

template <typename T>
void softmax_row_avx512(T* row, int64_t length, int64_t visible, bool normalize, float* buffer,
                        float* row_max, float* row_sum) {
  const float inf = std::numeric_limits<float>::infinity();
  __m512 vmax = _mm512_set1_ps(-inf);
  for (int64_t j = 0; j < visible; j += 16)
    vmax = _mm512_mask_max_ps(vmax, tail_mask(visible - j), vmax, load16(row + j, tail_mask(visible - j)));
  const float m = _mm512_reduce_max_ps(vmax);
  if (m == -inf) {   // no finite score: the portable path writes the NaNs
    softmax_row(row, length, visible, normalize, buffer, row_max, row_sum);
    return;
  }
  const __m512 vm = _mm512_set1_ps(m);
  __m512 vsum = _mm512_setzero_ps();
  if (normalize) {
    for (int64_t j = 0; j < visible; j += 16) {
      const __mmask16 k = tail_mask(visible - j);
      const __m512 e = _mm512_maskz_mov_ps(k, exp16_nonpositive(_mm512_sub_ps(load16(row + j, k), vm)));
      _mm512_storeu_ps(buffer + j, e);   // buffer holds a multiple of 16
      vsum = _mm512_add_ps(vsum, e);
    }
    const float total = _mm512_reduce_add_ps(vsum);
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int64_t j = 0; j < visible; j += 16)
      store16(row + j, _mm512_mul_ps(_mm512_loadu_ps(buffer + j), inv), tail_mask(visible - j));
    if (row_sum) *row_sum = total;
  } else {
    for (int64_t j = 0; j < visible; j += 16) {
      const __mmask16 k = tail_mask(visible - j);
      const __m512 e = _mm512_maskz_mov_ps(k, exp16_nonpositive(_mm512_sub_ps(load16(row + j, k), vm)));
      store16(row + j, e, k);
      vsum = _mm512_add_ps(vsum, rounded16(row, e));
    }
    if (row_sum) *row_sum = _mm512_reduce_add_ps(vsum);
  }
  for (int64_t j = visible; j < length; j += 16) store16(row + j, _mm512_setzero_ps(), tail_mask(length - j));
  if (row_max) *row_max = m;
}
#endif

// row_max / row_sum: [H, R] fp32 (any strides), one value per score row, rows = H * R.
template <typename T>
void softmax_rows(T* scores, int64_t rows, int64_t length, int64_t causal_rows, bool normalize,
                  float* row_max, float* row_sum, int64_t stat_rows, int64_t stride0, int64_t stride1,
                  bool vectorized) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(length, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(normalize ? (length + 15) / 16 * 16 : 0);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t visible = causal_rows ? length - causal_rows + row % causal_rows + 1 : length;
      const int64_t stat = (row / stat_rows) * stride0 + (row % stat_rows) * stride1;
      float* max_at = row_max ? row_max + stat : nullptr;
      float* sum_at = row_sum ? row_sum + stat : nullptr;
#ifdef WAVEPP_AVX512
      if (vectorized) {
        softmax_row_avx512(scores + row * length, length, visible, normalize, buffer.data(), max_at, sum_at);
        continue;
      }
#endif
      softmax_row(scores + row * length, length, visible, normalize, buffer.data(), max_at, sum_at);
    }
  });
}

void softmax_impl(at::Tensor& scores, int64_t causal_rows, bool normalize, float* row_max,
                  float* row_sum, int64_t stat_rows, int64_t stride0, int64_t stride1, bool vectorized) {
  TORCH_CHECK(scores.device().is_cpu() && scores.is_contiguous() && scores.dim() >= 1,
              "softmax: scores must be a contiguous CPU tensor");
  const int64_t length = scores.size(-1);
  const int64_t rows = length ? scores.numel() / length : 0;
  TORCH_CHECK(causal_rows >= 0 && causal_rows <= length && (causal_rows == 0 || rows % causal_rows == 0),
              "softmax: causal_rows must divide the rows and be at most the row length");
  if (rows == 0 || length == 0) return;
  if (scores.scalar_type() == at::kFloat) {
    softmax_rows(scores.data_ptr<float>(), rows, length, causal_rows, normalize, row_max, row_sum,
                 stat_rows, stride0, stride1, vectorized);
  } else if (scores.scalar_type() == at::kBFloat16) {
    softmax_rows(reinterpret_cast<uint16_t*>(scores.data_ptr<at::BFloat16>()), rows, length, causal_rows,
                 normalize, row_max, row_sum, stat_rows, stride0, stride1, vectorized);
  } else {
    TORCH_CHECK(false, "softmax: scores must be float32 or bfloat16, got ", scores.scalar_type());
  }
}

}  // namespace

// Normalized, in place. vectorized = false: the portable loops even where AVX-512 is built.
void softmax_(at::Tensor scores, int64_t causal_rows, bool vectorized) {
  softmax_impl(scores, causal_rows, true, nullptr, nullptr, 1, 0, 0, vectorized);
}

// exp(s - row max) in place; row_max, row_sum: [H, R] fp32 with H * R score rows.
void softmax_unnormalized_(at::Tensor scores, int64_t causal_rows, at::Tensor row_max, at::Tensor row_sum,
                           bool vectorized) {
  TORCH_CHECK(row_max.scalar_type() == at::kFloat && row_sum.scalar_type() == at::kFloat &&
                  row_max.dim() == 2 && row_max.sizes() == row_sum.sizes() &&
                  row_max.strides() == row_sum.strides() && row_max.device().is_cpu() && row_sum.device().is_cpu(),
              "softmax_unnormalized_: row_max and row_sum must be [H, R] float32 CPU tensors of one layout");
  const int64_t length = scores.size(-1);
  TORCH_CHECK(row_max.numel() * length == scores.numel(), "softmax_unnormalized_: one row_max per score row");
  softmax_impl(scores, causal_rows, false, row_max.data_ptr<float>(), row_sum.data_ptr<float>(),
               row_max.size(1), row_max.stride(0), row_max.stride(1), vectorized);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {  // the GIL is released while a kernel runs
  m.def("softmax_", &softmax_, "row softmax in place, causal blocks of rows", py::call_guard<py::gil_scoped_release>());
  m.def("softmax_unnormalized_", &softmax_unnormalized_, "exp(s - row max) in place, with row max and sum", py::call_guard<py::gil_scoped_release>());
#ifdef WAVEPP_AVX512
  m.attr("avx512") = true;
#else
  m.attr("avx512") = false;
#endif
}
