// SnapKV (Li et al., 2024): when a cache is built from a prompt, each (layer, KV head) keeps the
// prompt positions that the queries of the last `window` prompt positions attend to most, plus
// those last `window` positions themselves. Selection happens once; a TokenListCache holds the
// kept tokens (optionally KIVI-quantized) and keeps every token appended later.
#ifndef VC_WORKER_COMPRESSION_SNAPKV_H_
#define VC_WORKER_COMPRESSION_SNAPKV_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compression/compressed_cache.h"
#include "worker/compression/token_list_cache.h"

namespace vc {

struct SnapKvParams {
  enum class Pooling { kMax, kAvg };
  int64_t capacity = 2048;  // tokens kept per (layer, KV head), the window included
  int window = 32;          // observation window: the last prompt positions, whose queries vote
  int kernel = 5;           // width of the pooling over positions (odd)
  Pooling pooling = Pooling::kMax;
};


// Thread-compatible: Select is const and keeps no state.
class SnapKvSelector final : public PromptSelector {
 public:
  explicit SnapKvSelector(SnapKvParams params) : params_(params) {}

  // A prompt of at most `capacity` positions is kept whole. Otherwise, per (layer l, KV head g):
  // the vote of prefix position j < length - window is the sum, over the window's queries q and
  // the query heads of g's group, of softmax_j(q . k_j / sqrt(head_dim)) taken over every position
  // the query sees (causal, as in the forward pass), in float; votes are pooled over `kernel`
  // neighbouring prefix positions (max, or the mean with the padding counted as zeros); the
  // capacity - window prefix positions with the highest pooled votes (ties to the lower position)
  // and all window positions are kept. kInvalidArgument when `queries` is null, does not end at
  // `length`, holds fewer than `window` positions, or has the wrong shape.
  absl::StatusOr<std::vector<std::vector<std::vector<int32_t>>>> Select(const PagedKvCache& full, SeqId seq,
                                                                         int64_t length, const PromptQueries* queries,
                                                                         int num_heads) const override;
  CompressorNeeds needs() const override { return CompressorNeeds::kPromptQueries; }
  int64_t window() const override { return params_.window; }
  int64_t MaxKept(int64_t length) const override { return std::min(length, params_.capacity); }
  std::string spec() const override;

 private:
  const SnapKvParams params_;
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_SNAPKV_H_
