// Compressed KV caches: what a worker drafts from. One interface, one class per method; every
// method is built from a spec string such as "kivi:bits=4,group=32,residual=32" or a composition
// "snapkv:capacity=1024+kivi:bits=4" or "quest:budget=4096+kivi:bits=4".
#ifndef VC_WORKER_COMPRESSION_COMPRESSED_CACHE_H_
#define VC_WORKER_COMPRESSION_COMPRESSED_CACHE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// One method of a spec: "name:key=value,key=value".
struct MethodSpec {
  std::string name;
  std::map<std::string, std::string> params;
};

// Splits a spec on '+' and ':' and ','. kInvalidArgument for empty parts, a missing '=', or a
// repeated key. Does not check names or values (the factory does).
absl::StatusOr<std::vector<MethodSpec>> ParseCompressorSpec(absl::string_view spec);

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

  // Compressed blocks a cache store can hold (the store's compressed variant of a prefix, read by
  // a worker that has no compressed copy of its own). bits 0: this compressor has none.
  struct BlockCodec {
    int bits = 0;   // KIVI code width
    int group = 0;  // tokens per key group; blocks are whole groups
  };
  virtual BlockCodec block_codec() const { return {}; }
  // The compressed form of positions [first, first + tokens) of `full_seq` in `full`, one payload
  // per layer in the cache store's KIVI block layout (cachestore/block_format.h): every token
  // quantized, exactly as this cache quantizes them. first and tokens are multiples of the group.
  virtual absl::Status EncodeBlock(const PagedKvCache& full, SeqId full_seq, int64_t first, int64_t tokens,
                                   std::vector<std::string>* layers) const;
  // Appends an encoded block of `tokens` positions to `seq`, which must hold only appended blocks
  // (a new sequence, or one that blocks were appended to). Truncate never goes below them.
  virtual absl::Status AppendBlock(SeqId seq, int64_t tokens, const std::vector<absl::string_view>& layers);
  // Cuts `seq` back to positions [0, length), a multiple of the block form's group, every one of
  // them quantized already: it then holds what AppendBlock of those positions' encoded blocks
  // would (a cached prefix cut to the part a new prompt shares with it). kUnimplemented without a
  // block form, kInvalidArgument for a length out of range or off a group, kFailedPrecondition
  // when a position below it is not quantized yet; `seq` is unchanged then.
  virtual absl::Status CutTo(SeqId seq, int64_t length);
};

// Builds a cache for `spec` and a model of `layout` with `num_heads` query heads. kInvalidArgument
// naming the problem for an unknown method or parameter, a bad value, or an unsupported
// composition.
absl::StatusOr<std::unique_ptr<CompressedKvCache>> MakeCompressedKvCache(absl::string_view spec,
                                                                         const KvLayout& layout, int num_heads);

// kInvalidArgument unless `cache` can roll back a fixed window of k drafts. The engine runs a
// larger window at that limit; callers that take k from a user check it first.
absl::Status CheckDraftWindow(const CompressedKvCache& cache, int k);

// Parameter helpers for method constructors: each returns kInvalidArgument naming the method and
// the key when the value is malformed or outside [lo, hi]; absent keys give the default.
absl::StatusOr<int64_t> SpecInt(const MethodSpec& m, const std::string& key, int64_t fallback, int64_t lo,
                                int64_t hi);
absl::StatusOr<double> SpecDouble(const MethodSpec& m, const std::string& key, double fallback, double lo,
                                  double hi);
// kInvalidArgument when `m` has a key outside `known`.
absl::Status SpecKnownKeys(const MethodSpec& m, const std::vector<std::string>& known);

// The indices of the `keep` (in [1, n]) highest of scores[0, n), NaN lowest, ties to the lower
// index, in increasing order, into out [keep] (query-aware selection of pages or key groups).
// `scratch` is reused between calls.
void HighestScores(const float* scores, int64_t n, int64_t keep, std::vector<float>* scratch, int32_t* out);

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_COMPRESSED_CACHE_H_
