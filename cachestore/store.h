// The cache store's data model: blocks under tenant-scoped keys in a RAM tier over a disk tier.
// Puts are checked before they become visible and written through to disk; RAM evictions need no
// demotion then, and a restart serves every block the disk kept. Gets look in RAM, then disk
// (promoting a disk hit to RAM); a block that fails its checks is dropped from every tier and
// reported as kDataLoss, never served. Thread-safe.
#ifndef VC_CACHESTORE_STORE_H_
#define VC_CACHESTORE_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cachestore/block_key.h"
#include "cachestore/tiers.h"

namespace vc::cachestore {

// The most keys, or lease ids, one LeaseBlocks or ReleaseLeases call of the store service may carry
// (a LeaseBlocks call as many of each).
inline constexpr int kMaxKeysPerLeaseCall = 4096;

struct StoreStats {
  uint64_t ram_used_bytes = 0, ram_capacity_bytes = 0, ram_blocks = 0;
  uint64_t ram_block_bytes = 0;  // of the blocks in the slots ram_used_bytes counts
  uint64_t disk_used_bytes = 0, disk_capacity_bytes = 0, disk_blocks = 0;
  uint64_t disk_footprint_bytes = 0;  // DiskTier::footprint_bytes(): the files, logs and garbage included
  uint64_t hits_ram = 0, hits_disk = 0, misses = 0, corrupt_dropped = 0;
  uint64_t puts = 0;                                   // puts stored (on disk; RAM may have refused them)
  uint64_t ram_evictions = 0, disk_evictions = 0;      // blocks evicted to make room, per tier
  uint64_t disk_reserve_evictions = 0;                 // ...of them within the budget, for room on the filesystem
  uint64_t disk_write_errors = 0;                      // puts RocksDB failed (a full disk, an I/O error)
  uint64_t disk_writes_failing_ms = 0;                 // DiskTier::write_failure(); 0 while puts succeed
  bool disk_full = false;                              // ...and whether the last failure was "no space left"
};

struct StoreOptions {
  RamTierOptions ram;
  DiskTierOptions disk;
};

class BlockStore {
 public:
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const StoreOptions& options);

  // The key a tenant's client key is stored under: SHA-256(tenant salt || key).
  static BlockKey Scoped(absl::string_view tenant_salt, const BlockKey& key);
  // A tenant's salt under the store's secret: SHA-256(secret "\n" tenant), as raw bytes.
  static std::string TenantSalt(absl::string_view secret, absl::string_view tenant);

  // Checks the block's header, size and checksums (kInvalidArgument otherwise), then stores it in
  // both tiers (kFailedPrecondition, and neither changes, when a different block under `key` is
  // being read from RAM; kUnavailable while another Put of `key` is still copying in).
  absl::Status Put(const BlockKey& key, absl::string_view block);
  // The block, checked; kNotFound if absent. `from_ram` (may be null) tells which tier served it.
  absl::StatusOr<std::string> Get(const BlockKey& key, bool* from_ram);
  // Leading keys present, and how many of those are in RAM. With `use`, each block found counts
  // as a use of it, as reading it does (RamTier::Use, DiskTier::Touch): a worker reads a
  // replicated block from one of its shards but looks it up on all of them, and so keeps the
  // copies it finds as recent as the one it reads.
  std::pair<uint32_t, uint32_t> Lookup(absl::Span<const BlockKey> keys, bool use = false);
  absl::Status Delete(const BlockKey& key);
  // Pins the block in the RAM tier for a remote read by `owner` (bringing it up from disk,
  // checked, if needed) until Release or the lease's expiry (RamTier::Lease); kNotFound when
  // absent, kResourceExhausted when RAM cannot take it.
  absl::StatusOr<BlockLease> Lease(const BlockKey& key, absl::string_view owner = "");
  // RamTier::Release: OK only when the lease was still live, so the bytes read under it are good.
  absl::Status Release(uint64_t lease_id, absl::string_view owner = "") { return ram_->Release(lease_id, owner); }
  StoreStats Stats() const;

  RamTier& ram() { return *ram_; }
  DiskTier& disk() { return *disk_; }
  const DiskTier& disk() const { return *disk_; }

 private:
  // A stored block that cannot be served (RocksDB could not read it, or it failed its checks):
  // counted, deleted from disk (and from RAM when `from_ram_too`) so it is not offered again;
  // returns kDataLoss saying `what` happened and why.
  absl::Status Drop(const BlockKey& key, bool from_ram_too, absl::string_view what, const absl::Status& why);
  // Puts a block read from disk into RAM; true when RAM holds it after and disk still does.
  bool Promote(const BlockKey& key, absl::string_view block);
  BlockStore() = default;
  std::unique_ptr<RamTier> ram_;
  std::unique_ptr<DiskTier> disk_;
  std::atomic<uint64_t> hits_ram_{0}, hits_disk_{0}, misses_{0}, corrupt_{0}, puts_{0};
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_STORE_H_
