// Quest (Tang et al., 2024): query-aware page selection. The cache keeps every position's K/V in
// float32, plus for each page of `page` positions and each KV head the channel-wise minimum and
// maximum of its keys. A query row reads only the pages whose keys can score highest against it:
// memory is not saved, the bytes read per step are.
//
// Row p, KV head g: each complete page before the row's own page scores
//   sum over the group's query heads h, sum over channels c of max(q_hc * min_c, q_hc * max_c),
// an upper bound of q_h . k over the page. The row reads the budget / page - 1 highest-scoring
// pages (ties to the lower page), plus its own page (positions up to p), in position order; with
// budget >= p + 1 that is every position, and the result equals full attention bitwise.
#ifndef VC_WORKER_COMPRESSION_QUEST_CACHE_H_
#define VC_WORKER_COMPRESSION_QUEST_CACHE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compression/compressed_cache.h"
#include "worker/runtime/sequence_slots.h"

namespace vc {

struct QuestParams {
  int page = 16;           // positions per page
  int64_t budget = 1024;   // positions a row reads, its own page included (>= page)
};


// Not thread-safe.
class QuestCache final : public CompressedKvCache {
 public:
  QuestCache(const KvLayout& layout, QuestParams params);

  SeqId NewSequence() override;
  SeqId Fork(SeqId seq) override { return seqs_.Copy(seq); }
  void FreeSequence(SeqId seq) override;
  absl::Status BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                         const PromptQueries* queries) override;
  // K/V of every position plus the min/max keys of every page, partial last page included.
  int64_t Bytes(SeqId seq) const override;
  int64_t BytesBound(int64_t built, int64_t length) const override;
  // Unlimited: nothing is dropped, and a truncation recomputes the last page's bounds.
  int64_t MaxRollback() const override { return int64_t{1} << 30; }
  CompressorNeeds needs() const override { return CompressorNeeds::kCurrentQuery; }
  std::string spec() const override;

  int64_t Length(SeqId seq) const override { return seqs_[seq].length; }
  absl::Status Reserve(SeqId, int64_t) override { return absl::OkStatus(); }
  // Positions must arrive in increasing order after the sequence's length.
  void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) override;
  void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
              const kernels::Backend& backend, float* out) override;
  void Commit(SeqId seq, int64_t length) override { seqs_[seq].length = length; }
  absl::Status Truncate(SeqId seq, int64_t length) override;

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<std::vector<float>> k, v;          // per layer: [positions, num_kv_heads * head_dim]
    std::vector<std::vector<float>> kmin, kmax;    // per layer: [pages, num_kv_heads * head_dim]
  };

  const KvLayout layout_;
  const QuestParams params_;
  SequenceSlots<Sequence> seqs_;
  std::vector<std::vector<int32_t>> row_lists_;  // scratch for Attend
  std::vector<kernels::CompressedKvHead> views_;
  std::vector<float> page_scores_;
  std::vector<int32_t> page_order_;
  std::vector<float> score_scratch_;
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_QUEST_CACHE_H_
