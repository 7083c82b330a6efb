#include "worker/compression/h2o_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compression/highest_scores.h"

namespace vc {
namespace {

// q . k * scale. Kept out of line so that the softmax sum taken in Attend and the weights
// recomputed when the query is counted come from one compiled reduction, bit for bit.
[[gnu::noinline]] float Logit(const float* q, const float* k, int d, float scale) {
  float s = 0.0f;
  for (int i = 0; i < d; ++i) s += q[i] * k[i];
  return s * scale;
}

}  // namespace

H2oCache::H2oCache(const KvLayout& layout, int num_heads, H2oParams params)
    : layout_(layout), num_heads_(num_heads), group_(num_heads / layout.num_kv_heads), params_(params) {}

SeqId H2oCache::NewSequence() {
  const SeqId id = seqs_.Add();
  seqs_[id].heads.resize(static_cast<size_t>(layout_.num_layers) * layout_.num_kv_heads);
  return id;
}

void H2oCache::FreeSequence(SeqId seq) {
  if (!seqs_.live(seq)) return;
  seqs_.Remove(seq);
}

int64_t H2oCache::HeavyAt(int64_t t) const {
  if (params_.heavy >= 0) return params_.heavy;
  return static_cast<int64_t>(std::floor(params_.heavy_ratio * static_cast<double>(t)));
}

int64_t H2oCache::RecentAt(int64_t t) const {
  if (params_.recent >= 0) return params_.recent;
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(params_.recent_ratio * static_cast<double>(t))));
}

void H2oCache::CountQuery(const Head& h, int64_t q, std::vector<float>& score, std::vector<uint8_t>& alive) const {
  const int d = layout_.head_dim;
  const size_t n = h.pos.size();
  auto it = std::lower_bound(h.pending.begin(), h.pending.end(), q,
                             [](const PendingQuery& a, int64_t p) { return a.pos < p; });
  if (it != h.pending.end() && it->pos == q) {
    for (size_t i = 0; i < n && h.pos[i] <= q; ++i) {
      if (!alive[i]) continue;
      float w = 0.0f;
      for (int hh = 0; hh < group_; ++hh) {
        w += std::exp(Logit(it->q.data() + hh * d, h.k.data() + i * d, d, it->scale) - it->max[hh]) / it->sum[hh];
      }
      score[i] += w;
    }
  }
  // H2O's step after query q, as it would have run then: the `recent` positions up to q stay.
  const int64_t limit = q + 1 - RecentAt(q + 1);
  const int64_t heavy = HeavyAt(q + 1);
  int64_t candidates = 0;
  for (size_t i = 0; i < n && h.pos[i] <= limit; ++i) candidates += alive[i];
  while (candidates > heavy) {
    size_t worst = n;
    for (size_t i = 0; i < n && h.pos[i] <= limit; ++i) {
      if (alive[i] && (worst == n || score[i] < score[worst])) worst = i;
    }
    alive[worst] = 0;
    --candidates;
  }
}

void H2oCache::PrepareView(const Sequence& s, Head& h, int64_t target) const {
  if (!h.view_valid || h.view_counted > target) {
    h.view_score = h.score;
    h.view_alive.assign(h.pos.size(), 1);
    h.view_counted = s.counted;
    h.view_valid = true;
  }
  for (; h.view_counted < target; ++h.view_counted) CountQuery(h, h.view_counted, h.view_score, h.view_alive);
}

void H2oCache::Compact(Head& h, const std::vector<uint8_t>& alive, int d) {
  size_t out = 0;
  for (size_t i = 0; i < h.pos.size(); ++i) {
    if (!alive[i]) continue;
    if (out != i) {
      h.pos[out] = h.pos[i];
      h.score[out] = h.score[i];
      std::copy_n(h.k.data() + i * d, d, h.k.data() + out * d);
      std::copy_n(h.v.data() + i * d, d, h.v.data() + out * d);
      if (h.view_valid) {
        h.view_score[out] = h.view_score[i];
        h.view_alive[out] = h.view_alive[i];
      }
    }
    ++out;
  }
  h.pos.resize(out);
  h.score.resize(out);
  h.k.resize(out * d);
  h.v.resize(out * d);
  if (h.view_valid) {
    h.view_score.resize(out);
    h.view_alive.resize(out);
  }
}

absl::Status H2oCache::BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                                 const PromptQueries* queries) {
  if (length > full.Length(full_seq)) {
    return absl::InvalidArgumentError(
        absl::StrCat("build from ", length, " positions but the full cache holds ", full.Length(full_seq)));
  }
  const int kvh = layout_.num_kv_heads, d = layout_.head_dim;
  if (queries != nullptr) {
    bool ok = queries->end == length && queries->count >= 0 && queries->count <= length &&
              queries->per_layer.size() == static_cast<size_t>(layout_.num_layers);
    for (size_t l = 0; ok && l < queries->per_layer.size(); ++l) {
      ok = queries->per_layer[l].size() == static_cast<size_t>(queries->count) * num_heads_ * d;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("h2o: prompt queries must end at ", length, " and hold [count, ",
                                                     num_heads_, ", ", d, "] per layer for ", layout_.num_layers,
                                                     " layers"));
    }
  }
  Sequence& s = seqs_[seq];
  s.length = s.built = s.counted = length;
  const int64_t heavy = HeavyAt(length);
  const int64_t limit = length - RecentAt(length);
  const int64_t candidates = std::max<int64_t>(0, limit + 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> vote(static_cast<size_t>(length)), logits(static_cast<size_t>(length));
  std::vector<int32_t> order;
  std::vector<float> scratch, row(static_cast<size_t>(full.layout().row_elems()));
  std::vector<float> keys(static_cast<size_t>(length) * d);  // one KV head's, as float32
  for (int l = 0; l < layout_.num_layers; ++l) {
    for (int g = 0; g < kvh; ++g) {
      Head& h = s.heads[l * kvh + g];
      h = Head{};
      for (int64_t j = 0; j < length; ++j) {
        std::copy_n(full.KFloat(l, full_seq, j, row.data()) + g * d, d, keys.data() + j * d);
      }
      auto key = [&](int64_t j) -> const float* { return keys.data() + j * d; };
      std::fill(vote.begin(), vote.end(), 0.0f);
      if (queries != nullptr) {
        for (int64_t i = 0; i < queries->count; ++i) {
          const int64_t qpos = length - queries->count + i;
          for (int hh = g * group_; hh < (g + 1) * group_; ++hh) {
            const float* qv = queries->per_layer[l].data() + (i * num_heads_ + hh) * d;
            float m = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j <= qpos; ++j) {
              logits[j] = Logit(qv, key(j), d, scale);
              m = std::max(m, logits[j]);
            }
            for (int64_t j = 0; j <= qpos; ++j) {
              logits[j] = std::exp(logits[j] - m);
              sum += logits[j];
            }
            for (int64_t j = 0; j <= qpos; ++j) vote[j] += logits[j] / sum;
          }
        }
      }
      order.clear();
      if (candidates > heavy) {
        std::vector<float> rank(static_cast<size_t>(candidates));
        for (int64_t j = 0; j < candidates; ++j) {
          if (queries != nullptr) {
            rank[j] = vote[j];
          } else {
            const float* k = key(j);
            float n2 = 0.0f;
            for (int c = 0; c < d; ++c) n2 += k[c] * k[c];
            rank[j] = n2;
          }
        }
        order.resize(static_cast<size_t>(heavy));
        if (heavy > 0) HighestScores(rank.data(), candidates, heavy, &scratch, order.data());
      } else {
        for (int64_t j = 0; j < candidates; ++j) order.push_back(static_cast<int32_t>(j));
      }
      for (int64_t j = candidates; j < length; ++j) order.push_back(static_cast<int32_t>(j));
      h.pos = order;
      h.k.resize(order.size() * d);
      h.v.resize(order.size() * d);
      h.score.resize(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        std::copy_n(key(order[i]), d, h.k.data() + i * d);
        std::copy_n(full.VFloat(l, full_seq, order[i], row.data()) + g * d, d, h.v.data() + i * d);
        h.score[i] = vote[order[i]];
      }
    }
  }
  return absl::OkStatus();
}

void H2oCache::Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  const int kvh = layout_.num_kv_heads, d = layout_.head_dim;
  Sequence& s = seqs_[seq];
  for (int g = 0; g < kvh; ++g) {
    Head& h = s.heads[layer * kvh + g];
    h.pos.push_back(static_cast<int32_t>(pos));
    h.k.insert(h.k.end(), k + g * d, k + (g + 1) * d);
    h.v.insert(h.v.end(), v + g * d, v + (g + 1) * d);
    h.score.push_back(0.0f);
    if (h.view_valid) {
      h.view_score.push_back(0.0f);
      h.view_alive.push_back(1);
    }
  }
}

void H2oCache::Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                      const kernels::Backend& backend, float* out) {
  const int kvh = layout_.num_kv_heads, d = layout_.head_dim;
  // A row's view extends the previous row's, so rows of a sequence go in position order.
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return rows[a].seq != rows[b].seq ? rows[a].seq < rows[b].seq : rows[a].pos < rows[b].pos;
  });
  row_lists_.resize(rows.size() * kvh);
  views_.resize(rows.size() * kvh);
  std::vector<float> logits;
  for (size_t r : order) {
    Sequence& s = seqs_[rows[r].seq];
    const int64_t p = rows[r].pos;
    const int64_t target = std::max(s.built, p - params_.rollback);
    for (int g = 0; g < kvh; ++g) {
      Head& h = s.heads[layer * kvh + g];
      PrepareView(s, h, target);
      std::vector<int32_t>& list = row_lists_[r * kvh + g];
      list.clear();
      for (size_t i = 0; i < h.pos.size() && h.pos[i] <= p; ++i) {
        if (h.view_alive[i]) list.push_back(static_cast<int32_t>(i));
      }
      // What counting this query later needs: its vectors and its softmax max and sum.
      PendingQuery pq;
      pq.pos = p;
      pq.scale = scale;
      pq.q.assign(q + (r * num_heads + g * group_) * d, q + (r * num_heads + (g + 1) * group_) * d);
      pq.max.resize(group_);
      pq.sum.resize(group_);
      logits.resize(list.size());
      for (int hh = 0; hh < group_; ++hh) {
        float m = -INFINITY, sum = 0.0f;
        for (size_t j = 0; j < list.size(); ++j) {
          logits[j] = Logit(pq.q.data() + hh * d, h.k.data() + static_cast<size_t>(list[j]) * d, d, scale);
          m = std::max(m, logits[j]);
        }
        for (size_t j = 0; j < list.size(); ++j) sum += std::exp(logits[j] - m);
        pq.max[hh] = m;
        pq.sum[hh] = sum;
      }
      while (!h.pending.empty() && h.pending.back().pos >= p) h.pending.pop_back();
      h.pending.push_back(std::move(pq));

      kernels::CompressedKvHead& v = views_[r * kvh + g];
      v = kernels::CompressedKvHead{};
      v.dense.k = h.k.data();
      v.dense.v = h.v.data();
      v.dense.stride = d;
      v.dense.rows = list.data();
      v.dense.count = static_cast<int32_t>(list.size());
    }
  }
  backend.CompressedAttention(q, static_cast<int64_t>(rows.size()), num_heads, kvh, d, views_.data(), scale, out);
}

void H2oCache::Commit(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  s.length = length;
  // Queries that no truncation within the rollback can reach from here: count them for good.
  const int64_t target = std::max(s.counted, length - 2 * int64_t{params_.rollback});
  if (target <= s.counted) return;
  std::vector<uint8_t> alive;
  for (Head& h : s.heads) {
    alive.assign(h.pos.size(), 1);
    for (int64_t q = s.counted; q < target; ++q) CountQuery(h, q, h.score, alive);
    // The view counts at least as many queries, so it evicted the same tokens; an older view is
    // rebuilt from the new scores when next needed.
    if (h.view_valid && h.view_counted < target) h.view_valid = false;
    Compact(h, alive, layout_.head_dim);
    while (!h.pending.empty() && h.pending.front().pos < target) h.pending.pop_front();
  }
  s.counted = target;
}

absl::Status H2oCache::Truncate(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  if (absl::Status st = CheckTruncateLength(length, s.length); !st.ok()) return st;
  if (length == s.length) return absl::OkStatus();
  if (length < s.built) {
    return absl::FailedPreconditionError(
        absl::StrCat("h2o: cannot roll back to ", length, ", into the prompt of ", s.built, " the cache was built from"));
  }
  const int64_t target = std::max(s.built, length - params_.rollback);
  if (s.counted > target) {
    return absl::FailedPreconditionError(absl::StrCat("h2o: cannot roll back to ", length, ": the queries before ",
                                                      s.counted, " are counted (at most ", params_.rollback,
                                                      " positions back from the longest length)"));
  }
  const int d = layout_.head_dim;
  for (Head& h : s.heads) {
    const size_t keep = static_cast<size_t>(std::lower_bound(h.pos.begin(), h.pos.end(), length) - h.pos.begin());
    h.pos.resize(keep);
    h.score.resize(keep);
    h.k.resize(keep * d);
    h.v.resize(keep * d);
    while (!h.pending.empty() && h.pending.back().pos >= length) h.pending.pop_back();
    if (h.view_valid && h.view_counted > target) h.view_valid = false;
    if (h.view_valid) {
      h.view_score.resize(keep);
      h.view_alive.resize(keep);
    }
  }
  s.length = length;
  return absl::OkStatus();
}

int64_t H2oCache::Bytes(SeqId seq) const {
  int64_t b = 0;
  for (const Head& h : seqs_[seq].heads) {
    b += 4 * static_cast<int64_t>(h.pos.size() + h.k.size() + h.v.size() + h.score.size());
    if (h.view_valid) b += static_cast<int64_t>(h.view_score.size() * 4 + h.view_alive.size());
    for (const PendingQuery& pq : h.pending) {
      b += 12 + 4 * static_cast<int64_t>(pq.q.size() + pq.max.size() + pq.sum.size());
    }
  }
  return b;
}

int64_t H2oCache::BytesBound(int64_t, int64_t length) const {
  length = std::max<int64_t>(0, length);
  const int64_t r = params_.rollback, d = layout_.head_dim;
  // Scores count the queries before length - 2R: H2O's step at each of them left its heavy hitters
  // and the positions recent at the time, and the 2R positions since are all kept. A query of
  // those 2R positions is kept to be counted later.
  const int64_t tokens = std::min(length, HeavyAt(length) + RecentAt(length) + 2 * r);
  const int64_t pending = std::min(length, 2 * r);
  const int64_t per_token = 4 + 2 * d * 4 + 4 + 4 + 1;  // position, K, V, score, the view's score and flag
  const int64_t per_query = 12 + 4 * (int64_t{group_} * d + 2 * group_);
  return (tokens * per_token + pending * per_query) * layout_.num_layers * layout_.num_kv_heads;
}

std::string H2oCache::spec() const {
  std::string s = "h2o:";
  absl::StrAppend(&s, params_.heavy >= 0 ? absl::StrCat("heavy=", params_.heavy)
                                         : absl::StrCat("heavy_ratio=", params_.heavy_ratio));
  absl::StrAppend(&s, params_.recent >= 0 ? absl::StrCat(",recent=", params_.recent)
                                          : absl::StrCat(",recent_ratio=", params_.recent_ratio));
  absl::StrAppend(&s, ",rollback=", params_.rollback);
  return s;
}

}  // namespace vc
