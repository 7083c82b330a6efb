// A paged KV cache of exact K/V: fixed-size token blocks in a preallocated pool, a block table per
// sequence, one K and one V array per layer (so a layer can be read or streamed on its own). The
// elements are of the layout's dtype: float32, or the model's bf16 or f16 (half the bytes).
#ifndef VC_WORKER_RUNTIME_KV_CACHE_H_
#define VC_WORKER_RUNTIME_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/kernels.h"
#include "worker/runtime/attention_cache.h"
#include "worker/runtime/sequence_slots.h"

namespace vc {

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  DType dtype = DType::kF32;  // of every K and V element

  int64_t elem_bytes() const { return static_cast<int64_t>(DTypeSize(dtype)); }
  // Elements of one position's K (or V) in one layer: [num_kv_heads, head_dim].
  int64_t row_elems() const { return int64_t{num_kv_heads} * head_dim; }
  int64_t row_bytes() const { return row_elems() * elem_bytes(); }
  // Elements of K (or of V) of one layer in one block: [block_size, num_kv_heads, head_dim].
  int64_t block_elems() const { return int64_t{block_size} * row_elems(); }
  // Bytes of K and V of all layers for one token.
  int64_t bytes_per_token() const { return 2 * num_layers * row_bytes(); }
};

// Frees what AlignedAlloc allocated.
struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};

// Not thread-safe: one owner (an engine thread) drives it.
class PagedKvCache final : public AttentionCache {
 public:
  // A pool of `num_blocks` blocks. A nonzero `placement_seed` hands out physical blocks in a
  // seeded random order instead of in sequence (tests use it to show placement does not matter).
  PagedKvCache(const KvLayout& layout, int64_t num_blocks, uint64_t placement_seed = 0);

  const KvLayout& layout() const { return layout_; }

  SeqId NewSequence();
  // Returns the sequence's blocks to the pool. No-op for an unknown id.
  void FreeSequence(SeqId seq);

  // Positions [0, Length) hold valid K/V.
  int64_t Length(SeqId seq) const override { return seqs_[seq].length; }
  // Ensures blocks exist for positions [0, length); kResourceExhausted when the pool is empty
  // (nothing is allocated then).
  absl::Status Reserve(SeqId seq, int64_t length) override;
  // Stores k and v rounded to the layout's dtype (to nearest even; the model's forward pass hands
  // over values it has rounded so already).
  void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) override;
  // Paged attention through backend.PagedAttention.
  void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
              const kernels::Backend& backend, float* out) override;
  // Marks positions [0, length) valid; blocks must have been reserved. length may shrink or grow.
  void Commit(SeqId seq, int64_t length) override { seqs_[seq].length = length; }
  void SetLength(SeqId seq, int64_t length) { Commit(seq, length); }
  // Drops positions >= length and releases the blocks no longer needed. kInvalidArgument if
  // length > Length(seq).
  absl::Status Truncate(SeqId seq, int64_t length) override;

  // K or V of (layer, seq, position): [num_kv_heads, head_dim] elements of the layout's dtype
  // (row_bytes()). The position must be reserved.
  void* KRow(int layer, SeqId seq, int64_t pos);
  void* VRow(int layer, SeqId seq, int64_t pos);
  const void* KRow(int layer, SeqId seq, int64_t pos) const;
  const void* VRow(int layer, SeqId seq, int64_t pos) const;
  // The same row as float32: the row itself for a float32 cache, else widened into `scratch`
  // (row_elems() floats), which is returned.
  const float* KFloat(int layer, SeqId seq, int64_t pos, float* scratch) const;
  const float* VFloat(int layer, SeqId seq, int64_t pos, float* scratch) const;

  // Writes positions [from, to) of `seq` into `dst_seq` of `dst` (a compressed cache, or a paged
  // cache of any dtype) with dst.Write, as float32 rows, layer by layer. Reserving and committing
  // them there is the caller's.
  void CopyTo(SeqId seq, int64_t from, int64_t to, AttentionCache& dst, SeqId dst_seq) const;

  const std::vector<int32_t>& BlockTable(SeqId seq) const { return seqs_[seq].blocks; }
  kernels::PagedKvLayer LayerView(int layer) const;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Bytes of the whole pool.
  int64_t pool_bytes() const { return num_blocks_ * layout_.block_size * layout_.bytes_per_token(); }

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  // Byte offset of (seq, pos)'s row in a layer's pool.
  int64_t Offset(SeqId seq, int64_t pos) const;
  std::vector<kernels::AttentionRow> rows_scratch_;

  const KvLayout layout_;
  const int64_t num_blocks_;
  // Per layer: [num_blocks, block_elems] elements of layout_.dtype, 64-byte aligned.
  std::vector<std::unique_ptr<char[], AlignedFree>> k_, v_;
  std::vector<int32_t> free_;              // a stack; back() is handed out next
  SequenceSlots<Sequence> seqs_;
};

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_KV_CACHE_H_
