// nmt::one_query_attention: the attention of one new query per decoder row, for decoding.
//
// out[r, h] = softmax_t(q[r, h] . K[table[r, t], h, t]) . V[table[r, t], h, t], over each row's
// own positions t in [start[r], end[r]) (none: zeros).
//
// q (R, H, D) queries, already scaled by 1/sqrt(D); k, v (N, H, C, D) key and value buffers;
// table (R, >= max end) the buffer row that holds each row's position t: the self-attention
// cache is read through it, so a beam's reorder gathers the table and copies no keys, and
// cross-attention reads a sentence's one memory row through a stride-0 table (r -> r / g).
// Positions outside [start, end) are never read: each row pays for its own length only.
// q and the output fp32 or bf16, k and v in q's dtype or bf16 (the cache's precision: int8
// decoding keeps fp32 queries over a bf16 cache, half the bytes a step streams); accumulation
// in fp32. The last dimension of q, k and v must be contiguous; table, start and end are
// int64. Where the head size is 1, 2, 4 or 8 vectors, a (row, head) pair runs unrolled with
// the query and the sums in registers (attend_one: 2.3x the speed of the general loop, whose
// sums went through memory), adding in the same order: the same results.
//
// ATen's vector types take their width from compile-time macros: nmt/decoding/attention_op.py
// builds this file once per instruction set (CPU_CAPABILITY=AVX2 or AVX512) and loads the one
// that torch.backends.cpu.get_cpu_capability() names. The readable reference is
// attention_op.one_query_attention_reference; tests/unit/test_attention_op.py compares the two.
//
// nmt::reorder_tables: a beam's reorder of a loop's rows in every layer's table, in place (the
// tight loops' steps, nmt.decoding.fast_state.FastState.reorder_own).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// n (<= Vec::size()) values from p as floats; the rest of the vector zero.
inline Vec load(const float* p, int64_t n) {
  return n == Vec::size() ? Vec::loadu(p) : Vec::loadu(p, n);
}

inline Vec load(const c10::BFloat16* p, int64_t n) {
  if (n == Vec::size()) {
    Vec out;
    at::vec::load_fp32_from_bf16(p, out);
    return out;
  }
  float tmp[Vec::size()];
  for (int64_t i = 0; i < n; ++i) tmp[i] = static_cast<float>(p[i]);
  return Vec::loadu(tmp, n);
}

// sum_i a[i] * b[i] over D values, a already in floats.
template <typename T>
inline float dot(const float* a, const T* b, int64_t D) {
  Vec acc(0.0f);
  for (int64_t i = 0; i < D; i += Vec::size()) {
    const int64_t n = std::min<int64_t>(Vec::size(), D - i);
    acc = at::vec::fmadd(load(a + i, n), load(b + i, n), acc);
  }
  return at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
}

// acc[i] += w * b[i] over D values.
template <typename T>
inline void add_scaled(float* acc, float w, const T* b, int64_t D) {
  const Vec wv(w);
  for (int64_t i = 0; i < D; i += Vec::size()) {
    const int64_t n = std::min<int64_t>(Vec::size(), D - i);
    at::vec::fmadd(wv, load(b + i, n), load(acc + i, n)).store(acc + i, n);
  }
}

// w[t] = exp(w[t] - top) for t < n; returns their sum.
inline float exp_shifted(float* w, float top, int64_t n) {
  const Vec shift(top);
  Vec sum(0.0f);
  for (int64_t i = 0; i < n; i += Vec::size()) {
    const int64_t m = std::min<int64_t>(Vec::size(), n - i);
    const Vec e = (load(w + i, m) - shift).exp_u20();
    e.store(w + i, m);
    sum = sum + Vec::set(Vec(0.0f), e, m);  // the lanes past m stay out of the sum
  }
  return at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
}

// One (row, head) of attend for D = C * Vec::size(): the query and the output accumulators in
// registers, the positions' keys and values through `keys` and `values` (n pointers each).
template <typename KV, int C>
void attend_one(const float* qf, const KV* const* keys, const KV* const* values, int64_t n,
                float* w, float* out) {
  constexpr int64_t S = Vec::size();
  Vec qv[C];
  for (int c = 0; c < C; ++c) qv[c] = Vec::loadu(qf + c * S);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) {  // scores q . K
    Vec a = qv[0] * load(keys[t], S);
    for (int c = 1; c < C; ++c) a = at::vec::fmadd(qv[c], load(keys[t] + c * S, S), a);
    w[t] = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, a);
    top = std::max(top, w[t]);
  }
  const float total = exp_shifted(w, top, n);  // softmax, normalized at the end
  Vec acc[C];
  for (int c = 0; c < C; ++c) acc[c] = Vec(0.0f);
  for (int64_t t = 0; t < n; ++t) {  // . V
    const Vec wt(w[t]);
    for (int c = 0; c < C; ++c) acc[c] = at::vec::fmadd(wt, load(values[t] + c * S, S), acc[c]);
  }
  const Vec divisor(total);
  for (int c = 0; c < C; ++c) (acc[c] / divisor).store(out + c * S);
}

template <typename T, typename KV>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
            const at::Tensor& table, const at::Tensor& start, const at::Tensor& end,
            at::Tensor& out) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const T* qp = q.data_ptr<T>();
  const KV* kp = k.data_ptr<KV>();
  const KV* vp = v.data_ptr<KV>();
  T* op = out.data_ptr<T>();
  const int64_t* tp = table.data_ptr<int64_t>();
  const int64_t* sp = start.data_ptr<int64_t>();
  const int64_t* ep = end.data_ptr<int64_t>();
  const int64_t q0 = q.stride(0), q1 = q.stride(1);
  const int64_t k0 = k.stride(0), k1 = k.stride(1), k2 = k.stride(2);
  const int64_t v0 = v.stride(0), v1 = v.stride(1), v2 = v.stride(2);
  const int64_t t0 = table.stride(0), t1 = table.stride(1);
  const int64_t o0 = out.stride(0), o1 = out.stride(1);
  const int64_t N = k.size(0), positions = std::min(k.size(2), table.size(1));
  int64_t longest = 0;
  for (int64_t r = 0; r < R; ++r) {  // every position and buffer row read lies inside
    TORCH_CHECK(sp[r] >= 0 && ep[r] <= positions,
                "one_query_attention: row ", r, " reads positions ", sp[r], "..", ep[r],
                " of ", positions);
    for (int64_t t = sp[r]; t < ep[r]; ++t) {
      TORCH_CHECK(tp[r * t0 + t * t1] >= 0 && tp[r * t0 + t * t1] < N,
                  "one_query_attention: table names buffer row ", tp[r * t0 + t * t1],
                  " of ", N);
    }
    longest = std::max(longest, ep[r] - sp[r]);
  }
  // a (row, head) pair reads `longest` keys and values of D: keep small batches on one thread
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, longest * D));
  at::parallel_for(0, R * H, grain, [&](int64_t first, int64_t last) {
    std::vector<float> qf(D), acc(D), w(std::max<int64_t>(longest, 1));
    std::vector<const KV*> keys(std::max<int64_t>(longest, 1)), values(keys.size());
    const int64_t chunks = D % Vec::size() == 0 ? D / Vec::size() : 0;
    for (int64_t i = first; i < last; ++i) {
      const int64_t r = i / H, h = i % H, s = sp[r], n = ep[r] - s;
      T* o = op + r * o0 + h * o1;
      if (n <= 0) {
        for (int64_t j = 0; j < D; ++j) o[j] = static_cast<T>(0.0f);
        continue;
      }
      for (int64_t j = 0; j < D; ++j) qf[j] = static_cast<float>(qp[r * q0 + h * q1 + j]);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t row = tp[r * t0 + (s + t) * t1];
        keys[t] = kp + row * k0 + h * k1 + (s + t) * k2;
        values[t] = vp + row * v0 + h * v1 + (s + t) * v2;
      }
      const float* qv = qf.data();
      if (chunks == 1) {  // the head size a whole number of vectors: unrolled, in registers
        attend_one<KV, 1>(qv, keys.data(), values.data(), n, w.data(), acc.data());
      } else if (chunks == 2) {
        attend_one<KV, 2>(qv, keys.data(), values.data(), n, w.data(), acc.data());
      } else if (chunks == 4) {
        attend_one<KV, 4>(qv, keys.data(), values.data(), n, w.data(), acc.data());
      } else if (chunks == 8) {
        attend_one<KV, 8>(qv, keys.data(), values.data(), n, w.data(), acc.data());
      } else {  // any other head size, the same sums
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < n; ++t) {  // scores q . K
          w[t] = dot(qv, keys[t], D);
          top = std::max(top, w[t]);
        }
        const float total = exp_shifted(w.data(), top, n);  // softmax, normalized at the end
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t < n; ++t) add_scaled(acc.data(), w[t], values[t], D);  // . V
        for (int64_t j = 0; j < D; ++j) acc[j] /= total;
      }
      for (int64_t j = 0; j < D; ++j) o[j] = static_cast<T>(acc[j]);
    }
  });
}

at::Tensor one_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& table, const at::Tensor& start,
                               const at::Tensor& end) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.dim() == 4,
              "one_query_attention: q (R, H, D), k and v (N, H, C, D)");
  TORCH_CHECK(k.sizes() == v.sizes(), "one_query_attention: k and v differ in shape");
  TORCH_CHECK(q.size(1) == k.size(1) && q.size(2) == k.size(3),
              "one_query_attention: q and k differ in heads or head size");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "one_query_attention: k and v differ in dtype");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "one_query_attention: the last dimension of q, k and v must be contiguous");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == q.size(0) &&
                  table.scalar_type() == at::kLong,
              "one_query_attention: table (R, positions) int64");
  TORCH_CHECK(start.dim() == 1 && end.dim() == 1 && start.size(0) == q.size(0) &&
                  end.size(0) == q.size(0) && start.scalar_type() == at::kLong &&
                  end.scalar_type() == at::kLong && start.is_contiguous() &&
                  end.is_contiguous(),
              "one_query_attention: start and end (R,) int64, contiguous");
  const bool f32 = q.scalar_type() == at::kFloat, bf16 = q.scalar_type() == at::kBFloat16;
  const bool kv_bf16 = k.scalar_type() == at::kBFloat16;
  TORCH_CHECK((f32 || bf16) && (k.scalar_type() == q.scalar_type() || kv_bf16),
              "one_query_attention: q float32 or bfloat16, k and v its dtype or bfloat16, not ",
              q.scalar_type(), " and ", k.scalar_type());
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
  if (bf16) {
    attend<c10::BFloat16, c10::BFloat16>(q, k, v, table, start, end, out);
  } else if (kv_bf16) {
    attend<float, c10::BFloat16>(q, k, v, table, start, end, out);
  } else {
    attend<float, float>(q, k, v, table, start, end, out);
  }
  return out;
}

// A beam's reorder of rows that keep their number, in place, for every layer's table (R, C)
// int64 (alike in every layer): row r takes row index[r]'s entries before position `keep` and
// names its own buffer row from `keep` on (where it writes its next positions). The tables
// stay the same tensors, so that what holds them (a package's inputs) stays valid.
void reorder_tables(const std::vector<at::Tensor>& tables, const at::Tensor& index,
                    int64_t keep) {
  TORCH_CHECK(index.dim() == 1 && index.scalar_type() == at::kLong && index.is_contiguous(),
              "reorder_tables: index (R,) int64, contiguous");
  const int64_t R = index.size(0);
  const int64_t* rows = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(0 <= rows[r] && rows[r] < R, "reorder_tables: an index past the rows");
  std::vector<int64_t> kept;
  for (const at::Tensor& table : tables) {
    TORCH_CHECK(table.dim() == 2 && table.size(0) == R && table.scalar_type() == at::kLong &&
                    table.is_contiguous() && 0 <= keep && keep <= table.size(1),
                "reorder_tables: each table (R, C) int64, contiguous, keep in 0..C");
    const int64_t C = table.size(1);
    int64_t* entries = table.data_ptr<int64_t>();
    kept.resize(R * keep);  // (R, keep) the rows' entries before `keep`, gathered
    for (int64_t r = 0; r < R; ++r)
      std::copy(entries + rows[r] * C, entries + rows[r] * C + keep, kept.data() + r * keep);
    for (int64_t r = 0; r < R; ++r) {
      std::copy(kept.data() + r * keep, kept.data() + (r + 1) * keep, entries + r * C);
      std::fill(entries + r * C + keep, entries + (r + 1) * C, r);
    }
  }
}

}  // namespace

TORCH_LIBRARY(nmt, m) {
  m.def("one_query_attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor start, "
        "Tensor end) -> Tensor");
  m.def("reorder_tables(Tensor(a!)[] tables, Tensor index, int keep) -> ()");
}

TORCH_LIBRARY_IMPL(nmt, CPU, m) {
  m.impl("one_query_attention", &one_query_attention);
  m.impl("reorder_tables", &reorder_tables);
}
