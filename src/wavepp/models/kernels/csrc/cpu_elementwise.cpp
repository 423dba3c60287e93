// Fused elementwise passes of a Llama-family layer, bf16 in and out, on the CPU.
//
// silu_mul(gate_up): [T, 2I] -> [T, I], silu(gate) * up with gate = gate_up[:, :I] and
//   up = gate_up[:, I:]. It rounds where torch's `F.silu(gate).mul_(up)` does: silu(gate) to
//   bf16, then the product to bf16 (both computed in fp32). torch reads and writes the [T, I]
//   tensors twice; this reads gate and up once and writes the result once.
// rotary(x, cos, sin): x [T, H, D] (each head's D contiguous, heads D apart; rows may be
//   further apart, a view into the fused q/k/v projection), cos, sin [T, D/2] -> [T, H, D],
//   the "rotate half" rotation: out[:D/2] = x1 cos - x2 sin, out[D/2:] = x2 cos + x1 sin. Each
//   product, the difference and the sum rounded to bf16 as torch's bf16 ops round them one by
//   one (fp32 arithmetic in the same order, so the output is torch's, bit for bit), in one pass
//   where torch's take seven (four products, a sum, a difference, the concatenation).
// rms_norm(x, weight, eps): [T, D] -> [T, D], x * rsqrt(mean(x^2) + eps) rounded to bf16, then
//   times weight rounded to bf16; the statistics in fp32 (wavepp's RMSNorm, as transformers'
//   Llama rounds). One pass for the statistics and one for the output, where torch's ops take
//   six.
//
// exp is 2^n times a degree-5 polynomial for 2^f (the attention softmax's, cpu_softmax.cpp:
// 1.5e-7 relative), its argument clamped to fp32's normal range, so silu is within a few fp32
// ulps of torch's; after the bf16 rounding the two agree but where the fp32 value sits on a
// rounding boundary. The sum of squares is in another order than torch's reduction, with the
// same effect. The loops are plain so that the compiler vectorizes them (-O3 -march=native,
// -fopenmp-simd); rows are split over torch's intra-op threads.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define WAVEPP_AVX512 1
#endif

namespace {

inline float bf16_to_float(uint16_t h) { return __builtin_bit_cast(float, uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {   // round to nearest even, as torch's conversion
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

constexpr float kExp2[6] = {1.0000001192092896f, 0.6931469440460205f, 0.24022120237350464f,
                            0.05550713464617729f, 0.00967553723603487f, 0.001327644451521337f};

inline float exp_clamped(float x) {
  // t = x / ln2 = n + f, n = round(t) by the 1.5 * 2^23 shifter, 2^n put into the exponent;
  // t clamped to [-126, 127]: exp of x < -87.3 is 2^-126 (silu's denominator is then 1), of
  // x > 88 is 2^127, so silu of x < -88 is x / 2^127, under 1e-34 in size for |x| < 1e4,
  // where torch's is smaller still or 0
  float t = x * 1.44269504088896341f;
  t = t < -126.0f ? -126.0f : (t > 127.0f ? 127.0f : t);
  const float shifter = 12582912.0f;
  const float ts = t + shifter;
  const int32_t n = __builtin_bit_cast(int32_t, ts) - __builtin_bit_cast(int32_t, shifter);
  const float f = t - (ts - shifter);
  float p = __builtin_fmaf(kExp2[5], f, kExp2[4]);
  p = __builtin_fmaf(p, f, kExp2[3]);
  p = __builtin_fmaf(p, f, kExp2[2]);
  p = __builtin_fmaf(p, f, kExp2[1]);
  p = __builtin_fmaf(p, f, kExp2[0]);
  return p * __builtin_bit_cast(float, (n + 127) << 23);
}

#ifdef WAVEPP_AVX512
inline __m512 bf16x16_to_float(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

inline __m512i round_bf16_bits(__m512 v) {   // float_to_bf16 of 16 values, in the upper halves
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb),
                          _mm512_set1_epi32(int(0xFFFF0000u)));
}

// silu(gate) * up for 16 values, rounded as the scalar loop rounds. x / (1 + e) as x times a
// reciprocal refined by one Newton step (within an fp32 ulp or two of the quotient), exp as
// exp_clamped: 0.72 against 0.85 ms for the vectorized scalar loop on [1024, 2 x 1536], one
// core of an AMX Xeon (the pass is bound by memory there).
inline void silu_mul16(const uint16_t* gate, const uint16_t* up, uint16_t* out) {
  const __m512 x = bf16x16_to_float(gate);
  __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(-1.44269504088896341f));
  t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kExp2[5]), f, _mm512_set1_ps(kExp2[4]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[3]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[2]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[1]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2[0]));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_scalef_ps(p, n));
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);   // r (2 - d r)
  const __m512 act = _mm512_castsi512_ps(round_bf16_bits(_mm512_mul_ps(x, r)));
  const __m512i prod = round_bf16_bits(_mm512_mul_ps(act, bf16x16_to_float(up)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_srli_epi32(prod, 16)));
}
#endif

void check_bf16_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, name, " must be bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous 2-D tensor");
}

}  // namespace

at::Tensor silu_mul(at::Tensor gate_up) {
  check_bf16_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up's width must be even, got ", gate_up.size(1));
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, gate_up.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(gate_up.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = src + r * 2 * width;
      const uint16_t* up = gate + width;
      uint16_t* o = dst + r * width;
      int64_t i = 0;
#ifdef WAVEPP_AVX512
      for (; i + 16 <= width; i += 16) silu_mul16(gate + i, up + i, o + i);
#endif
#pragma omp simd
      for (int64_t j = i; j < width; ++j) {
        const float x = bf16_to_float(gate[j]);
        const float act = bf16_to_float(float_to_bf16(x / (1.0f + exp_clamped(-x))));
        o[j] = float_to_bf16(act * bf16_to_float(up[j]));
      }
    }
  });
  return out;
}

at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_bf16_rows(x, "x");
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kBFloat16 && weight.dim() == 1 &&
                  weight.is_contiguous() && weight.size(0) == x.size(1),
              "weight must be a contiguous bfloat16 vector of x's width ", x.size(1));
  const int64_t rows = x.size(0), width = x.size(1);
  at::Tensor out = at::empty_like(x);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float epsilon = float(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = src + r * width;
      uint16_t* o = dst + r * width;
      float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; ++i) {
        const float v = bf16_to_float(row[i]);
        squares += v * v;
      }
      const float scale = 1.0f / std::sqrt(squares / float(width) + epsilon);
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) {
        const float normed = bf16_to_float(float_to_bf16(bf16_to_float(row[i]) * scale));
        o[i] = float_to_bf16(normed * bf16_to_float(w[i]));
      }
    }
  });
  return out;
}

at::Tensor rotary(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 3, "x must be a 3-D bfloat16 CPU tensor");
  const int64_t rows = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  TORCH_CHECK(dim % 2 == 0 && x.stride(2) == 1 && x.stride(1) == dim,
              "x's heads must be contiguous, each of an even width");
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kBFloat16 && t->is_contiguous() &&
                    t->numel() == rows * half,
                "cos and sin must be contiguous bfloat16 tensors of ", rows, " x ", half);
  }
  at::Tensor out = at::empty({rows, heads, dim}, x.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const uint16_t* cp = reinterpret_cast<const uint16_t*>(cos.data_ptr());
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sin.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t row_stride = x.stride(0);
  auto r = [](float v) { return bf16_to_float(float_to_bf16(v)); };
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* c = cp + t * half;
      const uint16_t* s = sp + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        const uint16_t* x1 = src + t * row_stride + h * dim;
        const uint16_t* x2 = x1 + half;
        uint16_t* o = dst + (t * heads + h) * dim;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = bf16_to_float(x1[i]), b = bf16_to_float(x2[i]);
          const float co = bf16_to_float(c[i]), si = bf16_to_float(s[i]);
          o[i] = float_to_bf16(r(a * co) - r(b * si));
          o[i + half] = float_to_bf16(r(b * co) + r(a * si));
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {  // the GIL is released while a kernel runs
  m.def("rotary", &rotary, "rotate-half RoPE of [T, H, D] bf16, rounded as torch's ops", py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul", &silu_mul, "silu(gate) * up from [T, 2I] gate_up, bf16, rounded as torch", py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &rms_norm, "RMSNorm of [T, D] bf16 rows, statistics in fp32", py::call_guard<py::gil_scoped_release>());
}
