// The KV state a forward pass reads and appends to. The full paged cache and every compressed
// cache implement it, so the model's forward pass is written once for all of them.
#ifndef VC_WORKER_RUNTIME_ATTENTION_CACHE_H_
#define VC_WORKER_RUNTIME_ATTENTION_CACHE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/kernels.h"

namespace vc {

using SeqId = int32_t;

// A query row of a pass: the sequence and the position of its token.
struct QueryRow {
  SeqId seq = 0;
  int64_t pos = 0;
};

// Not thread-safe: one owner drives it. A pass over a sequence goes
//   Reserve(seq, new_length) -> for each layer { Write(...) for the new positions; Attend(...) }
//   -> Commit(seq, new_length).
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;

  // Positions [0, Length) are held (exactly or compressed).
  virtual int64_t Length(SeqId seq) const = 0;
  // Makes room for positions up to `length`; kResourceExhausted when there is none, in which case
  // nothing changed.
  virtual absl::Status Reserve(SeqId seq, int64_t length) = 0;
  // Stores K and V [num_kv_heads, head_dim] of a new position of the current pass.
  virtual void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) = 0;
  // out [rows, num_heads, head_dim] = attention of q [rows, num_heads, head_dim] for `layer`;
  // row i attends to the held positions <= rows[i].pos (all written before this call). The result
  // of a row must not depend on the other rows of the call.
  virtual void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
                      const kernels::Backend& backend, float* out) = 0;
  // Ends a pass: positions [0, length) are now held.
  virtual void Commit(SeqId seq, int64_t length) = 0;
  // Drops positions >= length. kInvalidArgument if length > Length(seq); kFailedPrecondition if
  // the cache cannot roll back that far (compressed caches declare how far they can).
  virtual absl::Status Truncate(SeqId seq, int64_t length) = 0;
};

// kInvalidArgument unless 0 <= length <= current: the range check every Truncate starts with.
inline absl::Status CheckTruncateLength(int64_t length, int64_t current) {
  if (length >= 0 && length <= current) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("truncate to ", length, " but the sequence has ", current,
                                                 " positions"));
}

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_ATTENTION_CACHE_H_
