#include "worker/compression/streaming_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace vc {

StreamingCache::StreamingCache(const KvLayout& layout, int sinks, int window, int rollback)
    : layout_(layout), sinks_(sinks), window_(window), rollback_(rollback), ring_(int64_t{window} + rollback) {}

SeqId StreamingCache::NewSequence() {
  const SeqId id = seqs_.Add();
  seqs_[id].k.resize(layout_.num_layers);
  seqs_[id].v.resize(layout_.num_layers);
  return id;
}

void StreamingCache::FreeSequence(SeqId seq) {
  if (!seqs_.live(seq)) return;
  seqs_.Remove(seq);
}

void StreamingCache::Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  const int64_t row = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  std::vector<float>& ks = seqs_[seq].k[layer];
  std::vector<float>& vs = seqs_[seq].v[layer];
  const int64_t slot = Slot(pos);
  if (static_cast<int64_t>(ks.size()) < (slot + 1) * row) {
    const size_t want = static_cast<size_t>(std::min(Slots(), std::max<int64_t>(slot + 1, 2 * (ks.size() / row))) * row);
    ks.resize(want);
    vs.resize(want);
  }
  std::copy_n(k, row, ks.data() + slot * row);
  std::copy_n(v, row, vs.data() + slot * row);
}

absl::Status StreamingCache::BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                                       const PromptQueries*) {
  if (length > full.Length(full_seq)) {
    return absl::InvalidArgumentError(
        absl::StrCat("build from ", length, " positions but the full cache holds ", full.Length(full_seq)));
  }
  Sequence& s = seqs_[seq];
  for (int l = 0; l < layout_.num_layers; ++l) {
    s.k[l].clear();
    s.v[l].clear();
  }
  // The sinks and the recent ring: the positions between are never visible again.
  const int64_t sinks = std::min<int64_t>(sinks_, length);
  full.CopyTo(full_seq, 0, sinks, *this, seq);
  full.CopyTo(full_seq, std::max(sinks, length - ring_), length, *this, seq);
  s.length = length;
  s.longest = length;
  return absl::OkStatus();
}

void StreamingCache::Commit(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  s.length = length;
  s.longest = std::max(s.longest, length);
}

void StreamingCache::Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                            const kernels::Backend& backend, float* out) {
  const int kvh = layout_.num_kv_heads, d = layout_.head_dim;
  row_lists_.resize(rows.size());
  views_.resize(rows.size() * kvh);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t p = rows[r].pos;
    std::vector<int32_t>& list = row_lists_[r];
    list.clear();
    for (int64_t i = 0; i < std::min<int64_t>(sinks_, p + 1); ++i) list.push_back(static_cast<int32_t>(i));
    for (int64_t i = std::max<int64_t>(sinks_, p - window_ + 1); i <= p; ++i) list.push_back(static_cast<int32_t>(Slot(i)));
    const Sequence& s = seqs_[rows[r].seq];
    for (int g = 0; g < kvh; ++g) {
      kernels::CompressedKvHead& v = views_[r * kvh + g];
      v = kernels::CompressedKvHead{};
      v.dense.k = s.k[layer].data() + g * d;
      v.dense.v = s.v[layer].data() + g * d;
      v.dense.stride = int64_t{kvh} * d;
      v.dense.rows = list.data();
      v.dense.count = static_cast<int32_t>(list.size());
    }
  }
  backend.CompressedAttention(q, static_cast<int64_t>(rows.size()), num_heads, kvh, d, views_.data(), scale, out);
}

absl::Status StreamingCache::Truncate(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  if (absl::Status st = CheckTruncateLength(length, s.length); !st.ok()) return st;
  if (s.longest - length > rollback_) {
    return absl::FailedPreconditionError(absl::StrCat("cannot roll back to ", length, ": ", s.longest - length,
                                                      " positions behind the longest length ", s.longest,
                                                      " (at most ", rollback_, ")"));
  }
  s.length = length;
  return absl::OkStatus();
}

int64_t StreamingCache::Bytes(SeqId seq) const {
  int64_t b = 0;
  for (int l = 0; l < layout_.num_layers; ++l) {
    b += 4 * static_cast<int64_t>(seqs_[seq].k[l].size() + seqs_[seq].v[l].size());
  }
  return b;
}

int64_t StreamingCache::BytesBound(int64_t, int64_t length) const {
  // The sinks and the ring; below them, Write's doubling may reach twice the positions.
  const int64_t slots = std::min(2 * std::max<int64_t>(0, length), Slots());
  return slots * 2 * layout_.num_kv_heads * int64_t{layout_.head_dim} * 4 * layout_.num_layers;
}

std::string StreamingCache::spec() const {
  return absl::StrCat("streaming:sinks=", sinks_, ",window=", window_, ",rollback=", rollback_);
}

}  // namespace vc
