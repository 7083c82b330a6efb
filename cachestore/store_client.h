// The client workers use to reach a cache store's control plane. Thread-safe (gRPC stubs are).
// Destroying a client sends the lease releases still waiting for a LeaseBlocks call to ride on
// (StoreClientOptions::release_delay_ms), waits briefly for its ReleaseLeases calls in flight, then
// cancels the rest (their leases simply expire).
#ifndef VC_CACHESTORE_STORE_CLIENT_H_
#define VC_CACHESTORE_STORE_CLIENT_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/block_key.h"
#include "cachestore/store.h"
#include "cachestore/ucx_transport.h"
#include "common/clock.h"
#include "vericache/v1/cache_store.grpc.pb.h"

namespace vc::cachestore {

// The largest gRPC message a store call carries either way, so also the largest block a Put can
// store and a read can be handed.
inline constexpr int kMaxStoreMessageBytes = 256 << 20;

// Whether a leased block's UCX location passes its checksum (kDataLoss naming it when it does
// not); a location without one, from a store older than the field, passes.
absl::Status CheckRemoteLocation(const vericache::v1::RemoteBlock& r);

struct StoreClientOptions {
  std::string target;  // host:port
  std::string token;   // bearer token of this client's tenant
  int64_t timeout_ms = 5000;
  std::string tls_root_certs_pem;  // empty: plaintext (loopback, tests)
  // What the client measures lease lifetimes against (GetRemoteBatch); null: SteadyClock(). Must
  // outlive the client.
  const Clock* clock = nullptr;
  // GetRemoteBatchInto leases a batch in rounds of about this many bytes of destination buffers
  // (at least one block a round), each round's LeaseBlocks call sent while the round before is
  // read; 0: one round per LeaseBlocks call the service accepts. (Rounds of 4 MiB measured no
  // faster than 16 MiB for 64 MiB calls of 1 MiB blocks on a 2-core host: each round's call costs
  // about as much as copying 4 MiB.)
  size_t lease_round_bytes = size_t{16} << 20;
  // GetRemoteBatchInto copies the blocks of a call whose buffers total at least this many bytes
  // (more than the caches keep) from a mapped region with non-temporal stores
  // (CopyCrc32cStreaming), which skip reading each destination line before overwriting it.
  size_t streaming_copy_bytes = size_t{8} << 20;
  // A round of GetRemoteBatch(Into) whose reads all finished within the lease trust window needs
  // no answer about its leases, so they are not released at once: their ids wait for this
  // client's next LeaseBlocks call (any thread's) and ride on it (release_lease_ids), which saves
  // a ReleaseLeases call per round. An id waits at most about this many milliseconds of real time
  // (the steady clock, not `clock`): a thread of the client sends the ids that waited that long
  // in a ReleaseLeases call, and the destructor sends those still waiting. Until then their blocks
  // stay pinned (the store cannot evict them), so keep it far below the store's lease time to live
  // (30 s by default); a lease the client never releases only expires. 0: every round's leases go
  // back at once in a ReleaseLeases call of their own, and the client runs no thread.
  int64_t release_delay_ms = 50;
  // At most this many lease ids wait (at most 4096, what one call carries): a round that would
  // make more sends the waiting ones in a ReleaseLeases call first, and a round of more than this
  // many leases sends its own at once.
  size_t max_pending_releases = 1024;
};

class StoreClient {
 public:
  // Creates a channel (connects lazily). kInvalidArgument for an empty target.
  static absl::StatusOr<std::unique_ptr<StoreClient>> Create(const StoreClientOptions& options);
  ~StoreClient();

  // Leading keys the store holds, and how many of them are in its RAM tier; with `use`, the
  // blocks found count as used (LookupRequest.count_as_use).
  absl::StatusOr<std::pair<uint32_t, uint32_t>> Lookup(absl::Span<const BlockKey> keys, bool use = false);
  absl::Status Put(const BlockKey& key, absl::string_view block);
  // kNotFound when absent; kDataLoss when the stored copy failed its checks (it is gone then).
  absl::StatusOr<std::string> Get(const BlockKey& key, const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  // Like Get, but a block the store holds in RAM is read with a one-sided UCX get through
  // `reader` (inline otherwise) under a lease; the block is checked end to end, and one that fails
  // is deleted from the store and reported as kDataLoss. kAborted when the read may have outlived
  // its lease (the slot may have been reused meanwhile; the bytes are discarded, the stored block
  // is kept, and the call can be retried). A batch of one GetRemoteBatch.
  absl::StatusOr<std::string> GetRemote(const BlockKey& key, UcxReader* reader,
                                        const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  // GetRemote for several blocks in one control-plane round trip: one LeaseBlocks call leases them
  // all (up to the service's limit of keys per call; more go in further rounds, each leased while
  // the one before is read), each is read over UCX, and each round's leases go back without being
  // waited for: on a later LeaseBlocks call of this client, or in a ReleaseLeases call of their own
  // (see StoreClientOptions::release_delay_ms). A read counts when it finished, by options.clock, before the moment LeaseBlocks was sent
  // plus the lease's time to live less a margin (LeaseTrustWindow); a read that finished later
  // counts only if the release then finds its lease still live, and is kAborted otherwise (such a
  // round's leases go back at once in a ReleaseLeases call, whose answer is waited for). Blocks
  // the store cannot lease (RAM full, or no UCX data plane) are fetched inline with Get. One result
  // per key, in order, each what GetRemote would have returned; a failed LeaseBlocks call is the
  // result of every key of its round.
  std::vector<absl::StatusOr<std::string>> GetRemoteBatch(absl::Span<const BlockKey> keys, UcxReader* reader,
                                                          const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  // GetRemoteBatch into memory the caller owns, with no allocation per block: block i is written to
  // dest[i] (dest.size() == keys.size()) and its result is the block's size in bytes. The keys are
  // leased in rounds of about options.lease_round_bytes of buffers: the LeaseBlocks call of the next
  // round is in flight while a round is read, each round has its own trust window (from when its
  // call was sent) and its leases go back as in GetRemoteBatch, and every round's call has
  // finished by the time this returns (releases aside). A block larger
  // than its buffer is kOutOfRange (nothing is read; its lease goes back as usual). Where the
  // store's region is shared memory on this host (error mode none; UcxReader::Map), each block is
  // copied and checked in one pass, the checksums computed from the bytes as they are written to
  // dest[i]; otherwise it is read with UcxReader::Get and then checked in dest[i]. Leases, trust
  // window, kAborted, kDataLoss (the block is deleted) and the inline fallback are as in
  // GetRemoteBatch. Where a result is not OK, dest[i] holds unspecified bytes.
  std::vector<absl::StatusOr<size_t>> GetRemoteBatchInto(absl::Span<const BlockKey> keys,
                                                         absl::Span<const absl::Span<char>> dest, UcxReader* reader,
                                                         const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  absl::Status Delete(const BlockKey& key);
  absl::StatusOr<StoreStats> Stats();

  // How long after sending LeaseBlocks a read may finish and still be trusted without asking the
  // store, for leases living `lease_ttl`: the TTL less max(20% of it, 1 s), which covers clock-rate
  // differences and scheduling hiccups between reading the clock and the read's end. Zero or less:
  // every read waits for its release's answer.
  static absl::Duration LeaseTrustWindow(absl::Duration lease_ttl);

  // LeaseBlocks calls this client has sent: one per round of a batched read.
  int64_t lease_calls() const { return lease_calls_.load(std::memory_order_relaxed); }

 private:
  struct ReleaseCall;
  // One round's LeaseBlocks call (store_client.cc).
  struct LeaseCall;
  // Where the blocks of a batch go (store_client.cc).
  struct Sink;
  // The ReleaseLeases calls in flight, shared with their completion callbacks so a callback that
  // runs as the client is destroyed never touches freed memory. An answered call waits in
  // `answered` for a thread of this client's callers to drop it: its context holds a reference to
  // the channel, and the channel must not die on a gRPC callback thread (gRPC would join that
  // thread from itself and free the completion queue the thread goes back to).
  struct ReleaseTracker {
    absl::Mutex mu;
    absl::flat_hash_map<ReleaseCall*, std::shared_ptr<ReleaseCall>> in_flight ABSL_GUARDED_BY(mu);
    std::vector<std::shared_ptr<ReleaseCall>> answered ABSL_GUARDED_BY(mu);
  };

  StoreClient() = default;
  // Adds the bearer token and the deadline to a call.
  void Prepare(grpc::ClientContext* ctx) const;
  // Starts the LeaseBlocks call for one round's keys (at most the service's limit) without waiting.
  std::unique_ptr<LeaseCall> SendLease(absl::Span<const BlockKey> keys, const std::array<uint8_t, 32>* fp);
  // Reads one round, keys first, first + 1, ... of the whole batch (as `sink` counts them), whose
  // LeaseBlocks call `lease` has been answered (null: lease nothing, every block comes inline):
  // out[i] is the size of block first + i or why there is none; fills out[0, keys.size()).
  void ReadRound(absl::Span<const BlockKey> keys, size_t first, UcxReader* reader,
                 const std::array<uint8_t, 32>* fp, const Sink& sink, const LeaseCall* lease,
                 absl::StatusOr<size_t>* out);
  // GetRemoteBatch and GetRemoteBatchInto: the rounds [0, ends[0]), [ends[0], ends[1]), ... (ends
  // ascending, the last keys.size(), each round at most the service's limit), round r + 1's
  // LeaseBlocks call sent when round r's has been answered, before round r is read.
  std::vector<absl::StatusOr<size_t>> ReadBatch(absl::Span<const BlockKey> keys, const std::vector<size_t>& ends,
                                                UcxReader* reader, const std::array<uint8_t, 32>* fp,
                                                const Sink& sink);
  // Inline Gets of keys[i] for every i in `which`, in flight together, handed to `sink`.
  void GetInline(absl::Span<const BlockKey> keys, size_t first, const std::vector<size_t>& which,
                 const std::array<uint8_t, 32>* fp, const Sink& sink, absl::StatusOr<size_t>* out);
  // Starts one ReleaseLeases call for `lease_ids` (not empty) and returns it without waiting; wait
  // on its `done` for the per-id answer.
  std::shared_ptr<ReleaseCall> SendReleases(const std::vector<uint64_t>& lease_ids);
  // Drops the answered ReleaseLeases calls (ReleaseTracker::answered) on the calling thread.
  void DropAnsweredReleases();
  // Queues `lease_ids` (leases whose release needs no answer) to ride on the next LeaseBlocks
  // call, within the bounds of options_.max_pending_releases.
  void DeferReleases(const std::vector<uint64_t>& lease_ids);
  // Once `call` (a LeaseBlocks call) is answered: sends its release_lease_ids again in a
  // ReleaseLeases call unless the store took them (a failed call, or a store that predates them).
  void SettleCarriedReleases(const LeaseCall& call);
  // The flush thread: sends the ids that have waited options_.release_delay_ms, until stopping_.
  void FlushLoop();

  // Constant after construction.
  StoreClientOptions options_;
  std::unique_ptr<vericache::v1::CacheStore::Stub> stub_;
  std::shared_ptr<ReleaseTracker> releases_ = std::make_shared<ReleaseTracker>();
  std::atomic<int64_t> lease_calls_{0};

  // Leases waiting to ride on the next LeaseBlocks call (options_.release_delay_ms).
  absl::Mutex pending_mu_;
  std::vector<uint64_t> pending_ids_ ABSL_GUARDED_BY(pending_mu_);
  // When the oldest of pending_ids_ was queued, by SteadyClock().
  absl::Duration pending_since_ ABSL_GUARDED_BY(pending_mu_);
  bool stopping_ ABSL_GUARDED_BY(pending_mu_) = false;  // set by the destructor
  std::thread flusher_;  // runs FlushLoop; not started when release_delay_ms is 0
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_STORE_CLIENT_H_
