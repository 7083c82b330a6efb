// StreamingLLM: attention sinks plus a window of recent positions. Each (sequence, layer) holds
// its sinks and a ring of window + rollback positions in float32; the extra `rollback` slots keep
// the positions a truncation brings back into the window.
#ifndef VC_WORKER_COMPRESSION_STREAMING_CACHE_H_
#define VC_WORKER_COMPRESSION_STREAMING_CACHE_H_

#include <string>
#include <vector>

#include "worker/compression/compressed_cache.h"
#include "worker/runtime/sequence_slots.h"

namespace vc {

class StreamingCache final : public CompressedKvCache {
 public:
  StreamingCache(const KvLayout& layout, int sinks, int window, int rollback);

  SeqId NewSequence() override;
  SeqId Fork(SeqId seq) override { return seqs_.Copy(seq); }
  void FreeSequence(SeqId seq) override;
  absl::Status BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                         const PromptQueries* queries) override;
  int64_t Bytes(SeqId seq) const override;
  int64_t BytesBound(int64_t built, int64_t length) const override;
  int64_t MaxRollback() const override { return rollback_; }
  CompressorNeeds needs() const override { return CompressorNeeds::kKeysValues; }
  std::string spec() const override;

  int64_t Length(SeqId seq) const override { return seqs_[seq].length; }
  absl::Status Reserve(SeqId, int64_t) override { return absl::OkStatus(); }
  void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) override;
  void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
              const kernels::Backend& backend, float* out) override;
  void Commit(SeqId seq, int64_t length) override;
  absl::Status Truncate(SeqId seq, int64_t length) override;

 private:
  struct Sequence {
    int64_t length = 0;
    // The longest length since the build: a ring slot may hold a position up to it, so rollbacks
    // are counted from it (two short truncations in a row must not reach overwritten slots).
    int64_t longest = 0;
    std::vector<std::vector<float>> k, v;  // per layer: [sinks + ring, num_kv_heads * head_dim]
  };
  int64_t Slot(int64_t pos) const { return pos < sinks_ ? pos : sinks_ + (pos - sinks_) % ring_; }
  int64_t Slots() const { return sinks_ + ring_; }

  const KvLayout layout_;
  const int sinks_, window_, rollback_;
  const int64_t ring_;
  SequenceSlots<Sequence> seqs_;
  std::vector<std::vector<int32_t>> row_lists_;
  std::vector<kernels::CompressedKvHead> views_;
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_STREAMING_CACHE_H_
