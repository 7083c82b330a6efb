// The RAM and disk tiers: budgets, LRU eviction, leases and their expiry, persistence across
// reopen; and what the store's reads do to the disk tier's eviction order.
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include "cachestore/store.h"
#include "cachestore/tiers.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/blocks.h"
#include "tests/testing/failing_fs.h"
#include "tests/testing/tiny_model.h"

namespace vc::cachestore {
namespace {

BlockKey Key(int i) {
  BlockKey k;
  k.bytes = Sha256(std::to_string(i));
  return k;
}

std::string Block(int i, size_t n = 10000) { return std::string(n, static_cast<char>('a' + i % 26)); }

// A disk tier's database opened by RocksDB itself, both families, for tests that look or write past
// the tier; the handles go with it.
struct RawDatabase {
  RawDatabase(const std::string& dir, bool read_only) {
    const std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
        {"sizes", rocksdb::ColumnFamilyOptions()}};
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = read_only
                                  ? rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir, families, &handles, &raw)
                                  : rocksdb::DB::Open(rocksdb::DBOptions(), dir, families, &handles, &raw);
    EXPECT_TRUE(s.ok()) << s.ToString();
    db.reset(raw);
  }
  ~RawDatabase() {
    if (db == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : handles) EXPECT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  }
  bool ok() const { return db != nullptr; }
  rocksdb::ColumnFamilyHandle* sizes() const { return handles[1]; }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::unique_ptr<rocksdb::DB> db;
};

TEST(RamTier, PutGetAndLruEvictionWithinBudget) {
  RamTierOptions o;
  o.capacity_bytes = 16 * 16384;  // 16 slots of 16 KiB
  o.high_watermark = 0.75;
  o.low_watermark = 0.5;
  RamTier t(o);
  std::vector<std::pair<BlockKey, std::string>> evicted;
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(*t.Get(Key(3)), Block(3));
  // Touch 0 so it is the most recent; the next put crosses the high watermark.
  ASSERT_TRUE(t.Get(Key(0)).ok());
  ASSERT_TRUE(t.Put(Key(12), Block(12), &evicted).ok());
  EXPECT_LE(t.used_bytes(), o.capacity_bytes * 0.5 + 16384);
  EXPECT_FALSE(evicted.empty());
  EXPECT_EQ(evicted.front().first, Key(1));  // the least recently used went first
  EXPECT_EQ(evicted.front().second, Block(1));
  EXPECT_EQ(t.evictions(), evicted.size());
  EXPECT_TRUE(t.Contains(Key(0)));
  EXPECT_TRUE(t.Contains(Key(12)));
  EXPECT_FALSE(t.Contains(Key(1)));
}

// Segmented LRU: blocks read since they were put (Get or Lease) are evicted after the blocks that
// were not, up to their share of the tier; past it the least recent of them turn cold again.
TEST(RamTier, BlocksReadSincePutOutliveBlocksNeverRead) {
  RamTierOptions o;
  o.capacity_bytes = 4 * 16384;  // four slots
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  o.hot_fraction = 0.5;  // two of them
  RamTier t(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  ASSERT_TRUE(t.Get(Key(0)).ok());
  auto lease = t.Lease(Key(1));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(t.Release(lease->id).ok());
  // Six puts: under plain LRU they would push 0 and 1 out too.
  std::vector<std::pair<BlockKey, std::string>> evicted;
  for (int i = 4; i < 10; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), &evicted).ok());
  ASSERT_EQ(evicted.size(), 6u);
  EXPECT_EQ(evicted[0].first, Key(2));
  EXPECT_EQ(evicted[1].first, Key(3));
  for (int i : {0, 1, 8, 9}) EXPECT_TRUE(t.Contains(Key(i))) << i;
  // Reading 8 and 9 takes the hot segment past its two slots: 0 and 1, its least recent, are the
  // next to go.
  ASSERT_TRUE(t.Get(Key(8)).ok());
  ASSERT_TRUE(t.Get(Key(9)).ok());
  evicted.clear();
  ASSERT_TRUE(t.Put(Key(10), Block(10), &evicted).ok());
  ASSERT_TRUE(t.Put(Key(11), Block(11), &evicted).ok());
  ASSERT_EQ(evicted.size(), 2u);
  EXPECT_EQ(evicted[0].first, Key(0));
  EXPECT_EQ(evicted[1].first, Key(1));
  for (int i : {8, 9, 10, 11}) EXPECT_TRUE(t.Contains(Key(i))) << i;
  // Deleting and replacing blocks keeps the segments whole.
  ASSERT_TRUE(t.Delete(Key(9)).ok());
  ASSERT_TRUE(t.Delete(Key(10)).ok());
  ASSERT_TRUE(t.Put(Key(8), Block(8), nullptr).ok());
  for (int i = 12; i < 20; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  EXPECT_EQ(t.blocks(), 4u);
  for (int i : {16, 17, 18, 19}) EXPECT_TRUE(t.Contains(Key(i))) << i;
  // A hot block deleted while it is leased leaves its segment at once; its slot frees at the
  // release. The hot segment still keeps what is read.
  auto held = t.Lease(Key(18));
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(t.Delete(Key(18)).ok());
  ASSERT_TRUE(t.Release(held->id).ok());
  ASSERT_TRUE(t.Get(Key(19)).ok());
  ASSERT_TRUE(t.Get(Key(17)).ok());
  for (int i = 20; i < 30; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  EXPECT_EQ(t.blocks(), 4u);
  for (int i : {17, 19, 28, 29}) EXPECT_TRUE(t.Contains(Key(i))) << i;
}

// Slots are the unit times a power of two, for any unit: blocks of a power-of-two payload plus a
// header fill units of their own size, where the default unit gives each a slot twice its size.
TEST(RamTier, AUnitOfTheBlockSizeFitsTwiceTheBlocks) {
  const size_t block = (64 << 10) + 64;
  for (const uint64_t unit : {uint64_t{4096}, uint64_t{block}}) {
    RamTierOptions o;
    o.capacity_bytes = 8 * block;
    o.high_watermark = 1.0;
    o.low_watermark = 1.0;
    o.min_slot_bytes = unit;
    RamTier t(o);
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i, block), nullptr).ok());
    EXPECT_EQ(t.blocks(), unit == 4096 ? 4u : 8u) << unit;
    EXPECT_EQ(t.block_bytes(), t.blocks() * block) << unit;  // the blocks' bytes, whatever their slots
    EXPECT_EQ(t.used_bytes(), t.blocks() * (unit == 4096 ? 2 * (64 << 10) : block)) << unit;
    for (int i = 12; i < 20; ++i) EXPECT_EQ(t.Contains(Key(i)), unit != 4096 || i >= 16) << unit << " " << i;
    EXPECT_EQ(*t.Get(Key(19)), Block(19, block));
    ASSERT_TRUE(t.Delete(Key(19)).ok());
    EXPECT_EQ(t.block_bytes(), t.blocks() * block) << unit;
  }
}

TEST(RamTier, LeasesPinBlocks) {
  RamTierOptions o;
  o.capacity_bytes = 4 * 16384;
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  RamTier t(o);
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto lease = t.Lease(Key(0));
  ASSERT_TRUE(lease.ok());
  for (int i = 1; i < 10; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  EXPECT_TRUE(t.Contains(Key(0)));  // pinned: never evicted
  EXPECT_EQ(std::string(t.region() + lease->offset, lease->size), Block(0));
  // Deleted while leased: invisible at once, its memory freed at release.
  ASSERT_TRUE(t.Delete(Key(0)).ok());
  EXPECT_FALSE(t.Contains(Key(0)));
  EXPECT_EQ(std::string(t.region() + lease->offset, lease->size), Block(0));
  EXPECT_TRUE(t.Release(lease->id).ok());
  EXPECT_EQ(t.Release(lease->id).code(), absl::StatusCode::kNotFound);  // once only
  // Every slot pinned: a put is refused, not forced.
  ASSERT_TRUE(t.Put(Key(20), Block(20), nullptr).ok());
  ASSERT_EQ(t.blocks(), 4u);
  std::vector<BlockLease> leases;
  for (int i = 0; i <= 20; ++i) {
    if (auto l = t.Lease(Key(i)); l.ok()) leases.push_back(*l);
  }
  ASSERT_EQ(leases.size(), 4u);
  EXPECT_EQ(t.Put(Key(50), Block(5), nullptr).code(), absl::StatusCode::kResourceExhausted);
  for (const auto& l : leases) EXPECT_TRUE(t.Release(l.id).ok());
  EXPECT_TRUE(t.Put(Key(50), Block(5), nullptr).ok());
}

// A store that restarts hands out lease ids of another range: a client's late release of a lease
// of the earlier run ends no lease of this one (whose owner would trust reads of a slot then free).
TEST(RamTier, LeaseIdsOfAnotherRunAreNotThisOnes) {
  RamTierOptions o;
  o.capacity_bytes = 4 * 16384;
  RamTier before(o), after(o);
  ASSERT_TRUE(before.Put(Key(0), Block(0), nullptr).ok());
  ASSERT_TRUE(after.Put(Key(0), Block(0), nullptr).ok());
  auto old_lease = before.Lease(Key(0), "tenant");
  auto lease = after.Lease(Key(0), "tenant");
  ASSERT_TRUE(old_lease.ok() && lease.ok());
  EXPECT_NE(old_lease->id, lease->id);
  EXPECT_EQ(after.Release(old_lease->id, "tenant").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(after.Release(lease->id, "tenant").ok());
}

// A different block under a key being read is refused whatever its size: one too large for RAM is
// refused as one that fits is (a store would otherwise put it on disk alone, and its tiers disagree).
TEST(RamTier, ADifferentBlockTooLargeForRamUnderAKeyBeingReadIsRefused) {
  RamTierOptions o;
  o.capacity_bytes = 4 * 16384;
  RamTier t(o);
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto lease = t.Lease(Key(0));
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(t.Put(Key(0), Block(1, 8 * 16384), nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(t.Release(lease->id).ok());
  // Not being read: the old copy goes, and RAM cannot take the new one.
  EXPECT_EQ(t.Put(Key(0), Block(1, 8 * 16384), nullptr).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(t.Contains(Key(0)));
}

// Room freed by blocks of one size serves blocks of another: a block as big as the region, then
// small ones, then the big one again.
TEST(RamTier, SlotsOfOneSizeMakeRoomForAnother) {
  RamTierOptions o;
  o.capacity_bytes = 1 << 20;
  o.min_slot_bytes = 4096;
  RamTier t(o);
  const std::string big = Block(0, 1 << 20);
  ASSERT_TRUE(t.Put(Key(0), big, nullptr).ok());
  std::vector<std::pair<BlockKey, std::string>> evicted;
  ASSERT_TRUE(t.Put(Key(1), Block(1, 100), &evicted).ok());
  EXPECT_TRUE(t.Contains(Key(1)));
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].first, Key(0));
  // Small blocks up to the high watermark, without evicting one another.
  evicted.clear();
  for (int i = 2; i < 200; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i, 4000), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(t.blocks(), 199u);
  // The big one back: every small one goes, and their slots merge into one.
  ASSERT_TRUE(t.Put(Key(0), big, &evicted).ok());
  EXPECT_EQ(*t.Get(Key(0)), big);
  EXPECT_EQ(t.blocks(), 1u);
  EXPECT_EQ(evicted.size(), 199u);
  EXPECT_EQ(t.used_bytes(), uint64_t{1} << 20);
}

TEST(RamTier, RegionOfAnySizeIsUsedWhole) {
  RamTierOptions o;
  o.capacity_bytes = 3 * 4096 + 100;  // pieces of 8 KiB and 4 KiB; the last 100 bytes unused
  o.min_slot_bytes = 4096;
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  RamTier t(o);
  EXPECT_EQ(t.Put(Key(0), Block(0, 3 * 4096), nullptr).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(t.Put(Key(1), Block(1, 8000), nullptr).ok());
  ASSERT_TRUE(t.Put(Key(2), Block(2, 4000), nullptr).ok());
  EXPECT_EQ(t.blocks(), 2u);
  EXPECT_EQ(t.used_bytes(), 3u * 4096);
  EXPECT_EQ(*t.Get(Key(1)), Block(1, 8000));
  EXPECT_EQ(*t.Get(Key(2)), Block(2, 4000));
}

// Keys name their content, so a second Put of a key being read is normally the same block and is
// a no-op; a different block is refused until the readers are done, never half-taken.
TEST(RamTier, DifferentBlockUnderAKeyBeingReadIsRefused) {
  RamTierOptions o;
  o.capacity_bytes = 4 * 16384;
  RamTier t(o);
  bool stored = false;
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr, &stored).ok());
  EXPECT_TRUE(stored);
  auto lease = t.Lease(Key(0));
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(t.Put(Key(0), Block(0), nullptr, &stored).ok());
  EXPECT_FALSE(stored);  // the copy being read stays; this call stored nothing
  EXPECT_EQ(t.Put(Key(0), Block(1), nullptr, &stored).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(stored);
  EXPECT_EQ(*t.Get(Key(0)), Block(0));
  EXPECT_TRUE(t.Release(lease->id).ok());
  ASSERT_TRUE(t.Put(Key(0), Block(1), nullptr, &stored).ok());
  EXPECT_TRUE(stored);
  EXPECT_EQ(*t.Get(Key(0)), Block(1));
  EXPECT_EQ(t.blocks(), 1u);
}

// Four 16 KiB slots, evicting only when full, leases living 100 ms on `clock`.
RamTierOptions FourSlots(const Clock* clock) {
  RamTierOptions o;
  o.capacity_bytes = 4 * 16384;
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  o.lease_ttl_ms = 100;
  o.clock = clock;
  return o;
}

TEST(RamTier, ExpiredLeaseNoLongerPins) {
  ManualClock clock;
  RamTierOptions o = FourSlots(&clock);
  o.hot_fraction = 0;  // plain LRU: the leased block is the least recently used below
  RamTier t(o);
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto lease = t.Lease(Key(0), "reader");
  ASSERT_TRUE(lease.ok());
  clock.Advance(absl::Milliseconds(99));
  for (int i = 1; i < 10; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  EXPECT_TRUE(t.Contains(Key(0)));  // still leased: never evicted
  // The reader died. Once the lease's time is up the next put may evict the block (the least
  // recently used) and reuse its slot.
  clock.Advance(absl::Milliseconds(1));
  std::vector<std::pair<BlockKey, std::string>> evicted;
  ASSERT_TRUE(t.Put(Key(10), Block(10), &evicted).ok());
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].first, Key(0));
  EXPECT_FALSE(t.Contains(Key(0)));
  EXPECT_EQ(std::string(t.region() + lease->offset, lease->size), Block(10));  // the slot moved on
  // Releasing the expired lease is refused, and harmless: the other blocks stay, unpinned.
  EXPECT_EQ(t.Release(lease->id, "reader").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Release(lease->id, "reader").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.blocks(), 4u);
  EXPECT_EQ(*t.Get(Key(10)), Block(10));
  for (int i = 11; i < 15; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  EXPECT_FALSE(t.Contains(Key(10)));
}

TEST(RamTier, LeaseExpiresAtItsDeadlineWhetherOrNotSwept) {
  ManualClock clock;
  RamTier t(FourSlots(&clock));
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto early = t.Lease(Key(0), "a");
  auto late = t.Lease(Key(0), "a");
  ASSERT_TRUE(early.ok() && late.ok());
  clock.Advance(absl::Milliseconds(60));
  EXPECT_TRUE(t.Release(early->id, "a").ok());  // in time: the bytes read under it are good
  auto next = t.Lease(Key(0), "a");
  ASSERT_TRUE(next.ok());
  // No tier operation ran since the deadline passed; the release still reports the expiry.
  clock.Advance(absl::Milliseconds(40));
  EXPECT_EQ(t.Release(late->id, "a").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(t.Release(next->id, "a").ok());  // granted later, so it lives later
}

TEST(RamTier, OnlyTheOwnerReleasesALease) {
  ManualClock clock;
  RamTier t(FourSlots(&clock));
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto lease = t.Lease(Key(0), "alice");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(t.Release(lease->id, "bob").code(), absl::StatusCode::kNotFound);
  for (int i = 1; i < 10; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  EXPECT_TRUE(t.Contains(Key(0)));  // bob's attempt left alice's pin in place
  EXPECT_TRUE(t.Release(lease->id, "alice").ok());
}

TEST(RamTier, OneOwnersLeasesPinAtMostItsCap) {
  ManualClock clock;
  RamTierOptions o = FourSlots(&clock);
  o.capacity_bytes = 8 * 16384;
  o.max_leased_bytes_per_owner = 2 * 16384;  // two of the eight 16 KiB slots
  RamTier t(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  auto a0 = t.Lease(Key(0), "alice");
  auto a1 = t.Lease(Key(1), "alice");
  ASSERT_TRUE(a0.ok() && a1.ok());
  const auto refused = t.Lease(Key(2), "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("32768"), absl::string_view::npos) << refused.status();
  EXPECT_EQ(t.Lease(Key(0), "alice").status().code(), absl::StatusCode::kResourceExhausted);  // the same block again
  // Another owner has a cap of its own.
  auto b2 = t.Lease(Key(2), "bob");
  auto b3 = t.Lease(Key(3), "bob");
  ASSERT_TRUE(b2.ok() && b3.ok());
  // Puts still find room past the four pinned blocks, and evict none of them.
  for (int i = 4; i < 20; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(t.Contains(Key(i))) << i;
  // A release gives the room back, and so does an expiry.
  EXPECT_TRUE(t.Release(a0->id, "alice").ok());
  auto again = t.Lease(Key(19), "alice");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(t.Lease(Key(2), "alice").status().code(), absl::StatusCode::kResourceExhausted);
  clock.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(t.Lease(Key(2), "alice").ok());
  EXPECT_TRUE(t.Lease(Key(3), "alice").ok());
}

TEST(RamTier, ExpiryFreesABlockDeletedWhileLeased) {
  ManualClock clock;
  RamTier t(FourSlots(&clock));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t.Put(Key(i), Block(i), nullptr).ok());
  std::vector<BlockLease> leases;
  for (int i = 0; i < 4; ++i) leases.push_back(*t.Lease(Key(i)));
  ASSERT_TRUE(t.Delete(Key(0)).ok());
  EXPECT_EQ(t.Put(Key(5), Block(5), nullptr).code(), absl::StatusCode::kResourceExhausted);
  clock.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(t.Put(Key(5), Block(5), nullptr).ok());  // the deleted block's slot came back
  EXPECT_EQ(t.used_bytes(), 4u * 16384);
  for (const BlockLease& l : leases) EXPECT_EQ(t.Release(l.id).code(), absl::StatusCode::kNotFound);
}

TEST(RamTier, LeasesExpireOnTheSteadyClockByDefault) {
  RamTierOptions o = FourSlots(nullptr);
  o.lease_ttl_ms = 20;
  RamTier t(o);
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto lease = t.Lease(Key(0));
  ASSERT_TRUE(lease.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  EXPECT_EQ(t.Release(lease->id).code(), absl::StatusCode::kNotFound);
}

TEST(RamTier, KeepsBlocksInTheRegionItIsGiven) {
  std::vector<char> region(4 * 16384);
  RamTierOptions o = FourSlots(nullptr);
  o.region = region.data();
  RamTier t(o);
  EXPECT_EQ(t.region(), region.data());
  ASSERT_TRUE(t.Put(Key(0), Block(0), nullptr).ok());
  auto lease = t.Lease(Key(0));
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(std::string(region.data() + lease->offset, lease->size), Block(0));
  EXPECT_TRUE(t.Release(lease->id).ok());
}

TEST(RamTier, ConcurrentReadersAndWritersSeeWholeBlocks) {
  RamTierOptions o;
  o.capacity_bytes = 64 * 16384;
  RamTier t(o);
  std::vector<std::thread> threads;
  std::atomic<int> torn{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::vector<std::pair<BlockKey, std::string>> ev;
      for (int i = 0; i < 300; ++i) {
        const int k = (w * 7 + i) % 100;
        if (i % 3 == 0) {
          (void)t.Put(Key(k), Block(k), &ev);
        } else if (auto got = t.Get(Key(k)); got.ok() && *got != Block(k)) {
          torn++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(torn.load(), 0);
}

// RocksDB's info logs are capped: restarts do not pile up old ones.
TEST(DiskTier, KeepsAFewInfoLogsAcrossRestarts) {
  const std::string dir = vc::testing::TempDir("disk_tier_logs");
  for (int i = 0; i < 8; ++i) {
    auto t = DiskTier::Open({dir, 1 << 20, false});
    ASSERT_TRUE(t.ok()) << t.status();
  }
  int logs = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    logs += e.path().filename().string().rfind("LOG", 0) == 0;
  }
  EXPECT_GE(logs, 1);
  EXPECT_LE(logs, 5);  // LOG and at most four old ones
}

// The footprint is what the directory's files take: the blocks (in the write-ahead log, then in
// blob files once the 1 MiB memtable flushes), and after evictions the garbage they leave, which
// the budget does not count.
TEST(DiskTier, TheFootprintCountsTheFilesTheBudgetDoesNot) {
  const std::string dir = vc::testing::TempDir("disk_tier_footprint");
  DiskTierOptions o{dir, 4 << 20, false};
  o.memtable_bytes = 1 << 20;
  o.blob_file_bytes = 1 << 20;
  auto t = DiskTier::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT((*t)->footprint_bytes(), 0u);  // the manifest, options and logs of an empty tier
  // (Sampled while RocksDB flushes and compacts in the background, so not compared exactly.)
  int64_t most_over = 0;
  for (int i = 0; i < 128; ++i) {  // 8 MiB through a 4 MiB budget
    ASSERT_TRUE((*t)->Put(Key(i), Block(i, 64 << 10)).ok());
    most_over = std::max(most_over, static_cast<int64_t>((*t)->footprint_bytes() - (*t)->used_bytes()));
  }
  EXPECT_LE((*t)->used_bytes(), 4u << 20);
  EXPECT_GT((*t)->evictions(), 0u);
  EXPECT_GT(most_over, 2 << 20);  // two memtables beyond the blocks, and more: logs, garbage
}

// Under the room kept free on the filesystem, a put evicts the least recently used blocks beyond
// the budget, as many bytes as are missing; with room again, the budget alone decides.
TEST(DiskTier, PutsKeepTheReserveFreeOnTheFilesystem) {
  DiskTierOptions o{vc::testing::TempDir("disk_tier_reserve"), 1 << 20, false};
  std::atomic<uint64_t> free{uint64_t{1} << 40};
  o.free_bytes = [&] { return free.load(); };
  o.reserve_bytes = 200 << 10;
  auto t = DiskTier::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  // Blocks of 40 KB, more than 1/32 of the budget, so every put looks at the free room.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i, 40000)).ok());
  EXPECT_EQ((*t)->blocks(), 10u);
  EXPECT_EQ((*t)->evictions(), 0u);

  free = 100 << 10;  // 102400 bytes short: three blocks go, the oldest
  ASSERT_TRUE((*t)->Put(Key(10), Block(10, 40000)).ok());
  EXPECT_EQ((*t)->blocks(), 8u);
  EXPECT_EQ((*t)->reserve_evictions(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE((*t)->Contains(Key(i))) << i;
  for (int i = 3; i <= 10; ++i) EXPECT_TRUE((*t)->Contains(Key(i))) << i;

  free = uint64_t{1} << 40;
  for (int i = 11; i < 14; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i, 40000)).ok());
  EXPECT_EQ((*t)->blocks(), 11u);
  EXPECT_EQ((*t)->reserve_evictions(), 3u);
  EXPECT_LE((*t)->used_bytes(), 1u << 20);
}

// A bad flag: refused before anything is written in the directory.
TEST(DiskTier, ABudgetPastTheFilesystemIsRefused) {
  const std::string dir = vc::testing::TempDir("disk_tier_budget");
  auto t = DiskTier::Open({dir, uint64_t{1} << 62, false});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(t.status().message().find("exceeds the filesystem"), absl::string_view::npos) << t.status();
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  // So is room to keep free that the filesystem cannot give beside the budget.
  DiskTierOptions o{dir, 1 << 20, false};
  o.reserve_bytes = uint64_t{1} << 62;
  t = DiskTier::Open(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  EXPECT_NE(t.status().message().find("keeping"), absl::string_view::npos) << t.status();
  // No room kept free: a budget of the whole filesystem is taken.
  struct statvfs fs;
  ASSERT_EQ(statvfs(dir.c_str(), &fs), 0);
  o.capacity_bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  o.reserve_bytes = 0;
  EXPECT_TRUE(DiskTier::Open(o).ok());
  EXPECT_TRUE(DiskTier::Open({dir, 1 << 20, false}).ok());
}

TEST(DiskTier, PersistsAcrossReopenAndEvictsOldest) {
  const std::string dir = vc::testing::TempDir("disk_tier");
  {
    auto t = DiskTier::Open({dir, 1 << 20, false});
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i)).ok());
    EXPECT_EQ((*t)->blocks(), 5u);
  }
  {
    auto t = DiskTier::Open({dir, 1 << 20, false});
    ASSERT_TRUE(t.ok());
    EXPECT_EQ((*t)->blocks(), 5u);
    EXPECT_EQ(*(*t)->Get(Key(3)), Block(3));
    ASSERT_TRUE((*t)->Delete(Key(3)).ok());
    EXPECT_EQ((*t)->Get(Key(3)).status().code(), absl::StatusCode::kNotFound);
  }
  {
    auto t = DiskTier::Open({dir, 35000, false});  // room for three 10 KB blocks
    ASSERT_TRUE(t.ok());
    // The smaller budget holds from the start, not from the first put.
    EXPECT_LE((*t)->used_bytes(), 35000u);
    EXPECT_EQ((*t)->blocks(), 3u);
    ASSERT_TRUE((*t)->Put(Key(9), Block(9)).ok());
    EXPECT_LE((*t)->used_bytes(), 35000u);
    EXPECT_TRUE((*t)->Get(Key(9)).ok());
    // A block larger than the whole budget is refused, and evicts nothing.
    EXPECT_EQ((*t)->Put(Key(10), Block(10, 40000)).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE((*t)->Get(Key(9)).ok());
  }
  EXPECT_EQ(DiskTier::Open({"/proc/no/such/dir", 1, false}).status().code(), absl::StatusCode::kUnavailable);
}

// A 1 MiB disk tier in a fresh directory named after `name`, on a disk whose writes fail on demand.
struct FailingTier {
  explicit FailingTier(const std::string& name) : options{vc::testing::TempDir(name), 1 << 20, false} {
    options.env = disk.env.get();
  }
  testing::FailingDisk disk;
  DiskTierOptions options;
};

// A disk already full when the tier opens: a clear error; once it has room, the tier opens.
TEST(DiskTier, ADiskFullAtOpenIsAnError) {
  FailingTier f("disk_tier_full");
  f.disk.fs->fault = testing::FailingFileSystem::Fault::kNoSpace;
  for (int i = 0; i < 2; ++i) {  // the second open finds what the first left
    const auto t = DiskTier::Open(f.options);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
    EXPECT_NE(t.status().message().find("the disk is full"), std::string::npos) << t.status();
  }
  f.disk.fs->fault = testing::FailingFileSystem::Fault::kNone;
  auto t = DiskTier::Open(f.options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Put(Key(1), Block(1)).ok());
  EXPECT_EQ(*(*t)->Get(Key(1)), Block(1));
}

// Writes that fail under RocksDB's info log (here past a file size limit, as on a full disk) do not
// abort the process: RocksDB's own log writer asserts on a write after a failed one, and Debian's
// RocksDB keeps its assertions. The tier opens or fails, puts, and closes.
TEST(DiskTierDeathTest, WritesFailingUnderTheInfoLogAreNoAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = vc::testing::TempDir("disk_tier_fsize");
  const auto open_put_close = [&] {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
    rlimit limit;
    limit.rlim_cur = limit.rlim_max = 4096;
    setrlimit(RLIMIT_FSIZE, &limit);
    {
      DiskTierOptions o{dir, 1 << 20, false};
      auto t = DiskTier::Open(o);
      for (int i = 0; t.ok() && i < 4; ++i) (*t)->Put(Key(i), Block(i, 1000)).IgnoreError();
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(open_put_close(), ::testing::ExitedWithCode(0), "");
}

// A disk that fills up fails puts, and the tier counts them; reads go on. Once it has room again,
// RocksDB takes writes again by itself (it polls for room), and puts succeed with no restart.
TEST(DiskTier, PutsFailWhileTheDiskIsFullAndSucceedOnceItHasRoom) {
  FailingTier f("disk_tier");
  const auto& fs = f.disk.fs;
  auto t = DiskTier::Open(f.options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Put(Key(1), Block(1)).ok());
  EXPECT_EQ((*t)->write_failure().duration, absl::ZeroDuration());
  fs->fault = testing::FailingFileSystem::Fault::kNoSpace;
  for (int i = 2; i < 4; ++i) {
    const absl::Status failed = (*t)->Put(Key(i), Block(i));
    EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
    EXPECT_FALSE((*t)->Contains(Key(i)));
  }
  EXPECT_EQ(*(*t)->Get(Key(1)), Block(1));
  EXPECT_EQ((*t)->write_errors(), 2u);
  EXPECT_GT((*t)->write_failure().duration, absl::ZeroDuration());
  fs->fault = testing::FailingFileSystem::Fault::kNone;
  absl::Status put;
  for (int i = 0; i < 600; ++i) {
    put = (*t)->Put(Key(2), Block(2));
    if (put.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(put.ok()) << "puts still fail 30 s after the disk has room: " << put;
  EXPECT_EQ(*(*t)->Get(Key(2)), Block(2));
  EXPECT_TRUE((*t)->Put(Key(3), Block(3)).ok());
  EXPECT_EQ((*t)->blocks(), 3u);
  EXPECT_EQ((*t)->write_failure().duration, absl::ZeroDuration());
}

// A delete the disk fails leaves the block as it was: stored, readable and counted, so that the
// budget and the eviction order still see it. The error says why.
TEST(DiskTier, ADeleteTheDiskFailsKeepsTheBlockCounted) {
  FailingTier f("disk_tier_delete");
  auto t = DiskTier::Open(f.options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Put(Key(1), Block(1)).ok());
  const uint64_t used = (*t)->used_bytes();
  f.disk.fs->fault = testing::FailingFileSystem::Fault::kIoError;
  const absl::Status failed = (*t)->Delete(Key(1));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_TRUE((*t)->Contains(Key(1)));
  EXPECT_EQ((*t)->blocks(), 1u);
  EXPECT_EQ((*t)->used_bytes(), used);
  EXPECT_EQ(*(*t)->Get(Key(1)), Block(1));
}

// An eviction whose erase the disk fails keeps the block indexed: still counted against the budget,
// still readable, and the next to be evicted, where it was dropped from the index and left on disk
// uncounted. (Deletes fail here and puts do not: the fault hits small log records only.)
TEST(DiskTier, AnEvictionTheDiskFailsKeepsTheBlockCounted) {
  FailingTier f("disk_tier_evict");
  f.options.capacity_bytes = 5 * 10000;
  auto t = DiskTier::Open(f.options);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i)).ok());
  f.disk.fs->fault_below_bytes = 1000;
  f.disk.fs->fault = testing::FailingFileSystem::Fault::kIoError;
  ASSERT_TRUE((*t)->Put(Key(5), Block(5)).ok());
  EXPECT_TRUE((*t)->Contains(Key(0)));
  EXPECT_EQ((*t)->blocks(), 6u);
  EXPECT_EQ((*t)->used_bytes(), 6u * 10000);
  EXPECT_EQ((*t)->evictions(), 0u);
  EXPECT_EQ(*(*t)->Get(Key(0)), Block(0));
}

// Puts may stop coming while writes fail; the probe tells whether RocksDB takes writes again.
// After a full disk has room, it does, with no put; after a log write failed with EIO, it does not
// (RocksDB recovers from that only when reopened), and how long writes have failed keeps growing.
// A reopen then takes puts and serves what was stored before.
TEST(DiskTier, TheWriteProbeSeesRecoveryWithoutPutsAndAStuckDatabaseStaysFailing) {
  using Fault = testing::FailingFileSystem::Fault;
  FailingTier f("disk_tier_probe");
  const auto& fs = f.disk.fs;
  {
    auto t = DiskTier::Open(f.options);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->ProbeWrites().ok());  // nothing failing: nothing to probe
    ASSERT_TRUE((*t)->Put(Key(1), Block(1)).ok());

    fs->fault = Fault::kNoSpace;
    ASSERT_FALSE((*t)->Put(Key(2), Block(2)).ok());
    EXPECT_FALSE((*t)->ProbeWrites().ok());
    EXPECT_GT((*t)->write_failure().duration, absl::ZeroDuration());
    EXPECT_TRUE((*t)->write_failure().no_space);
    fs->fault = Fault::kNone;
    absl::Status probe;
    for (int i = 0; i < 600 && !(probe = (*t)->ProbeWrites()).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(probe.ok()) << "writes still fail 30 s after the disk has room: " << probe;
    EXPECT_EQ((*t)->write_failure().duration, absl::ZeroDuration());
    EXPECT_EQ((*t)->write_errors(), 1u);  // probes are not puts

    fs->fault = Fault::kIoError;
    ASSERT_FALSE((*t)->Put(Key(3), Block(3)).ok());
    fs->fault = Fault::kNone;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const absl::Duration before = (*t)->write_failure().duration;
    EXPECT_GE(before, absl::Milliseconds(300));
    for (int i = 0; i < 20; ++i) {
      EXPECT_FALSE((*t)->ProbeWrites().ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE((*t)->Put(Key(3), Block(3)).ok());
    EXPECT_GE((*t)->write_failure().duration, before + absl::Seconds(1));
    EXPECT_FALSE((*t)->write_failure().no_space);
    EXPECT_EQ(*(*t)->Get(Key(1)), Block(1));  // reads go on
  }
  auto t = DiskTier::Open(f.options);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Get(Key(1)), Block(1));
  EXPECT_TRUE((*t)->Put(Key(3), Block(3)).ok());
  EXPECT_EQ((*t)->write_failure().duration, absl::ZeroDuration());
}

// Bursts of puts of a few keys from two threads into a tier with room for three blocks, each put
// evicting another key's block; between bursts, every key the index lists must be readable. Before
// puts and evictions of a key were serialized, an eviction could erase a block that a put of the
// same key wrote after the eviction picked it, leaving the index naming a block that was gone.
TEST(DiskTier, ConcurrentPutsNeverLeaveAListedBlockUnreadable) {
  const std::string dir = vc::testing::TempDir("disk_tier_race");
  auto t = DiskTier::Open({dir, 35000, false});  // room for three 10 KB blocks
  ASSERT_TRUE(t.ok()) << t.status();
  DiskTier& tier = **t;
  int stale = 0;
  for (int round = 0; round < 300; ++round) {
    const auto burst = [&](uint32_t x) {
      for (int i = 0; i < 40; ++i) {
        x = x * 1664525u + 1013904223u;
        const int k = static_cast<int>((x >> 16) % 5);
        EXPECT_TRUE(tier.Put(Key(k), Block(k)).ok());
      }
    };
    std::thread other(burst, 2 * round + 1);
    burst(2 * round + 2);
    other.join();
    for (int j = 0; j < 5; ++j) stale += tier.Contains(Key(j)) && !tier.Get(Key(j)).ok();
  }
  EXPECT_EQ(stale, 0);
  EXPECT_LE(tier.used_bytes(), 35000u);
}

TEST(DiskTier, EvictsTheLeastRecentlyUsed) {
  const std::string dir = vc::testing::TempDir("disk_tier_lru");
  auto t = DiskTier::Open({dir, 35000, false});  // room for three 10 KB blocks
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i)).ok());
  (*t)->Touch(Key(0));   // now 1 is the least recently used
  (*t)->Touch(Key(42));  // absent: nothing
  ASSERT_TRUE((*t)->Put(Key(3), Block(3)).ok());
  EXPECT_TRUE((*t)->Contains(Key(0)));
  EXPECT_FALSE((*t)->Contains(Key(1)));
  EXPECT_TRUE((*t)->Contains(Key(2)));
  // A put again counts as a use too.
  ASSERT_TRUE((*t)->Put(Key(2), Block(2)).ok());
  ASSERT_TRUE((*t)->Put(Key(4), Block(4)).ok());
  EXPECT_FALSE((*t)->Contains(Key(0)));
  EXPECT_TRUE((*t)->Contains(Key(2)));
  EXPECT_TRUE((*t)->Contains(Key(3)));
  EXPECT_EQ((*t)->blocks(), 3u);
  EXPECT_EQ((*t)->evictions(), 2u);  // 1, then 0
}

// A block read from either tier is a use of its disk copy: a shared prefix read all the time
// outlives blocks written after it and never read again.
TEST(BlockStore, ReadsKeepBlocksOnDisk) {
  const std::string dir = vc::testing::TempDir("block_store_lru");
  const std::string block = vc::testing::RandomBlock(1, 7);
  StoreOptions o;
  o.ram.capacity_bytes = 2 * block.size();
  o.ram.min_slot_bytes = 64;
  o.disk.path = dir;
  o.disk.capacity_bytes = 3 * block.size();
  auto store = BlockStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  BlockStore& s = **store;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Put(Key(i), vc::testing::RandomBlock(i + 1, 7)).ok());
  // Key 0 is read (from disk: RAM keeps the last puts) and by lease; key 1 by Get.
  auto lease = s.Lease(Key(0));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(s.Release(lease->id).ok());
  ASSERT_TRUE(s.Get(Key(1), nullptr).ok());
  ASSERT_TRUE(s.Put(Key(3), vc::testing::RandomBlock(4, 7)).ok());  // evicts key 2 from disk
  // Not key 0, the oldest put, which only its lease keeps (Contains marks no use).
  EXPECT_FALSE(s.disk().Contains(Key(2)));
  EXPECT_TRUE(s.disk().Contains(Key(0)));
  ASSERT_TRUE(s.Put(Key(4), vc::testing::RandomBlock(5, 7)).ok());  // and then key 0
  bool from_ram = true;
  EXPECT_TRUE(absl::IsNotFound(s.Get(Key(2), &from_ram).status()));
  EXPECT_TRUE(s.Get(Key(1), &from_ram).ok());
  // Stats count the puts and what each tier evicted for them.
  const StoreStats st = s.Stats();
  EXPECT_EQ(st.puts, 5u);
  EXPECT_EQ(st.disk_evictions, 2u);
  EXPECT_GE(st.ram_evictions, 3u);  // RAM holds two: each put past the second made room
}

// A lookup that counts as a use (as a worker's does for a block it reads from another replica)
// keeps a block in both tiers as a read would; a plain lookup changes nothing.
TEST(BlockStore, LookupsThatCountAsUsesKeepBlocks) {
  for (const bool use : {true, false}) {
    const std::string dir = vc::testing::TempDir(use ? "block_store_lookup_use" : "block_store_lookup_plain");
    const std::string block = vc::testing::RandomBlock(1, 7);
    StoreOptions o;
    o.ram.min_slot_bytes = (block.size() + 63) / 64 * 64;  // a slot a block: two in RAM
    o.ram.capacity_bytes = 2 * o.ram.min_slot_bytes;
    o.ram.high_watermark = o.ram.low_watermark = 1.0;
    o.disk.path = dir;
    o.disk.capacity_bytes = 3 * block.size();
    auto store = BlockStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    BlockStore& s = **store;
    ASSERT_TRUE(s.Put(Key(0), vc::testing::RandomBlock(1, 7)).ok());
    ASSERT_TRUE(s.Put(Key(1), vc::testing::RandomBlock(2, 7)).ok());
    const BlockKey zero[] = {Key(0)};
    EXPECT_EQ(s.Lookup(zero, use), std::make_pair(1u, 1u));
    ASSERT_TRUE(s.Put(Key(2), vc::testing::RandomBlock(3, 7)).ok());  // RAM evicts one of keys 0 and 1
    EXPECT_EQ(s.ram().Contains(Key(0)), use) << use;
    EXPECT_EQ(s.ram().Contains(Key(1)), !use) << use;
    // The disk order: out of RAM, key 0 is looked up on disk, then a put evicts one of 0 and 1.
    (void)s.ram().Delete(Key(0));
    EXPECT_EQ(s.Lookup(zero, use), std::make_pair(1u, 0u));
    ASSERT_TRUE(s.Put(Key(3), vc::testing::RandomBlock(4, 7)).ok());
    bool from_ram = true;
    EXPECT_EQ(s.Get(Key(0), &from_ram).ok(), use) << use;
    EXPECT_EQ(s.Get(Key(1), &from_ram).ok(), !use) << use;
  }
}

// Writes blocks [first, first + n) of 10 KB and reopens once, so that they sit in a blob file of
// their own; returns that file's path.
std::string BlocksInABlobFile(const std::string& dir, int first, int n) {
  std::set<std::string> before;
  for (const auto& e : std::filesystem::directory_iterator(dir)) before.insert(e.path().string());
  {
    auto t = DiskTier::Open({dir, 1 << 20, false});
    EXPECT_TRUE(t.ok()) << t.status();
    for (int i = first; i < first + n; ++i) EXPECT_TRUE((*t)->Put(Key(i), Block(i)).ok());
  }
  { EXPECT_TRUE(DiskTier::Open({dir, 1 << 20, false}).ok()); }  // recovery flushes the log
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".blob" && !before.contains(e.path().string())) return e.path().string();
  }
  ADD_FAILURE() << "no new blob file in " << dir;
  return "";
}

// The blocks [first, first + n) read back whole; returns how many reported their loss instead.
int ReadBack(DiskTier& t, int first, int n) {
  int lost = 0;
  for (int i = first; i < first + n; ++i) {
    auto got = t.Get(Key(i));
    if (got.ok()) {
      EXPECT_EQ(*got, Block(i));
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
      ++lost;
    }
  }
  return lost;
}

// A flipped byte in a blob file costs the block it lands in, not the store: it opens, serves the
// other blocks, and reports the damaged one as lost (the store then drops it).
TEST(DiskTier, FlippedByteInABlobFileCostsOneBlock) {
  const std::string dir = vc::testing::TempDir("disk_tier_flip");
  const std::string blob = BlocksInABlobFile(dir, 0, 20);
  ASSERT_FALSE(blob.empty());
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(blob) / 2));
    f.put('\x5a');
  }
  auto t = DiskTier::Open({dir, 1 << 20, false});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->blocks(), 20u);
  EXPECT_EQ(ReadBack(**t, 0, 20), 1);
}

// A truncated blob file costs the blocks in it: the store opens with every block indexed (their
// sizes are kept apart from the payloads), serves those of the other file, and reports the lost.
TEST(DiskTier, TruncatedBlobFileCostsItsBlocksOnly) {
  const std::string dir = vc::testing::TempDir("disk_tier_truncated");
  ASSERT_FALSE(BlocksInABlobFile(dir, 0, 10).empty());
  const std::string second = BlocksInABlobFile(dir, 10, 10);
  ASSERT_FALSE(second.empty());
  std::filesystem::resize_file(second, std::filesystem::file_size(second) / 2);
  auto t = DiskTier::Open({dir, 1 << 20, false});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->blocks(), 20u);
  EXPECT_EQ(ReadBack(**t, 0, 10), 0);
  EXPECT_EQ(ReadBack(**t, 10, 10), 10);
}

// Writes blocks [0, n) as a database from before block sizes were kept holds them (the default
// column family only), then reopens it once so that they sit in a blob file.
void WriteDatabaseWithoutSizes(const std::string& dir, int n) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.enable_blob_files = true;
  o.min_blob_size = 4096;
  for (int round = 0; round < 2; ++round) {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    for (int i = 0; i < n && round == 0; ++i) {
      const BlockKey key = Key(i);
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), rocksdb::Slice(reinterpret_cast<const char*>(key.bytes.data()), 32),
                          Block(i)).ok());
    }
  }
}

// Such a database is indexed from its payloads once, and from its sizes after that.
TEST(DiskTier, DatabaseWithoutSizesIsIndexedFromItsBlocks) {
  const std::string dir = vc::testing::TempDir("disk_tier_old");
  WriteDatabaseWithoutSizes(dir, 5);
  for (int round = 0; round < 2; ++round) {
    auto t = DiskTier::Open({dir, 1 << 20, false});
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->blocks(), 5u);
    EXPECT_EQ((*t)->used_bytes(), 5u * Block(0).size());
    EXPECT_EQ(ReadBack(**t, 0, 5), 0);
  }
  // Indexed from the sizes now: with its blob file lost it still opens (from the payloads it
  // would be refused, as below).
  int blobs = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".blob") std::filesystem::resize_file(e.path(), 100), ++blobs;
  }
  ASSERT_GT(blobs, 0);
  auto t = DiskTier::Open({dir, 1 << 20, false});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->blocks(), 5u);
}

// Such a database with a blob file it cannot read cannot be indexed (what the file hides is spread
// over every key): it is dropped, and the tier opens empty and takes puts.
TEST(DiskTier, DatabaseWithoutSizesAndALostBlobFileIsDropped) {
  const std::string dir = vc::testing::TempDir("disk_tier_old_lost");
  WriteDatabaseWithoutSizes(dir, 5);
  int blobs = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".blob") std::filesystem::resize_file(e.path(), 100), ++blobs;
  }
  ASSERT_GT(blobs, 0);
  auto t = DiskTier::Open({dir, 1 << 20, false});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->blocks(), 0u);
  EXPECT_EQ((*t)->resets(), 1u);
  EXPECT_EQ((*t)->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*t)->Put(Key(1), Block(1)).ok());
  EXPECT_EQ(*(*t)->Get(Key(1)), Block(1));
}

// Damaged blocks of the index of sizes are salvaged around: the tier opens, serves every block the
// index still names and deletes the ones the damage hid, between the last entry a scan from the
// front read and the first one a scan from the back read. The mark that the sizes are complete
// survives, even where it lay between: the next open reads the index again, not every payload
// (which a payload RocksDB cannot read would stop for good).
TEST(DiskTier, ASalvagedIndexKeepsItsMarkOfCompleteSizes) {
  const std::string dir = vc::testing::TempDir("disk_tier_salvage");
  constexpr int kBlocks = 600;
  {
    auto t = DiskTier::Open({dir, 64 << 20, false});
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < kBlocks; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i, 100)).ok());
  }
  { ASSERT_TRUE(DiskTier::Open({dir, 64 << 20, false}).ok()); }  // recovery writes the tables
  // The table of the sizes family holds the mark (the key's suffix, past a shared first byte). A
  // byte is flipped in a table block before the mark's and in one after it (blocks of about 4 KiB),
  // so the two scans stop on either side of it.
  bool damaged = false;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".sst") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find("izes-complete");
    if (at == std::string::npos) continue;
    ASSERT_GT(at, 6000u);
    ASSERT_LT(at + 6000, bytes.size()) << "the mark is too near the table's end";
    for (const size_t flip : {at - 6000, at + 6000}) {
      f.seekp(static_cast<std::streamoff>(flip));
      f.put(static_cast<char>(bytes[flip] ^ 0x5a));
    }
    damaged = true;
  }
  ASSERT_TRUE(damaged) << "no table of sizes in " << dir;
  size_t kept = 0;
  {
    auto t = DiskTier::Open({dir, 64 << 20, false});
    ASSERT_TRUE(t.ok()) << t.status();
    kept = (*t)->blocks();
    EXPECT_LT(kept, static_cast<size_t>(kBlocks));
    EXPECT_GT(kept, 0u);
    for (int i = 0; i < kBlocks; ++i) {
      if ((*t)->Contains(Key(i))) {
        EXPECT_EQ(*(*t)->Get(Key(i)), Block(i, 100)) << i;
      }
    }
  }
  {
    RawDatabase raw(dir, /*read_only=*/true);
    ASSERT_TRUE(raw.ok());
    std::string mark;
    EXPECT_TRUE(raw.db->Get(rocksdb::ReadOptions(), raw.sizes(), "sizes-complete", &mark).ok());
  }
  auto t = DiskTier::Open({dir, 64 << 20, false});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->blocks(), kept);
}

// A size entry that is not 8 bytes (a damaged index) takes its block with it when the tier opens:
// left unindexed, the block would be served but never counted or evicted.
TEST(DiskTier, ADamagedSizeEntryDropsItsBlock) {
  const std::string dir = vc::testing::TempDir("disk_tier_damaged_size");
  {
    auto t = DiskTier::Open({dir, 1 << 20, false});
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i)).ok());
  }
  {
    RawDatabase raw(dir, /*read_only=*/false);
    ASSERT_TRUE(raw.ok());
    const BlockKey key = Key(1);
    EXPECT_TRUE(raw.db->Put(rocksdb::WriteOptions(), raw.sizes(),
                            rocksdb::Slice(reinterpret_cast<const char*>(key.bytes.data()), 32), "abc")
                    .ok());
  }
  auto t = DiskTier::Open({dir, 1 << 20, false});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->blocks(), 2u);
  EXPECT_EQ((*t)->used_bytes(), 2u * Block(0).size());
  EXPECT_FALSE((*t)->Contains(Key(1)));
  EXPECT_EQ((*t)->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*(*t)->Get(Key(0)), Block(0));
  EXPECT_EQ(*(*t)->Get(Key(2)), Block(2));
}

}  // namespace
}  // namespace vc::cachestore
