// The PrefixStore of a worker backed by a cache store: block names are the store's chained
// SHA-256 keys (bound to the model fingerprint, the KV layout, the kernels' numerics and the
// worker's client tenant; the store adds its own tenant, the worker's), reads
// are leased one-sided UCX gets (or inline gRPC bytes), and publishing encodes blocks in the
// store's checksummed format and puts them from a background thread.
//
// The store may be several stores (shards): each block lives on the one its name picks by
// rendezvous hashing over the shards' targets, so every worker that lists the same targets (in
// any order) finds it there, and adding a shard moves about 1/n of the blocks. A lookup asks every
// shard holding some of a prompt's blocks, in parallel; the prefix found ends at the first block
// missing from its shards. A read takes the shards' blocks from all of them at once. A shard that
// is down costs the blocks it holds, not the others'; with replicas, not even those: each block is
// put on the `replicas` shards its name ranks highest, a lookup finds it on any of them (and keeps
// every copy it finds as recent as the one read), a read that fails on one shard takes the blocks
// it wanted there from their next replicas, and a copy found missing is put back (read repair).
//
// Nothing here can make a worker's output wrong: a block that is missing, of another model or
// layout, or fails its checksums is an error the engine answers by recomputing. A store that is
// down only makes lookups miss (after the client's timeout) and puts fail.
#ifndef VC_WORKER_PREFIXES_STORE_PREFIXES_H_
#define VC_WORKER_PREFIXES_STORE_PREFIXES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/block_format.h"
#include "cachestore/store_client.h"
#include "cachestore/ucx_transport.h"
#include "worker/prefixes/link_pacer.h"
#include "worker/prefixes/prefix_store.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

// SHA-256 over the checkpoint's config.json and the files its weights load from (CheckpointFiles:
// model.safetensors, or the index and its shards), in name order: the identity KV blocks are bound
// to. kNotFound when `dir` has no config or weights.
absl::StatusOr<std::array<uint8_t, 32>> ModelFingerprint(const std::string& dir);

struct StorePrefixOptions {
  // The store's client settings but its target.
  cachestore::StoreClientOptions store;
  // The stores blocks are spread over (host:port each): one or more.
  std::vector<std::string> shards;
  // How many shards hold each block (1 to the number of shards).
  int replicas = 1;
  // "none" or "peer": UCX error-handling mode of one-sided reads; "off": inline gRPC bytes.
  std::string ucx = "none";
  int block_tokens = 256;
  // The numerics of the kernels that compute this worker's KV (kernels::Backend::numerics()):
  // blocks are shared only among workers of the same, as KV of other numerics is near but not
  // bitwise what this worker computes. Required.
  std::string numerics;
  // Optional: reads are paced through this link (benchmarks standing for a slower network).
  LinkPacer* link = nullptr;
  // Encoded blocks waiting to be put, split evenly among the shards; a block past its shard's
  // share is dropped (counted).
  int64_t max_publish_queue_bytes = int64_t{256} << 20;
};

class StorePrefixes final : public PrefixStore {
 public:
  // kFailedPrecondition when a store refuses the token or a target is no store, kInvalidArgument
  // when no shard is given, one is listed twice or there are fewer shards than replicas; a store
  // that does not answer is not an error (it may come up later).
  // Whether blocks of `block_tokens` have a stored compressed form in `format` (whole KIVI groups).
  static bool HasCompressedForm(const KiviBlockFormat& format, int block_tokens) {
    return format.bits != 0 && block_tokens % format.group == 0;
  }
  static absl::StatusOr<std::unique_ptr<StorePrefixes>> Create(const StorePrefixOptions& options,
                                                              const std::array<uint8_t, 32>& fingerprint,
                                                              const KvLayout& layout);
  ~StorePrefixes() override;

  int block_tokens() const override { return options_.block_tokens; }
  std::vector<PrefixName> Names(absl::string_view tenant, absl::Span<const int32_t> tokens) const override;
  int Lookup(absl::Span<const PrefixName> names, bool read_follows) override;
  absl::Status Read(absl::Span<const PrefixName> names, const PagedDest& dest) override;
  void Publish(absl::Span<const PrefixName> names, int from, int to, const PagedKvCache& cache, SeqId seq) override;
  std::vector<PrefixName> CompressedNames(absl::string_view tenant, absl::Span<const int32_t> tokens,
                                          const KiviBlockFormat& format) const override;
  absl::Status ReadCompressed(absl::Span<const PrefixName> names, CompressedKvCache& cache, SeqId seq) override;
  void PublishCompressed(absl::Span<const PrefixName> names, int from, int to, const CompressedKvCache& cache,
                         const PagedKvCache& full, SeqId seq) override;

  // Waits until every block published so far has been put (or failed), for up to `timeout`;
  // whether they all were.
  bool Flush(absl::Duration timeout = absl::InfiniteDuration());
  // The shards (indexes into the options' list) that hold the block of this name, best first:
  // options.replicas of them.
  absl::InlinedVector<size_t, 4> ShardsOf(const PrefixName& name) const;
  StorePrefixStats stats() const override;

 private:
  StorePrefixes(const StorePrefixOptions& options, const std::array<uint8_t, 32>& fingerprint, const KvLayout& layout);
  // Puts the blocks queued for shard s until the store is destroyed.
  void PublishLoop(size_t s);
  // Encodes blocks [from, to) with `encode` (block index -> bytes) and queues their puts on their
  // shards; a shard whose queue is over its share of the byte limit drops its copy (counted).
  void Enqueue(absl::Span<const PrefixName> names, int from, int to,
               const std::function<absl::StatusOr<std::string>(int)>& encode);
  cachestore::BlockLayout FullLayout() const;
  cachestore::BlockLayout CompressedLayout(const KiviBlockFormat& format) const;
  // What a read does with a block: (its index in the names read, its bytes, its header).
  using BlockUse = std::function<absl::Status(size_t, absl::string_view, const cachestore::BlockHeader&)>;
  // Reads blocks names[0..n) of layout `want`, checks them, and hands each to `use` (block index,
  // bytes, header) once: in index order on this thread when `in_order`, else the shards at once
  // (one batch each, `use` called from their threads). Each block is asked of its first replica
  // whose lookups are not backed off; one that a shard lacks, or every block of a shard that
  // fails as a whole, is asked of its next replica, and a block read after a shard lacked it is
  // put back there. The error, when a block cannot be had: `use`'s, else a bad copy's
  // (kDataLoss), else the first other.
  absl::Status ReadBlocks(absl::Span<const PrefixName> names, const cachestore::BlockLayout& want, bool in_order,
                          const BlockUse& use);
  // Queues puts of an encoded block read from one replica to the shards that lack it: those its
  // read found without it, and those a lookup did (repair_hints_).
  // `from` is the shard it came from.
  void Repair(const PrefixName& name, absl::string_view block, size_t from, absl::Span<const size_t> lacking);
  // Whether shard s's outbox is past its share of max_publish_queue_bytes.
  bool OutboxFull(size_t s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a put of `block` under `name` on shard s, or counts it dropped when its outbox is full.
  void QueuePut(size_t s, const PrefixName& name, const std::shared_ptr<const std::string>& block)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chained names of the full blocks of `tokens`, the layout tag appended to the KV layout's
  // (a compressed variant's), salted with `tenant`.
  std::vector<PrefixName> ChainNames(absl::string_view layout_tag, absl::string_view tenant,
                                     absl::Span<const int32_t> tokens) const;
  // Blocks idx of `names` from shard `s`, in that order, as ReadBlocks reads them; adds the bytes
  // read to *bytes, and to *handed the blocks handed to `use`. A block the shard lacks (missing,
  // or a bad copy) goes to *lacked; with `pass_over` the read goes on past it, else it ends there.
  // The result is then the first such block's error. Any other error ends the read and is returned.
  absl::Status ReadFromShard(size_t s, absl::Span<const PrefixName> names, absl::Span<const size_t> idx,
                             const cachestore::BlockLayout& want, bool pass_over, int64_t* bytes,
                             std::vector<size_t>* handed, std::vector<size_t>* lacked,
                             const BlockUse& use);
  // Leading names (of `names`, all on shard s) that shard holds; nullopt while it is backed off or
  // when it cannot be asked.
  // With `use`, the shard counts the blocks it finds as used.
  std::optional<size_t> LookupShard(size_t s, absl::Span<const cachestore::BlockKey> keys, bool use);

  const StorePrefixOptions options_;
  const std::array<uint8_t, 32> fingerprint_;
  const KvLayout layout_;
  cachestore::KeyContext keys_;
  struct Shard {
    std::string target;
    uint64_t seed = 0;  // its rendezvous-hashing weight salt, from the target
    std::unique_ptr<cachestore::StoreClient> client;
    std::unique_ptr<cachestore::UcxReader> reader;  // null with ucx "off"
  };
  std::vector<Shard> shards_;

  struct Put {
    cachestore::BlockKey key;
    std::shared_ptr<const std::string> block;  // shared by the block's replicas
  };
  // A shard's puts waiting for its publisher thread.
  struct Outbox {
    std::deque<Put> puts;
    int64_t bytes = 0;    // of the puts waiting or in progress
    int in_progress = 0;
  };
  mutable absl::Mutex mu_;
  std::vector<Outbox> outboxes_ ABSL_GUARDED_BY(mu_);  // by shard
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  StorePrefixStats stats_ ABSL_GUARDED_BY(mu_);
  // After a failed lookup of a shard, or a read that failed as a whole (its data plane down while
  // its control plane answers), its lookups are skipped (answered "no prefix": the worker
  // computes, or reads another replica) and reads ask it last until then: for 8 times as long as
  // the failed call took, 50 ms at least. Lookups run on the worker's scheduling thread, so a
  // store that hangs would otherwise stall the batch for its timeout at every request; this way
  // it stalls it a ninth of the time at most, and a store that refuses at once (down, restarting)
  // is tried again soon. Per shard.
  std::vector<absl::Duration> skip_lookups_until_ ABSL_GUARDED_BY(mu_);  // SteadyClock() time
  void BackOff(size_t shard, absl::Duration failed_after) ABSL_LOCKS_EXCLUDED(mu_);
  void BackOffLocked(size_t shard, absl::Duration failed_after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With replicas: blocks a lookup found on some of their shards, and the shards that answered
  // it without them (each its first missing block), which get a copy when the block is read
  // (cleared past kMaxRepairHints).
  static constexpr size_t kMaxRepairHints = 1 << 16;
  absl::flat_hash_map<PrefixName, absl::InlinedVector<size_t, 2>> repair_hints_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> publishers_;  // by shard
  // Read buffers not in use (ReadFromShard's), as many as reads have run at once.
  absl::Mutex buffers_mu_;
  std::vector<std::vector<char>> buffers_ ABSL_GUARDED_BY(buffers_mu_);
};

}  // namespace vc

#endif  // VC_WORKER_PREFIXES_STORE_PREFIXES_H_
