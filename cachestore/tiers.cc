#include "cachestore/tiers.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cachestore/block_format.h"
#include "common/files.h"

namespace vc::cachestore {
namespace {

// RocksDB's info log: the LOG file in the data directory, rolled at `roll_bytes` with four old ones
// kept (LOG.old.1 the newest), as RocksDB's own would be, but written with plain stdio that drops a
// line it cannot write. RocksDB's own writer asserts on a write after a failed one: on a full disk,
// Debian's RocksDB (built with assertions) would abort the store at open, at shutdown, or seconds
// after puts began to fail. Without a LOG (it cannot be created), warnings and worse go to stderr.
class InfoLog final : public rocksdb::Logger {
 public:
  static constexpr int kOld = 4;

  InfoLog(std::string path, long roll_bytes)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), path_(std::move(path)), roll_bytes_(roll_bytes) {
    // RocksDB's own old logs (LOG.old.<microseconds>), from before this one was: at most four.
    std::error_code ec;
    const std::filesystem::path p(path_);
    const std::string old = p.filename().string() + ".old.";
    for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(old, 0) == 0 && name.size() > old.size() + 1) std::filesystem::remove(e.path(), ec);
    }
    Roll();
  }
  ~InfoLog() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  void Logv(const char* format, va_list ap) override {
    char line[2048];
    const int n = std::vsnprintf(line, sizeof(line), format, ap);
    size_t end = std::min(sizeof(line) - 1, static_cast<size_t>(std::max(n, 0)));
    while (end > 0 && line[end - 1] == '\n') line[--end] = '\0';
    std::lock_guard<std::mutex> l(mu_);
    if (file_ == nullptr) {
      std::fprintf(stderr, "rocksdb: %s\n", line);
      return;
    }
    const absl::Time now = absl::Now();
    std::fprintf(file_, "%s %s\n", absl::FormatTime("%Y/%m/%d-%H:%M:%E6S", now, absl::UTCTimeZone()).c_str(), line);
    std::fflush(file_);  // a failed write or flush loses this line only
    if (std::ftell(file_) >= roll_bytes_) Roll();
  }

  // Without a LOG, stderr gets warnings and worse only.
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < rocksdb::InfoLogLevel::WARN_LEVEL) {
      std::lock_guard<std::mutex> l(mu_);
      if (file_ == nullptr) return;
    }
    rocksdb::Logger::Logv(level, format, ap);
  }

 private:
  // Moves LOG to LOG.old.1 (and each old one up, the oldest out) and starts a new LOG.
  void Roll() {
    if (file_ != nullptr) std::fclose(file_);
    std::error_code ec;
    std::filesystem::remove(absl::StrCat(path_, ".old.", kOld), ec);
    for (int i = kOld - 1; i >= 1; --i) {
      std::filesystem::rename(absl::StrCat(path_, ".old.", i), absl::StrCat(path_, ".old.", i + 1), ec);
    }
    std::filesystem::rename(path_, path_ + ".old.1", ec);
    file_ = std::fopen(path_.c_str(), "ae");
  }

  const std::string path_;
  const long roll_bytes_;
  std::mutex mu_;
  std::FILE* file_ = nullptr;
};

rocksdb::Slice KeySlice(const BlockKey& k) {
  return rocksdb::Slice(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(what, ": not found"));
  // A missing blob file is as lost as a corrupt one.
  if (s.IsCorruption() || s.IsPathNotFound()) return absl::DataLossError(absl::StrCat(what, ": ", s.ToString()));
  return absl::UnavailableError(absl::StrCat(what, ": ", s.ToString()));
}

// Where a tier's lease ids start: a random point in [1, 2^62], so that the id of a lease from an
// earlier run of the store (released late by a client, after a restart) names no lease of this
// run, whose owner would lose it. 2^62 leases later the ids still have not wrapped.
uint64_t FirstLeaseId() {
  std::random_device random;
  const uint64_t r = (uint64_t{random()} << 32) ^ random();
  return (r >> 2) + 1;
}

}  // namespace

// ------------------------------------------------------------------------------------------ RAM

RamTier::RamTier(const RamTierOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : SteadyClock()),
      owned_region_(options.region != nullptr ? nullptr : new char[options.capacity_bytes]),
      region_(options.region != nullptr ? options.region : owned_region_.get()),
      unit_(std::max<uint64_t>(1, options.min_slot_bytes)),
      hot_cap_(static_cast<uint64_t>(
          (options.hot_fraction > 0 ? std::min(options.hot_fraction, 1.0) : 0.0) *
          static_cast<double>(options.capacity_bytes))) {
  // The region as aligned power-of-two pieces, largest first (the binary digits of its size in
  // slot units), each free as a whole.
  absl::MutexLock l(&mu_);
  next_lease_ = FirstLeaseId();
  uint64_t offset = 0;
  for (int bit = 63; bit >= 0; --bit) {
    const uint64_t units = uint64_t{1} << bit;
    if ((options_.capacity_bytes / unit_) & units) {
      const uint64_t bytes = units * unit_;
      if (largest_slot_ == 0) largest_slot_ = bytes;
      free_slots_[bytes].insert(offset);
      offset += bytes;
    }
  }
}

RamTier::~RamTier() = default;

uint64_t RamSlotBytes(uint64_t unit, uint64_t size) {
  uint64_t slot = std::max<uint64_t>(1, unit);
  while (slot < size && slot <= UINT64_MAX / 2) slot *= 2;
  return slot;
}

uint64_t RamTier::SlotFor(uint64_t size) const {
  return RamSlotBytes(unit_, size);  // past the largest slot: refused by the caller
}

uint64_t RamTier::Allocate(uint64_t slot) {
  auto it = free_slots_.lower_bound(slot);
  if (it == free_slots_.end()) return UINT64_MAX;
  uint64_t size = it->first;
  const uint64_t offset = *it->second.begin();
  it->second.erase(it->second.begin());
  if (it->second.empty()) free_slots_.erase(it);
  while (size > slot) {  // keep the upper halves
    size /= 2;
    free_slots_[size].insert(offset + size);
  }
  return offset;
}

void RamTier::Free(Entry& e) {
  used_ -= e.slot;
  block_bytes_ -= e.size;
  uint64_t offset = e.offset, size = e.slot;
  while (size < largest_slot_) {
    const uint64_t buddy = (offset / unit_ ^ size / unit_) * unit_;
    auto it = free_slots_.find(size);
    if (it == free_slots_.end() || it->second.erase(buddy) == 0) break;
    if (it->second.empty()) free_slots_.erase(it);
    offset = std::min(offset, buddy);
    size *= 2;
  }
  free_slots_[size].insert(offset);
}

void RamTier::Unpin(const BlockKey& key) {
  auto e = entries_.find(key);
  if (e == entries_.end()) return;
  if (--e->second.pins == 0 && e->second.dead) {
    Free(e->second);
    entries_.erase(e);
  }
}

void RamTier::Unlink(Entry& e) {
  if (e.lru == cold_) ++cold_;
  if (e.hot) hot_bytes_ -= e.slot;
  e.hot = false;
  lru_.erase(e.lru);
}

void RamTier::Touch(Entry& e) {
  if (!e.hot) {
    if (e.lru == cold_) ++cold_;
    e.hot = true;
    hot_bytes_ += e.slot;
  }
  lru_.splice(lru_.begin(), lru_, e.lru);
  // Past its share, the hot segment's least recent blocks become the cold segment's most recent.
  while (hot_bytes_ > hot_cap_ && cold_ != lru_.begin()) {
    cold_ = std::prev(cold_);
    Entry& h = entries_[*cold_];
    h.hot = false;
    hot_bytes_ -= h.slot;
  }
}

void RamTier::ExpireLeases(absl::Duration now) {
  while (!leases_.empty() && leases_.begin()->second.deadline <= now) EndLease(leases_.begin());
}

void RamTier::EndLease(std::map<uint64_t, LeaseRecord>::iterator it) {
  auto owned = leased_bytes_.find(it->second.owner);
  owned->second -= it->second.slot;
  if (owned->second == 0) leased_bytes_.erase(owned);
  Unpin(it->second.key);
  leases_.erase(it);
}

absl::Status RamTier::Put(const BlockKey& key, absl::string_view block,
                          std::vector<std::pair<BlockKey, std::string>>* evicted, bool* stored) {
  if (stored != nullptr) *stored = false;
  const uint64_t slot = SlotFor(block.size());
  uint64_t offset;
  {
    absl::MutexLock l(&mu_);
    ExpireLeases(clock_->Now());  // before choosing victims: an expired lease pins nothing
    // The key's entry first, whatever the new block's size: a different block under a key being
    // read is refused even where RAM could not take it (the caller's disk tier would, and the
    // tiers would disagree).
    if (auto it = entries_.find(key); it != entries_.end()) {
      Entry& e = it->second;
      // Deleted while being read: the key's one entry is taken until its readers finish, so this
      // copy is not kept here (the caller's disk tier holds it).
      if (e.dead) return absl::OkStatus();
      if (e.pins > 0) {
        // Being read: it stays. Keys name their content, so this is normally the same block; a
        // different one is refused, so the tiers do not come to disagree. Another Put still
        // copying in cannot be compared yet.
        if (!e.ready) return absl::UnavailableError("another put of this key is in progress; retry");
        ++e.pins;
        const uint64_t at = e.offset, size = e.size;
        mu_.Unlock();
        const bool same = size == block.size() && std::memcmp(region_ + at, block.data(), size) == 0;
        mu_.Lock();
        Unpin(key);
        if (same) return absl::OkStatus();
        return absl::FailedPreconditionError("a different block under this key is being read; retry later");
      }
      Free(e);
      Unlink(e);
      entries_.erase(it);
    }
    if (slot > largest_slot_) {
      return absl::ResourceExhaustedError(absl::StrCat("block of ", block.size(), " bytes exceeds the RAM tier"));
    }
    // Evict least-recently-used unpinned blocks above the high watermark (down to the low one),
    // and whenever no slot of this size is free.
    const uint64_t high = static_cast<uint64_t>(options_.high_watermark * options_.capacity_bytes);
    const uint64_t low = static_cast<uint64_t>(options_.low_watermark * options_.capacity_bytes);
    bool evicting = used_ + slot > high;
    offset = evicting ? UINT64_MAX : Allocate(slot);
    auto victim = lru_.end();
    while (offset == UINT64_MAX) {
      if (victim == lru_.begin()) {
        offset = Allocate(slot);
        if (offset == UINT64_MAX) {
          return absl::ResourceExhaustedError("RAM tier full of pinned blocks");
        }
        break;
      }
      --victim;
      Entry& e = entries_[*victim];
      if (e.pins > 0) continue;
      if (evicted != nullptr) evicted->emplace_back(*victim, std::string(region_ + e.offset, e.size));
      evictions_++;
      Free(e);
      const BlockKey k = *victim;
      ++victim;
      Unlink(e);
      entries_.erase(k);
      if (evicting && used_ + slot > low) continue;
      evicting = false;
      offset = Allocate(slot);
    }
    Entry e;
    e.offset = offset;
    e.slot = slot;
    e.size = block.size();
    e.pins = 1;  // held while copying in, so it cannot be evicted under us
    e.lru = lru_.insert(cold_, key);  // the cold segment's most recent
    cold_ = e.lru;
    used_ += slot;
    block_bytes_ += block.size();
    entries_[key] = e;
  }
  std::memcpy(region_ + offset, block.data(), block.size());
  absl::MutexLock l(&mu_);
  if (auto it = entries_.find(key); it != entries_.end()) it->second.ready = true;
  Unpin(key);  // frees the slot if the block was deleted while being copied in
  if (stored != nullptr) *stored = true;
  return absl::OkStatus();
}

absl::StatusOr<std::string> RamTier::Get(const BlockKey& key) {
  // Pinned without a lease, which could expire during a slow copy.
  uint64_t offset, size;
  {
    absl::MutexLock l(&mu_);
    Entry* found = Readable(key);
    if (found == nullptr) return absl::NotFoundError("no such block");
    Entry& e = *found;
    ++e.pins;
    Touch(e);
    offset = e.offset;
    size = e.size;
  }
  std::string out(region_ + offset, size);
  absl::MutexLock l(&mu_);
  Unpin(key);
  return out;
}

const RamTier::Entry* RamTier::Readable(const BlockKey& key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.ready && !it->second.dead ? &it->second : nullptr;
}

bool RamTier::Use(const BlockKey& key) {
  absl::MutexLock l(&mu_);
  Entry* e = Readable(key);
  if (e != nullptr) Touch(*e);
  return e != nullptr;
}

bool RamTier::Contains(const BlockKey& key) const {
  absl::MutexLock l(&mu_);
  return Readable(key) != nullptr;
}

absl::Status RamTier::Delete(const BlockKey& key) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.dead) return absl::NotFoundError("no such block");
  Unlink(it->second);
  if (it->second.pins > 0) {
    it->second.dead = true;  // readers finish; freed at the last release
    it->second.lru = lru_.end();
    return absl::OkStatus();
  }
  Free(it->second);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<BlockLease> RamTier::Lease(const BlockKey& key, absl::string_view owner) {
  absl::MutexLock l(&mu_);
  const absl::Duration now = clock_->Now();
  ExpireLeases(now);
  Entry* found = Readable(key);
  if (found == nullptr) return absl::NotFoundError("no such block");
  Entry& e = *found;
  if (!FitsCap(owner, e.slot)) {
    return absl::ResourceExhaustedError(absl::StrCat("leases of this owner pin ", LeasedBy(owner), " bytes of RAM; ",
                                                     e.slot, " more would pass the cap of ",
                                                     options_.max_leased_bytes_per_owner, " per owner"));
  }
  ++e.pins;
  Touch(e);
  leased_bytes_[owner] += e.slot;
  const uint64_t id = next_lease_++;
  leases_.emplace_hint(leases_.end(), id,
                       LeaseRecord{key, now + absl::Milliseconds(options_.lease_ttl_ms), std::string(owner), e.slot});
  return BlockLease{id, e.offset, e.size};
}

uint64_t RamTier::LeasedBy(absl::string_view owner) const {
  auto owned = leased_bytes_.find(owner);
  return owned == leased_bytes_.end() ? 0 : owned->second;
}

bool RamTier::FitsCap(absl::string_view owner, uint64_t slot) const {
  const uint64_t cap = options_.max_leased_bytes_per_owner;
  return cap == 0 || LeasedBy(owner) + slot <= cap;
}

bool RamTier::LeaseFits(absl::string_view owner, uint64_t size) const {
  absl::MutexLock l(&mu_);
  return FitsCap(owner, SlotFor(size));
}

absl::Status RamTier::Release(uint64_t lease_id, absl::string_view owner) {
  absl::MutexLock l(&mu_);
  ExpireLeases(clock_->Now());  // a lease past its deadline is gone, swept or not
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.owner != owner) {
    return absl::NotFoundError("no such lease (released, expired, or another owner's)");
  }
  EndLease(it);
  return absl::OkStatus();
}

uint64_t RamTier::used_bytes() const {
  absl::MutexLock l(&mu_);
  return used_;
}

uint64_t RamTier::block_bytes() const {
  absl::MutexLock l(&mu_);
  return block_bytes_;
}

size_t RamTier::blocks() const {
  absl::MutexLock l(&mu_);
  return lru_.size();
}

uint64_t RamTier::evictions() const {
  absl::MutexLock l(&mu_);
  return evictions_;
}

// ----------------------------------------------------------------------------------------- disk

namespace {

constexpr char kSizesFamily[] = "sizes";
// In the sizes family once every block's size is there (written with the last of them): a
// database without it is indexed from its payloads first. Not 32 bytes, so never a block key.
constexpr char kSizesComplete[] = "sizes-complete";
// Deleted in the sizes family to see whether writes succeed again (DiskTier::ProbeWrites). Not 32
// bytes either, and only ever a deletion.
constexpr char kWriteProbe[] = "write-probe";

// A block's size in the sizes family: 8 bytes, little-endian.
std::string SizeValue(uint64_t size) {
  std::string v;
  PutLittleEndian(&v, size, 8);
  return v;
}

uint64_t ParseSizeValue(rocksdb::Slice v) { return GetLittleEndian(absl::string_view(v.data(), v.size()), 0, 8); }

}  // namespace

// Visits the sizes family in key order with `visit` (false: stop). An entry RocksDB cannot read
// (a damaged SST) stops a scan; then a second scan from the other end visits what lies past it,
// and the keys between the two, which neither could reach, are deleted from both families in one
// write, so that nothing stays on disk that the index does not count (the blocks there are lost;
// this is a cache); Open's mark that the sizes are complete, which may lie between, is written
// again in that write. Returns the first scan's error, or the deletion's if that failed too.
absl::Status DiskTier::ScanSalvaging(const rocksdb::ReadOptions& options,
                                     const std::function<bool(const rocksdb::Iterator&)>& visit) {
  rocksdb::ColumnFamilyHandle* cf = sizes_cf_;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options, cf));
  std::string first_gap;  // after the last key read from the front
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    first_gap = it->key().ToString() + std::string(1, '\0');
    if (!visit(*it)) return absl::OkStatus();
  }
  if (it->status().ok()) return absl::OkStatus();
  const absl::Status error = FromRocks(it->status(), "scan");
  it.reset(db_->NewIterator(options, cf));
  std::string gap_end(33, '\xff');  // past every 32-byte key
  for (it->SeekToLast(); it->Valid(); it->Prev()) {
    if (!visit(*it)) break;
    gap_end = it->key().ToString();
  }
  rocksdb::WriteBatch gap;
  for (rocksdb::ColumnFamilyHandle* h : {blocks_, sizes_cf_}) (void)gap.DeleteRange(h, first_gap, gap_end);
  // The mark that the sizes are complete may lie in the gap; they still are.
  (void)gap.Put(sizes_cf_, kSizesComplete, "");
  rocksdb::WriteOptions sync;
  sync.sync = true;
  if (rocksdb::Status d = db_->Write(sync, &gap); !d.ok()) {
    return absl::UnavailableError(absl::StrCat(error.message(), "; deleting the keys it hides: ", d.ToString()));
  }
  return error;
}

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// RocksDB's memtable and blob file sizes under a budget: what was asked, capped so that the logs
// and files in flight of a small budget fit in it.
uint64_t MemtableBytes(const DiskTierOptions& o) {
  return std::min(o.memtable_bytes, std::max<uint64_t>(256 << 10, o.capacity_bytes / 32));
}
uint64_t BlobFileBytes(const DiskTierOptions& o) {
  return std::min(o.blob_file_bytes, std::max<uint64_t>(kMiB, o.capacity_bytes / 32));
}
long InfoLogRollBytes(const DiskTierOptions& o) {
  return std::clamp<long>(static_cast<long>(o.capacity_bytes / 256), 64 << 10, 16 << 20);
}
constexpr uint64_t kManifestPreallocation = 64 << 10;

// The files' budget, at least what an empty database's own files take.
uint64_t FilesBudgetOf(const DiskTierOptions& o) { return std::max(o.capacity_bytes, 8 * kMiB); }

// The blocks' share of the budget: what is left beside RocksDB's write-ahead logs (two memtables,
// and one more for the log being written and its preallocation), its info logs, a blob file being
// written and one being rewritten by garbage collection, and a mebibyte for the manifest, SSTs and
// options files; at least half the budget, and no more than the budget.
uint64_t BlockBudgetOf(const DiskTierOptions& o) {
  const uint64_t files = 4 * MemtableBytes(o) + (InfoLog::kOld + 1) * static_cast<uint64_t>(InfoLogRollBytes(o)) +
                         2 * BlobFileBytes(o) + kMiB;
  const uint64_t budget = FilesBudgetOf(o);
  return std::min(o.capacity_bytes, files < budget / 2 ? budget - files : budget / 2);
}

// An error of OpenDatabase's writes: kDataLoss when RocksDB met a corrupt file (Open then drops the
// database), else kUnavailable.
absl::Status OpenWriteError(const rocksdb::Status& s, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  return s.IsCorruption() ? absl::DataLossError(message) : absl::UnavailableError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  std::unique_ptr<DiskTier> t(new DiskTier());
  t->options_ = options;
  // (RocksDB opens no logger of its own when given one; the directory must exist for this one.)
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  // A budget the filesystem could never hold would only show as failed puts once it fills: refused
  // before anything is written there.
  struct statvfs fs;
  if (!options.allow_past_filesystem && statvfs(options.path.c_str(), &fs) == 0) {
    const uint64_t size = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    if (options.capacity_bytes > size) {
      return absl::InvalidArgumentError(absl::StrCat("a disk tier of ", options.capacity_bytes,
                                                     " bytes exceeds the filesystem at ", options.path, " (", size,
                                                     " bytes)"));
    }
    // Room kept free that the filesystem cannot give would evict every block put.
    if (options.reserve_bytes > 0 && options.reserve_bytes >= size - options.capacity_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a disk tier of ", options.capacity_bytes, " bytes keeping ", options.reserve_bytes,
          " bytes free needs more than the filesystem at ", options.path, " (", size, " bytes)"));
    }
  }
  absl::Status opened = t->OpenDatabase();
  if (absl::IsDataLoss(opened)) opened = t->ResetDatabase(opened.message());
  if (!opened.ok()) return opened;
  if (options.maintain_every_ms > 0) {
    t->maintainer_ = std::thread([p = t.get()] {
      for (;;) {
        {
          absl::MutexLock l(&p->mu_);
          p->mu_.AwaitWithTimeout(absl::Condition(&p->wake_), absl::Milliseconds(p->options_.maintain_every_ms));
          p->wake_ = false;
        }
        if (p->stop_.HasBeenNotified()) return;
        p->Maintain();
      }
    });
  }
  return t;
}

absl::Status DiskTier::OpenDatabase() {
  // Two column families: the blocks (payloads in blob files, keys and offsets in SSTs), and each
  // block's size (8 bytes, inline in SSTs) written with it in one batch, so that Open rebuilds the
  // index without reading a payload. A damaged blob file then costs the blocks in it (each found
  // and dropped when it is read) and not the store.
  // (A database opened here once cannot be opened by a build without the sizes family.)
  const uint64_t memtable = MemtableBytes(options_);
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  // The small sizes family would hold back the deletion of every log file until it flushes; logs
  // past two memtables make it flush.
  db_options.max_total_wal_size = 2 * memtable;
  db_options.max_manifest_file_size = std::max<uint64_t>(kMiB, options_.capacity_bytes / 256);
  db_options.manifest_preallocation_size = kManifestPreallocation;
  db_options.info_log = std::make_shared<InfoLog>(options_.path + "/LOG", InfoLogRollBytes(options_));
  if (options_.env != nullptr) db_options.env = options_.env;
  rocksdb::ColumnFamilyOptions blocks;
  blocks.enable_blob_files = true;
  blocks.min_blob_size = 4096;
  blocks.enable_blob_garbage_collection = true;
  blocks.blob_file_size = BlobFileBytes(options_);
  blocks.write_buffer_size = memtable;
  // Both families' memtables the same size: RocksDB keeps the largest free on the disk before it
  // resumes writes after a full disk (64 MiB by default, more than a small budget's filesystem).
  rocksdb::ColumnFamilyOptions sizes;
  sizes.write_buffer_size = memtable;
  blocks.disable_auto_compactions = sizes.disable_auto_compactions = pause_compactions_;
  const std::vector<rocksdb::ColumnFamilyDescriptor> families = {{rocksdb::kDefaultColumnFamilyName, blocks},
                                                                 {kSizesFamily, sizes}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options_.path, families, &handles, &db);
  if (s.IsCorruption()) return absl::DataLossError(absl::StrCat("RocksDB at ", options_.path, ": ", s.ToString()));
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("open RocksDB at ", options_.path, ": ", s.ToString()));
  db_.reset(db);
  blocks_ = handles[0];
  sizes_cf_ = handles[1];
  {
    absl::MutexLock l(&mu_);
    sizes_.clear();
    order_.clear();
    used_ = 0;
  }
  rocksdb::ReadOptions scan;
  scan.fill_cache = false;
  std::vector<Victim> victims;
  {
    absl::MutexLock l(&mu_);
    auto index = [&](const BlockKey& k, uint64_t size) {
      if (sizes_.contains(k)) return false;  // met the other scan
      Index(k, size);
      return true;
    };
    std::string complete;
    const bool had_sizes = db_->Get(rocksdb::ReadOptions(), sizes_cf_, kSizesComplete, &complete).ok();
    absl::Status scanned;
    if (had_sizes) {
      std::vector<std::string> damaged;  // keys whose size entry is not 8 bytes
      scanned = ScanSalvaging(scan, [&](const rocksdb::Iterator& it) {
        if (it.key().size() != 32) return true;
        if (it.value().size() != 8) {
          damaged.push_back(it.key().ToString());
          return true;
        }
        BlockKey k;
        std::memcpy(k.bytes.data(), it.key().data(), 32);
        return index(k, ParseSizeValue(it.value()));
      });
      // A block whose size entry is damaged goes with it: left unindexed, it would be served but
      // never counted or evicted.
      if (!damaged.empty()) {
        rocksdb::WriteBatch drop;
        for (const std::string& k : damaged) {
          (void)drop.Delete(blocks_, k);
          (void)drop.Delete(sizes_cf_, k);
        }
        rocksdb::WriteOptions sync;
        sync.sync = true;
        if (rocksdb::Status w = db_->Write(sync, &drop); !w.ok()) {
          return OpenWriteError(w, absl::StrCat("RocksDB at ", options_.path, ": deleting blocks with damaged sizes"));
        }
        std::fprintf(stderr, "RocksDB at %s: %zu blocks had a damaged size entry and were deleted\n",
                     options_.path.c_str(), damaged.size());
      }
    } else {
      // A database from before the sizes were kept (or a new one, or one whose first indexing was
      // cut short): sizes from the payloads, all in one synced write with the mark that they are
      // complete. Only sizes are needed, so RocksDB's value checksums are skipped (each block's own
      // are checked when it is read). A payload RocksDB cannot read at all stops the indexing: keys
      // are hashes, so what it hides is spread over every key, and Open drops the database.
      scan.verify_checksums = false;
      rocksdb::WriteBatch batch;
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan, blocks_));
      for (it->SeekToFirst(); it->Valid(); it->Next()) {
        if (it->key().size() != 32) continue;
        BlockKey k;
        std::memcpy(k.bytes.data(), it->key().data(), 32);
        index(k, it->value().size());
        (void)batch.Put(sizes_cf_, it->key(), SizeValue(it->value().size()));
      }
      if (!it->status().ok()) {
        return absl::DataLossError(absl::StrCat(
            "RocksDB at ", options_.path, " has no index of block sizes (written before they were kept, or its ",
            "index is lost) and a block it cannot read, so it cannot be indexed: ", it->status().ToString()));
      }
      (void)batch.Put(sizes_cf_, kSizesComplete, "");
      rocksdb::WriteOptions sync;
      sync.sync = true;
      if (rocksdb::Status w = db_->Write(sync, &batch); !w.ok()) {
        return OpenWriteError(w, absl::StrCat("RocksDB at ", options_.path, ": writing block sizes"));
      }
    }
    if (!scanned.ok()) {
      std::fprintf(stderr,
                   "RocksDB at %s: an index entry could not be read (%s); serving the %zu blocks read around it\n",
                   options_.path.c_str(), std::string(scanned.message()).c_str(), sizes_.size());
    }
    // A budget smaller than at the last run: down to it now, not at the first put (a store that
    // only serves reads would stay over it).
    victims = TakeVictims(/*short_of_reserve=*/0, /*keep=*/0);
  }
  if (!victims.empty()) {
    std::fprintf(stderr, "RocksDB at %s: %zu blocks over the budget of %llu bytes evicted\n", options_.path.c_str(),
                 victims.size(), static_cast<unsigned long long>(BlockBudgetOf(options_)));
  }
  for (const Victim& v : victims) EraseEvicted(v.key, v.size, v.for_reserve);
  return absl::OkStatus();
}

void DiskTier::CloseDatabase() {
  if (db_ == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* h : {blocks_, sizes_cf_}) {
    if (h != nullptr) (void)db_->DestroyColumnFamilyHandle(h);
  }
  blocks_ = sizes_cf_ = nullptr;
  (void)db_->Close();
  db_.reset();
}

absl::Status DiskTier::ResetDatabase(absl::string_view why) {
  CloseDatabase();
  size_t blocks = 0;
  {
    absl::MutexLock l(&mu_);
    blocks = sizes_.size();
    resets_++;
  }
  std::fprintf(stderr, "RocksDB at %s: %s; dropping the database (%zu blocks) and starting empty\n",
               options_.path.c_str(), std::string(why).c_str(), blocks);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(options_.path, ec)) {
    std::filesystem::remove_all(e.path(), ec);
  }
  return OpenDatabase();
}

DiskTier::~DiskTier() {
  stop_.Notify();
  {
    absl::MutexLock l(&mu_);
    wake_ = true;
  }
  if (maintainer_.joinable()) maintainer_.join();
  CloseDatabase();
}

absl::Status DiskTier::Put(const BlockKey& key, absl::string_view block) {
  if (block.size() > options_.capacity_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block of ", block.size(), " bytes exceeds the disk tier's ", options_.capacity_bytes));
  }
  // The files at their budget: the maintainer evicts and collects garbage, and the put waits for
  // it (a little), so that the files never outgrow the budget by more than a put.
  uint64_t short_of_reserve = ShortOfReserve(block.size());
  {
    absl::MutexLock l(&mu_);
    // (Without a maintainer, as in some tests, nothing would come to wait for.)
    if (files_full_ && maintainer_.joinable()) {
      wake_ = true;
      const auto room = [this] { return !files_full_; };
      if (!mu_.AwaitWithTimeout(absl::Condition(&room), absl::Seconds(2))) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the disk tier's files are at their budget of ", FilesBudget(), " bytes; collecting garbage, retry"));
      }
    }
  }
  rocksdb::WriteOptions w;
  w.sync = options_.sync_writes;
  absl::ReaderMutexLock db(&db_mu_);
  if (db_ == nullptr) return absl::UnavailableError("put: the disk tier is being reopened");
  // One RocksDB write is atomic: a reader sees the whole value or none of it, and its size with it.
  rocksdb::WriteBatch batch;
  (void)batch.Put(blocks_, KeySlice(key), rocksdb::Slice(block.data(), block.size()));
  (void)batch.Put(sizes_cf_, KeySlice(key), SizeValue(block.size()));
  std::vector<Victim> victims;
  {
    absl::MutexLock stripe(&Stripe(key));
    const rocksdb::Status written = db_->Write(w, &batch);
    const absl::Status s = FromRocks(written, "put");
    absl::MutexLock l(&mu_);
    NoteWrite(s, written.IsNoSpace());
    if (!s.ok()) {
      write_errors_++;
      return s;
    }
    Unindex(key);
    Index(key, block.size());
    victims = TakeVictims(short_of_reserve, /*keep=*/1);  // not the block just put
  }
  for (const Victim& v : victims) EraseEvicted(v.key, v.size, v.for_reserve);
  return absl::OkStatus();
}

std::vector<DiskTier::Victim> DiskTier::TakeVictims(uint64_t short_of_reserve, size_t keep) {
  std::vector<Victim> victims;
  const uint64_t budget = BlockBudgetOf(options_);
  while ((used_ > budget || short_of_reserve > 0) && order_.size() > keep) {
    const BlockKey victim = order_.front();
    const uint64_t size = sizes_[victim].first;
    const bool for_reserve = used_ <= budget;
    if (for_reserve) short_of_reserve -= std::min(short_of_reserve, size);
    victims.push_back({victim, size, for_reserve});
    Unindex(victim);
  }
  return victims;
}

uint64_t DiskTier::ShortOfReserve(uint64_t put_bytes) {
  {
    absl::MutexLock l(&mu_);
    put_since_look_ += put_bytes;
    // Often enough that the garbage of what is put between two looks fits in the reserve.
    uint64_t every = options_.capacity_bytes / 32;
    if (options_.reserve_bytes > 0) every = std::min(every, options_.reserve_bytes / 4);
    // Near the budget, at every put.
    if (put_since_look_ < every && files_near_budget_) every = 0;
    if (put_since_look_ < every) return 0;
    put_since_look_ = 0;
  }
  const uint64_t files_over = FilesOver(footprint_bytes(), put_bytes);
  if (options_.reserve_bytes == 0) return files_over;
  const uint64_t free = FreeBytes();
  const uint64_t short_of_reserve = free < options_.reserve_bytes ? options_.reserve_bytes - free : 0;
  absl::MutexLock l(&mu_);
  if ((short_of_reserve > 0) != short_of_reserve_) {
    if (short_of_reserve > 0) {
      std::fprintf(stderr, "RocksDB at %s: %llu bytes free on its filesystem, under the %llu kept free; puts evict "
                   "blocks beyond the budget until there is room\n", options_.path.c_str(),
                   static_cast<unsigned long long>(free), static_cast<unsigned long long>(options_.reserve_bytes));
    } else {
      std::fprintf(stderr, "RocksDB at %s: its filesystem has the room kept free again\n", options_.path.c_str());
    }
    short_of_reserve_ = short_of_reserve > 0;
  }
  return std::max(short_of_reserve, files_over);
}

uint64_t DiskTier::FilesBudget() const { return FilesBudgetOf(options_); }

uint64_t DiskTier::block_budget_bytes() const { return BlockBudgetOf(options_); }

uint64_t DiskTier::FilesOver(uint64_t footprint, uint64_t put_bytes) {
  absl::MutexLock l(&mu_);
  files_near_budget_ = footprint + FilesBudget() / 16 > FilesBudget();
  files_full_ = footprint + put_bytes > FilesBudget();
  if (files_full_) wake_ = true;
  const uint64_t budget = FilesBudget() + files_evicted_;
  const bool over = footprint > budget;
  if (over != files_over_) {
    std::fprintf(stderr, over ? "RocksDB at %s: its files take %llu bytes, over the budget of %llu; evicting blocks "
                                "beyond it and collecting garbage\n"
                              : "RocksDB at %s: its files take %llu bytes, within the budget of %llu again\n",
                 options_.path.c_str(), static_cast<unsigned long long>(footprint),
                 static_cast<unsigned long long>(FilesBudget()));
    files_over_ = over;
  }
  if (!over) return 0;
  files_evicted_ += footprint - budget;
  return footprint - budget;
}

uint64_t DiskTier::FreeBytes() const {
  if (options_.free_bytes) return options_.free_bytes();
  struct statvfs fs;
  if (statvfs(options_.path.c_str(), &fs) != 0) return UINT64_MAX;  // unknown: nothing to act on
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

uint64_t DiskTier::reserve_evictions() const {
  absl::MutexLock l(&mu_);
  return reserve_evictions_;
}

void DiskTier::EraseEvicted(const BlockKey& key, uint64_t size, bool for_reserve) {
  absl::MutexLock stripe(&Stripe(key));
  {
    absl::MutexLock l(&mu_);
    if (sizes_.contains(key)) {  // put again meanwhile: that put's block stays
      evictions_++;
      reserve_evictions_ += for_reserve;
      return;
    }
  }
  const bool erased = Erase(key).ok();
  absl::MutexLock l(&mu_);
  if (erased) {
    evictions_++;
    reserve_evictions_ += for_reserve;
    return;
  }
  // Still stored: indexed again, as the oldest block, so that it stays counted against the budget
  // and is the next to go (unindexed, it would take room that nothing counts or ever frees).
  Index(key, size, /*oldest=*/true);
}

absl::Status DiskTier::Erase(const BlockKey& key) {
  if (db_ == nullptr) return absl::UnavailableError("delete: the disk tier is being reopened");
  rocksdb::WriteBatch batch;
  (void)batch.Delete(blocks_, KeySlice(key));
  (void)batch.Delete(sizes_cf_, KeySlice(key));
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "delete");
}

absl::StatusOr<std::string> DiskTier::Get(const BlockKey& key) {
  absl::ReaderMutexLock db(&db_mu_);
  if (db_ == nullptr) return absl::UnavailableError("get: the disk tier is being reopened");
  std::string value;
  absl::Status s = FromRocks(db_->Get(rocksdb::ReadOptions(), blocks_, KeySlice(key), &value), "get");
  if (!s.ok()) return s;
  return value;
}

absl::Status DiskTier::Delete(const BlockKey& key) {
  absl::ReaderMutexLock db(&db_mu_);
  absl::MutexLock stripe(&Stripe(key));
  // Erased first: a delete that fails leaves the block stored, and so still counted against the
  // budget and still in the eviction order.
  if (absl::Status erased = Erase(key); !erased.ok()) return erased;
  absl::MutexLock l(&mu_);
  Unindex(key);
  return absl::OkStatus();
}

bool DiskTier::Touch(const BlockKey& key) {
  absl::MutexLock l(&mu_);
  auto it = sizes_.find(key);
  if (it == sizes_.end()) return false;
  order_.splice(order_.end(), order_, it->second.second);
  return true;
}

void DiskTier::Index(const BlockKey& key, uint64_t size, bool oldest) {
  sizes_[key] = {size, order_.insert(oldest ? order_.begin() : order_.end(), key)};
  used_ += size;
}

void DiskTier::Unindex(const BlockKey& key) {
  auto it = sizes_.find(key);
  if (it == sizes_.end()) return;
  used_ -= it->second.first;
  order_.erase(it->second.second);
  sizes_.erase(it);
}

bool DiskTier::Contains(const BlockKey& key) const {
  absl::MutexLock l(&mu_);
  return sizes_.contains(key);
}

uint64_t DiskTier::SizeOf(const BlockKey& key) const {
  absl::MutexLock l(&mu_);
  auto it = sizes_.find(key);
  return it == sizes_.end() ? 0 : it->second.first;
}

uint64_t DiskTier::used_bytes() const {
  absl::MutexLock l(&mu_);
  return used_;
}

uint64_t DiskTier::footprint_bytes() const {
  // Space allocated, not the files' sizes: RocksDB preallocates its logs past what they hold.
  uint64_t total = 0;
  const bool listed =
      ForEachFileAllocation(options_.path, [&](const std::filesystem::path&, uint64_t bytes) { total += bytes; });
  return listed ? total : 0;
}

size_t DiskTier::blocks() const {
  absl::MutexLock l(&mu_);
  return sizes_.size();
}

uint64_t DiskTier::evictions() const {
  absl::MutexLock l(&mu_);
  return evictions_;
}

uint64_t DiskTier::write_errors() const {
  absl::MutexLock l(&mu_);
  return write_errors_;
}

void DiskTier::NoteWrite(const absl::Status& s, bool no_space) {
  // Logged once per run of failures: RocksDB takes no writes after a failed one until it recovers,
  // by itself once a full disk has room or after errors it deems retryable; after others (a log
  // write failing with EIO, for one) only a restart (a reopen) recovers.
  if (s.ok()) {
    if (writes_failing_) std::fprintf(stderr, "RocksDB at %s: writes succeed again\n", options_.path.c_str());
    writes_failing_ = false;
    return;
  }
  if (!writes_failing_) {
    std::fprintf(stderr, "RocksDB at %s: a put failed (%s); puts fail until it recovers\n", options_.path.c_str(),
                 std::string(s.message()).c_str());
    failing_since_ = SteadyClock()->Now();
    ++failure_runs_;
  }
  writes_failing_ = true;
  failing_for_room_ = no_space;
  failing_corrupt_ = absl::IsDataLoss(s);
}

DiskWriteFailure DiskTier::write_failure() const {
  absl::MutexLock l(&mu_);
  if (!writes_failing_) return {};
  return {SteadyClock()->Now() - failing_since_, failing_for_room_};
}

absl::Status DiskTier::ProbeWrites() {
  uint64_t run = 0;
  {
    absl::MutexLock l(&mu_);
    if (!writes_failing_) return absl::OkStatus();
    run = failure_runs_;
  }
  absl::ReaderMutexLock db(&db_mu_);
  const rocksdb::Status deleted = db_ == nullptr ? rocksdb::Status::Incomplete("the database is not open")
                                                 : db_->Delete(rocksdb::WriteOptions(), sizes_cf_, kWriteProbe);
  const absl::Status s = FromRocks(deleted, "write probe");
  absl::MutexLock l(&mu_);
  // Only for the run it probed: a put may have ended that run, and another begun, meanwhile.
  if (writes_failing_ && failure_runs_ == run) NoteWrite(s, deleted.IsNoSpace());
  return s;
}

uint64_t DiskTier::reopens() const {
  absl::MutexLock l(&mu_);
  return reopens_;
}

uint64_t DiskTier::resets() const {
  absl::MutexLock l(&mu_);
  return resets_;
}

void DiskTier::Maintain() {
  (void)ProbeWrites();
  bool failing = false, no_space = false, corrupt = false;
  absl::Duration failing_for;
  {
    absl::MutexLock l(&mu_);
    failing = writes_failing_;
    no_space = failing_for_room_;
    corrupt = failing_corrupt_;
    failing_for = SteadyClock()->Now() - failing_since_;
  }
  if (failing) Heal(failing_for, no_space, corrupt);
  KeepFilesInBudget();
}

void DiskTier::Heal(absl::Duration failing_for, bool no_space, bool corrupt) {
  const absl::Duration now = SteadyClock()->Now();
  absl::Duration since_reopen;
  {
    absl::MutexLock l(&mu_);
    since_reopen = now - last_reopen_;
  }
  if (corrupt) {
    Reopen(/*verify=*/true);
    return;
  }
  bool db_open = false;
  {
    absl::ReaderMutexLock db(&db_mu_);
    db_open = db_ != nullptr;
  }
  if (db_open) {
    // After a full disk RocksDB polls for room and resumes by itself; this is for when it does not.
    const absl::Duration resume_after = no_space ? absl::Seconds(5) : absl::Seconds(1);
    if (failing_for < resume_after || (no_space && FreeBytes() < 2 * MemtableBytes(options_))) return;
    {
      absl::ReaderMutexLock db(&db_mu_);
      if (db_ != nullptr) (void)db_->Resume();
    }
    const absl::Duration reopen_after = no_space ? absl::Seconds(15) : absl::ZeroDuration();
    if (ProbeWrites().ok() || failing_for < reopen_after || since_reopen < absl::Seconds(10)) return;
  } else if (since_reopen < absl::Seconds(1)) {
    return;
  }
  Reopen(/*verify=*/false);
}

void DiskTier::Reopen(bool verify) {
  {
    absl::MutexLock l(&mu_);
    reopens_++;
    last_reopen_ = SteadyClock()->Now();
  }
  std::fprintf(stderr, "RocksDB at %s: reopening it to take writes again%s\n", options_.path.c_str(),
               verify ? ", reading every block to drop the corrupt ones" : "");
  {
    absl::WriterMutexLock db(&db_mu_);
    CloseDatabase();
    // Verifying: no compaction until the corrupt blocks are deleted (it would meet them first).
    pause_compactions_ = verify;
    absl::Status opened = OpenDatabase();
    pause_compactions_ = false;
    if (absl::IsDataLoss(opened)) opened = ResetDatabase(opened.message());
    if (!opened.ok()) {
      std::fprintf(stderr, "RocksDB at %s: %s; trying again\n", options_.path.c_str(),
                   std::string(opened.message()).c_str());
      return;
    }
  }
  // Writes fail until the probe says otherwise.
  (void)ProbeWrites();
  if (!verify) return;
  // Every block read (the index copied first: reads and puts go on meanwhile), and those RocksDB
  // cannot read deleted, so that no compaction meets them again.
  std::vector<BlockKey> keys;
  {
    absl::MutexLock l(&mu_);
    keys.assign(order_.begin(), order_.end());
  }
  size_t dropped = 0;
  for (const BlockKey& key : keys) {
    absl::ReaderMutexLock db(&db_mu_);
    if (db_ == nullptr) break;
    std::string value;
    const rocksdb::Status got = db_->Get(rocksdb::ReadOptions(), blocks_, KeySlice(key), &value);
    if (!got.IsCorruption() && !got.IsPathNotFound()) continue;
    absl::MutexLock stripe(&Stripe(key));
    if (Erase(key).ok()) {
      absl::MutexLock l(&mu_);
      Unindex(key);
      ++dropped;
    }
  }
  absl::Status collected = CollectGarbage(/*age_cutoff=*/1.0);
  {
    absl::ReaderMutexLock db(&db_mu_);
    for (rocksdb::ColumnFamilyHandle* h : {blocks_, sizes_cf_}) {
      if (db_ == nullptr || !collected.ok()) break;
      collected = FromRocks(db_->SetOptions(h, {{"disable_auto_compactions", "false"}}), "resume compactions");
    }
  }
  std::fprintf(stderr, "RocksDB at %s: %zu of %zu blocks were corrupt and deleted; compacting the rest: %s\n",
               options_.path.c_str(), dropped, keys.size(),
               collected.ok() ? "OK" : std::string(collected.message()).c_str());
  if (collected.ok() && ProbeWrites().ok()) return;
  absl::WriterMutexLock db(&db_mu_);
  if (const absl::Status reset = ResetDatabase(absl::StrCat("a compaction after dropping the corrupt blocks failed (",
                                                            collected.message(), ")"));
      !reset.ok()) {
    std::fprintf(stderr, "RocksDB at %s: %s; trying again\n", options_.path.c_str(), std::string(reset.message()).c_str());
  }
  {
    absl::MutexLock l(&mu_);
    files_evicted_ = 0;
  }
}

absl::Status DiskTier::CollectGarbage(double age_cutoff) {
  absl::ReaderMutexLock db(&db_mu_);
  if (db_ == nullptr) return absl::UnavailableError("compact: the disk tier is being reopened");
  rocksdb::CompactRangeOptions o;
  o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  o.blob_garbage_collection_age_cutoff = age_cutoff;
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  return FromRocks(db_->CompactRange(o, blocks_, nullptr, nullptr), "compact");
}

void DiskTier::KeepFilesInBudget() {
  const uint64_t over = FilesOver(footprint_bytes(), 0);
  std::vector<Victim> victims;
  bool collect = false;
  {
    absl::MutexLock l(&mu_);
    if (over > 0) victims = TakeVictims(over, /*keep=*/0);
    collect = files_evicted_ > 0;
  }
  {
    absl::ReaderMutexLock db(&db_mu_);
    for (const Victim& v : victims) EraseEvicted(v.key, v.size, v.for_reserve);
  }
  if (!collect) return;
  // The oldest quarter of the blob files: those of the least recently put blocks, mostly evicted.
  if (CollectGarbage(/*age_cutoff=*/0.25).ok()) {
    absl::MutexLock l(&mu_);
    files_evicted_ = 0;
  }
  // Puts waiting for room see what the collection freed.
  (void)FilesOver(footprint_bytes(), 0);
}

}  // namespace vc::cachestore
