#include "cachestore/store.h"

#include "absl/strings/str_cat.h"
#include "cachestore/block_format.h"
#include "common/status_macros.h"

namespace vc::cachestore {
absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const StoreOptions& options) {
  std::unique_ptr<BlockStore> s(new BlockStore());
  s->ram_ = std::make_unique<RamTier>(options.ram);
  VC_ASSIGN_OR_RETURN(s->disk_, DiskTier::Open(options.disk));
  return s;
}

std::string BlockStore::TenantSalt(absl::string_view secret, absl::string_view tenant) {
  const auto digest = Sha256(absl::StrCat(secret, "\n", tenant));
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

BlockKey BlockStore::Scoped(absl::string_view tenant_salt, const BlockKey& key) {
  std::string msg(tenant_salt);
  msg.push_back('\0');
  msg.append(reinterpret_cast<const char*>(key.bytes.data()), key.bytes.size());
  BlockKey out;
  out.bytes = Sha256(msg);
  return out;
}

absl::Status BlockStore::Put(const BlockKey& key, absl::string_view block) {
  // Checked against the block's own fingerprint; a block that fails is the caller's error (a
  // disk's DataLoss below is not).
  if (absl::Status v = VerifyBlock(block).status(); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("rejected block: ", v.message()));
  }
  // RAM first, so that a different block under a key being read is refused before either tier
  // takes it. RAM holds only what disk holds (its evictions are not demoted), so a block the disk
  // refuses leaves RAM too.
  // A RAM tier full of pinned blocks only means this block is served from disk for now.
  bool stored = false;
  const absl::Status s = ram_->Put(key, block, nullptr, &stored);
  if (!s.ok() && !absl::IsResourceExhausted(s)) return s;
  if (absl::Status d = disk_->Put(key, block); !d.ok()) {
    if (stored) (void)ram_->Delete(key);
    return d;
  }
  puts_++;
  return absl::OkStatus();
}

absl::Status BlockStore::Drop(const BlockKey& key, bool from_ram_too, absl::string_view what, const absl::Status& why) {
  corrupt_++;
  if (from_ram_too) (void)ram_->Delete(key);
  (void)disk_->Delete(key);
  return absl::DataLossError(absl::StrCat("stored block ", what, " and was dropped: ", why.message()));
}

absl::StatusOr<std::string> BlockStore::Get(const BlockKey& key, bool* from_ram) {
  bool ram = true;
  absl::StatusOr<std::string> block = ram_->Get(key);
  if (absl::IsNotFound(block.status())) {
    ram = false;
    block = disk_->Get(key);
  }
  if (!block.ok()) {
    if (absl::IsNotFound(block.status())) misses_++;
    if (absl::IsDataLoss(block.status())) return Drop(key, false, "unreadable", block.status());
    return block.status();
  }
  if (absl::Status s = VerifyBlock(*block).status(); !s.ok()) return Drop(key, true, "failed its checks", s);
  disk_->Touch(key);
  if (ram) {
    hits_ram_++;
  } else {
    hits_disk_++;
    (void)Promote(key, *block);  // a full RAM tier just skips it
  }
  if (from_ram != nullptr) *from_ram = ram;
  return block;
}

absl::StatusOr<BlockLease> BlockStore::Lease(const BlockKey& key, absl::string_view owner) {
  absl::StatusOr<BlockLease> lease = ram_->Lease(key, owner);
  if (!absl::IsNotFound(lease.status())) {
    if (lease.ok()) {
      hits_ram_++;
      disk_->Touch(key);
    }
    return lease;
  }
  // A lease the owner's cap would refuse is refused before the block is read and promoted.
  if (const uint64_t size = disk_->SizeOf(key); size > 0 && !ram_->LeaseFits(owner, size)) {
    return absl::ResourceExhaustedError("this reader's leases are at their cap");
  }
  absl::StatusOr<std::string> block = disk_->Get(key);
  if (!block.ok()) {
    if (absl::IsNotFound(block.status())) misses_++;
    if (absl::IsDataLoss(block.status())) return Drop(key, false, "unreadable", block.status());
    return block.status();
  }
  if (absl::Status s = VerifyBlock(*block).status(); !s.ok()) return Drop(key, false, "failed its checks", s);
  hits_disk_++;
  disk_->Touch(key);
  // RAM may not take this copy now: full of pinned blocks, another put of the key still copying
  // in, or a deleted copy still being read (it keeps the key's entry until its readers finish).
  // The block is then served inline. (Or it was deleted from disk meanwhile; an inline read then
  // finds it gone.)
  if (!Promote(key, *block)) return absl::ResourceExhaustedError("RAM cannot take this block now");
  absl::StatusOr<BlockLease> promoted = ram_->Lease(key, owner);
  // Evicted again before it could be leased (another put took its slot): read inline.
  if (absl::IsNotFound(promoted.status())) return absl::ResourceExhaustedError("RAM cannot keep this block now");
  return promoted;
}

std::pair<uint32_t, uint32_t> BlockStore::Lookup(absl::Span<const BlockKey> keys, bool use) {
  uint32_t n = 0, in_ram = 0;
  for (const BlockKey& k : keys) {
    // With `use`, one call each finds the block and counts the use.
    const bool r = use ? ram_->Use(k) : ram_->Contains(k);
    const bool on_disk = use ? disk_->Touch(k) : !r && disk_->Contains(k);
    if (!r && !on_disk) break;
    ++n;
    in_ram += r;
  }
  return {n, in_ram};
}

absl::Status BlockStore::Delete(const BlockKey& key) {
  (void)ram_->Delete(key);
  // A key in neither tier is deleted as well; a disk that fails the delete keeps the block, and
  // the caller is told why.
  VC_RETURN_IF_ERROR(disk_->Delete(key));
  // And RAM again: a read that found the block on disk before it was deleted may have promoted it
  // since (Promote, which looks for it on disk after, handles one that promotes later).
  (void)ram_->Delete(key);
  return absl::OkStatus();
}

bool BlockStore::Promote(const BlockKey& key, absl::string_view block) {
  bool stored = false;
  if (!ram_->Put(key, block, nullptr, &stored).ok() || !stored) return false;
  // A delete that ran while the block was read from disk has erased it there: RAM holds only
  // what disk holds, so the copy goes.
  if (!disk_->Contains(key)) {
    (void)ram_->Delete(key);
    return false;
  }
  return true;
}

StoreStats BlockStore::Stats() const {
  StoreStats s;
  s.ram_used_bytes = ram_->used_bytes();
  s.ram_capacity_bytes = ram_->region_bytes();
  s.ram_blocks = ram_->blocks();
  s.ram_block_bytes = ram_->block_bytes();
  s.disk_used_bytes = disk_->used_bytes();
  s.disk_capacity_bytes = disk_->capacity_bytes();
  s.disk_blocks = disk_->blocks();
  s.disk_footprint_bytes = disk_->footprint_bytes();
  s.hits_ram = hits_ram_;
  s.hits_disk = hits_disk_;
  s.misses = misses_;
  s.corrupt_dropped = corrupt_;
  s.puts = puts_;
  s.ram_evictions = ram_->evictions();
  s.disk_evictions = disk_->evictions();
  s.disk_reserve_evictions = disk_->reserve_evictions();
  s.disk_write_errors = disk_->write_errors();
  const DiskWriteFailure failure = disk_->write_failure();
  s.disk_writes_failing_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(failure.duration));
  s.disk_full = failure.no_space;
  return s;
}

}  // namespace vc::cachestore
