#include "worker/compression/quest_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compression/highest_scores.h"

namespace vc {

QuestCache::QuestCache(const KvLayout& layout, QuestParams params) : layout_(layout), params_(params) {}

SeqId QuestCache::NewSequence() {
  const SeqId id = seqs_.Add();
  Sequence& s = seqs_[id];
  s.k.resize(layout_.num_layers);
  s.v.resize(layout_.num_layers);
  s.kmin.resize(layout_.num_layers);
  s.kmax.resize(layout_.num_layers);
  return id;
}

void QuestCache::FreeSequence(SeqId seq) {
  if (!seqs_.live(seq)) return;
  seqs_.Remove(seq);
}

void QuestCache::Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  const int64_t row = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  Sequence& s = seqs_[seq];
  std::vector<float>& ks = s.k[layer];
  std::vector<float>& vs = s.v[layer];
  if (static_cast<int64_t>(ks.size()) < (pos + 1) * row) {
    ks.resize(static_cast<size_t>((pos + 1) * row));
    vs.resize(static_cast<size_t>((pos + 1) * row));
  }
  std::copy_n(k, row, ks.data() + pos * row);
  std::copy_n(v, row, vs.data() + pos * row);
  const int64_t page = pos / params_.page;
  std::vector<float>& mn = s.kmin[layer];
  std::vector<float>& mx = s.kmax[layer];
  if (static_cast<int64_t>(mn.size()) < (page + 1) * row) {
    mn.resize(static_cast<size_t>((page + 1) * row));
    mx.resize(static_cast<size_t>((page + 1) * row));
    std::copy_n(k, row, mn.data() + page * row);
    std::copy_n(k, row, mx.data() + page * row);
    return;
  }
  for (int64_t c = 0; c < row; ++c) {
    mn[page * row + c] = std::min(mn[page * row + c], k[c]);
    mx[page * row + c] = std::max(mx[page * row + c], k[c]);
  }
}

absl::Status QuestCache::BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                                   const PromptQueries*) {
  if (length > full.Length(full_seq)) {
    return absl::InvalidArgumentError(
        absl::StrCat("build from ", length, " positions but the full cache holds ", full.Length(full_seq)));
  }
  Sequence& s = seqs_[seq];
  for (int l = 0; l < layout_.num_layers; ++l) {
    s.k[l].clear();
    s.v[l].clear();
    s.kmin[l].clear();
    s.kmax[l].clear();
  }
  full.CopyTo(full_seq, 0, length, *this, seq);
  s.length = length;
  return absl::OkStatus();
}

void QuestCache::Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                        const kernels::Backend& backend, float* out) {
  const int kvh = layout_.num_kv_heads, d = layout_.head_dim, group = num_heads / kvh;
  const int64_t row = int64_t{kvh} * d;
  const int64_t P = params_.page;
  const int64_t other_pages = params_.budget / P - 1;
  row_lists_.resize(rows.size() * kvh);
  views_.resize(rows.size() * kvh);
  for (size_t r = 0; r < rows.size(); ++r) {
    const Sequence& s = seqs_[rows[r].seq];
    const int64_t p = rows[r].pos;
    const int64_t own = p / P;
    const float* mn = s.kmin[layer].data();
    const float* mx = s.kmax[layer].data();
    for (int g = 0; g < kvh; ++g) {
      std::vector<int32_t>& list = row_lists_[r * kvh + g];
      list.clear();
      page_order_.clear();
      if (own <= other_pages) {
        for (int64_t pg = 0; pg < own; ++pg) page_order_.push_back(static_cast<int32_t>(pg));
      } else {
        page_scores_.assign(static_cast<size_t>(own), 0.0f);
        for (int64_t pg = 0; pg < own; ++pg) {
          float score = 0.0f;
          for (int hh = g * group; hh < (g + 1) * group; ++hh) {
            const float* qh = q + (r * num_heads + hh) * d;
            const float* lo = mn + pg * row + g * d;
            const float* hi = mx + pg * row + g * d;
            for (int c = 0; c < d; ++c) score += std::max(qh[c] * lo[c], qh[c] * hi[c]);
          }
          page_scores_[pg] = score;
        }
        page_order_.resize(static_cast<size_t>(other_pages));
        HighestScores(page_scores_.data(), own, other_pages, &score_scratch_, page_order_.data());
      }
      for (int32_t pg : page_order_) {
        for (int64_t i = pg * P; i < (pg + 1) * P; ++i) list.push_back(static_cast<int32_t>(i));
      }
      for (int64_t i = own * P; i <= p; ++i) list.push_back(static_cast<int32_t>(i));
      kernels::CompressedKvHead& v = views_[r * kvh + g];
      v = kernels::CompressedKvHead{};
      v.dense.k = s.k[layer].data() + g * d;
      v.dense.v = s.v[layer].data() + g * d;
      v.dense.stride = row;
      v.dense.rows = list.data();
      v.dense.count = static_cast<int32_t>(list.size());
    }
  }
  backend.CompressedAttention(q, static_cast<int64_t>(rows.size()), num_heads, kvh, d, views_.data(), scale, out);
}

absl::Status QuestCache::Truncate(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  if (absl::Status st = CheckTruncateLength(length, s.length); !st.ok()) return st;
  const int64_t row = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  const int64_t P = params_.page;
  const int64_t pages = (length + P - 1) / P;
  for (int l = 0; l < layout_.num_layers; ++l) {
    s.k[l].resize(static_cast<size_t>(length * row));
    s.v[l].resize(static_cast<size_t>(length * row));
    s.kmin[l].resize(static_cast<size_t>(pages * row));
    s.kmax[l].resize(static_cast<size_t>(pages * row));
    if (length % P == 0) continue;
    // The last page lost positions: its bounds are those of the positions left.
    const int64_t first = (pages - 1) * P;
    float* mn = s.kmin[l].data() + (pages - 1) * row;
    float* mx = s.kmax[l].data() + (pages - 1) * row;
    std::copy_n(s.k[l].data() + first * row, row, mn);
    std::copy_n(s.k[l].data() + first * row, row, mx);
    for (int64_t p = first + 1; p < length; ++p) {
      const float* k = s.k[l].data() + p * row;
      for (int64_t c = 0; c < row; ++c) {
        mn[c] = std::min(mn[c], k[c]);
        mx[c] = std::max(mx[c], k[c]);
      }
    }
  }
  s.length = length;
  return absl::OkStatus();
}

int64_t QuestCache::Bytes(SeqId seq) const {
  const Sequence& s = seqs_[seq];
  int64_t b = 0;
  for (int l = 0; l < layout_.num_layers; ++l) {
    b += 4 * static_cast<int64_t>(s.k[l].size() + s.v[l].size() + s.kmin[l].size() + s.kmax[l].size());
  }
  return b;
}

int64_t QuestCache::BytesBound(int64_t, int64_t length) const {
  // Every position in float32, and each page's per-channel minimum and maximum of the keys.
  length = std::max<int64_t>(0, length);
  const int64_t pages = (length + params_.page - 1) / params_.page;
  return (2 * length + 2 * pages) * layout_.num_kv_heads * int64_t{layout_.head_dim} * 4 * layout_.num_layers;
}

std::string QuestCache::spec() const {
  return absl::StrCat("quest:page=", params_.page, ",budget=", params_.budget);
}

}  // namespace vc
