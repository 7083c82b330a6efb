#include "worker/runtime/kv_cache.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace vc {

PagedKvCache::PagedKvCache(const KvLayout& layout, int64_t num_blocks, uint64_t placement_seed)
    : layout_(layout), num_blocks_(num_blocks) {
  k_.resize(layout.num_layers);
  v_.resize(layout.num_layers);
  for (int l = 0; l < layout.num_layers; ++l) {
    k_[l].assign(static_cast<size_t>(num_blocks * layout.block_floats()), 0.0f);
    v_[l].assign(static_cast<size_t>(num_blocks * layout.block_floats()), 0.0f);
  }
  free_.resize(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) free_[i] = static_cast<int32_t>(num_blocks - 1 - i);
  if (placement_seed != 0) {
    std::mt19937_64 rng(placement_seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }
}

SeqId PagedKvCache::NewSequence() { return seqs_.Add(); }

void PagedKvCache::FreeSequence(SeqId seq) {
  if (!seqs_.live(seq)) return;
  for (auto it = seqs_[seq].blocks.rbegin(); it != seqs_[seq].blocks.rend(); ++it) free_.push_back(*it);
  seqs_.Remove(seq);
}

absl::Status PagedKvCache::Reserve(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  const int64_t need = (length + layout_.block_size - 1) / layout_.block_size;
  const int64_t more = need - static_cast<int64_t>(s.blocks.size());
  if (more <= 0) return absl::OkStatus();
  if (more > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", length, " positions need ", more,
                                                     " more blocks, ", free_blocks(), " free of ",
                                                     num_blocks_));
  }
  for (int64_t i = 0; i < more; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::Truncate(SeqId seq, int64_t length) {
  Sequence& s = seqs_[seq];
  if (absl::Status st = CheckTruncateLength(length, s.length); !st.ok()) return st;
  s.length = length;
  const size_t keep = static_cast<size_t>((length + layout_.block_size - 1) / layout_.block_size);
  while (s.blocks.size() > keep) {
    free_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
  return absl::OkStatus();
}

float* PagedKvCache::Slot(std::vector<float>& pool, SeqId seq, int64_t pos) {
  const int32_t block = seqs_[seq].blocks[pos / layout_.block_size];
  return pool.data() + block * layout_.block_floats() +
         (pos % layout_.block_size) * layout_.num_kv_heads * layout_.head_dim;
}

const float* PagedKvCache::Slot(const std::vector<float>& pool, SeqId seq, int64_t pos) const {
  const int32_t block = seqs_[seq].blocks[pos / layout_.block_size];
  return pool.data() + block * layout_.block_floats() +
         (pos % layout_.block_size) * layout_.num_kv_heads * layout_.head_dim;
}

float* PagedKvCache::K(int layer, SeqId seq, int64_t pos) { return Slot(k_[layer], seq, pos); }
const float* PagedKvCache::K(int layer, SeqId seq, int64_t pos) const { return Slot(k_[layer], seq, pos); }
const float* PagedKvCache::V(int layer, SeqId seq, int64_t pos) const { return Slot(v_[layer], seq, pos); }

void PagedKvCache::Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  const int64_t n = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  std::copy_n(k, n, K(layer, seq, pos));
  std::copy_n(v, n, V(layer, seq, pos));
}

void PagedKvCache::Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                          const kernels::Backend& backend, float* out) {
  rows_scratch_.resize(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    rows_scratch_[r] = {seqs_[rows[r].seq].blocks.data(), static_cast<int32_t>(rows[r].pos + 1)};
  }
  backend.PagedAttention(q, static_cast<int64_t>(rows.size()), num_heads, rows_scratch_.data(), LayerView(layer),
                         scale, out);
}
float* PagedKvCache::V(int layer, SeqId seq, int64_t pos) { return Slot(v_[layer], seq, pos); }

kernels::PagedKvLayer PagedKvCache::LayerView(int layer) const {
  kernels::PagedKvLayer v;
  v.k = k_[layer].data();
  v.v = v_[layer].data();
  v.block_stride = layout_.block_floats();
  v.block_size = layout_.block_size;
  v.num_kv_heads = layout_.num_kv_heads;
  v.head_dim = layout_.head_dim;
  return v;
}

}  // namespace vc
