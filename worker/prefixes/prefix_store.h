// Full KV of shared prompt prefixes kept outside the worker (a cache store), in blocks of
// block_tokens() positions. Block i of a prompt is named by a digest of its tokens [0, (i + 1) *
// block_tokens()) bound to the model, the KV layout and the tenant, so one name stands for exactly
// one KV content: whoever computed it, the bits are the same (the kernels are batch-invariant).
//
// The engine looks a prompt up when it admits it, reads the blocks on its tier's I/O thread while
// the sequence drafts, and publishes the blocks the store lacked once it has computed them.
#ifndef VC_WORKER_PREFIXES_PREFIX_STORE_H_
#define VC_WORKER_PREFIXES_PREFIX_STORE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/kernels.h"
#include "worker/compression/compressed_cache.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

// Where a fetch writes: the physical blocks of one sequence of a PagedKvCache, resolved when the
// fetch is issued (the cache itself is not thread-safe; its pools never move).
struct PagedDest {
  std::vector<int32_t> blocks;                // logical block -> physical block
  std::vector<kernels::PagedKvLayer> layers;  // per layer

  static PagedDest Of(const PagedKvCache& cache, SeqId seq);
  // K or V rows of `layer` at `pos`: [num_kv_heads, head_dim] elements of the cache's dtype.
  void* KRow(int layer, int64_t pos) const;
  void* VRow(int layer, int64_t pos) const;
  DType dtype() const { return layers.empty() ? DType::kF32 : layers[0].dtype; }
};

using PrefixName = std::array<uint8_t, 32>;

// One store shard's part of a prefix store's traffic.
struct StoreShardStats {
  std::string target;
  int64_t lookups = 0, lookup_failures = 0, lookups_skipped = 0;
  // blocks_read: blocks it gave; read_failures: reads from it that failed or lacked a block.
  int64_t blocks_read = 0, read_failures = 0, bytes_read = 0;
  int64_t blocks_published = 0, publish_failures = 0, publish_dropped = 0;
};

// A prefix store's traffic since it was made. With several store shards, lookups,
// lookup_failures and lookups_skipped count calls to each shard; blocks_hit counts the leading
// blocks found per prompt; `shards` holds each shard's part.
struct StorePrefixStats {
  int64_t lookups = 0, lookup_failures = 0, blocks_hit = 0;
  int64_t lookups_skipped = 0;  // answered "no prefix" at once while backing off after a failure
  int64_t blocks_read = 0, read_failures = 0, bytes_read = 0;
  int64_t blocks_published = 0, publish_failures = 0, publish_dropped = 0;
  // Full-block reads that succeeded: their bytes and their time (the link's rate as reads see it).
  int64_t timed_read_bytes = 0;
  double read_seconds = 0;
  std::vector<StoreShardStats> shards;
};

class PrefixStore {
 public:
  virtual ~PrefixStore() = default;

  virtual int block_tokens() const = 0;
  // Names of the full blocks of `tokens` (a trailing partial block gets none), bound to `tenant`:
  // the same tokens of another tenant have other names, so no lookup of one tenant finds, or can
  // time, another's prefixes.
  virtual std::vector<PrefixName> Names(absl::string_view tenant, absl::Span<const int32_t> tokens) const = 0;
  // How many leading `names` the store holds; 0 when it cannot be reached (the worker computes
  // the prefix then). `read_follows`: the caller reads what is found (a store that keeps copies
  // of a block may then count the lookup as a use of each). Thread-safe.
  virtual int Lookup(absl::Span<const PrefixName> names, bool read_follows) = 0;
  // Writes the K/V of blocks names[0..n) to positions [0, n * block_tokens()) of `dest`. Any
  // error (unreachable, evicted, corrupt) is returned; the caller recomputes. Thread-safe.
  virtual absl::Status Read(absl::Span<const PrefixName> names, const PagedDest& dest) = 0;
  // Stores blocks [from, to) of `names`, whose exact K/V are positions [from * block_tokens(),
  // to * block_tokens()) of `seq` in `cache`. Copies what it needs before returning; the puts run
  // in the background and a failed one is only counted (a later request recomputes).
  virtual void Publish(absl::Span<const PrefixName> names, int from, int to, const PagedKvCache& cache,
                       SeqId seq) = 0;

  // Compressed variants, for a worker that has no compressed copy of a prefix of its own: blocks a
  // compressed cache's KiviBlockCodec encodes, named apart from the full blocks
  // and from other codecs' (Lookup takes these names too). Empty: this store keeps none.
  virtual std::vector<PrefixName> CompressedNames(absl::string_view /*tenant*/, absl::Span<const int32_t> /*tokens*/,
                                                  const KiviBlockFormat& /*format*/) const {
    return {};
  }
  // Appends compressed blocks names[0..n) to `seq` of `cache` (KiviBlockCodec::AppendBlock),
  // which must hold nothing else. Any error is returned; the caller drops `seq`. Not thread-safe
  // in `cache`.
  virtual absl::Status ReadCompressed(absl::Span<const PrefixName> /*names*/, CompressedKvCache& /*cache*/,
                                      SeqId /*seq*/) {
    return absl::UnimplementedError("this prefix store keeps no compressed blocks");
  }
  // Encodes blocks [from, to) of `names` with the block codec of `cache` (nothing without one) from
  // positions [from * block_tokens(), to * block_tokens()) of `seq` in `full`, and puts them like
  // Publish.
  virtual void PublishCompressed(absl::Span<const PrefixName> /*names*/, int /*from*/, int /*to*/,
                                 const CompressedKvCache& /*cache*/, const PagedKvCache& /*full*/, SeqId /*seq*/) {}

  // Counts of lookups, reads and puts so far (zeros where a store keeps none). Thread-safe.
  virtual StorePrefixStats stats() const { return {}; }
};

// Publishes the full blocks of `tokens` past its first `known` ones (named and shared already),
// whose exact K/V are those positions of `seq` in `cache`; returns how many it published. What an
// engine does when a request ends, so that the next turn of a conversation finds its output.
inline int PublishBlocksPast(PrefixStore& store, absl::string_view tenant, absl::Span<const int32_t> tokens,
                             int known, const PagedKvCache& cache, SeqId seq) {
  const std::vector<PrefixName> names = store.Names(tenant, tokens);
  const int to = static_cast<int>(names.size());
  if (to <= known) return 0;
  store.Publish(names, known, to, cache, seq);
  return to - known;
}

}  // namespace vc

#endif  // VC_WORKER_PREFIXES_PREFIX_STORE_H_
