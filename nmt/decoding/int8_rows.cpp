// nmt::int8_rows: an int8 linear map for the one row of a decoding step at batch 1.
//
// out = dequantize(u8(x) . W^T) + bias, then ReLU, or plus a residual: x (R, K) float rows,
// rounded to 8 bits with one scale and zero point for the call, as fbgemm's dynamic linear
// rounds them (its parameters, its fused multiply-add and round to nearest even); W (N, K) int8
// rows with one symmetric scale each; the products summed in int32, exactly; then, per output,
// fma(float(acc - x_zero * sum_k W[n, k]), x_scale * w_scale[n], bias[n]) as fbgemm's epilogue
// computes it, and the ReLU or the residual in the same pass (no second sweep over the output):
// fbgemm's outputs bit for bit.
//
// fbgemm's call costs ~9 us before its first product (packing the activations into a blocked
// buffer, its output pipeline); a step at batch 1 makes seven such calls of a few thousand
// products each. Here a call is one pass over x and one over W, packed once by int8_rows_pack
// so that one vector of its weights (16-bit lanes) times a broadcast pair of x's values gives
// a block of outputs' partial sums (madd: u8 x s8 pairs summed into 32 bits; ATen's capability
// flags pick the width, AVX-512 or AVX2; plain loops otherwise). Each row of x streams all of
// W: at two rows and more fbgemm's blocked kernels, which reuse each weight across rows, are as
// fast or faster (nmt/decoding/affine.py picks; scripts/bench_int8_rows.py).
//
// tests/unit/test_fast_model.py compares its outputs with fbgemm's (Int8Affine.product), bit
// for bit, under each build.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace {

constexpr float kSmallScale = 6.1e-5f;  // fbgemm's and ATen's SMALL_SCALE_THRESHOLD

struct Rounding {
  float scale;
  int32_t zero;
};

// The scale and zero point of 8-bit activations in [lo, hi]: ChooseQuantizationParams of
// ATen's QuantUtils.h (fbgemm's), without sparsity or a power of two.
Rounding choose(float lo, float hi, bool reduce_range) {
  const int32_t qmin = 0, qmax = reduce_range ? 127 : 255;
  lo = std::min(lo, 0.f);
  hi = std::max(hi, 0.f);
  double scale = (static_cast<double>(hi) - lo) / (qmax - qmin);
  if (float(scale) == 0.0f || std::isinf(1.0f / float(scale))) scale = 0.1;
  if (scale < kSmallScale) {
    const float small = scale;
    scale = kSmallScale;
    if (lo == 0.0f) {
      hi = kSmallScale * (qmax - qmin);
    } else if (hi == 0.0f) {
      lo = -kSmallScale * (qmax - qmin);
    } else {
      lo *= kSmallScale / small;
      hi *= kSmallScale / small;
    }
  }
  const double from_min = qmin - lo / scale, from_max = qmax - hi / scale;
  const double error_min = std::abs(qmin) - std::abs(lo / scale);
  const double error_max = std::abs(qmax) - std::abs(hi / scale);
  const double zero = error_min < error_max ? from_min : from_max;
  int32_t nudged = zero < qmin ? qmin : zero > qmax ? qmax : int32_t(std::nearbyint(zero));
  return {float(scale), nudged};
}

// Vectors of 16-bit lanes: W's 8-bit values widened, pairs of products summed into 32-bit
// lanes by madd (exact: |u8 x s8| < 2^15). ATen's capability macros pick the width.
#if defined(CPU_CAPABILITY_AVX512)
using V = __m512i;
constexpr int64_t kOut = 16;  // outputs a vector holds (32-bit lanes)
inline V widen(const int8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
inline V pair(const int16_t* p) { return _mm512_set1_epi32(*(const int32_t*)p); }
inline V madd_add(V acc, V a, V b) { return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)); }
inline V zeros() { return _mm512_setzero_si512(); }
inline void store(int32_t* p, V v) { _mm512_storeu_si512(p, v); }
inline V add4(V a, V b, V c, V d) { return _mm512_add_epi32(_mm512_add_epi32(a, b), _mm512_add_epi32(c, d)); }
#elif defined(CPU_CAPABILITY_AVX2)
using V = __m256i;
constexpr int64_t kOut = 8;
inline V widen(const int8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p)); }
inline V pair(const int16_t* p) { return _mm256_set1_epi32(*(const int32_t*)p); }
inline V madd_add(V acc, V a, V b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
inline V zeros() { return _mm256_setzero_si256(); }
inline void store(int32_t* p, V v) { _mm256_storeu_si256((__m256i*)p, v); }
inline V add4(V a, V b, V c, V d) { return _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d)); }
#else
constexpr int64_t kOut = 8;
#endif

// W (N, K) int8 -> (ceil(N / kOut), ceil(K / 2), kOut, 2): each block of kOut outputs stores,
// for each pair of inputs k, 2k+1, its outputs' two weights side by side (zeros past N and K),
// so that one vector of them times x's pair, broadcast, gives kOut outputs' partial sums.
at::Tensor int8_rows_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, "weight: int8 (N, K)");
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t Np = (N + kOut - 1) / kOut * kOut, Kp = (K + 1) / 2 * 2;
  at::Tensor padded = at::constant_pad_nd(weight, {0, Kp - K, 0, Np - N}, 0);  // (Np, Kp)
  return padded.view({Np / kOut, kOut, Kp / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// acc[j] = sum_k a[k] * W[block j][k] for one row a (16-bit, Kp values) and one packed block
// of kOut outputs: four sums over alternate pairs of inputs, so that four products are in
// flight rather than each waiting for the last.
inline void block_dots(const int16_t* a, const int8_t* w, int64_t Kp, int32_t* acc) {
  int64_t k = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  V s0 = zeros(), s1 = zeros(), s2 = zeros(), s3 = zeros();
  for (; k + 8 <= Kp; k += 8) {
    s0 = madd_add(s0, pair(a + k), widen(w + k * kOut));
    s1 = madd_add(s1, pair(a + k + 2), widen(w + (k + 2) * kOut));
    s2 = madd_add(s2, pair(a + k + 4), widen(w + (k + 4) * kOut));
    s3 = madd_add(s3, pair(a + k + 6), widen(w + (k + 6) * kOut));
  }
  for (; k < Kp; k += 2) s0 = madd_add(s0, pair(a + k), widen(w + k * kOut));
  store(acc, add4(s0, s1, s2, s3));
#else
  for (int64_t j = 0; j < kOut; ++j) acc[j] = 0;
  for (; k < Kp; k += 2)
    for (int64_t j = 0; j < kOut; ++j)
      acc[j] += int32_t(a[k]) * w[k * kOut + 2 * j] + int32_t(a[k + 1]) * w[k * kOut + 2 * j + 1];
#endif
}

at::Tensor int8_rows(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                     const at::Tensor& w_sums, const c10::optional<at::Tensor>& bias,
                     const c10::optional<at::Tensor>& residual, bool relu, bool reduce_range) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float rows");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.dim() == 4 &&
              packed.size(2) == kOut, "weight: int8_rows_pack's layout");
  const int64_t N = w_scale.size(0), Kp = packed.size(1) * 2, K = x.size(-1);
  const int64_t R = x.numel() / std::max<int64_t>(K, 1);
  TORCH_CHECK(Kp == (K + 1) / 2 * 2, "x's last dimension is not the weight's");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor out = residual.has_value() ? residual->clone(at::MemoryFormat::Contiguous)
                                        : at::empty(shape, x.options());
  const float* xs = x.data_ptr<float>();
  const auto [lo, hi] = std::minmax_element(xs, xs + R * K);
  const Rounding q = R * K ? choose(*lo, *hi, reduce_range) : Rounding{1.f, 0};
  const float inverse = 1.0f / q.scale, qmax = reduce_range ? 127.f : 255.f;
  std::vector<int16_t> xq(R * Kp, 0);  // (R, Kp), zeros past K
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {  // fbgemm's rounding: fma, nearest even, clamp
      const float v = std::nearbyint(std::fma(xs[r * K + k], inverse, float(q.zero)));
      xq[r * Kp + k] = int16_t(std::min(std::max(v, 0.f), qmax));
    }
  const int8_t* w = packed.data_ptr<int8_t>();
  const float* scale = w_scale.data_ptr<float>();
  const int32_t* sums = w_sums.data_ptr<int32_t>();
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const bool add = residual.has_value();
  const int64_t blocks = packed.size(0), grain = std::max<int64_t>(1, 65536 / (Kp * kOut * R));
  at::parallel_for(0, blocks, grain, [&](int64_t nb0, int64_t nb1) {
    int32_t acc[kOut];
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      const int8_t* wb = w + nb * Kp * kOut;  // (Kp / 2, kOut, 2): a block of kOut outputs
      const int64_t n0 = nb * kOut, outs = std::min<int64_t>(kOut, N - n0);
      for (int64_t r = 0; r < R; ++r) {
        block_dots(xq.data() + r * Kp, wb, Kp, acc);
        float* y = o + r * N + n0;
        for (int64_t j = 0; j < outs; ++j) {  // the epilogue, in fbgemm's order
          const float v = std::fma(float(acc[j] - q.zero * sums[n0 + j]),
                                   q.scale * scale[n0 + j], b ? b[n0 + j] : 0.f);
          y[j] = add ? y[j] + v : relu ? std::max(v, 0.f) : v;
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nmt, m) {
  m.def("int8_rows_pack(Tensor weight) -> Tensor");
  m.def("int8_rows(Tensor x, Tensor packed, Tensor w_scale, Tensor w_sums, Tensor? bias, "
        "Tensor? residual, bool relu, bool reduce_range) -> Tensor");
}

TORCH_LIBRARY_IMPL(nmt, CPU, m) {
  m.impl("int8_rows_pack", int8_rows_pack);
  m.impl("int8_rows", int8_rows);
}
