#include "worker/runtime/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "absl/strings/str_cat.h"

namespace vc {

PagedKvCache::PagedKvCache(const KvLayout& layout, int64_t num_blocks, uint64_t placement_seed)
    : layout_(layout), num_blocks_(num_blocks) {
  // Zeroed, so a row read before it is written is zeros whatever the dtype; 64-byte aligned, and
  // rounded up to a whole 64 bytes as aligned_alloc asks.
  const size_t bytes = static_cast<size_t>(num_blocks * layout.block_elems() * layout.elem_bytes());
  const size_t alloc = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  for (int l = 0; l < layout.num_layers; ++l) {
    for (auto* pool : {&k_, &v_}) {
      char* p = static_cast<char*>(std::aligned_alloc(64, alloc));
      if (p == nullptr) throw std::bad_alloc();
      std::memset(p, 0, alloc);
      pool->emplace_back(p);
    }
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

int64_t PagedKvCache::Offset(SeqId seq, int64_t pos) const {
  const int32_t block = seqs_[seq].blocks[pos / layout_.block_size];
  return (block * layout_.block_elems() + (pos % layout_.block_size) * layout_.row_elems()) * layout_.elem_bytes();
}

void* PagedKvCache::KRow(int layer, SeqId seq, int64_t pos) { return k_[layer].get() + Offset(seq, pos); }
void* PagedKvCache::VRow(int layer, SeqId seq, int64_t pos) { return v_[layer].get() + Offset(seq, pos); }
const void* PagedKvCache::KRow(int layer, SeqId seq, int64_t pos) const { return k_[layer].get() + Offset(seq, pos); }
const void* PagedKvCache::VRow(int layer, SeqId seq, int64_t pos) const { return v_[layer].get() + Offset(seq, pos); }

const float* PagedKvCache::KFloat(int layer, SeqId seq, int64_t pos, float* scratch) const {
  if (layout_.dtype == DType::kF32) return static_cast<const float*>(KRow(layer, seq, pos));
  WidenToF32(KRow(layer, seq, pos), layout_.dtype, layout_.row_elems(), scratch);
  return scratch;
}

const float* PagedKvCache::VFloat(int layer, SeqId seq, int64_t pos, float* scratch) const {
  if (layout_.dtype == DType::kF32) return static_cast<const float*>(VRow(layer, seq, pos));
  WidenToF32(VRow(layer, seq, pos), layout_.dtype, layout_.row_elems(), scratch);
  return scratch;
}

void PagedKvCache::CopyTo(SeqId seq, int64_t from, int64_t to, AttentionCache& dst, SeqId dst_seq) const {
  std::vector<float> k(static_cast<size_t>(layout_.row_elems())), v(k.size());
  for (int l = 0; l < layout_.num_layers; ++l) {
    for (int64_t p = from; p < to; ++p) dst.Write(l, dst_seq, p, KFloat(l, seq, p, k.data()), VFloat(l, seq, p, v.data()));
  }
}

void PagedKvCache::Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) {
  NarrowFromF32(k, layout_.row_elems(), layout_.dtype, KRow(layer, seq, pos));
  NarrowFromF32(v, layout_.row_elems(), layout_.dtype, VRow(layer, seq, pos));
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
kernels::PagedKvLayer PagedKvCache::LayerView(int layer) const {
  kernels::PagedKvLayer v;
  v.k = k_[layer].get();
  v.v = v_[layer].get();
  v.dtype = layout_.dtype;
  v.block_stride = layout_.block_elems();
  v.block_size = layout_.block_size;
  v.num_kv_heads = layout_.num_kv_heads;
  v.head_dim = layout_.head_dim;
  return v;
}

}  // namespace vc
