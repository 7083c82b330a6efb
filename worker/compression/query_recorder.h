// Records the queries a prefill pass computes for the last positions of a prompt, for methods
// that choose what to keep from them (SnapKV, optionally H2O). It wraps the full paged cache the
// prefill runs on and changes nothing about the pass.
#ifndef VC_WORKER_COMPRESSION_QUERY_RECORDER_H_
#define VC_WORKER_COMPRESSION_QUERY_RECORDER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compression/compressed_cache.h"
#include "worker/runtime/attention_cache.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

// Not thread-safe, like the cache it wraps. Every AttentionCache call is forwarded to `inner`;
// Attend also copies the queries of `seq`'s rows at positions [end - window, end) (clamped at 0).
class QueryRecorder final : public AttentionCache {
 public:
  // `inner` must outlive the recorder. `window` >= 1, `end` >= 0, `num_layers` as the model's.
  QueryRecorder(PagedKvCache& inner, SeqId seq, int64_t end, int64_t window, int num_layers);

  // The recorded queries: end = `end`, count = min(window, end), per_layer[l] [count, num_heads,
  // head_dim]. kFailedPrecondition if some layer did not see every one of those positions (the
  // prefill did not reach `end`). Leaves the recorder empty.
  absl::StatusOr<PromptQueries> Take();

  int64_t Length(SeqId seq) const override { return inner_.Length(seq); }
  absl::Status Reserve(SeqId seq, int64_t length) override { return inner_.Reserve(seq, length); }
  void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) override {
    inner_.Write(layer, seq, pos, k, v);
  }
  void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
              const kernels::Backend& backend, float* out) override;
  void Commit(SeqId seq, int64_t length) override { inner_.Commit(seq, length); }
  absl::Status Truncate(SeqId seq, int64_t length) override { return inner_.Truncate(seq, length); }

 private:
  PagedKvCache& inner_;
  const SeqId seq_;
  const int64_t end_;
  const int64_t count_;
  const int head_dim_;
  int num_heads_ = 0;                       // known from the first Attend
  std::vector<std::vector<float>> queries_;  // per layer: [count, num_heads, head_dim]
  std::vector<std::vector<uint8_t>> seen_;   // per layer: [count]
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_QUERY_RECORDER_H_
