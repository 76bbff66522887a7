// Elementwise math the compiler can vectorise, and the blocked loop the fused
// kernels use: half-precision inputs are widened to float a block at a time, the
// float kernel runs on the block, the results are narrowed back.
//
// Kernels are plain loops over arrays of float/double calling the inline functions
// below. `NPU_SIMD` compiles a float entry point for AVX-512, AVX2 and the baseline
// ISA and picks one at load time (GCC function multiversioning), so the wheel runs
// on any x86-64 and is fast where the CPU allows.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NPU_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NPU_SIMD
#endif

namespace torch_npu::custom_ops::vmath {

// e^x in float to about 1 ulp: 2^(x log2 e) as 2^round * 2^frac, the fraction by its
// Taylor polynomial on [-0.5, 0.5]. Branch-free so that loops calling it vectorise.
inline float exp(float x) {
  const float clamped = std::min(std::max(x, -87.0f), 88.0f);
  const float t = clamped * 1.44269504088896341f;
  const float r = (t + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5 * 2^23 pushes out the fraction
  const float f = t - r;
  float p = 1.5252733804059841e-05f;
  p = p * f + 1.5403530393381609e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.6181291076284772e-03f;
  p = p * f + 5.5504108664821580e-02f;
  p = p * f + 2.4022650695910071e-01f;
  p = p * f + 6.9314718055994531e-01f;
  p = p * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(r) << 23;
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return x < -87.0f ? 0.0f : (x > 88.0f ? INFINITY : y);
}
inline double exp(double x) { return std::exp(x); }

template <typename F>
inline F sigmoid(F x) {
  return F(1) / (F(1) + vmath::exp(-x));
}

// tanh through exp: 1 - 2 / (e^{2x} + 1), exact at the saturated ends.
template <typename F>
inline F tanh(F x) {
  return F(1) - F(2) / (vmath::exp(F(2) * x) + F(1));
}

// Widens T to the compute type: float for half types and float, double for double.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int64_t kBlock = 256;

// Calls `fn(in, out, n)` on [begin, end) with arrays of acc_t<T>: direct pointers when
// T is already the compute type, else block-sized widened copies.
template <typename T, size_t NI, size_t NO, typename Fn>
void blocked(const std::array<const T*, NI>& in, const std::array<T*, NO>& out, int64_t begin, int64_t end,
             Fn&& fn) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, A>) {
    std::array<const A*, NI> i;
    std::array<A*, NO> o;
    for (size_t k = 0; k < NI; ++k) i[k] = in[k] + begin;
    for (size_t k = 0; k < NO; ++k) o[k] = out[k] + begin;
    fn(i, o, end - begin);
  } else {
    A ibuf[NI > 0 ? NI : 1][kBlock];
    A obuf[NO][kBlock];
    std::array<const A*, NI> i;
    std::array<A*, NO> o;
    for (size_t k = 0; k < NI; ++k) i[k] = ibuf[k];
    for (size_t k = 0; k < NO; ++k) o[k] = obuf[k];
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t n = std::min(kBlock, end - b);
      for (size_t k = 0; k < NI; ++k) {
        for (int64_t j = 0; j < n; ++j) ibuf[k][j] = static_cast<A>(in[k][b + j]);
      }
      fn(i, o, n);
      for (size_t k = 0; k < NO; ++k) {
        for (int64_t j = 0; j < n; ++j) out[k][b + j] = static_cast<T>(obuf[k][j]);
      }
    }
  }
}

}  // namespace torch_npu::custom_ops::vmath
