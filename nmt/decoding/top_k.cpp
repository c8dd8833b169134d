// nmt::top_k: the n largest values of each row of a float matrix and their columns, best first,
// for beam search's choice of the 2k best continuations among k x V (strategies.top_k).
//
// torch.topk over a row of k V floats costs ~17 us at k V = 16,000 and grows with it; the
// strided-groups reduction in strategies.top_k is ~17 us of six operator calls at any size.
// Here each row is one pass: the first n values sorted into a buffer, then every later value
// compared with the buffer's n-th best, a vector of them at a time; the few that beat it are
// inserted (insertion sort), which moves the bar. Equal values keep the earlier column first;
// NaN ranks above every number (torch.topk's order), so a dead row still yields n columns.
// `banned` (V,) bool, where given: those columns count as -inf (x.masked_fill's values, without
// writing them; greedy's choice in int8's package, nmt.decoding.aot_step).
//
// tests/unit/test_fast_model.py compares it with torch.topk under each build.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

namespace {

// Whether a goes before b: NaN first, then the larger.
inline bool before(float a, float b) { return a > b || (std::isnan(a) && !std::isnan(b)); }

using Vec = at::vec::Vectorized<float>;

// The n best so far (n <= the values seen), best first: vals, cols.
struct Best {
  float* vals;
  int64_t* cols;
  int64_t n;
  int64_t filled = 0;

  // Value v at column c in its place (insertion sort), if it goes before the n-th.
  void insert(float v, int64_t c) {
    if (filled == n && !before(v, vals[n - 1])) return;
    int64_t j = filled < n ? filled++ : n - 1;  // a full buffer drops its last
    for (; j > 0 && before(v, vals[j - 1]); --j) {
      vals[j] = vals[j - 1];
      cols[j] = cols[j - 1];
    }
    vals[j] = v;
    cols[j] = c;
  }
};

// One row's V values into `best`, as columns base + c: one(c) a value, many(c) the W values
// from c (the same arithmetic: each lane is one's value, or a lane that one(c) may lower to
// -inf, such as a banned column's). The first values fill the buffer; then every later
// vector is compared with its n-th best, and the few lanes that beat it are inserted.
template <typename One, typename Many>
void scan_row(Best& best, int64_t V, int64_t base, One one, Many many) {
  constexpr int64_t W = Vec::size();
  const int all = (1 << W) - 1;
  int64_t c = 0;
  for (; c < V && best.filled < best.n; ++c) best.insert(one(c), base + c);
  for (; c + W <= V; c += W) {
    // a superset of the lanes that go before the bar: larger, or NaN
    const Vec v = many(c);
    const int lanes = all & ~((v > Vec(best.vals[best.n - 1])) | v.isnan()).zero_mask();
    for (int m = lanes; m != 0; m &= m - 1) {
      const int i = __builtin_ctz(m);
      best.insert(one(c + i), base + c + i);
    }
  }
  for (; c < V; ++c) best.insert(one(c), base + c);
}

// The n best of one row x[0 .. V) into vals, cols (n <= V), best first; columns where
// `banned` (nullptr: none) count as -inf.
void row_top(const float* x, int64_t V, int64_t n, const bool* banned, float* vals,
             int64_t* cols) {
  Best best{vals, cols, n};
  scan_row(
      best, V, 0,
      [&](int64_t c) { return banned != nullptr && banned[c] ? -INFINITY : x[c]; },
      [&](int64_t c) { return Vec::loadu(x + c); });
}

// log_softmax's terms of one row of V logits, ATen's (its lastdim kernel: the maximum, the
// sum of exp(x - max) in its order, and the sum's log, each through the same vector
// functions): column c's log-probability is x[c] - max - log_sum, in that order.
std::pair<float, float> log_softmax_terms(const float* x, int64_t V) {
  const float max = at::vec::reduce_all<float>(
      [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, x, V);
  float sum = at::vec::map_reduce_all<float>(
      [max](Vec a) { return (a - Vec(max)).exp(); }, [](Vec a, Vec b) { return a + b; }, x, V);
  at::vec::map([](Vec a) { return a.log(); }, &sum, &sum, 1);
  return {max, sum};
}

std::tuple<at::Tensor, at::Tensor> top_k(const at::Tensor& x, int64_t n,
                                         const std::optional<at::Tensor>& banned) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "nmt::top_k: x must be (R, V) float32 rows with contiguous columns");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(0 < n && n <= V, "nmt::top_k: n must be in 1..V");
  const bool* ban = nullptr;
  if (banned.has_value()) {
    TORCH_CHECK(banned->dim() == 1 && banned->size(0) == V &&
                    banned->scalar_type() == at::kBool && banned->is_contiguous(),
                "nmt::top_k: banned must be (V,) contiguous bool");
    ban = banned->data_ptr<bool>();
  }
  at::Tensor values = at::empty({R, n}, x.options());
  at::Tensor columns = at::empty({R, n}, x.options().dtype(at::kLong));
  const float* xs = x.data_ptr<float>();
  float* vs = values.data_ptr<float>();
  int64_t* cs = columns.data_ptr<int64_t>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row_top(xs + r * stride, V, n, ban, vs + r * n, cs + r * n);
  });
  return {values, columns};
}

// Beam search's choice (strategies.choose_beam) after a step of U units of kb rows each, in
// one call: log_softmax of the logits (R, V), R = U kb (torch.log_softmax's values:
// log_softmax_terms), the banned columns (ids) at -inf, each row's prefix score added (as
// choose_beam: index_fill_ then add_), each value compared as it is computed (none written:
// 0.8x the call's time at 4 and 16 rows of 4,000 columns, 0.6x at 64); then each unit's n
// best of its kb V candidates (row, then column order for equal ones) and their rows within
// the unit (parents) and columns (tokens), (U, n) each; and the first n / 2 of each unit as
// the rows that go on where none of them ends: their scores (U, n / 2), their rows in the
// step's batch (u kb + parent) and their tokens (U n / 2,) each (a beam loop's next step
// without a slice, an offset or a copy of its own).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> beam_top_k(
    const at::Tensor& logits, const at::Tensor& scores, const at::Tensor& banned, int64_t n) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "nmt::beam_top_k: logits must be (R, V) float32");
  TORCH_CHECK(scores.dim() == 2 && scores.scalar_type() == at::kFloat &&
                  scores.numel() == logits.size(0),
              "nmt::beam_top_k: scores must be (U, kb) float32, U kb = R");
  const int64_t U = scores.size(0), kb = scores.size(1), V = logits.size(1);
  TORCH_CHECK(banned.dim() == 1 && banned.scalar_type() == at::kLong,
              "nmt::beam_top_k: banned must be (n,) column ids");
  TORCH_CHECK(0 < n && n <= kb * V, "nmt::beam_top_k: n must be in 1..kb V");
  const at::Tensor x = logits.contiguous(), ban = banned.contiguous(), score = scores.contiguous();
  const float* xs = x.data_ptr<float>();
  const int64_t* bs = ban.data_ptr<int64_t>();
  const int64_t nb = ban.numel();
  for (int64_t i = 0; i < nb; ++i)
    TORCH_CHECK(0 <= bs[i] && bs[i] < V, "nmt::beam_top_k: a banned column past V");
  const float* ss = score.data_ptr<float>();
  at::Tensor values = at::empty({U, n}, logits.options());
  at::Tensor parents = at::empty({U, n}, logits.options().dtype(at::kLong));
  at::Tensor tokens = at::empty({U, n}, logits.options().dtype(at::kLong));
  float* vs = values.data_ptr<float>();
  int64_t* ps = parents.data_ptr<int64_t>();
  int64_t* ts = tokens.data_ptr<int64_t>();
  const int64_t k = n / 2;
  at::Tensor on_scores = at::empty({U, k}, logits.options());
  at::Tensor on_rows = at::empty({U * k}, logits.options().dtype(at::kLong));
  at::Tensor on_tokens = at::empty({U * k}, logits.options().dtype(at::kLong));
  float* os = on_scores.data_ptr<float>();
  int64_t* orow = on_rows.data_ptr<int64_t>();
  int64_t* otok = on_tokens.data_ptr<int64_t>();
  for (int64_t u = 0; u < U; ++u) {
    // the unit's kb rows as one row of kb V columns: log_softmax(x) + score, banned at -inf
    Best best{vs + u * n, ps + u * n, n};
    for (int64_t r = u * kb; r < (u + 1) * kb; ++r) {
      const float* row = xs + r * V;
      const auto [max, log_sum] = log_softmax_terms(row, V);
      const float s = ss[r];
      const Vec vmax(max), vlog(log_sum), vscore(s);
      scan_row(
          best, V, (r - u * kb) * V,
          [&](int64_t c) {
            return (std::find(bs, bs + nb, c) != bs + nb ? -INFINITY : row[c] - max - log_sum) + s;
          },
          [&](int64_t c) { return Vec::loadu(row + c) - vmax - vlog + vscore; });
    }
    for (int64_t i = u * n; i < (u + 1) * n; ++i) {
      ts[i] = ps[i] % V;
      ps[i] /= V;
    }
    for (int64_t j = 0; j < k; ++j) {
      os[u * k + j] = vs[u * n + j];
      orow[u * k + j] = u * kb + ps[u * n + j];
      otok[u * k + j] = ts[u * n + j];
    }
  }
  return {values, parents, tokens, on_scores, on_rows, on_tokens};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nmt, m) {
  m.def("top_k(Tensor x, int n, Tensor? banned=None) -> (Tensor, Tensor)");
  // n a SymInt: a package compiled ahead of time takes it from an input's size (any beam)
  m.def("beam_top_k(Tensor logits, Tensor scores, Tensor banned, SymInt n) -> (Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(nmt, CPU, m) {
  m.impl("top_k", top_k);
  m.impl("beam_top_k", beam_top_k);
}
