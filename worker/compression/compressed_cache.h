// Compressed KV caches: what a worker drafts from. One interface, one class per method; the
// registry (worker/compression/registry.h) builds each from a spec string such as
// "kivi:bits=4,group=32,residual=32" or a composition "snapkv:capacity=1024+kivi:bits=4".
#ifndef VC_WORKER_COMPRESSION_COMPRESSED_CACHE_H_
#define VC_WORKER_COMPRESSION_COMPRESSED_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/compression/kivi_block_codec.h"
#include "worker/runtime/attention_cache.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

// What a method looks at to decide what to keep.
enum class CompressorNeeds {
  kKeysValues,     // only the keys and values (KIVI, StreamingLLM)
  kPastAttention,  // attention weights of past queries (H2O)
  kCurrentQuery,   // the query of the position being decoded (Quest)
  kPromptQueries,  // queries of the last prompt positions at build time (SnapKV)
};

// Queries of the last `count` positions before `end` of a prefill, per layer:
// per_layer[l] is [count, num_heads, head_dim]. Only methods that need kPromptQueries read them.
struct PromptQueries {
  int64_t end = 0;
  int64_t count = 0;
  std::vector<std::vector<float>> per_layer;
};

// Not thread-safe, like every AttentionCache.
class CompressedKvCache : public AttentionCache {
 public:
  virtual SeqId NewSequence() = 0;
  virtual void FreeSequence(SeqId seq) = 0;
  // A new sequence holding a copy of `seq`'s content (a shared prefix handed to a new request).
  virtual SeqId Fork(SeqId seq) = 0;

  // Replaces `seq`'s content with the compressed form of positions [0, length) of `full_seq` in
  // `full`. `queries` must be non-null for methods that need kPromptQueries.
  virtual absl::Status BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                                 const PromptQueries* queries) = 0;

  // Bytes held for `seq` (codes, scales, kept rows, metadata), as stored.
  virtual int64_t Bytes(SeqId seq) const = 0;
  // The most Bytes can be, with every write committed, for a sequence of at most `length`
  // positions, drafts and rollbacks included. `built`: the fewest positions it was built from with
  // BuildFrom; it matters only where positions are chosen at build time (SnapKV), which keeps
  // every position written after the build. What a worker reserves for a sequence out of its
  // compressed-KV memory.
  virtual int64_t BytesBound(int64_t built, int64_t length) const = 0;
  // How many trailing positions Truncate can always drop and have the cache behave as if they had
  // never been appended. Draft windows must not exceed it.
  virtual int64_t MaxRollback() const = 0;
  virtual CompressorNeeds needs() const = 0;
  // How many of the last prompt positions' queries BuildFrom can use (0: none).
  virtual int64_t prompt_query_window() const { return 0; }
  // The canonical spec, every parameter spelled out.
  virtual std::string spec() const = 0;

  // The KIVI block codec of this cache's content (worker/compression/kivi_block_codec.h), or null
  // where it has no block form a cache store can hold.
  virtual KiviBlockCodec* block_codec() { return nullptr; }
  virtual const KiviBlockCodec* block_codec() const { return nullptr; }
  // The format of block_codec(); bits 0 without one.
  KiviBlockFormat block_format() const {
    const KiviBlockCodec* c = block_codec();
    return c != nullptr ? c->format() : KiviBlockFormat{};
  }
};

// kInvalidArgument unless `cache` can roll back a fixed window of k drafts. The engine runs a
// larger window at that limit; callers that take k from a user check it first.
absl::Status CheckDraftWindow(const CompressedKvCache& cache, int k);

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_COMPRESSED_CACHE_H_
