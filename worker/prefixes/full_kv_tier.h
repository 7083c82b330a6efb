// Where the full KV of a sequence lives while the worker drafts from a compressed copy: host
// memory here, the cache store over UCX later. The engine is written against this interface.
//
// Fetches are asynchronous: the copy into the worker's staging cache runs on the tier's own
// thread while the engine drafts, which is the overlap VeriCache depends on.
#ifndef VC_WORKER_PREFIXES_FULL_KV_TIER_H_
#define VC_WORKER_PREFIXES_FULL_KV_TIER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/prefixes/link_pacer.h"
#include "worker/prefixes/prefix_store.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

// A fetch in flight. Thread-safe.
class FetchHandle {
 public:
  // Blocks until the fetch is done; returns its status.
  absl::Status Wait();
  // Blocks until the fetch is done or `timeout` has passed; whether it is done.
  bool WaitFor(absl::Duration timeout);
  bool Done() const;
  int64_t bytes() const { return bytes_; }
  // When the fetch finished, on SteadyClock() (absl::InfiniteDuration() while it runs).
  absl::Duration finished_at() const;

 private:
  friend class HostKvTier;
  explicit FetchHandle(int64_t bytes) : bytes_(bytes) {}
  void Finish(absl::Status s);

  const int64_t bytes_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration finished_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

using TierKey = uint64_t;

// Writes the full K/V of positions [0, length) of a prefix into a destination (a PrefixStore
// read, bound to the prefix's names). Runs on the tier's I/O thread.
using PrefixReader = std::function<absl::Status(const PagedDest& dest)>;

class FullKvTier {
 public:
  virtual ~FullKvTier() = default;
  // Sets aside the memory for `key` to hold positions up to `positions` (a prefix attached later
  // keeps its share, for the day its read fails and the positions are held here), so that its
  // appends up to there cannot fail for room; kResourceExhausted when the tier's budget is taken.
  // Erase gives it back.
  virtual absl::Status Reserve(TierKey key, int64_t positions) = 0;
  // kResourceExhausted when even an empty tier could not hold `positions` of one sequence.
  virtual absl::Status CanHold(int64_t positions) const = 0;
  // Appends K/V of positions [begin, end) of `seq` in `src` for `key`; begin must equal the
  // number of positions the tier holds for key (kFailedPrecondition otherwise).
  virtual absl::Status Append(TierKey key, const PagedKvCache& src, SeqId seq, int64_t begin, int64_t end) = 0;
  // Starts copying positions [from, length) of `key` into `dest_seq` of `dest`, whose blocks for
  // positions [0, length) must be reserved and must not be touched until the handle is done. An
  // attached prefix is read (whole) only when `from` lies inside it.
  virtual std::shared_ptr<FetchHandle> Fetch(TierKey key, int64_t from, int64_t length, PagedKvCache* dest,
                                             SeqId dest_seq) = 0;
  // Positions held for key (0 if none).
  virtual int64_t Length(TierKey key) const = 0;
  // Makes positions [0, length) of an empty `key` readable through `read` (a shared prefix kept
  // elsewhere): fetches then read the prefix through it and the rest from the tier, and appends
  // start at `length`. A fetch whose read fails finishes with that error.
  virtual absl::Status AttachPrefix(TierKey key, int64_t length, PrefixReader read) = 0;
  virtual void Erase(TierKey key) = 0;
  // Forgets what `key` holds (its positions and any attached prefix) but keeps its reservation:
  // appends start again at position 0.
  virtual void Clear(TierKey key) = 0;
  // Bytes set aside for sequences now, and the most that may be (0: no bound). Thread-safe.
  virtual int64_t reserved_bytes() const = 0;
  virtual int64_t capacity_bytes() const = 0;
};

// Full KV in host memory, per (key, layer) in chunks of about 64 KiB for K and for V, so an append
// never moves what the tier holds (a contiguous array would copy a 16K-position prefix on the first
// decode append after it) and a short sequence holds little more than its own KV. Fetches run on
// `io_threads` background threads in FIFO order (several, so that prefix reads, which wait on
// the network, overlap). `bytes_per_second` > 0 paces the fetches through one shared link of
// that bandwidth, standing for PCIe or a network (0: as fast as memcpy); a PrefixStore can
// share the link (link()). Thread-safe.
class HostKvTier final : public FullKvTier {
 public:
  // `capacity_bytes` bounds the memory the tier's sequences may hold (0: no bound). Memory is
  // counted in whole chunks, as it is allocated.
  HostKvTier(const KvLayout& layout, double bytes_per_second, int io_threads = 1, int64_t capacity_bytes = 0);
  ~HostKvTier() override;

  absl::Status Reserve(TierKey key, int64_t positions) override;
  absl::Status CanHold(int64_t positions) const override;
  int64_t reserved_bytes() const override;
  int64_t capacity_bytes() const override { return capacity_bytes_; }
  // Bytes a sequence takes to hold `stored` positions (whole chunks).
  int64_t BytesFor(int64_t stored) const;
  // Positions per chunk (memory is counted in whole chunks).
  int64_t chunk_positions() const { return chunk_positions_; }

  absl::Status Append(TierKey key, const PagedKvCache& src, SeqId seq, int64_t begin, int64_t end) override;
  std::shared_ptr<FetchHandle> Fetch(TierKey key, int64_t from, int64_t length, PagedKvCache* dest,
                                     SeqId dest_seq) override;
  int64_t Length(TierKey key) const override;
  absl::Status AttachPrefix(TierKey key, int64_t length, PrefixReader read) override;
  void Erase(TierKey key) override;
  void Clear(TierKey key) override;

  LinkPacer* link() { return &link_; }

 private:
  struct Entry {
    int64_t base = 0;  // positions [0, base) come from `prefix`
    PrefixReader prefix;
    int64_t length = 0;
    // Per layer, chunk c holds positions base + c * chunk_positions_ onward, as
    // [chunk_positions_, num_kv_heads * head_dim] (uninitialized past length).
    std::vector<std::vector<std::unique_ptr<char[]>>> k, v;  // chunks of rows of layout_.dtype
    int64_t reserved_positions = 0;  // Reserve's bound (absolute positions)
    int64_t reserved_bytes = 0;      // what the tier set aside for positions [base, that bound)
  };
  // Destinations are resolved when the fetch is issued (the cache is not thread-safe; its pool
  // arrays never move, so the block addresses stay valid).
  struct Job {
    std::shared_ptr<Entry> entry;
    int64_t first;  // positions [first, length) are written: 0 when the attached prefix is read
    int64_t length;
    PagedDest dest;
    std::shared_ptr<FetchHandle> handle;
  };
  void IoLoop();
  // An empty entry: no positions, no reservation.
  std::shared_ptr<Entry> NewEntry() const;
  // The entry of `key`, made empty if there is none.
  std::shared_ptr<Entry>& EntryFor(TierKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes e's reservation cover positions up to `positions` if the budget allows; else changes nothing.
  absl::Status Grow(Entry& e, int64_t positions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvLayout layout_;
  const int64_t chunk_positions_;  // positions per chunk: about 64 KiB of one layer's K (or V)
  LinkPacer link_;
  const int64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<TierKey, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> io_;
};

}  // namespace vc

#endif  // VC_WORKER_PREFIXES_FULL_KV_TIER_H_
