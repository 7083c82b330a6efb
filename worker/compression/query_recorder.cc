#include "worker/compression/query_recorder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace vc {

QueryRecorder::QueryRecorder(PagedKvCache& inner, SeqId seq, int64_t end, int64_t window, int num_layers)
    : inner_(inner),
      seq_(seq),
      end_(end),
      count_(std::max<int64_t>(0, std::min(window, end))),
      head_dim_(inner.layout().head_dim),
      queries_(num_layers),
      seen_(num_layers, std::vector<uint8_t>(static_cast<size_t>(count_), 0)) {}

void QueryRecorder::Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                           const kernels::Backend& backend, float* out) {
  const int64_t row_floats = int64_t{num_heads} * head_dim_;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t i = rows[r].pos - (end_ - count_);
    if (rows[r].seq != seq_ || i < 0 || i >= count_) continue;
    num_heads_ = num_heads;
    std::vector<float>& dst = queries_[layer];
    dst.resize(static_cast<size_t>(count_ * row_floats));
    std::copy_n(q + r * row_floats, row_floats, dst.data() + i * row_floats);
    seen_[layer][i] = 1;
  }
  inner_.Attend(layer, rows, q, num_heads, scale, backend, out);
}

absl::StatusOr<PromptQueries> QueryRecorder::Take() {
  for (size_t l = 0; l < seen_.size(); ++l) {
    const int64_t missing = std::count(seen_[l].begin(), seen_[l].end(), 0);
    if (missing > 0) {
      return absl::FailedPreconditionError(absl::StrCat("query recorder: layer ", l, " missed ", missing, " of the ",
                                                        count_, " positions before ", end_));
    }
  }
  PromptQueries out;
  out.end = end_;
  out.count = count_;
  out.per_layer = std::move(queries_);
  queries_.assign(seen_.size(), {});
  for (auto& s : seen_) std::fill(s.begin(), s.end(), 0);
  return out;
}

}  // namespace vc
