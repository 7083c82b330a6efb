#include "worker/prefixes/full_kv_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace vc {

PagedDest PagedDest::Of(const PagedKvCache& cache, SeqId seq) {
  PagedDest d;
  d.blocks = cache.BlockTable(seq);
  for (int layer = 0; layer < cache.layout().num_layers; ++layer) d.layers.push_back(cache.LayerView(layer));
  return d;
}

namespace {

// Byte offset of `pos`'s row in a layer of `d` whose blocks are `blocks`.
int64_t RowOffset(const kernels::PagedKvLayer& d, const std::vector<int32_t>& blocks, int64_t pos) {
  return (blocks[pos / d.block_size] * d.block_stride + (pos % d.block_size) * d.num_kv_heads * d.head_dim) *
         static_cast<int64_t>(DTypeSize(d.dtype));
}

}  // namespace

void* PagedDest::KRow(int layer, int64_t pos) const {
  const kernels::PagedKvLayer& d = layers[layer];
  return static_cast<char*>(const_cast<void*>(d.k)) + RowOffset(d, blocks, pos);
}

void* PagedDest::VRow(int layer, int64_t pos) const {
  const kernels::PagedKvLayer& d = layers[layer];
  return static_cast<char*>(const_cast<void*>(d.v)) + RowOffset(d, blocks, pos);
}

absl::Status FetchHandle::Wait() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

bool FetchHandle::WaitFor(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
}

bool FetchHandle::Done() const {
  absl::MutexLock l(&mu_);
  return done_;
}

void FetchHandle::Finish(absl::Status s) {
  absl::MutexLock l(&mu_);
  status_ = std::move(s);
  finished_at_ = SteadyClock()->Now();
  done_ = true;
}

absl::Duration FetchHandle::finished_at() const {
  absl::MutexLock l(&mu_);
  return finished_at_;
}

HostKvTier::HostKvTier(const KvLayout& layout, double bytes_per_second, int io_threads, int64_t capacity_bytes)
    : layout_(layout),
      chunk_positions_(std::max<int64_t>(1, (int64_t{64} << 10) / layout.row_bytes())),
      link_(bytes_per_second),
      capacity_bytes_(capacity_bytes) {
  for (int i = 0; i < std::max(1, io_threads); ++i) io_.emplace_back([this] { IoLoop(); });
}

HostKvTier::~HostKvTier() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : io_) t.join();
}

int64_t HostKvTier::BytesFor(int64_t stored) const {
  const int64_t chunks = (std::max<int64_t>(0, stored) + chunk_positions_ - 1) / chunk_positions_;
  return chunks * chunk_positions_ * layout_.bytes_per_token();
}

absl::Status HostKvTier::Grow(Entry& e, int64_t positions) {
  const int64_t target = std::max(e.reserved_positions, positions);
  const int64_t need = BytesFor(target - e.base);
  if (need > e.reserved_bytes) {
    if (capacity_bytes_ > 0 && reserved_bytes_ + need - e.reserved_bytes > capacity_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("the host KV tier's ", capacity_bytes_ >> 20,
                                                       " MiB are taken (", reserved_bytes_ >> 20,
                                                       " MiB by other sequences)"));
    }
    reserved_bytes_ += need - e.reserved_bytes;
    e.reserved_bytes = need;
  }
  e.reserved_positions = target;
  return absl::OkStatus();
}

std::shared_ptr<HostKvTier::Entry>& HostKvTier::EntryFor(TierKey key) {
  std::shared_ptr<Entry>& slot = entries_[key];
  if (slot == nullptr) slot = NewEntry();
  return slot;
}

std::shared_ptr<HostKvTier::Entry> HostKvTier::NewEntry() const {
  auto e = std::make_shared<Entry>();
  e->k.resize(layout_.num_layers);
  e->v.resize(layout_.num_layers);
  return e;
}

absl::Status HostKvTier::Reserve(TierKey key, int64_t positions) {
  absl::MutexLock l(&mu_);
  return Grow(*EntryFor(key), positions);
}

absl::Status HostKvTier::CanHold(int64_t positions) const {
  if (capacity_bytes_ > 0 && BytesFor(positions) > capacity_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat("%d positions need %.2f MiB of host KV tier; it holds %.2f MiB",
                                                        positions, BytesFor(positions) / 1048576.0,
                                                        capacity_bytes_ / 1048576.0));
  }
  return absl::OkStatus();
}

int64_t HostKvTier::reserved_bytes() const {
  absl::MutexLock l(&mu_);
  return reserved_bytes_;
}

absl::Status HostKvTier::Append(TierKey key, const PagedKvCache& src, SeqId seq, int64_t begin, int64_t end) {
  std::shared_ptr<Entry> e;
  {
    absl::MutexLock l(&mu_);
    e = EntryFor(key);
    // Past the reservation (or with none): more room, if the budget has it.
    VC_RETURN_IF_ERROR(Grow(*e, end));
  }
  // One writer per key (the engine thread that owns the sequence); fetches of the same key are
  // never in flight while it appends.
  if (begin != e->length) {
    return absl::FailedPreconditionError(
        absl::StrCat("tier append at ", begin, " but the tier holds ", e->length, " positions"));
  }
  if (src.layout().dtype != layout_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("a ", DTypeName(src.layout().dtype), " cache appended to a ",
                                                   DTypeName(layout_.dtype), " tier"));
  }
  const int64_t row = layout_.row_bytes();
  const size_t chunks = static_cast<size_t>((end - e->base + chunk_positions_ - 1) / chunk_positions_);
  for (int l = 0; l < layout_.num_layers; ++l) {
    while (e->k[l].size() < chunks) {
      e->k[l].emplace_back(new char[chunk_positions_ * row]);
      e->v[l].emplace_back(new char[chunk_positions_ * row]);
    }
    for (int64_t p = begin; p < end; ++p) {
      const int64_t c = (p - e->base) / chunk_positions_, at = (p - e->base) % chunk_positions_ * row;
      std::memcpy(e->k[l][c].get() + at, src.KRow(l, seq, p), row);
      std::memcpy(e->v[l][c].get() + at, src.VRow(l, seq, p), row);
    }
  }
  e->length = end;
  return absl::OkStatus();
}

std::shared_ptr<FetchHandle> HostKvTier::Fetch(TierKey key, int64_t from, int64_t length, PagedKvCache* dest,
                                               SeqId dest_seq) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  const int64_t first = it == entries_.end() || from < it->second->base ? 0 : from;
  auto handle = std::shared_ptr<FetchHandle>(
      new FetchHandle(std::max<int64_t>(0, length - first) * layout_.bytes_per_token()));
  if (from < 0 || from > length) {
    handle->Finish(absl::InvalidArgumentError(absl::StrCat("fetch of positions [", from, ", ", length, ")")));
    return handle;
  }
  if (it == entries_.end() || it->second->length < length) {
    handle->Finish(absl::NotFoundError(absl::StrCat("tier holds ", it == entries_.end() ? 0 : it->second->length,
                                                    " positions of the sequence, ", length, " requested")));
    return handle;
  }
  jobs_.push_back(Job{it->second, first, length, PagedDest::Of(*dest, dest_seq), handle});
  return handle;
}

int64_t HostKvTier::Length(TierKey key) const {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second->length;
}

absl::Status HostKvTier::AttachPrefix(TierKey key, int64_t length, PrefixReader read) {
  absl::MutexLock l(&mu_);
  Entry& e = *EntryFor(key);
  if (e.length > 0) {
    return absl::FailedPreconditionError(absl::StrCat("tier already holds ", e.length, " positions of the sequence"));
  }
  e.base = length;
  e.length = length;
  e.prefix = std::move(read);
  // A reservation keeps the prefix's share: should the prefix's read fail, its positions are
  // computed and held here, and that must not fail for room.
  return absl::OkStatus();
}

void HostKvTier::Erase(TierKey key) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  reserved_bytes_ -= it->second->reserved_bytes;
  entries_.erase(it);
}

void HostKvTier::Clear(TierKey key) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  // A new entry: a fetch still queued keeps the old one alive.
  std::shared_ptr<Entry> fresh = NewEntry();
  fresh->reserved_positions = it->second->reserved_positions;
  fresh->reserved_bytes = it->second->reserved_bytes;
  it->second = std::move(fresh);
}

void HostKvTier::IoLoop() {
  const int64_t row = layout_.row_bytes();
  const int64_t bs = layout_.block_size;
  while (true) {
    Job job;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](HostKvTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->stop_ || !t->jobs_.empty(); }, this));
      if (stop_ && jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const Entry& e = *job.entry;
    if (job.first < e.base) {
      absl::Status st = e.prefix(job.dest);
      if (!st.ok()) {
        job.handle->Finish(std::move(st));
        continue;
      }
    }
    // Layer by layer, in runs contiguous on both sides: within one destination block and one
    // tier chunk. The tier's rows start at e.base, which need not be block-aligned.
    const auto start = std::chrono::steady_clock::now();
    int64_t moved = 0;
    for (int l = 0; l < layout_.num_layers; ++l) {
      for (int64_t p0 = std::max(e.base, job.first); p0 < job.length;) {
        const int64_t c = (p0 - e.base) / chunk_positions_, off = (p0 - e.base) % chunk_positions_;
        const int64_t n = std::min({bs - p0 % bs, chunk_positions_ - off, job.length - p0});
        std::memcpy(job.dest.KRow(l, p0), e.k[l][c].get() + off * row, n * row);
        std::memcpy(job.dest.VRow(l, p0), e.v[l][c].get() + off * row, n * row);
        p0 += n;
        moved += 2 * n * row;
      }
    }
    link_.Transfer(moved, start);  // a paced link: done when it would have carried the bytes
    job.handle->Finish(absl::OkStatus());
  }
}

}  // namespace vc
