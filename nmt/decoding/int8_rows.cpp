// nmt::int8_rows: an int8 linear map for the few rows of a decoding step (batch 1, a beam, a
// few sentences).
//
// out = dequantize(u8(x) . W^T) + bias, then ReLU, or plus a residual: x (R, K) float rows,
// each rounded to 8 bits with its own scale and zero point, as fbgemm's dynamic linear rounds a
// call of that row alone (its parameters, its fused multiply-add and round to nearest even), so
// that a row's outputs never depend on the rows beside it (CTranslate2 scales each row too);
// W (N, K) int8 rows with one symmetric scale each; the products summed in int32, exactly;
// then, per output, fma(float(acc - x_zero * sum_k W[n, k]), x_scale * w_scale[n], bias[n]) as
// fbgemm's epilogue computes it, and the ReLU or the residual in the same pass (no second sweep
// over the output): fbgemm's outputs for each row alone, bit for bit.
//
// The same rounding serves the maps of many rows (nmt.decoding.affine.Int8Affine):
// int8_rows_quantize gives each row's u8 values, scale and zero point, oneDNN sums the products
// (its qlinear with a scale of 1 and no zero point: float(acc) x w_scale[n]), and
// int8_rows_rescale takes each row's zero point and scale back out of those outputs.
//
// fbgemm's call costs ~9 us before its first product (packing the activations into a blocked
// buffer, its output pipeline); a step at batch 1 makes seven such calls of a few thousand
// products each. Here a call is one pass over x and one over W, packed once by int8_rows_pack
// in one of two layouts:
// - VNNI (AVX-512 VNNI, asked of the CPU at run time: Cascade Lake, Ice Lake, Zen 4 and later):
//   vpdpbusd sums four u8 x s8 products into each 32-bit lane at once. W is packed in groups of
//   64 outputs, each input quadruple's weights side by side, and each group's weights are read
//   once for all the rows, 4 rows x 64 outputs of sums in registers at a time: the few rows of a
//   step cost little more than one (nmt.decoding.affine.few_rows: the rows Int8Affine gives it).
//   With AMX (int8_amx.cpp), a few rows' sums of this layout through its tiles instead.
// - quads (AVX-512 without VNNI, AVX2): the VNNI layout (groups of 4 vectors of outputs), each
//   vpdpbusd done as fbgemm's kernels do it there: vpmaddubsw (pairs of u8 x s8 products into
//   16 bits) then vpmaddwd by ones and an addition. Exact where activations keep 7 bits
//   (reduce_range: |2 x 127 x 128| < 2^15), as they do wherever fbgemm's products saturate
//   (affine.int8_saturates); with 8-bit activations (never Int8Affine's choice there) a plain
//   loop over the same layout.
// - pairs (plain loops, no vector build): each row of x streams all of W; one row given it.
// ATen's capability flags pick the vector width (AVX-512 or AVX2); VNNI is compiled only into
// the AVX-512 object, for its own functions, and taken where the CPU has it.
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
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include "int8_amx.h"

namespace {

constexpr float kSmallScale = 6.1e-5f;  // fbgemm's and ATen's SMALL_SCALE_THRESHOLD
// Rounded activations are clamped to u8's range, with 7-bit activations too, as fbgemm clamps
// them: a row's largest value, at 127 + a rounding's worth, may round to 128 (exact still in the
// quads: 2 x 128 x 127 < 2^15).
constexpr float kTop = 255.f;

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

// One activation rounded as fbgemm rounds it: fma with the inverse scale and the zero point,
// nearest even, clamped to [0, kTop].
inline uint8_t round_one(float x, float inverse, float zero) {
  return uint8_t(std::min(std::max(std::nearbyint(std::fma(x, inverse, zero)), 0.f), kTop));
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

// quads without VNNI: four u8 x s8 products into each 32-bit lane, through 16-bit pairs
#if defined(CPU_CAPABILITY_AVX512)
inline V load(const int8_t* p) { return _mm512_loadu_si512(p); }
inline V broadcast(int32_t quad) { return _mm512_set1_epi32(quad); }
inline V ones() { return _mm512_set1_epi16(1); }
inline V dot4(V acc, V a, V w, V one) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, w), one));
}
#elif defined(CPU_CAPABILITY_AVX2)
inline V load(const int8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
inline V broadcast(int32_t quad) { return _mm256_set1_epi32(quad); }
inline V ones() { return _mm256_set1_epi16(1); }
inline V dot4(V acc, V a, V w, V one) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), one));
}
#endif

constexpr int64_t kGroup = 4 * kOut;  // quads: the outputs of a group (4 vectors of kOut lanes)
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kRowBlock = 4;  // quads: the rows whose sums a pass holds (4 x 4 vectors)
#else
constexpr int64_t kRowBlock = 2;  // AVX2's 16 registers: 2 rows x 4 vectors of sums
#endif

// Whether this build packs quads (a vector build), else pairs.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kQuads = true;
#else
constexpr bool kQuads = false;
#endif

// Whether this CPU has AVX-512 VNNI and this object its kernel (the AVX-512 build only).
bool has_vnni() {
#if defined(CPU_CAPABILITY_AVX512)
  static const bool yes = __builtin_cpu_supports("avx512vnni");
  return yes;
#else
  return false;
#endif
}

// The fewest rows int8_rows gives AMX's tiles: one or two rows take as long as vpdpbusd's
// there, 3-4 rows 0.7-0.85x, 16 0.35-0.7x, 64 0.35-0.55x; but a map of more weights than
// kAmxBigWeights (the output projections of larger vocabularies: read from memory either way)
// 1.05-1.15x at 3-4 rows, and so takes them from kAmxBigRows (docs/results.md, "int8 maps
// through AMX's tiles"). NMT_AMX_ROWS overrides kAmxRows (0: never; empty: unset), for
// comparisons.
constexpr int64_t kAmxRows = 3;
constexpr int64_t kAmxBigWeights = int64_t(1) << 21, kAmxBigRows = 16;

int64_t amx_min_rows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("NMT_AMX_ROWS");
    return v && *v ? (std::atoll(v) > 0 ? std::atoll(v) : INT64_MAX) : kAmxRows;
  }();
  return rows;
}

// The fewest rows of a map that int8_rows gives AMX's tiles here (0: none).
int64_t amx_rows_here() {
  return has_vnni() && amx_min_rows() < INT64_MAX && nmt_amx::amx_usable() ? amx_min_rows() : 0;
}

// W (N, K) int8 -> quads (VNNI's and the vector builds'): (ceil(N / G), ceil(K / 4), G, 4),
// G = kGroup, each group of G outputs storing, for each quadruple of inputs, its outputs' four
// weights side by side; pairs: (ceil(N / kOut), ceil(K / 2), kOut, 2) alike. Zeros past N and
// K. One vector of them times x's quadruple (or pair), broadcast, gives kOut outputs' partial
// sums.
at::Tensor int8_rows_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, "weight: int8 (N, K)");
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t outs = kQuads ? kGroup : kOut, lanes = kQuads ? 4 : 2;
  const int64_t Np = (N + outs - 1) / outs * outs, Kp = (K + lanes - 1) / lanes * lanes;
  at::Tensor padded = at::constant_pad_nd(weight, {0, Kp - K, 0, Np - N}, 0);  // (Np, Kp)
  return padded.view({Np / outs, outs, Kp / lanes, lanes}).permute({0, 2, 1, 3}).contiguous();
}

// What a call's outputs are made of besides the sums: each row's rounding, W's scales
// and row sums, the bias, where the outputs go, and the residual added to them or the ReLU.
struct Epilogue {
  const Rounding* q;  // (R,)
  const float* scale;
  const int32_t* sums;
  const float* bias;  // nullptr: none
  float* out;  // (R, N)
  int64_t N;
  const float* add;  // (R, N) the residual; nullptr: none
  bool relu;
};

// Output n of row r from its sum: the epilogue, in fbgemm's order.
inline void finish_one(const Epilogue& e, int64_t r, int64_t n, int32_t acc) {
  const float v = std::fma(float(acc - e.q[r].zero * e.sums[n]), e.q[r].scale * e.scale[n],
                           e.bias ? e.bias[n] : 0.f);
  e.out[r * e.N + n] = e.add ? e.add[r * e.N + n] + v : e.relu ? std::max(v, 0.f) : v;
}

// ----------------------------------------------------------------------------- pairs (madd)
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

// The map through the pairs' layout: x's R rows (K values) rounded to 16-bit lanes, each row
// over every block of W (blocks of them, Kp inputs each), each output's epilogue in fbgemm's
// order.
void pair_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const int8_t* w,
               int64_t blocks, const Epilogue& e) {
  std::vector<int16_t> xq(R * Kp, 0);  // (R, Kp), zeros past K
  for (int64_t r = 0; r < R; ++r) {
    const float inverse = 1.0f / e.q[r].scale, zero = float(e.q[r].zero);
    for (int64_t k = 0; k < K; ++k) xq[r * Kp + k] = round_one(xs[r * K + k], inverse, zero);
  }
  const int64_t grain = std::max<int64_t>(1, 65536 / (Kp * kOut * R));
  at::parallel_for(0, blocks, grain, [&](int64_t nb0, int64_t nb1) {
    int32_t acc[kOut];
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      const int8_t* wb = w + nb * Kp * kOut;  // (Kp / 2, kOut, 2): a block of kOut outputs
      const int64_t n0 = nb * kOut, outs = std::min<int64_t>(kOut, e.N - n0);
      for (int64_t r = 0; r < R; ++r) {
        block_dots(xq.data() + r * Kp, wb, Kp, acc);
        for (int64_t j = 0; j < outs; ++j) finish_one(e, r, n0 + j, acc[j]);
      }
    }
  });
}

// x's R rows (K values) rounded to u8 as pair_rows rounds them (fma, nearest even, clamp),
// row r by q[r], into xq (R, Kp), whose values past K stay zero (vectorized on AVX-512).
void round_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const Rounding* q,
                uint8_t* xq);

// kernel(RB) with RB a compile-time constant (std::integral_constant) equal to rows, 1 to 4.
template <typename Kernel>
void by_rows(int64_t rows, Kernel kernel) {
  switch (rows) {
    case 4: kernel(std::integral_constant<int, 4>{}); break;
    case 3: kernel(std::integral_constant<int, 3>{}); break;
    case 2: kernel(std::integral_constant<int, 2>{}); break;
    default: kernel(std::integral_constant<int, 1>{});
  }
}

// The map through the quads' layout: x's R rows rounded to u8, then each group of W (groups of
// them) read once for all the rows, `block` rows at a time: group(x, rows, W's group, first
// row, first output).
template <typename Group>
void grouped_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const int8_t* w,
                  int64_t groups, const Epilogue& e, int64_t block, Group group) {
  std::vector<uint8_t> xq(R * Kp, 0);  // (R, Kp), zeros past K
  round_rows(xs, R, K, Kp, e.q, xq.data());
  const int64_t grain = std::max<int64_t>(1, 65536 / (Kp * kGroup * R));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t r = 0; r < R; r += block)
        group(xq.data() + r * Kp, std::min(block, R - r), w + g * Kp * kGroup, r, g * kGroup);
  });
}

// ----------------------------------------------------------------------------- VNNI
#if defined(CPU_CAPABILITY_AVX512)
// The first `count` of 16 lanes.
inline __mmask16 lanes16(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
}

// The smallest and largest of n floats (n > 0).
std::pair<float, float> range(const float* xs, int64_t n) {
  __m512 lo = _mm512_set1_ps(INFINITY), hi = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, xs + i);
    lo = _mm512_mask_min_ps(lo, m, lo, v);
    hi = _mm512_mask_max_ps(hi, m, hi, v);
  }
  return {_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi)};
}

// round_rows, 16 values at a time.
void round_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const Rounding* q,
                uint8_t* xq) {
  const __m512 top = _mm512_set1_ps(kTop), bottom = _mm512_setzero_ps();
  for (int64_t r = 0; r < R; ++r) {
    const __m512 inverse = _mm512_set1_ps(1.0f / q[r].scale);
    const __m512 zero = _mm512_set1_ps(float(q[r].zero));
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 m = lanes16(K - k);
      __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xs + r * K + k), inverse, zero);
      v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_ps(_mm512_max_ps(v, bottom), top);
      _mm512_mask_cvtepi32_storeu_epi8(xq + r * Kp + k, m, _mm512_cvtps_epi32(v));
    }
  }
}

// Outputs n0 .. n0 + 15 of row r (those below N) from their sums: pair_rows' epilogue, 16 at
// once (the same operations in the same order; max(0, v) keeps a -0 as std::max(v, 0) does).
inline void finish(const Epilogue& e, int64_t r, int64_t n0, __m512i acc) {
  if (n0 >= e.N) return;
  const __mmask16 m = lanes16(e.N - n0);
  const __m512i zero_sums = _mm512_mullo_epi32(_mm512_set1_epi32(e.q[r].zero),
                                               _mm512_maskz_loadu_epi32(m, e.sums + n0));
  const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(e.q[r].scale),
                                     _mm512_maskz_loadu_ps(m, e.scale + n0));
  const __m512 bias = e.bias ? _mm512_maskz_loadu_ps(m, e.bias + n0) : _mm512_setzero_ps();
  __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, zero_sums)), scale, bias);
  if (e.add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, e.add + r * e.N + n0), v);
  else if (e.relu) v = _mm512_max_ps(_mm512_setzero_ps(), v);
  _mm512_mask_storeu_ps(e.out + r * e.N + n0, m, v);
}

// Outputs n0 .. n0 + n - 1 of row r (those below N) from their sums acc (n,): finish's
// epilogue along a row, the row's rounding and the arrays held apart from the outputs it
// writes (restrict), so that one span's vectors need not wait on the last one's store.
inline void finish_span(const Epilogue& e, int64_t r, int64_t n0, int64_t n,
                        const int32_t* __restrict acc) {
  const int64_t end = std::min(n, e.N - n0);
  const __m512i zero = _mm512_set1_epi32(e.q[r].zero);
  const __m512 row_scale = _mm512_set1_ps(e.q[r].scale);
  const int32_t* __restrict sums = e.sums + n0;
  const float* __restrict scales = e.scale + n0;
  const float* __restrict bias = e.bias ? e.bias + n0 : nullptr;
  float* __restrict y = e.out + r * e.N + n0;
  const float* __restrict add = e.add ? e.add + r * e.N + n0 : nullptr;
  const bool relu = e.relu;
  for (int64_t j = 0; j < end; j += 16) {
    const __mmask16 m = lanes16(end - j);
    const __m512i zero_sums = _mm512_mullo_epi32(zero, _mm512_maskz_loadu_epi32(m, sums + j));
    const __m512 scale = _mm512_mul_ps(row_scale, _mm512_maskz_loadu_ps(m, scales + j));
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + j) : _mm512_setzero_ps();
    const __m512i sum = _mm512_maskz_loadu_epi32(m, acc + j);
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, zero_sums)), scale, b);
    if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, add + j), v);
    else if (relu) v = _mm512_max_ps(_mm512_setzero_ps(), v);
    _mm512_mask_storeu_ps(y + j, m, v);
  }
}

// RB rows (u8, rows Kp apart, from row r0) times one group of W (Kp / 4, 64, 4) of outputs n0
// .. n0 + 63: RB x 4 vectors of sums in registers, each weight vector loaded once for all the
// rows, four products summed into each lane by vpdpbusd (exactly: |u8 x s8| x 4 < 2^31).
template <int RB>
__attribute__((target("avx512vnni"))) void group_rows(const uint8_t* x, int64_t Kp,
                                                      const int8_t* w, const Epilogue& e,
                                                      int64_t r0, int64_t n0) {
  __m512i s[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) s[r][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < Kp; k += 4, w += 4 * kGroup) {
    const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
    const __m512i w2 = _mm512_loadu_si512(w + 128), w3 = _mm512_loadu_si512(w + 192);
    for (int r = 0; r < RB; ++r) {
      int32_t quad;  // x[k .. k+3], read as one 32-bit value (memcpy: no aliasing)
      std::memcpy(&quad, x + r * Kp + k, sizeof quad);
      const __m512i a = _mm512_set1_epi32(quad);
      s[r][0] = _mm512_dpbusd_epi32(s[r][0], a, w0);
      s[r][1] = _mm512_dpbusd_epi32(s[r][1], a, w1);
      s[r][2] = _mm512_dpbusd_epi32(s[r][2], a, w2);
      s[r][3] = _mm512_dpbusd_epi32(s[r][3], a, w3);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) finish(e, r0 + r, n0 + 16 * j, s[r][j]);
}
#elif defined(CPU_CAPABILITY_AVX2)
// The smallest and largest of n floats (n > 0), 8 at a time.
std::pair<float, float> range(const float* xs, int64_t n) {
  __m256 lo = _mm256_set1_ps(INFINITY), hi = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(xs + i);
    lo = _mm256_min_ps(lo, v);
    hi = _mm256_max_ps(hi, v);
  }
  float los[8], his[8];
  _mm256_storeu_ps(los, lo);
  _mm256_storeu_ps(his, hi);
  float a = *std::min_element(los, los + 8), b = *std::max_element(his, his + 8);
  for (; i < n; ++i) a = std::min(a, xs[i]), b = std::max(b, xs[i]);
  return {a, b};
}

// round_rows, 8 values at a time (the same fma and rounding: the same bytes), the rest one by
// one.
void round_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const Rounding* q,
                uint8_t* xq) {
  const __m256 top = _mm256_set1_ps(kTop), bottom = _mm256_setzero_ps();
  for (int64_t r = 0; r < R; ++r) {
    const float inverse = 1.0f / q[r].scale, zero = float(q[r].zero);
    const __m256 inverses = _mm256_set1_ps(inverse), zeros = _mm256_set1_ps(zero);
    const float* x = xs + r * K;
    uint8_t* out = xq + r * Kp;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), inverses, zeros);
      v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i ints = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, bottom), top));
      const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(ints),
                                             _mm256_extracti128_si256(ints, 1));  // 8 x u16
      _mm_storel_epi64((__m128i*)(out + k), _mm_packus_epi16(words, words));  // 8 x u8
    }
    for (; k < K; ++k) out[k] = round_one(x[k], inverse, zero);
  }
}

// Outputs n0 .. n0 + 7 of row r (those below N) from their sums: finish_one's epilogue, 8 at
// once where all 8 are below N (the same operations in the same order; max(0, v) keeps a -0 as
// std::max(v, 0) does), else one at a time.
inline void finish(const Epilogue& e, int64_t r, int64_t n0, V acc) {
  if (e.N - n0 < kOut) {
    int32_t sums[kOut];
    store(sums, acc);
    for (int64_t j = 0; j < e.N - n0; ++j) finish_one(e, r, n0 + j, sums[j]);
    return;
  }
  const V zero_sums = _mm256_mullo_epi32(_mm256_set1_epi32(e.q[r].zero),
                                         _mm256_loadu_si256((const V*)(e.sums + n0)));
  const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(e.q[r].scale), _mm256_loadu_ps(e.scale + n0));
  const __m256 bias = e.bias ? _mm256_loadu_ps(e.bias + n0) : _mm256_setzero_ps();
  __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, zero_sums)), scale, bias);
  if (e.add) v = _mm256_add_ps(_mm256_loadu_ps(e.add + r * e.N + n0), v);
  else if (e.relu) v = _mm256_max_ps(_mm256_setzero_ps(), v);
  _mm256_storeu_ps(e.out + r * e.N + n0, v);
}
#else
std::pair<float, float> range(const float* xs, int64_t n) {
  const auto [lo, hi] = std::minmax_element(xs, xs + n);
  return {*lo, *hi};
}

// round_rows, one value at a time.
void round_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const Rounding* q,
                uint8_t* xq) {
  for (int64_t r = 0; r < R; ++r) {
    const float inverse = 1.0f / q[r].scale, zero = float(q[r].zero);
    for (int64_t k = 0; k < K; ++k) xq[r * Kp + k] = round_one(xs[r * K + k], inverse, zero);
  }
}

#endif

// ----------------------------------------------------------------------------- quads
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// RB rows (u8, rows Kp apart, from row r0) times one group of W (Kp / 4, kGroup, 4) of outputs
// n0 ..: group_rows without VNNI, each vpdpbusd as dot4 (exact with 7-bit activations).
template <int RB>
void quad_group_rows(const uint8_t* x, int64_t Kp, const int8_t* w, const Epilogue& e,
                     int64_t r0, int64_t n0) {
  V s[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) s[r][j] = zeros();
  const V one = ones();
  for (int64_t k = 0; k < Kp; k += 4, w += 4 * kGroup) {
    const V w0 = load(w), w1 = load(w + kGroup), w2 = load(w + 2 * kGroup);
    const V w3 = load(w + 3 * kGroup);
    for (int r = 0; r < RB; ++r) {
      int32_t quad;  // x[k .. k+3], read as one 32-bit value
      std::memcpy(&quad, x + r * Kp + k, sizeof quad);
      const V a = broadcast(quad);
      s[r][0] = dot4(s[r][0], a, w0, one);
      s[r][1] = dot4(s[r][1], a, w1, one);
      s[r][2] = dot4(s[r][2], a, w2, one);
      s[r][3] = dot4(s[r][3], a, w3, one);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) finish(e, r0 + r, n0 + kOut * j, s[r][j]);
}

#if defined(CPU_CAPABILITY_AVX512)
// The map through AMX's tiles (int8_amx.cpp; Kp a multiple of 64): x's R rows rounded to u8
// and padded with zero rows to whole tiles of up to 16 rows, then the sums of a few groups of
// W at a time for every tile of rows, and their epilogue along each row (finish_span).
void amx_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const int8_t* w,
              int64_t groups, const Epilogue& e) {
  constexpr int64_t kGroups = 4;  // groups a pass: their sums, 1 KB a row, read back at once
  const int64_t rows = std::min(R, nmt_amx::kTileRows), blocks = (R + rows - 1) / rows;
  std::vector<uint8_t> xq(blocks * rows * Kp, 0);  // (blocks x rows, Kp), zeros past R and K
  round_rows(xs, R, K, Kp, e.q, xq.data());
  const int64_t grain = std::max<int64_t>(1, 65536 / (Kp * kGroup * R));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    std::vector<int32_t> sums(blocks * rows * kGroups * kGroup);  // (blocks x rows, 4 x 64)
    for (int64_t g = g0; g < g1; g += kGroups) {
      const int64_t n = std::min(kGroups, g1 - g);
      nmt_amx::amx_sums(xq.data(), rows, blocks, Kp, w + g * Kp * kGroup, n, sums.data(),
                        kGroups * kGroup);
      for (int64_t r = 0; r < R; ++r)
        finish_span(e, r, g * kGroup, n * kGroup, sums.data() + r * kGroups * kGroup);
    }
  });
}
#endif

// The map through the quads' layout: grouped_rows, kRowBlock rows at a time, each group's sums
// by vpdpbusd where the CPU has VNNI (group_rows), else as dot4 (quad_group_rows: exact with
// 7-bit activations); through AMX's tiles (amx_rows: the same sums) where the CPU has them,
// from amx_min_rows() rows (kAmxBigRows for a map of more than kAmxBigWeights), K a multiple
// of 64.
void quad_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const int8_t* w,
               int64_t groups, const Epilogue& e) {
  const bool vnni = has_vnni();
#if defined(CPU_CAPABILITY_AVX512)
  const bool big = groups * kGroup * Kp > kAmxBigWeights;
  if (vnni && R >= std::max(amx_min_rows(), big ? kAmxBigRows : 0) &&
      Kp % nmt_amx::kChunk == 0 && nmt_amx::amx_usable())
    return amx_rows(xs, R, K, Kp, w, groups, e);
#endif
  grouped_rows(xs, R, K, Kp, w, groups, e, kRowBlock,
               [&](const uint8_t* x, int64_t rows, const int8_t* wg, int64_t r, int64_t n0) {
                 by_rows(rows, [&](auto RB) {
#if defined(CPU_CAPABILITY_AVX512)
                   if (vnni) return group_rows<RB()>(x, Kp, wg, e, r, n0);
#endif
                   quad_group_rows<RB()>(x, Kp, wg, e, r, n0);
                 });
               });
}
#else
void quad_rows(const float*, int64_t, int64_t, int64_t, const int8_t*, int64_t, const Epilogue&) {
  TORCH_CHECK(false, "int8_rows: the quads' layout in a build without vectors");
}
#endif

// The map through the quads' layout in plain loops: 8-bit activations on a CPU without VNNI
// (whose vpmaddubsw would saturate; Int8Affine gives fbgemm those products there).
void plain_quad_rows(const float* xs, int64_t R, int64_t K, int64_t Kp, const int8_t* w,
                     int64_t groups, const Epilogue& e) {
  std::vector<uint8_t> xq(R * Kp, 0);  // (R, Kp), zeros past K
  round_rows(xs, R, K, Kp, e.q, xq.data());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < kGroup && g * kGroup + j < e.N; ++j) {
        int32_t acc = 0;
        for (int64_t k = 0; k < Kp; ++k)
          acc += int32_t(xq[r * Kp + k]) * w[((g * (Kp / 4) + k / 4) * kGroup + j) * 4 + k % 4];
        finish_one(e, r, g * kGroup + j, acc);
      }
}

// Each of x's R rows' (K values) rounding: its own range's scale and zero point.
std::vector<Rounding> row_roundings(const float* xs, int64_t R, int64_t K, bool reduce_range) {
  std::vector<Rounding> q(R);
  for (int64_t r = 0; r < R; ++r) {
    const auto [lo, hi] = range(xs + r * K, K);
    q[r] = choose(lo, hi, reduce_range);
  }
  return q;
}

at::Tensor int8_rows(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                     const at::Tensor& w_sums, const c10::optional<at::Tensor>& bias,
                     const c10::optional<at::Tensor>& residual, bool relu, bool reduce_range) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float rows");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.dim() == 4,
              "weight: int8_rows_pack's layout");
  const int64_t lanes = packed.size(3);
  const bool quads = lanes == 4 && packed.size(2) == kGroup;
  TORCH_CHECK(quads || (lanes == 2 && packed.size(2) == kOut), "weight: int8_rows_pack's layout");
  const int64_t N = w_scale.size(0), Kp = packed.size(1) * lanes, K = x.size(-1);
  const int64_t R = x.numel() / std::max<int64_t>(K, 1);
  TORCH_CHECK(Kp == (K + lanes - 1) / lanes * lanes, "x's last dimension is not the weight's");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  // the residual read where it is (a clone into the outputs was 4 more operators a call)
  const at::Tensor res = residual.has_value() ? residual->contiguous() : at::Tensor();
  TORCH_CHECK(!res.defined() || res.numel() == R * N, "residual: the outputs' shape");
  at::Tensor out = at::empty(shape, x.options());
  if (R * K == 0) return res.defined() ? out.copy_(res.view(shape)) : out;
  const float* xs = x.data_ptr<float>();
  const std::vector<Rounding> q = row_roundings(xs, R, K, reduce_range);
  const Epilogue e{q.data(), w_scale.data_ptr<float>(), w_sums.data_ptr<int32_t>(),
                   bias.has_value() ? bias->data_ptr<float>() : nullptr, out.data_ptr<float>(),
                   N, res.defined() ? res.data_ptr<float>() : nullptr, relu};
  const auto kernel = !quads                        ? pair_rows
                      : has_vnni() || reduce_range ? quad_rows
                                                   : plain_quad_rows;
  kernel(xs, R, K, Kp, packed.data_ptr<int8_t>(), packed.size(0), e);
  return out;
}

// x's rows (..., K) rounded to u8 as int8_rows rounds them: (the u8 values (..., K), each row's
// scale (R,) and zero point (R,)), for a GEMM of many rows elsewhere (int8_rows_rescale after).
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_rows_quantize(const at::Tensor& x,
                                                                  bool reduce_range) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float rows");
  const int64_t K = x.size(-1), R = x.numel() / std::max<int64_t>(K, 1);
  at::Tensor values = at::empty(x.sizes(), x.options().dtype(at::kByte));
  at::Tensor scale = at::empty({R}, x.options()), zero = at::empty({R}, x.options().dtype(at::kInt));
  if (R * K == 0) return {values, scale, zero};
  const std::vector<Rounding> q = row_roundings(x.data_ptr<float>(), R, K, reduce_range);
  round_rows(x.data_ptr<float>(), R, K, K, q.data(), values.data_ptr<uint8_t>());
  for (int64_t r = 0; r < R; ++r) {
    scale.data_ptr<float>()[r] = q[r].scale;
    zero.data_ptr<int32_t>()[r] = q[r].zero;
  }
  return {values, scale, zero};
}

// A GEMM's outputs y (R, N) = float(acc) x w_scale[n] of int8_rows_quantize's u8 rows, finished
// in place as int8_rows finishes its sums: (y - zero[r] x zero_sums[n]) x scale[r] + bias[n],
// then ReLU, or plus the residual; zero_sums[n] = w_scale[n] x sum_k W[n, k]. Equal to
// int8_rows' outputs to within float rounding. In place: a batch's vocabulary projection is
// megabytes, which a new buffer would take page by page.
void int8_rows_rescale(at::Tensor& y, const at::Tensor& scale, const at::Tensor& zero,
                       const at::Tensor& zero_sums, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& residual, bool relu) {
  TORCH_CHECK(y.scalar_type() == at::kFloat && y.is_contiguous(), "y: contiguous float rows");
  const int64_t N = y.size(-1), R = y.numel() / std::max<int64_t>(N, 1);
  TORCH_CHECK(scale.numel() == R && zero.numel() == R && zero_sums.numel() == N,
              "int8_rows_rescale: a scale and zero point per row, a sum per output");
  at::Tensor res = residual.has_value() ? residual->contiguous() : at::Tensor();
  TORCH_CHECK(!res.defined() || res.numel() == y.numel(), "residual: y's shape");
  const float *s = scale.data_ptr<float>(), *c = zero_sums.data_ptr<float>();
  const float *b = bias ? bias->data_ptr<float>() : nullptr;
  const float* add = res.defined() ? res.data_ptr<float>() : nullptr;
  const int32_t* z = zero.data_ptr<int32_t>();
  float* ys = y.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)),
                   [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float zr = float(z[r]), sr = s[r];
      float* yr = ys + r * N;  // one loop per form, each vectorized by the compiler
      if (add) {
        const float* ar = add + r * N;
        for (int64_t n = 0; n < N; ++n) yr[n] = ar[n] + std::fma(yr[n] - zr * c[n], sr, b ? b[n] : 0.f);
      } else if (relu) {
        for (int64_t n = 0; n < N; ++n)
          yr[n] = std::max(std::fma(yr[n] - zr * c[n], sr, b ? b[n] : 0.f), 0.f);
      } else {
        for (int64_t n = 0; n < N; ++n) yr[n] = std::fma(yr[n] - zr * c[n], sr, b ? b[n] : 0.f);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nmt, m) {
  m.def("int8_rows_pack(Tensor weight) -> Tensor");
  m.def("int8_rows_vnni() -> bool");
  m.def("int8_rows_amx() -> int");
  m.def("int8_rows(Tensor x, Tensor packed, Tensor w_scale, Tensor w_sums, Tensor? bias, "
        "Tensor? residual, bool relu, bool reduce_range) -> Tensor");
  m.def("int8_rows_quantize(Tensor x, bool reduce_range) -> (Tensor, Tensor, Tensor)");
  m.def("int8_rows_rescale(Tensor(a!) y, Tensor scale, Tensor zero, Tensor zero_sums, "
        "Tensor? bias, Tensor? residual, bool relu) -> ()");
}

TORCH_LIBRARY_IMPL(nmt, CatchAll, m) {
  m.impl("int8_rows_vnni", has_vnni);
  m.impl("int8_rows_amx", amx_rows_here);
}

TORCH_LIBRARY_IMPL(nmt, CPU, m) {
  m.impl("int8_rows_pack", int8_rows_pack);
  m.impl("int8_rows", int8_rows);
  m.impl("int8_rows_quantize", int8_rows_quantize);
  m.impl("int8_rows_rescale", int8_rows_rescale);
}
