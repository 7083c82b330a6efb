#include "worker/compression/token_list_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif
#include <type_traits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/thread_pool.h"
#include "worker/compression/highest_scores.h"
#include "worker/compression/kivi.h"

namespace vc {

TokenListCache::TokenListCache(const KvLayout& layout, int num_heads, KiviParams kivi,
                               std::unique_ptr<PromptSelector> selector, int64_t query_budget)
    : layout_(layout),
      num_heads_(num_heads),
      kivi_(kivi),
      value_group_(std::min(kivi.group, layout.head_dim)),
      selector_(std::move(selector)),
      query_budget_(kivi.bits != 0 && selector_ == nullptr ? query_budget : 0) {}

SeqId TokenListCache::NewSequence() {
  const SeqId id = seqs_.Add();
  seqs_[id].heads.resize(static_cast<size_t>(layout_.num_layers) * layout_.num_kv_heads);
  return id;
}

void TokenListCache::FreeSequence(SeqId seq) {
  if (!seqs_.live(seq)) return;
  seqs_.Remove(seq);
}

int32_t TokenListCache::Tokens(const HeadList& h) const {
  return h.f_start + static_cast<int32_t>(h.res_k.size() / layout_.head_dim);
}

int32_t TokenListCache::QuantizedCount(int64_t n) const {
  if (kivi_.bits == 0 || n <= kivi_.residual) return 0;
  return static_cast<int32_t>((n - kivi_.residual) / kivi_.group * kivi_.group);
}

int32_t TokenListCache::VisibleCount(const Sequence& s, const HeadList& h, int64_t pos) const {
  if (pos < 0) return 0;
  if (!s.selective) return static_cast<int32_t>(std::min<int64_t>(Tokens(h), pos + 1));
  return static_cast<int32_t>(std::upper_bound(h.positions.begin(), h.positions.end(), pos) - h.positions.begin());
}

void TokenListCache::Append(HeadList& h, bool selective, int64_t pos, const float* k, const float* v) {
  if (selective) h.positions.push_back(static_cast<int32_t>(pos));
  h.res_k.insert(h.res_k.end(), k, k + layout_.head_dim);
  h.res_v.insert(h.res_v.end(), v, v + layout_.head_dim);
}

void TokenListCache::QuantizeNextGroup(HeadList& h) {
  const int d = layout_.head_dim;
  const float* src_k = h.res_k.data() + static_cast<size_t>(h.q_tokens - h.f_start) * d;
  const float* src_v = h.res_v.data() + static_cast<size_t>(h.q_tokens - h.f_start) * d;
  QuantizeGroup(src_k, src_v, &h);
  h.q_tokens += kivi_.group;
}

void TokenListCache::QuantizeGroup(const float* k, const float* v, HeadList* h) const {
  const size_t d = static_cast<size_t>(layout_.head_dim), g = static_cast<size_t>(kivi_.group);
  const size_t codes = g * d * kivi_.bits / 8, k_scales = d, v_scales = g * (d / value_group_);
  const size_t kc = h->k_codes.size(), ks = h->k_scale.size(), vc = h->v_codes.size(), vs = h->v_scale.size();
  h->k_codes.resize(kc + codes, 0);
  h->v_codes.resize(vc + codes, 0);
  h->k_scale.resize(ks + k_scales);
  h->k_min.resize(ks + k_scales);
  h->v_scale.resize(vs + v_scales);
  h->v_min.resize(vs + v_scales);
  QuantizeKiviGroup(k, v, kivi_.group, layout_.head_dim, value_group_, kivi_.bits,
                    {h->k_codes.data() + kc, h->k_scale.data() + ks, h->k_min.data() + ks, h->v_codes.data() + vc,
                     h->v_scale.data() + vs, h->v_min.data() + vs});
}

void TokenListCache::QuantizeFromFull(const PagedKvCache& full, SeqId full_seq, int layer, int head, int64_t first,
                                      int64_t tokens, HeadList* h) const {
  const int g = kivi_.group, d = layout_.head_dim;
  std::vector<float> k(static_cast<size_t>(g) * d), v(k.size()), row(static_cast<size_t>(full.layout().row_elems()));
  for (int64_t t0 = first; t0 < first + tokens; t0 += g) {
    for (int t = 0; t < g; ++t) {
      std::copy_n(full.KFloat(layer, full_seq, t0 + t, row.data()) + head * d, d, k.data() + t * d);
      std::copy_n(full.VFloat(layer, full_seq, t0 + t, row.data()) + head * d, d, v.data() + t * d);
    }
    QuantizeGroup(k.data(), v.data(), h);
  }
}

TokenListCache::BlockParts TokenListCache::Parts(int64_t tokens) const {
  const size_t d = static_cast<size_t>(layout_.head_dim), t = static_cast<size_t>(tokens);
  return {t * d * kivi_.bits / 8, t / kivi_.group * d * 4, t * (d / value_group_) * 4};
}

absl::Status TokenListCache::EncodeBlock(const PagedKvCache& full, SeqId full_seq, int64_t first, int64_t tokens,
                                         std::vector<std::string>* layers) const {
  const int g = kivi_.group;
  if (first < 0 || tokens <= 0 || first % g != 0 || tokens % g != 0 || first + tokens > full.Length(full_seq)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot encode positions [", first, ", ", first + tokens,
                                                   ") of a sequence of ", full.Length(full_seq), " in groups of ", g));
  }
  layers->assign(layout_.num_layers, std::string());
  for (int l = 0; l < layout_.num_layers; ++l) {
    std::string& out = (*layers)[l];
    for (int h = 0; h < layout_.num_kv_heads; ++h) {
      HeadList q;
      QuantizeFromFull(full, full_seq, l, h, first, tokens, &q);
      auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
      put(q.k_codes.data(), q.k_codes.size());
      put(q.k_scale.data(), q.k_scale.size() * 4);
      put(q.k_min.data(), q.k_min.size() * 4);
      put(q.v_codes.data(), q.v_codes.size());
      put(q.v_scale.data(), q.v_scale.size() * 4);
      put(q.v_min.data(), q.v_min.size() * 4);
    }
  }
  return absl::OkStatus();
}

absl::Status TokenListCache::AppendBlock(SeqId seq, int64_t tokens, const std::vector<absl::string_view>& layers) {
  Sequence& s = seqs_[seq];
  const BlockParts parts = Parts(tokens);
  const size_t head_bytes = parts.head();
  if (tokens <= 0 || tokens % kivi_.group != 0 || static_cast<int>(layers.size()) != layout_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("an encoded block of ", tokens, " tokens in ", layers.size(),
                                                   " layers does not fit this cache"));
  }
  for (const absl::string_view l : layers) {
    if (l.size() != head_bytes * layout_.num_kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat("encoded layer of ", l.size(), " bytes, expected ",
                                                     head_bytes * layout_.num_kv_heads));
    }
  }
  for (const HeadList& h : s.heads) {
    if (s.selective || h.appended != h.q_tokens || h.f_start != h.q_tokens || !h.res_k.empty()) {
      return absl::FailedPreconditionError("encoded blocks append only to a sequence of appended blocks");
    }
  }
  auto take = [](absl::string_view* in, size_t n, auto* vec) {
    using T = typename std::remove_reference_t<decltype(*vec)>::value_type;
    const size_t old = vec->size();
    vec->resize(old + n / sizeof(T));
    std::memcpy(vec->data() + old, in->data(), n);
    in->remove_prefix(n);
  };
  for (int l = 0; l < layout_.num_layers; ++l) {
    absl::string_view in = layers[l];
    for (int g = 0; g < layout_.num_kv_heads; ++g) {
      HeadList& h = s.heads[l * layout_.num_kv_heads + g];
      take(&in, parts.codes, &h.k_codes);
      take(&in, parts.k_scales, &h.k_scale);
      take(&in, parts.k_scales, &h.k_min);
      take(&in, parts.codes, &h.v_codes);
      take(&in, parts.v_scales, &h.v_scale);
      take(&in, parts.v_scales, &h.v_min);
      h.q_tokens += static_cast<int32_t>(tokens);
      h.f_start = h.appended = h.q_tokens;
    }
  }
  s.length += tokens;
  return absl::OkStatus();
}

void TokenListCache::KeepQuantized(int32_t q, HeadList* h) const {
  const size_t d = static_cast<size_t>(layout_.head_dim), n = static_cast<size_t>(q);
  const size_t row_bytes = d * kivi_.bits / 8;
  const size_t groups = kivi_.bits == 0 ? 0 : n / kivi_.group;
  h->q_tokens = q;
  h->k_codes.resize(n * row_bytes);
  h->v_codes.resize(n * row_bytes);
  h->k_scale.resize(groups * d);
  h->k_min.resize(groups * d);
  h->v_scale.resize(n * (d / value_group_));
  h->v_min.resize(n * (d / value_group_));
}

absl::Status TokenListCache::CutTo(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  if (length < 0 || length > s.length || length % kivi_.group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot cut a sequence of ", s.length, " positions to ", length,
                                                   " (a multiple of ", kivi_.group, ")"));
  }
  for (const HeadList& h : s.heads) {
    if (h.q_tokens < length) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot cut to ", length, ": only ", h.q_tokens, " positions are quantized"));
    }
  }
  for (HeadList& h : s.heads) {
    KeepQuantized(static_cast<int32_t>(length), &h);
    h.res_k.clear();
    h.res_v.clear();
    h.f_start = h.appended = h.q_tokens;
  }
  s.length = length;
  return absl::OkStatus();
}

absl::Status TokenListCache::BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                                       const PromptQueries* queries) {
  if (length > full.Length(full_seq)) {
    return absl::InvalidArgumentError(
        absl::StrCat("build from ", length, " positions but the full cache holds ", full.Length(full_seq)));
  }
  std::vector<std::vector<std::vector<int32_t>>> kept;
  if (selector_ != nullptr) {
    VC_ASSIGN_OR_RETURN(kept, selector_->Select(full, full_seq, length, queries, num_heads_));
  }
  Sequence& s = seqs_[seq];
  s.selective = selector_ != nullptr;
  s.length = length;
  for (auto& h : s.heads) h = HeadList{};
  // Without selection, the groups Commit would quantize and then drop from float32 (those before
  // the rollback horizon) are quantized straight from `full`.
  const int64_t direct =
      s.selective ? 0 : QuantizedCount(std::max<int64_t>(0, length - MaxRollback()));
  const int d = layout_.head_dim;
  std::vector<float> krow(static_cast<size_t>(full.layout().row_elems())), vrow(krow.size());
  for (int l = 0; l < layout_.num_layers; ++l) {
    for (int g = 0; g < layout_.num_kv_heads; ++g) {
      HeadList& h = s.heads[l * layout_.num_kv_heads + g];
      auto add = [&](int64_t p) {
        Append(h, s.selective, p, full.KFloat(l, full_seq, p, krow.data()) + g * d,
               full.VFloat(l, full_seq, p, vrow.data()) + g * d);
      };
      if (s.selective) {
        for (int32_t p : kept[l][g]) add(p);
      } else {
        QuantizeFromFull(full, full_seq, l, g, 0, direct, &h);
        h.q_tokens = h.f_start = static_cast<int32_t>(direct);
        for (int64_t p = direct; p < length; ++p) add(p);
      }
    }
  }
  Commit(seq, length);
  return absl::OkStatus();
}

absl::Status TokenListCache::Reserve(SeqId, int64_t) { return absl::OkStatus(); }

void TokenListCache::Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  Sequence& s = seqs_[seq];
  const int d = layout_.head_dim;
  for (int g = 0; g < layout_.num_kv_heads; ++g) {
    Append(s.heads[layer * layout_.num_kv_heads + g], s.selective, pos, k + g * d, v + g * d);
  }
}

void TokenListCache::Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                            const kernels::Backend& backend, float* out) {
  const int kvh = layout_.num_kv_heads, d = layout_.head_dim;
  // A row reads as quantized what a commit at its own position would have quantized; later rows of
  // a multi-row pass may need groups the last commit did not quantize yet. Done before any view is
  // taken, since quantizing grows the code arrays.
  for (const QueryRow& row : rows) {
    Sequence& s = seqs_[row.seq];
    for (int g = 0; g < kvh; ++g) {
      HeadList& h = s.heads[layer * kvh + g];
      const int32_t want = QuantizedCount(VisibleCount(s, h, row.pos - 1));
      while (h.q_tokens < want) QuantizeNextGroup(h);
    }
  }
  views_.resize(rows.size() * kvh);
  const int64_t keep = query_budget_ / kivi_.group;
  if (keep > 0) group_tables_.resize(views_.size() * static_cast<size_t>(keep));
  const int heads = num_heads / kvh;
  size_t max_dense = 0;
  bool select = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Sequence& s = seqs_[rows[r].seq];
    for (int g = 0; g < kvh; ++g) {
      const HeadList& h = s.heads[layer * kvh + g];
      const int32_t visible = VisibleCount(s, h, rows[r].pos);
      // Clamped for a row behind the rollback horizon, whose float32 copies may be gone.
      const int32_t quantized =
          std::min(visible, std::max(QuantizedCount(VisibleCount(s, h, rows[r].pos - 1)), h.f_start));
      kernels::CompressedKvHead& v = views_[r * kvh + g];
      v = kernels::CompressedKvHead{};
      kernels::QuantizedKvHead& qk = v.quant;
      qk.bits = kivi_.bits;
      qk.key_group = kivi_.group;
      qk.value_group = value_group_;
      qk.tokens = quantized;
      qk.k_codes = h.k_codes.data();
      qk.k_scale = h.k_scale.data();
      qk.k_min = h.k_min.data();
      qk.v_codes = h.v_codes.data();
      qk.v_scale = h.v_scale.data();
      qk.v_min = h.v_min.data();
      v.dense.k = h.res_k.data() + static_cast<size_t>(quantized - h.f_start) * d;
      v.dense.v = h.res_v.data() + static_cast<size_t>(quantized - h.f_start) * d;
      v.dense.stride = d;
      v.dense.count = visible - qk.tokens;
      max_dense = std::max(max_dense, static_cast<size_t>(v.dense.count));
      select |= keep > 0 && quantized / kivi_.group > keep;
    }
  }
  if (select) {
    // Each view's groups are its own choice: the views' selections share the kernel threads
    // (at batch 1, the KV heads of the row).
    select_scratch_.resize(views_.size());
    kernels::KernelThreadPool().ParallelFor(static_cast<int64_t>(views_.size()), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t r = i / kvh, g = i % kvh;
        SelectGroups(q + (r * num_heads + g * heads) * d, heads, &views_[i].quant,
                     group_tables_.data() + i * keep, &select_scratch_[i]);
      }
    });
  }
  if (iota_.size() < max_dense) {
    iota_.resize(max_dense);
    std::iota(iota_.begin(), iota_.end(), 0);
  }
  for (auto& v : views_) v.dense.rows = iota_.data();
  backend.CompressedAttention(q, static_cast<int64_t>(rows.size()), num_heads, kvh, d, views_.data(), scale, out);
}

void TokenListCache::SelectGroups(const float* q, int heads, kernels::QuantizedKvHead* view, int32_t* table,
                                  SelectScratch* scratch) const {
  const int64_t keep = query_budget_ / kivi_.group, groups = view->tokens / kivi_.group;
  if (groups <= keep) return;
  const int d = layout_.head_dim;
  // Quest's bound summed over the heads, sum over h, c of max(q_hc * min_c, q_hc * (min_c +
  // levels * scale_c)), is sum over c of (sum_h q_hc) * min_c + levels * (sum_h max(q_hc, 0)) * scale_c.
  const float levels = static_cast<float>((1 << kivi_.bits) - 1);
  scratch->query.resize(2 * static_cast<size_t>(d));
  float* a = scratch->query.data();
  float* b = a + d;
  for (int c = 0; c < d; ++c) {
    float sum = 0.0f, pos = 0.0f;
    for (int h = 0; h < heads; ++h) {
      sum += q[h * d + c];
      pos += std::max(q[h * d + c], 0.0f);
    }
    a[c] = sum;
    b[c] = levels * pos;
  }
  scratch->scores.resize(static_cast<size_t>(groups));
  float* score = scratch->scores.data();
  for (int64_t i = 0; i < groups; ++i) {
    const float* mn = view->k_min + i * d;
    const float* sc = view->k_scale + i * d;
    float sum = 0.0f;
    int c = 0;
#if defined(__SSE2__)
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
    for (; c + 8 <= d; c += 8) {
      s0 = _mm_add_ps(s0, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(a + c), _mm_loadu_ps(mn + c)),
                                     _mm_mul_ps(_mm_loadu_ps(b + c), _mm_loadu_ps(sc + c))));
      s1 = _mm_add_ps(s1, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(a + c + 4), _mm_loadu_ps(mn + c + 4)),
                                     _mm_mul_ps(_mm_loadu_ps(b + c + 4), _mm_loadu_ps(sc + c + 4))));
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_add_ps(s0, s1));
    sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
    for (; c < d; ++c) sum += a[c] * mn[c] + b[c] * sc[c];
    score[i] = sum;
  }
  HighestScores(score, groups, keep, &scratch->order, table);
  view->tokens = static_cast<int32_t>(keep * kivi_.group);
  view->group_table = table;
}

void TokenListCache::Commit(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  s.length = length;
  if (kivi_.bits == 0) return;
  const int64_t d = layout_.head_dim;
  for (HeadList& h : s.heads) {
    const int32_t want = QuantizedCount(Tokens(h));
    while (h.q_tokens < want) QuantizeNextGroup(h);
    // Float32 copies are still needed by the view of any length a truncation may return to.
    const int32_t keep_from = QuantizedCount(VisibleCount(s, h, length - MaxRollback() - 1));
    if (keep_from > h.f_start) {
      const size_t drop = static_cast<size_t>(keep_from - h.f_start) * d;
      h.res_k.erase(h.res_k.begin(), h.res_k.begin() + drop);
      h.res_v.erase(h.res_v.begin(), h.res_v.begin() + drop);
      h.f_start = keep_from;
    }
  }
}

absl::Status TokenListCache::Truncate(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  if (absl::Status st = CheckTruncateLength(length, s.length); !st.ok()) return st;
  std::vector<int32_t> keep(s.heads.size());
  for (size_t i = 0; i < s.heads.size(); ++i) {
    keep[i] = VisibleCount(s, s.heads[i], length - 1);
    if (keep[i] < s.heads[i].appended) {
      return absl::FailedPreconditionError(absl::StrCat("cannot roll back to ", length, " into appended blocks"));
    }
    if (std::max(QuantizedCount(keep[i]), s.heads[i].appended) < s.heads[i].f_start) {
      return absl::FailedPreconditionError(absl::StrCat("cannot roll back to ", length, ": the float32 copies of ",
                                                        "its tokens are gone (at most ", MaxRollback(),
                                                        " positions back from the longest length)"));
    }
  }
  const int d = layout_.head_dim;
  for (size_t i = 0; i < s.heads.size(); ++i) {
    HeadList& h = s.heads[i];
    if (s.selective) h.positions.resize(keep[i]);
    // Codes of groups the view at `length` reads in float32 go; they are rebuilt when needed.
    KeepQuantized(std::min(h.q_tokens, std::max(QuantizedCount(keep[i]), h.appended)), &h);
    h.res_k.resize(static_cast<size_t>(keep[i] - h.f_start) * d);
    h.res_v.resize(static_cast<size_t>(keep[i] - h.f_start) * d);
  }
  s.length = length;
  return absl::OkStatus();
}

int64_t TokenListCache::Bytes(SeqId seq) const {
  int64_t b = 0;
  for (const HeadList& h : seqs_[seq].heads) {
    b += static_cast<int64_t>(h.positions.size()) * 4 + static_cast<int64_t>(h.k_codes.size() + h.v_codes.size()) +
         4 * static_cast<int64_t>(h.k_scale.size() + h.k_min.size() + h.v_scale.size() + h.v_min.size() +
                                  h.res_k.size() + h.res_v.size());
  }
  return b;
}

int64_t TokenListCache::BytesBound(int64_t built, int64_t length) const {
  length = std::max<int64_t>(0, length);
  built = std::clamp<int64_t>(built, 0, length);
  // Tokens per (layer, KV head): a selection at build time keeps at most MaxKept of the positions
  // it chose from; every position written later is kept. Building from more positions than
  // `built` can only drop more of them.
  const int64_t tokens = selector_ != nullptr ? length - (built - selector_->MaxKept(built)) : length;
  const int64_t d = layout_.head_dim;
  int64_t b = selector_ != nullptr ? 4 * tokens : 0;  // positions
  if (kivi_.bits == 0) {
    b += tokens * 2 * d * 4;
  } else {
    // Codes and scales of every token, and the float32 tokens: the residual, a group being
    // filled, and the copies kept for a rollback (Commit keeps those of the last `residual`).
    b += static_cast<int64_t>(Parts(tokens).head());
    b += std::min<int64_t>(tokens, 2 * int64_t{kivi_.residual} + kivi_.group) * 2 * d * 4;
  }
  return b * layout_.num_layers * layout_.num_kv_heads;
}

int64_t TokenListCache::MaxRollback() const { return kivi_.bits == 0 ? (int64_t{1} << 30) : kivi_.residual; }

CompressorNeeds TokenListCache::needs() const {
  if (query_budget_ > 0) return CompressorNeeds::kCurrentQuery;
  return selector_ != nullptr ? selector_->needs() : CompressorNeeds::kKeysValues;
}

std::string TokenListCache::spec() const {
  std::string s = selector_ != nullptr ? selector_->spec() : "";
  if (query_budget_ > 0) s = absl::StrCat("quest:budget=", query_budget_);
  if (kivi_.bits != 0) {
    if (!s.empty()) s += "+";
    s += absl::StrCat("kivi:bits=", kivi_.bits, ",group=", kivi_.group, ",residual=", kivi_.residual);
  }
  return s.empty() ? "none" : s;
}

}  // namespace vc
