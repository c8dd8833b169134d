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
#include <ATen/ops/_log_softmax.h>
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

// The n best of one row x[0 .. V) into vals, cols (n <= V), best first; columns where
// `banned` (nullptr: none) count as -inf.
void row_top(const float* x, int64_t V, int64_t n, const bool* banned, float* vals,
             int64_t* cols) {
  int64_t filled = 0;
  auto insert = [&](float v, int64_t c) {
    if (banned != nullptr && banned[c]) v = -INFINITY;
    if (filled == n && !before(v, vals[n - 1])) return;
    int64_t j = filled < n ? filled++ : n - 1;  // a full buffer drops its last
    for (; j > 0 && before(v, vals[j - 1]); --j) {
      vals[j] = vals[j - 1];
      cols[j] = cols[j - 1];
    }
    vals[j] = v;
    cols[j] = c;
  };
  int64_t c = 0;
  for (; c < n; ++c) insert(x[c], c);
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t W = Vec::size();
  const int all = (1 << W) - 1;
  for (; c + W <= V; c += W) {
    const Vec v = Vec::loadu(x + c);
    // a superset of the lanes that go before the bar: larger, or NaN
    const int lanes = all & ~((v > Vec(vals[n - 1])) | v.isnan()).zero_mask();
    for (int m = lanes; m != 0; m &= m - 1) {
      const int i = __builtin_ctz(m);
      insert(x[c + i], c + i);
    }
  }
  for (; c < V; ++c) insert(x[c], c);
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
// one call: log_softmax of the logits (R, V), R = U kb (ATen's kernel: torch.log_softmax's
// values), the banned columns (ids) at -inf, each row's prefix score added (as choose_beam:
// index_fill_ then add_), then each unit's n best of its kb V candidates (row, then column
// order for equal ones) and their rows within the unit (parents) and columns (tokens), (U, n)
// each; and the first n / 2 of each unit as the rows that go on where none of them ends:
// their scores (U, n / 2), their rows in the step's batch (u kb + parent) and their tokens
// (U n / 2,) each (a beam loop's next step without a slice, an offset or a copy of its own).
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
  at::Tensor lp = at::_log_softmax(logits, 1, false).contiguous();  // (R, V), owned here
  const at::Tensor ban = banned.contiguous(), score = scores.contiguous();
  float* xs = lp.data_ptr<float>();
  const int64_t* bs = ban.data_ptr<int64_t>();
  for (int64_t i = 0; i < ban.numel(); ++i)
    TORCH_CHECK(0 <= bs[i] && bs[i] < V, "nmt::beam_top_k: a banned column past V");
  const float* ss = score.data_ptr<float>();
  using Vec = at::vec::Vectorized<float>;
  for (int64_t r = 0; r < U * kb; ++r) {
    float* row = xs + r * V;
    for (int64_t i = 0; i < ban.numel(); ++i) row[bs[i]] = -INFINITY;
    const Vec add(ss[r]);
    int64_t c = 0;
    for (; c + Vec::size() <= V; c += Vec::size()) (Vec::loadu(row + c) + add).store(row + c);
    for (; c < V; ++c) row[c] += ss[r];
  }
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
    row_top(xs + u * kb * V, kb * V, n, nullptr, vs + u * n, ps + u * n);
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
