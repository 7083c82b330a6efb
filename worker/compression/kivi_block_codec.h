// The KIVI block codec: a compressed prefix as a cache store holds it. Each block is whole KIVI
// key groups of positions, every one quantized, one payload per layer in the store's KIVI block
// layout (cachestore/block_format.h). A worker that has no compressed copy of a prefix of its own
// reads the store's blocks and drafts from them at once.
//
// A compressed cache offers this codec (CompressedKvCache::block_codec) only where its own
// content can be cut into such blocks and rebuilt from them bit for bit: KIVI without token
// selection (alone, or under Quest's per-query group selection).
#ifndef VC_WORKER_COMPRESSION_KIVI_BLOCK_CODEC_H_
#define VC_WORKER_COMPRESSION_KIVI_BLOCK_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

// What names a codec's blocks apart from another's. bits 0: no block form.
struct KiviBlockFormat {
  int bits = 0;   // KIVI code width: 2, 4 or 8
  int group = 0;  // positions per key group; blocks are whole groups
};

// Not thread-safe: it is a view of one compressed cache, whose thread calls it.
class KiviBlockCodec {
 public:
  virtual KiviBlockFormat format() const = 0;
  // The compressed form of positions [first, first + tokens) of `full_seq` in `full`, one payload
  // per layer: every position quantized exactly as the cache quantizes it. kInvalidArgument
  // unless first and tokens are multiples of the group within the sequence.
  virtual absl::Status EncodeBlock(const PagedKvCache& full, SeqId full_seq, int64_t first, int64_t tokens,
                                   std::vector<std::string>* layers) const = 0;
  // Appends an encoded block of `tokens` positions to `seq` of the cache. `seq` must hold only
  // appended blocks (a new sequence, or one that blocks were appended to): kFailedPrecondition
  // otherwise, kInvalidArgument for payloads of the wrong size. Truncate never goes below them.
  virtual absl::Status AppendBlock(SeqId seq, int64_t tokens, const std::vector<absl::string_view>& layers) = 0;
  // Cuts `seq` back to positions [0, length), a multiple of the group, every one of them quantized
  // already: it then holds what AppendBlock of those positions' encoded blocks would (a cached
  // prefix cut to the part a new prompt shares with it). kInvalidArgument for a length out of
  // range or off a group, kFailedPrecondition when a position below it is not quantized yet;
  // `seq` is unchanged then.
  virtual absl::Status CutTo(SeqId seq, int64_t length) = 0;

 protected:
  ~KiviBlockCodec() = default;
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_KIVI_BLOCK_CODEC_H_
