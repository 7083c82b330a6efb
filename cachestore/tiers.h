// Storage tiers of the cache store: a host-RAM tier (one contiguous region, size-class slabs, a
// byte budget with LRU eviction between high and low watermarks, leases that pin blocks being read)
// over a persistent RocksDB tier (values in blob files, its own byte budget, oldest-first eviction).
// Both are thread-safe; neither holds its lock across RocksDB calls or copies of block payloads
// larger than a slot.
#ifndef VC_CACHESTORE_TIERS_H_
#define VC_CACHESTORE_TIERS_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/block_key.h"

namespace rocksdb {
class DB;
}

namespace vc::cachestore {

// Where a leased block sits in the RAM tier's region: valid until the lease is released.
struct BlockLease {
  uint64_t id = 0;
  uint64_t offset = 0;  // from the region's base
  uint64_t size = 0;
};

struct RamTierOptions {
  uint64_t capacity_bytes = uint64_t{1} << 30;
  double high_watermark = 0.95;  // eviction starts above this fraction of capacity...
  double low_watermark = 0.85;   // ...and stops below this one
  uint64_t min_slot_bytes = 4096;
};

class RamTier {
 public:
  explicit RamTier(const RamTierOptions& options);
  ~RamTier();

  // Stores `block` (replacing an existing copy). Evicts unpinned least-recently-used blocks as
  // the watermarks say; `evicted` (may be null) receives the keys and bytes of what was evicted so
  // the caller can demote them. kResourceExhausted when pinned blocks leave no room.
  absl::Status Put(const BlockKey& key, absl::string_view block,
                   std::vector<std::pair<BlockKey, std::string>>* evicted);
  // A copy of the block; kNotFound when absent. Counts as a use for LRU.
  absl::StatusOr<std::string> Get(const BlockKey& key);
  bool Contains(const BlockKey& key) const;
  absl::Status Delete(const BlockKey& key);

  // Pins the block until Release(lease.id); kNotFound when absent. Readers (UCX gets) read
  // region() + offset for size bytes while the lease is held.
  absl::StatusOr<BlockLease> Lease(const BlockKey& key);
  void Release(uint64_t lease_id);

  // The region blocks live in (registered once with the data plane).
  const char* region() const { return region_.get(); }
  uint64_t region_bytes() const { return options_.capacity_bytes; }
  uint64_t used_bytes() const;
  size_t blocks() const;

 private:
  struct Entry {
    uint64_t offset = 0, slot = 0, size = 0;
    int pins = 0;
    bool ready = false;  // payload copied in; invisible to readers until then
    bool dead = false;   // deleted while pinned: freed at the last release
    std::list<BlockKey>::iterator lru;
  };
  uint64_t SlotFor(uint64_t size) const;
  // Returns an offset of a free slot of `slot` bytes, or UINT64_MAX.
  uint64_t Allocate(uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Free(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RamTierOptions options_;
  std::unique_ptr<char[]> region_;
  mutable absl::Mutex mu_;
  uint64_t bump_ ABSL_GUARDED_BY(mu_) = 0;  // region bytes never handed out yet
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of live slots
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> free_slots_ ABSL_GUARDED_BY(mu_);  // slot size -> offsets
  absl::flat_hash_map<BlockKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<BlockKey> lru_ ABSL_GUARDED_BY(mu_);  // front = most recent
  absl::flat_hash_map<uint64_t, BlockKey> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
};

struct DiskTierOptions {
  std::string path;
  uint64_t capacity_bytes = uint64_t{8} << 30;
  bool sync_writes = false;  // fsync every put (survives power loss, not only kill -9)
};

class DiskTier {
 public:
  // Opens (or creates) the database; blocks already there are served again. kUnavailable when
  // RocksDB cannot open the path (the message says why).
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();

  // Stores the block, evicting the oldest blocks beyond the byte budget.
  absl::Status Put(const BlockKey& key, absl::string_view block);
  absl::StatusOr<std::string> Get(const BlockKey& key);
  absl::Status Delete(const BlockKey& key);
  bool Contains(const BlockKey& key) const;
  uint64_t used_bytes() const;
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  size_t blocks() const;

 private:
  DiskTier() = default;
  DiskTierOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  mutable absl::Mutex mu_;
  // Insertion order for eviction, rebuilt from the database on open (RocksDB key order then).
  std::list<BlockKey> order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockKey, std::pair<uint64_t, std::list<BlockKey>::iterator>> sizes_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_TIERS_H_
