// Storage tiers of the cache store: a host-RAM tier (one contiguous region carved into slots of a
// unit times a power of two by a buddy allocator, so the room blocks of one size free is there for
// blocks of another; a byte budget with segmented-LRU eviction between high and low watermarks,
// leases that pin blocks being read)
// over a persistent RocksDB tier (values in blob files, its own byte budget, least-recently-used
// eviction, a read from either tier counting as a use).
// Both are thread-safe; neither holds its lock across RocksDB calls or copies of block payloads
// larger than a slot.
//
// Leases expire. A reader that dies holding one would otherwise pin its block forever, so a lease
// not released within RamTierOptions::lease_ttl_ms is dropped, lazily: the tier's next Put, Lease
// or Release drops every expired lease first (no thread of its own). Once its lease is gone a
// block can be evicted and its slot reused, so a remote read still in flight may copy parts of
// another block. The block format's checksums catch a torn read but not a slot that now holds
// another whole block of the same size, so a reader trusts its bytes only when Release of the
// lease, called after the read completed, returns OK: a lease that was live then was live for the
// whole read; or when the read finished, by the reader's own monotonic clock, well within
// lease_ttl_ms of a moment before the lease was granted (StoreClient::GetRemoteBatch trusts that,
// with a margin for clock rates, and asks Release only for reads that finished later).
#ifndef VC_CACHESTORE_TIERS_H_
#define VC_CACHESTORE_TIERS_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cachestore/block_key.h"
#include "common/clock.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class Iterator;
struct ReadOptions;
}

namespace vc::cachestore {

// Where a leased block sits in the RAM tier's region: valid until the lease is released or expires.
struct BlockLease {
  uint64_t id = 0;
  uint64_t offset = 0;  // from the region's base
  uint64_t size = 0;
};

// The slot a block of `size` bytes takes in a RAM tier whose slots are `unit` bytes times a
// power of two: the smallest that holds it.
uint64_t RamSlotBytes(uint64_t unit, uint64_t size);

struct RamTierOptions {
  uint64_t capacity_bytes = uint64_t{1} << 30;
  double high_watermark = 0.95;  // eviction starts above this fraction of capacity...
  double low_watermark = 0.85;   // ...and stops below this one
  // Blocks take slots of this many bytes times a power of two (the smallest that holds them). Any
  // size works: a block of B bytes wastes nothing when this is B (or B over a power of two), where
  // with the default a block of a power-of-two payload plus its header takes twice its size.
  uint64_t min_slot_bytes = 4096;
  // Segmented LRU: a block enters the cold segment and moves to the hot one when it is read (Get
  // or Lease, or Use: a lookup counted as a read); eviction takes the cold segment's least recent blocks first. The hot segment holds
  // at most this fraction of capacity; past it, its least recent blocks turn cold again. So blocks
  // put and never read, most of a prefix cache's, cannot push out the ones being reused. 0 is
  // plain LRU (every block cold, in order of use); values past [0, 1] are taken as its ends.
  double hot_fraction = 0.5;
  // A lease not released this long after it was granted expires (see the top of this file). > 0.
  int64_t lease_ttl_ms = 30'000;
  // Bytes of RAM (the blocks' slots) one owner's live leases may pin at once; 0: no cap. Past
  // it, Lease is kResourceExhausted (the store then serves the block inline), so one tenant
  // cannot pin the tier and leave the others' blocks, and new puts, no room.
  uint64_t max_leased_bytes_per_owner = 0;
  // What lease deadlines are measured against; null: SteadyClock(). Must outlive the tier.
  const Clock* clock = nullptr;
  // The memory blocks live in: capacity_bytes bytes that the caller owns and keeps alive longer
  // than the tier (UcxRegionServer::Allocate's region, which peers can read fast); null: the tier
  // allocates its own.
  char* region = nullptr;
};

class RamTier {
 public:
  explicit RamTier(const RamTierOptions& options);
  ~RamTier();

  // Stores `block`, replacing an existing copy unless that copy is pinned: then the same bytes are
  // a no-op, different ones kFailedPrecondition, and kUnavailable while another Put of the key
  // is still copying in. Evicts unpinned least-recently-used blocks as the watermarks say, and
  // until a slot of the block's size is free; `evicted` (may be null) receives the keys and bytes
  // of what was evicted so the caller can demote them. kResourceExhausted when pinned blocks leave
  // no room, or when the block is larger than any slot (an unpinned copy under its key is dropped
  // first: the caller's disk tier takes the new one). `stored` (may be null) says whether this call
  // put the block in.
  absl::Status Put(const BlockKey& key, absl::string_view block,
                   std::vector<std::pair<BlockKey, std::string>>* evicted, bool* stored = nullptr);
  // A copy of the block; kNotFound when absent. Counts as a use for LRU.
  absl::StatusOr<std::string> Get(const BlockKey& key);
  bool Contains(const BlockKey& key) const;
  // Contains, counting as a use for LRU as a read does (a lookup that finds the block).
  bool Use(const BlockKey& key);
  absl::Status Delete(const BlockKey& key);

  // Pins the block for `owner` until Release(lease.id, owner) or until the lease expires,
  // lease_ttl_ms from now; kNotFound when absent, kResourceExhausted when it would take the
  // owner's leases past max_leased_bytes_per_owner. Readers (UCX gets) read region() + offset
  // for size bytes while the lease is held.
  absl::StatusOr<BlockLease> Lease(const BlockKey& key, absl::string_view owner = "");
  // Whether `owner` could lease one more block of `size` bytes now under
  // max_leased_bytes_per_owner (its other leases as they stand).
  bool LeaseFits(absl::string_view owner, uint64_t size) const;
  // Ends `owner`'s lease. OK when it was live: bytes read under it before this call were the
  // block's. kNotFound when `owner` holds no live lease of that id (released already, expired, or
  // another owner's, which is left alone); bytes read under an expired lease must be discarded.
  // Releasing an unknown or expired id changes nothing else.
  absl::Status Release(uint64_t lease_id, absl::string_view owner = "");

  // How long a lease lives after it is granted (RamTierOptions::lease_ttl_ms).
  int64_t lease_ttl_ms() const { return options_.lease_ttl_ms; }
  // The region blocks live in (registered once with the data plane).
  const char* region() const { return region_; }
  uint64_t region_bytes() const { return options_.capacity_bytes; }
  // Bytes of the slots taken, and of the blocks in them (the rest of the slots is unused).
  uint64_t used_bytes() const;
  uint64_t block_bytes() const;
  size_t blocks() const;
  // Blocks evicted to make room, since the tier opened.
  uint64_t evictions() const;

 private:
  struct Entry {
    uint64_t offset = 0, slot = 0, size = 0;
    int pins = 0;
    bool ready = false;  // payload copied in; invisible to readers until then
    bool dead = false;   // deleted while pinned: freed at the last release
    bool hot = false;    // in the hot segment of lru_ (read since it was put)
    std::list<BlockKey>::iterator lru;
  };
  struct LeaseRecord {
    BlockKey key;
    absl::Duration deadline;
    std::string owner;
    uint64_t slot = 0;  // bytes pinned, counted against the owner
  };
  // The slot a block of `size` bytes takes: min_slot_bytes times a power of two.
  uint64_t SlotFor(uint64_t size) const;
  // Drops every lease whose deadline is not after `now`.
  void ExpireLeases(absl::Duration now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes e out of lru_ (and its segment).
  void Unlink(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read of e: to the front of the hot segment, which then sheds blocks past its share.
  void Touch(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of a block that can be read (present, copied in, not deleted), or null.
  const Entry* Readable(const BlockKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* Readable(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return const_cast<Entry*>(static_cast<const RamTier*>(this)->Readable(key));
  }
  // Drops one pin of `key`, freeing a deleted block at its last one.
  void Unpin(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes `owner`'s live leases pin, and whether one more slot of `slot` bytes keeps it within
  // max_leased_bytes_per_owner.
  uint64_t LeasedBy(absl::string_view owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FitsCap(absl::string_view owner, uint64_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a live lease: its pin and its share of its owner's leased bytes.
  void EndLease(std::map<uint64_t, LeaseRecord>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns an offset of a free slot of `slot` bytes, or UINT64_MAX: the lowest free slot of the
  // smallest size that holds it, split in halves down to `slot`.
  uint64_t Allocate(uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns e's slot, merged with its free buddies.
  void Free(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RamTierOptions options_;
  const Clock* const clock_;
  std::unique_ptr<char[]> owned_region_;  // null when options_.region is given
  char* const region_;
  mutable absl::Mutex mu_;
  const uint64_t unit_;        // min_slot_bytes (at least 1): slots are unit_ times a power of two
  const uint64_t hot_cap_;     // bytes the hot segment may hold
  uint64_t largest_slot_ = 0;  // the region's biggest aligned power-of-two piece
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;         // bytes of live slots
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t block_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of the blocks in them
  // Free slots: size -> offsets (no size with none). A slot of s bytes sits at a multiple of s
  // (counted from the region's base in min_slot_bytes units), and its buddy, the other half of the
  // slot of 2s that holds it, at offset XOR s.
  std::map<uint64_t, std::set<uint64_t>> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Front = most recent: the hot segment, then from cold_ on the cold one.
  std::list<BlockKey> lru_ ABSL_GUARDED_BY(mu_);
  std::list<BlockKey>::iterator cold_ ABSL_GUARDED_BY(mu_) = lru_.end();  // the cold segment's first
  uint64_t hot_bytes_ ABSL_GUARDED_BY(mu_) = 0;                            // slots of hot blocks
  // Live leases by id. Every lease gets the same time to live and ids grow with the (monotonic)
  // clock, so id order is deadline order and the expired leases are always a prefix.
  std::map<uint64_t, LeaseRecord> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> leased_bytes_ ABSL_GUARDED_BY(mu_);  // by owner, live leases only
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_);
};

struct DiskTierOptions {
  std::string path;
  // The budget of everything the tier writes in `path`: blocks, RocksDB's write-ahead logs,
  // memtables as they flush, SST and blob files with the garbage of evicted blocks until it is
  // collected, manifest and info logs. Blocks alone never take more than this; the files are kept
  // within it too (see DiskTier::Maintain), never under 8 MiB (an empty database's own files).
  uint64_t capacity_bytes = uint64_t{8} << 30;
  bool sync_writes = false;  // fsync every put (survives power loss, not only kill -9)
  rocksdb::Env* env = nullptr;  // RocksDB's environment (tests: one whose writes fail); null: the default
  // Open refuses a budget past the filesystem's size (it would only show as failed puts once the
  // disk fills), unless this is set: a trace replay's tier takes only what its trace puts.
  bool allow_past_filesystem = false;
  // RocksDB's memtable of blocks (write_buffer_size; a write-ahead log past two of them makes it
  // flush), written to a blob file when full, and its largest blob file. Both are capped at a
  // thirty-second and a sixteenth of the budget (at least 256 KiB and 1 MiB), so that the logs of
  // a small budget fit in it.
  uint64_t memtable_bytes = uint64_t{64} << 20;
  uint64_t blob_file_bytes = uint64_t{256} << 20;
  // Room kept free on the filesystem. A filesystem RocksDB's files fill stops its writes, and then
  // nothing frees the garbage that filled it. So whenever less than this is free (looked at every
  // 1/32 of the budget or a quarter of this put, whichever is less), a put evicts the least
  // recently used blocks beyond the budget, as many bytes as are missing, and RocksDB's
  // compactions free their room. Open refuses a reserve the filesystem cannot keep beside the
  // budget (unless allow_past_filesystem). 0: never.
  uint64_t reserve_bytes = uint64_t{256} << 20;
  // The filesystem's free bytes, for tests; null: statvfs of `path`.
  std::function<uint64_t()> free_bytes = nullptr;
  // How often the tier's own thread calls DiskTier::Maintain; 0: never (tests call it).
  int64_t maintain_every_ms = 1000;
};

// Puts failing on disk: since when, and whether for want of room.
struct DiskWriteFailure {
  // How long since the first failed put with no put or probe succeeding after it; zero while
  // they succeed.
  absl::Duration duration;
  // The last failure was "no space left": RocksDB takes writes again by itself once the disk has
  // room, where after other errors (a log write failing with EIO) only a reopen does.
  bool no_space = false;
};

class DiskTier {
 public:
  // Opens (or creates) the database; blocks already there are served again. kUnavailable when
  // RocksDB cannot open the path (the message says why).
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();

  // Stores the block, evicting the least recently used blocks (by Put and Touch) beyond the byte
  // budget.
  absl::Status Put(const BlockKey& key, absl::string_view block);
  absl::StatusOr<std::string> Get(const BlockKey& key);
  // Marks the block as just used, so that it is evicted last; whether it is here (nothing is
  // marked when absent). The order is kept in memory only: after a restart blocks are evicted in
  // RocksDB's key order.
  bool Touch(const BlockKey& key);
  absl::Status Delete(const BlockKey& key);
  bool Contains(const BlockKey& key) const;
  // The stored size of the block, from the index (no read); 0 when absent.
  uint64_t SizeOf(const BlockKey& key) const;
  uint64_t used_bytes() const;
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  // What blocks may take of it: the budget less room for RocksDB's logs and files in flight (at
  // least half the budget; all of a budget under 8 MiB). Eviction keeps used_bytes() within it.
  uint64_t block_budget_bytes() const;
  // What the tier takes on the filesystem now: the space allocated to the files in its directory
  // (blob files, with the garbage of deleted blocks until garbage collection rewrites them; SSTs;
  // write-ahead logs; RocksDB's own logs and manifest). A listing of the directory; 0 if it
  // cannot be read.
  uint64_t footprint_bytes() const;
  size_t blocks() const;
  // Blocks evicted to make room, since the tier opened.
  uint64_t evictions() const;
  // Of those, the ones evicted within the budget to keep room free on the filesystem
  // (DiskTierOptions::reserve_bytes).
  uint64_t reserve_evictions() const;
  // Puts that failed in RocksDB (a full disk, an I/O error, a corrupt file), since the tier
  // opened. After such a failure RocksDB takes no writes until it recovers (see Maintain).
  uint64_t write_errors() const;
  // Whether writes are failing now, and how: see DiskWriteFailure.
  DiskWriteFailure write_failure() const;
  // While writes are failing, writes nothing but a deletion of a key no block has, to see whether
  // RocksDB takes writes again (puts may have stopped coming); OK when it does, or when writes
  // were not failing.
  absl::Status ProbeWrites();
  // Keeps the tier taking puts and its files within the budget; its own thread calls it every
  // maintain_every_ms. While puts fail it probes (ProbeWrites) and heals:
  //  - a full disk: RocksDB resumes by itself once there is room; after 5 s with room and no
  //    recovery, RocksDB is told to resume, and after 15 s the database is reopened;
  //  - a corrupt file (puts fail with kDataLoss once a compaction meets it): the database is
  //    reopened, every block is read and those that fail their checksums are deleted, and a
  //    compaction rewrites the rest; when that still meets corruption (a damaged SST), the whole
  //    database is dropped and opened empty (a cache may lose blocks, never the ability to cache);
  //  - another error (an I/O error): RocksDB is told to resume after 1 s, and the database is
  //    reopened when it does not (at most every 10 s).
  // Then, when the files take more than the budget, it evicts the least recently used blocks by
  // as many bytes as they are over (less the garbage of earlier such evictions not yet collected)
  // and has RocksDB collect the oldest blob files' garbage. Reads and puts wait only while the
  // database is closed and opened again.
  void Maintain();
  // Times the tier was reopened, and dropped whole, to heal (see Maintain), since it opened.
  uint64_t reopens() const;
  uint64_t resets() const;

 private:
  DiskTier() = default;
  // Opens RocksDB at options_.path and indexes the blocks there into an empty index; kDataLoss when
  // RocksDB finds the database corrupt. db_ must be closed, and db_mu_ held exclusively once
  // others can see the tier.
  absl::Status OpenDatabase();
  void CloseDatabase();
  // Deletes every file in the directory and opens an empty database (db_mu_ held exclusively).
  absl::Status ResetDatabase(absl::string_view why);
  // Maintain's steps: healing failed writes (`corrupt`: the last failure was kDataLoss), and
  // keeping the files within the budget.
  void Heal(absl::Duration failing_for, bool no_space, bool corrupt);
  void KeepFilesInBudget();
  // Closes and opens the database again (reads and puts wait meanwhile); with `verify`, then reads
  // every block, deletes those RocksDB reports as lost, and compacts every file; drops the whole
  // database when that does not bring writes back.
  void Reopen(bool verify);
  // Compacts the blocks' files, rewriting the live blocks of the oldest `age_cutoff` of the blob
  // files so that RocksDB deletes them with their garbage.
  absl::Status CollectGarbage(double age_cutoff);
  // Bytes the files take past the budget, less those evicted for the files and not yet collected.
  // Also notes whether the files are near the budget (looked at every put then), and whether
  // a put of `put_bytes` would take them past it (it waits for the maintainer then, woken).
  uint64_t FilesOver(uint64_t footprint, uint64_t put_bytes);
  uint64_t FilesBudget() const;
  // Shared for every use of db_ and its handles; exclusive to close and open it (db_ is null while
  // an open failed: reads and puts fail with kUnavailable then).
  mutable absl::Mutex db_mu_;
  absl::Notification stop_;
  std::thread maintainer_;
  int64_t reopens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration last_reopen_ ABSL_GUARDED_BY(mu_) = -absl::InfiniteDuration();
  bool failing_corrupt_ ABSL_GUARDED_BY(mu_) = false;  // the last failure was kDataLoss
  bool pause_compactions_ = false;  // OpenDatabase opens with automatic compactions off (db_mu_ held)
  uint64_t files_evicted_ ABSL_GUARDED_BY(mu_) = 0;     // bytes evicted for the files, not yet collected
  bool files_over_ ABSL_GUARDED_BY(mu_) = false;        // at the last look (logged when it changes)
  bool files_near_budget_ ABSL_GUARDED_BY(mu_) = false;  // within a sixteenth of it at the last look
  bool files_full_ ABSL_GUARDED_BY(mu_) = false;  // the last look saw no room for its put
  bool wake_ ABSL_GUARDED_BY(mu_) = false;        // the maintainer is wanted now
  // Deletes the block and its size from the database.
  absl::Status Erase(const BlockKey& key);
  // A block eviction took out of the index, and whether to keep room free on the filesystem
  // (counted in reserve_evictions()).
  struct Victim {
    BlockKey key;
    uint64_t size;
    bool for_reserve;
  };
  // Erases a block of `size` bytes that eviction took out of the index, unless a put of its key
  // has indexed it again since (that put's block stays). A failed erase indexes it again.
  void EraseEvicted(const BlockKey& key, uint64_t size, bool for_reserve);
  // A put of a key holds the key's stripe from its write to its index entry, and an eviction or a
  // delete of it from its index change to its erase, so an eviction never erases a block that a
  // put wrote after the eviction picked the key (which left the index naming a block not there).
  absl::Mutex& Stripe(const BlockKey& key) { return stripes_[absl::Hash<BlockKey>{}(key) % kStripes]; }
  static constexpr size_t kStripes = 64;
  absl::Mutex stripes_[kStripes];
  // Adds `key` to the index as the newest block (with `oldest`, as the next to be evicted); takes
  // it out of the index (if there).
  void Index(const BlockKey& key, uint64_t size, bool oldest = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unindex(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the least recently used blocks out of the index, past the budget first and then, within
  // it, as many bytes as `short_of_reserve`, keeping the `keep` most recent; for EraseEvicted
  // outside mu_.
  std::vector<Victim> TakeVictims(uint64_t short_of_reserve, size_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ScanSalvaging(const rocksdb::ReadOptions& options,
                             const std::function<bool(const rocksdb::Iterator&)>& visit);
  // Records the outcome of a put or a probe: times a run of failures (`no_space`: this one was a
  // full disk's), logs its start and end.
  void NoteWrite(const absl::Status& s, bool no_space) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DiskTierOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* blocks_ = nullptr;    // the default family: key -> block
  rocksdb::ColumnFamilyHandle* sizes_cf_ = nullptr;  // key -> block size (8 bytes, little-endian)
  mutable absl::Mutex mu_;
  // Use order for eviction, least recent first (Put and Touch move a block to the back), rebuilt
  // from the database on open (RocksDB key order then).
  std::list<BlockKey> order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockKey, std::pair<uint64_t, std::list<BlockKey>::iterator>> sizes_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t write_errors_ ABSL_GUARDED_BY(mu_) = 0;
  bool writes_failing_ ABSL_GUARDED_BY(mu_) = false;    // the last put or probe failed
  absl::Duration failing_since_ ABSL_GUARDED_BY(mu_);  // on SteadyClock(): the run's first failure
  bool failing_for_room_ ABSL_GUARDED_BY(mu_) = false;  // the last failure was "no space left"
  uint64_t failure_runs_ ABSL_GUARDED_BY(mu_) = 0;     // runs of failures begun since the tier opened
  uint64_t put_since_look_ ABSL_GUARDED_BY(mu_) = 0;    // bytes put since the free room was looked at
  bool short_of_reserve_ ABSL_GUARDED_BY(mu_) = false;  // at the last look (logged when it changes)
  uint64_t reserve_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  // The filesystem's free bytes (options_.free_bytes, or statvfs); UINT64_MAX when unknown.
  uint64_t FreeBytes() const;
  // For a put of `put_bytes`: every 1/32 of the budget put (or a quarter of the reserve, if
  // less), how many bytes the filesystem's free room is short of options_.reserve_bytes, to evict
  // beyond the budget (logged when it starts and stops being short); 0 between looks.
  uint64_t ShortOfReserve(uint64_t put_bytes);
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_TIERS_H_
