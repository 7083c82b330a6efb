#include "worker/compression/snapkv.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compression/highest_scores.h"

namespace vc {

absl::StatusOr<std::vector<std::vector<std::vector<int32_t>>>> SnapKvSelector::Select(
    const PagedKvCache& full, SeqId seq, int64_t length, const PromptQueries* queries, int num_heads) const {
  const KvLayout& layout = full.layout();
  const int kvh = layout.num_kv_heads, d = layout.head_dim;
  std::vector<std::vector<std::vector<int32_t>>> kept(layout.num_layers, std::vector<std::vector<int32_t>>(kvh));
  if (length <= params_.capacity) {
    std::vector<int32_t> all(static_cast<size_t>(length));
    std::iota(all.begin(), all.end(), 0);
    for (auto& layer : kept) {
      for (auto& head : layer) head = all;
    }
    return kept;
  }
  const int w = params_.window;
  if (queries == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapkv: needs the queries of the last ", w, " prompt positions; none were given"));
  }
  if (queries->end != length || queries->count < w ||
      queries->per_layer.size() != static_cast<size_t>(layout.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("snapkv: needs the queries of positions [", length - w, ", ", length,
                                                   ") for ", layout.num_layers, " layers; got ", queries->count,
                                                   " positions ending at ", queries->end, " for ",
                                                   queries->per_layer.size(), " layers"));
  }
  for (const auto& q : queries->per_layer) {
    if (q.size() != static_cast<size_t>(queries->count) * num_heads * d) {
      return absl::InvalidArgumentError(absl::StrCat("snapkv: a layer's queries hold ", q.size(), " floats, expected ",
                                                     queries->count, " x ", num_heads, " x ", d));
    }
  }
  const int group = num_heads / kvh;
  const int64_t prefix = length - w;
  const int64_t keep_prefix = params_.capacity - w;
  const int half = params_.kernel / 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> keys(static_cast<size_t>(length) * d), logits(static_cast<size_t>(length));
  std::vector<float> votes(static_cast<size_t>(prefix)), pooled(static_cast<size_t>(prefix));
  std::vector<float> scratch, row(static_cast<size_t>(layout.row_elems()));
  for (int l = 0; l < layout.num_layers; ++l) {
    for (int g = 0; g < kvh; ++g) {
      for (int64_t j = 0; j < length; ++j) std::copy_n(full.KFloat(l, seq, j, row.data()) + g * d, d, keys.data() + j * d);
      std::fill(votes.begin(), votes.end(), 0.0f);
      for (int i = 0; i < w; ++i) {
        const int64_t qpos = prefix + i;
        const int64_t row = queries->count - w + i;
        for (int hh = g * group; hh < (g + 1) * group; ++hh) {
          const float* q = queries->per_layer[l].data() + (row * num_heads + hh) * d;
          float m = -INFINITY;
          for (int64_t j = 0; j <= qpos; ++j) {
            float s = 0.0f;
            for (int c = 0; c < d; ++c) s += q[c] * keys[j * d + c];
            logits[j] = s * scale;
            m = std::max(m, logits[j]);
          }
          float sum = 0.0f;
          for (int64_t j = 0; j <= qpos; ++j) {
            logits[j] = std::exp(logits[j] - m);
            sum += logits[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < prefix; ++j) votes[j] += logits[j] * inv;
        }
      }
      for (int64_t j = 0; j < prefix; ++j) {
        const int64_t lo = std::max<int64_t>(0, j - half), hi = std::min<int64_t>(prefix - 1, j + half);
        if (params_.pooling == SnapKvParams::Pooling::kMax) {
          float v = votes[lo];
          for (int64_t t = lo + 1; t <= hi; ++t) v = std::max(v, votes[t]);
          pooled[j] = v;
        } else {
          float v = 0.0f;
          for (int64_t t = lo; t <= hi; ++t) v += votes[t];
          pooled[j] = v / static_cast<float>(params_.kernel);
        }
      }
      std::vector<int32_t>& out = kept[l][g];
      out.resize(static_cast<size_t>(keep_prefix));
      if (keep_prefix > 0) HighestScores(pooled.data(), prefix, keep_prefix, &scratch, out.data());
      for (int64_t j = prefix; j < length; ++j) out.push_back(static_cast<int32_t>(j));
    }
  }
  return kept;
}

std::string SnapKvSelector::spec() const {
  return absl::StrCat("snapkv:capacity=", params_.capacity, ",window=", params_.window, ",kernel=", params_.kernel,
                      ",pooling=", params_.pooling == SnapKvParams::Pooling::kMax ? "max" : "avg");
}

}  // namespace vc
