#include "worker/prefixes/store_prefixes.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cachestore/block_format.h"
#include "cachestore/block_key.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "openssl/evp.h"
#include "worker/runtime/safetensors.h"

namespace vc {
namespace {

cachestore::BlockKey ToKey(const PrefixName& n) {
  cachestore::BlockKey k;
  k.bytes = n;
  return k;
}

}  // namespace

absl::StatusOr<std::array<uint8_t, 32>> ModelFingerprint(const std::string& dir) {
  namespace fs = std::filesystem;
  // config.json and the files the weights load from, in name order.
  VC_ASSIGN_OR_RETURN(std::vector<std::string> files, CheckpointFiles(dir));
  files.push_back("config.json");
  std::sort(files.begin(), files.end());
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  for (const std::string& name : files) {
    const uint32_t len = static_cast<uint32_t>(name.size());
    EVP_DigestUpdate(ctx.get(), &len, sizeof(len));
    EVP_DigestUpdate(ctx.get(), name.data(), name.size());
    // Regular files only (a FIFO would block, a link to a device such as /dev/zero would never
    // end), read to the size they had when opened.
    const std::string path = (fs::path(dir) / name).string();
    uint64_t size = 0;
    VC_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, "checkpoint file", &size));
    for (uint64_t left = size; left > 0;) {
      const ssize_t got = ::read(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        const int err = got < 0 ? errno : 0;
        ::close(fd);
        return absl::DataLossError(absl::StrCat("cannot read ", path, ": ",
                                                err != 0 ? std::strerror(err) : "shorter than when opened"));
      }
      EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(got));
      left -= static_cast<uint64_t>(got);
    }
    ::close(fd);
  }
  std::array<uint8_t, 32> out{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), out.data(), &n);
  return out;
}

StorePrefixes::StorePrefixes(const StorePrefixOptions& options, const std::array<uint8_t, 32>& fingerprint,
                             const KvLayout& layout)
    : options_(options), fingerprint_(fingerprint), layout_(layout) {
  keys_.model_fingerprint.assign(reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size());
  // The KV dtype is part of every name: a block of bf16 K/V is not the float32 one.
  keys_.layout = absl::StrCat(absl::AsciiStrToLower(DTypeName(layout.dtype)), "/l", layout.num_layers, "/h",
                              layout.num_kv_heads, "/d", layout.head_dim, "/", options.numerics);
  keys_.block_tokens = options.block_tokens;
}

absl::StatusOr<std::unique_ptr<StorePrefixes>> StorePrefixes::Create(const StorePrefixOptions& options,
                                                                     const std::array<uint8_t, 32>& fingerprint,
                                                                     const KvLayout& layout) {
  if (options.block_tokens < 1 || options.block_tokens % layout.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("store block of ", options.block_tokens,
                                                   " tokens is not a multiple of the KV block size ",
                                                   layout.block_size));
  }
  if (options.shards.empty()) return absl::InvalidArgumentError("no store given");
  if (options.numerics.empty()) return absl::InvalidArgumentError("the kernels' numerics are not given");
  if (options.replicas < 1 || static_cast<size_t>(options.replicas) > options.shards.size()) {
    return absl::InvalidArgumentError(absl::StrCat(options.replicas, " replicas of each block need as many stores; ",
                                                   options.shards.size(), " given"));
  }
  std::unique_ptr<StorePrefixes> p(new StorePrefixes(options, fingerprint, layout));
  for (const std::string& target : options.shards) {
    for (const Shard& other : p->shards_) {
      if (other.target == target) return absl::InvalidArgumentError(absl::StrCat("the store ", target, " is listed twice"));
    }
    Shard shard;
    shard.target = target;
    const std::array<uint8_t, 32> digest = cachestore::Sha256(target);
    std::memcpy(&shard.seed, digest.data(), sizeof(shard.seed));
    cachestore::StoreClientOptions o = options.store;
    o.target = target;
    VC_ASSIGN_OR_RETURN(shard.client, cachestore::StoreClient::Create(o));
    // A store that refuses the token, or a target that is no store, would only ever look like a
    // store without prefixes: an error now. (One that is down may come up later.) A lookup of no
    // keys asks only that.
    if (const absl::Status st = shard.client->Lookup({}).status();
        absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st) || absl::IsUnimplemented(st)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the store at ", target, " refused this worker: ",
          absl::IsUnimplemented(st) ? "it serves no cache store there (is it a worker or a router?)" : st.message()));
    }
    p->shards_.push_back(std::move(shard));
  }
  {
    absl::MutexLock l(&p->mu_);
    p->skip_lookups_until_.assign(p->shards_.size(), -absl::InfiniteDuration());
    for (const Shard& shard : p->shards_) p->stats_.shards.push_back({shard.target});
  }
  if (options.ucx != "off") {
    // A reader (a UCX worker) per shard: one reader's reads take turns, so the shards' would too.
    VC_ASSIGN_OR_RETURN(cachestore::UcxErrorMode mode, cachestore::ParseUcxErrorMode(options.ucx));
    for (Shard& shard : p->shards_) {
      VC_ASSIGN_OR_RETURN(shard.reader, cachestore::UcxReader::Create(mode));
    }
  }
  {
    absl::MutexLock l(&p->mu_);
    p->outboxes_.resize(p->shards_.size());
  }
  // A publisher per shard, so a shard that hangs holds up only its own puts.
  for (size_t s = 0; s < p->shards_.size(); ++s) {
    p->publishers_.emplace_back([raw = p.get(), s] { raw->PublishLoop(s); });
  }
  return p;
}

StorePrefixes::~StorePrefixes() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : publishers_) t.join();
}

std::vector<PrefixName> StorePrefixes::ChainNames(absl::string_view layout_tag, absl::string_view tenant,
                                                  absl::Span<const int32_t> tokens) const {
  // The worker's clients' tenant salts the chain, as the store's tenant (the worker's) salts it
  // again in the store. The default tenant's is empty, the names of a worker without tenants.
  cachestore::KeyContext k = keys_;
  absl::StrAppend(&k.layout, layout_tag);
  k.tenant_salt = std::string(tenant);
  std::vector<PrefixName> out;
  for (const cachestore::BlockKey& key : cachestore::ChainBlockKeys(k, tokens)) out.push_back(key.bytes);
  return out;
}

std::vector<PrefixName> StorePrefixes::Names(absl::string_view tenant, absl::Span<const int32_t> tokens) const {
  return ChainNames("", tenant, tokens);
}

absl::InlinedVector<size_t, 4> StorePrefixes::ShardsOf(const PrefixName& name) const {
  if (shards_.size() == 1) return {0};
  // Rendezvous hashing: the shards whose salted hashes of the name are highest. Names are SHA-256
  // digests, so 8 of their bytes mixed with each shard's salt (SplitMix64's finalizer) suffice.
  uint64_t word;
  std::memcpy(&word, name.data(), sizeof(word));
  absl::InlinedVector<std::pair<uint64_t, size_t>, 4> scored;
  for (size_t s = 0; s < shards_.size(); ++s) {
    uint64_t z = word ^ shards_[s].seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    scored.push_back({z, s});
  }
  const size_t r = static_cast<size_t>(options_.replicas);
  std::partial_sort(scored.begin(), scored.begin() + r, scored.end(), std::greater<>());
  absl::InlinedVector<size_t, 4> out;
  for (size_t i = 0; i < r; ++i) out.push_back(scored[i].second);
  return out;
}

void StorePrefixes::BackOffLocked(size_t s, absl::Duration failed_after) {
  skip_lookups_until_[s] = SteadyClock()->Now() + std::max(8 * failed_after, absl::Milliseconds(50));
}

void StorePrefixes::BackOff(size_t s, absl::Duration failed_after) {
  absl::MutexLock l(&mu_);
  BackOffLocked(s, failed_after);
}

std::optional<size_t> StorePrefixes::LookupShard(size_t s, absl::Span<const cachestore::BlockKey> keys, bool use) {
  {
    absl::MutexLock l(&mu_);
    if (SteadyClock()->Now() < skip_lookups_until_[s]) {
      stats_.shards[s].lookups_skipped++;
      return std::nullopt;
    }
  }
  const absl::Duration start = SteadyClock()->Now();
  auto got = shards_[s].client->Lookup(keys, use);
  const absl::Duration end = SteadyClock()->Now();
  absl::MutexLock l(&mu_);
  stats_.shards[s].lookups++;
  if (!got.ok()) {
    stats_.shards[s].lookup_failures++;
    BackOffLocked(s, end - start);
    return std::nullopt;
  }
  return std::min<size_t>(got->first, keys.size());
}

int StorePrefixes::Lookup(absl::Span<const PrefixName> names, bool read_follows) {
  // Each shard is asked about its own blocks (those it holds a replica of), in prompt order; the
  // prefix ends at the first block none of its shards has among the leading blocks it holds.
  std::vector<std::vector<cachestore::BlockKey>> keys(shards_.size());
  // A block that will be read is read from one replica: the others count the lookup as a use, so
  // that their copies do not age out before the one read.
  const bool use = read_follows && options_.replicas > 1;
  // Where each block is asked: (shard, its place in that shard's keys).
  std::vector<absl::InlinedVector<std::pair<size_t, size_t>, 4>> asked_at(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t s : ShardsOf(names[i])) {
      asked_at[i].push_back({s, keys[s].size()});
      keys[s].push_back(ToKey(names[i]));
    }
  }
  // The shards at once: this thread asks the first that has blocks to ask about, a thread each
  // the others.
  std::vector<std::optional<size_t>> answer(shards_.size());
  std::vector<std::future<std::optional<size_t>>> asked(shards_.size());
  size_t here = shards_.size();
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (keys[s].empty()) continue;
    if (here == shards_.size()) {
      here = s;
    } else {
      asked[s] = std::async(std::launch::async, [this, s, &keys, use] { return LookupShard(s, keys[s], use); });
    }
  }
  if (here < shards_.size()) answer[here] = LookupShard(here, keys[here], use);
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (asked[s].valid()) answer[s] = asked[s].get();
  }
  size_t n = 0;
  const auto found_on_some = [&](size_t i) {
    return std::any_of(asked_at[i].begin(), asked_at[i].end(),
                       [&](const std::pair<size_t, size_t>& at) { return at.second < answer[at.first].value_or(0); });
  };
  while (n < names.size() && found_on_some(n)) ++n;
  absl::MutexLock l(&mu_);
  // A shard that answered lacks the first of its blocks it did not count (the ones after that
  // are unknown): found on another replica, that block is put back there when it is read.
  if (options_.replicas > 1) {
    if (repair_hints_.size() > kMaxRepairHints) repair_hints_.clear();
    for (size_t i = 0; i < n; ++i) {
      for (const auto& [s, at] : asked_at[i]) {
        if (!answer[s].has_value() || at != *answer[s]) continue;
        absl::InlinedVector<size_t, 2>& hint = repair_hints_[names[i]];
        if (!absl::c_linear_search(hint, s)) hint.push_back(s);
      }
    }
  }
  stats_.blocks_hit += static_cast<int64_t>(n);
  return static_cast<int>(n);
}

cachestore::BlockLayout StorePrefixes::FullLayout() const {
  cachestore::BlockLayout bl;
  bl.num_layers = layout_.num_layers;
  bl.num_kv_heads = layout_.num_kv_heads;
  bl.head_dim = layout_.head_dim;
  bl.tokens = static_cast<uint32_t>(options_.block_tokens);
  bl.encoding = layout_.dtype == DType::kBF16  ? cachestore::BlockEncoding::kBFloat16
                : layout_.dtype == DType::kF16 ? cachestore::BlockEncoding::kFloat16
                                               : cachestore::BlockEncoding::kFloat32;
  return bl;
}

cachestore::BlockLayout StorePrefixes::CompressedLayout(const KiviBlockFormat& format) const {
  cachestore::BlockLayout bl = FullLayout();
  bl.encoding = cachestore::BlockEncoding::kKivi;
  bl.bits = static_cast<uint8_t>(format.bits);
  bl.group = static_cast<uint16_t>(format.group);
  return bl;
}

absl::Status StorePrefixes::ReadBlocks(absl::Span<const PrefixName> names, const cachestore::BlockLayout& want,
                                       bool in_order, const BlockUse& use) {
  const auto start = std::chrono::steady_clock::now();
  // A block is asked of its first replica that has not failed it, shards whose lookups are backed
  // off or that lacked another block here last. A shard that fails as a whole (unreachable, timed
  // out) is not asked again in this call; one that lacks a block (missing, or a bad copy its read
  // deleted) may still be asked for others.
  std::vector<bool> backed_off(shards_.size()), failed(shards_.size(), false), lacked(shards_.size(), false);
  {
    absl::MutexLock l(&mu_);
    const absl::Duration now = SteadyClock()->Now();
    for (size_t s = 0; s < shards_.size(); ++s) backed_off[s] = now < skip_lookups_until_[s];
  }
  std::vector<absl::InlinedVector<size_t, 4>> replicas;
  for (const PrefixName& name : names) replicas.push_back(ShardsOf(name));
  std::vector<absl::InlinedVector<size_t, 2>> lacking(names.size());  // shards that lack block i
  // The shard to ask for block i; shards_.size() when none is left.
  const auto choose = [&](size_t i) {
    size_t pick = shards_.size();
    for (size_t s : replicas[i]) {
      if (failed[s] || absl::c_linear_search(lacking[i], s)) continue;
      if (!backed_off[s] && !lacked[s]) return s;
      if (pick == shards_.size()) pick = s;
    }
    return pick;
  };
  // A block read after a shard lacked it is put back there (read repair). An error of `use` is
  // not the shards': nothing is asked again after one, and it is the one returned.
  absl::Mutex use_mu;
  absl::Status use_error;
  const auto use_once = [&](size_t from, size_t i, absl::string_view block, const cachestore::BlockHeader& h) {
    absl::Status st = use(i, block, h);
    if (!st.ok()) {
      absl::MutexLock l(&use_mu);
      use_error.Update(st);
    } else if (options_.replicas > 1) {
      Repair(names[i], block, from, lacking[i]);
    }
    return st;
  };
  // Each batch's outcome, counted for its shard.
  const auto count = [this](size_t s, const absl::Status& st, size_t blocks, int64_t b) {
    absl::MutexLock l(&mu_);
    StoreShardStats& c = stats_.shards[s];
    c.bytes_read += b;
    c.blocks_read += static_cast<int64_t>(blocks);
    if (!st.ok()) c.read_failures++;
  };
  int64_t bytes = 0;
  // What is returned when a block cannot be had: a copy found bad (the engine shares its own
  // then) before any other error.
  absl::Status data_loss, other;
  bool stranded = false;
  std::vector<size_t> pending(names.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  while (!pending.empty() && !stranded) {
    // Batches of one shard each: in order, the leading run of pending blocks that share a shard;
    // else all of them, by shard.
    std::vector<std::pair<size_t, std::vector<size_t>>> batches;
    for (size_t i : pending) {
      const size_t s = choose(i);
      auto it = std::find_if(batches.begin(), batches.end(), [s](const auto& b) { return b.first == s; });
      if (in_order && !batches.empty() && it != batches.end() - 1) break;
      if (it == batches.end()) it = batches.insert(batches.end(), {s, {}});
      it->second.push_back(i);
    }
    // The shards at once, each on a thread of its own (this one reads the first) with its own UCX
    // reader: their blocks go to places of their own.
    std::vector<int64_t> got(batches.size(), 0);
    std::vector<std::vector<size_t>> handed(batches.size()), lacks(batches.size());
    std::vector<absl::Duration> took(batches.size());
    const auto read = [&](size_t k) {
      const size_t s = batches[k].first;
      const absl::Duration start = SteadyClock()->Now();
      // A block a shard lacks is passed over when another replica may have it.
      const bool pass_over = !in_order && options_.replicas > 1;
      absl::Status st = ReadFromShard(s, names, batches[k].second, want, pass_over, &got[k], &handed[k], &lacks[k],
                                      [&, s](size_t i, absl::string_view block, const cachestore::BlockHeader& h) {
                                        return use_once(s, i, block, h);
                                      });
      took[k] = SteadyClock()->Now() - start;
      return st;
    };
    std::vector<std::future<absl::Status>> rest;
    for (size_t k = 1; k < batches.size(); ++k) rest.push_back(std::async(std::launch::async, read, k));
    std::vector<bool> done(names.size(), false);
    for (size_t k = 0; k < batches.size(); ++k) {
      const size_t s = batches[k].first;
      const absl::Status outcome = k == 0 ? read(0) : rest[k - 1].get();
      bytes += got[k];
      count(s, outcome, handed[k].size(), got[k]);
      for (size_t i : handed[k]) done[i] = true;
      for (size_t i : lacks[k]) lacking[i].push_back(s);
      if (!lacks[k].empty()) lacked[s] = true;
      if (outcome.ok()) continue;
      // Blocks not handed over are asked again, of other replicas first.
      if (!absl::IsNotFound(outcome) && !absl::IsDataLoss(outcome)) {
        failed[s] = true;
        // The shard itself did not answer (not a block of its, nor this worker's use of one).
        if (absl::IsUnavailable(outcome) || absl::IsDeadlineExceeded(outcome)) BackOff(s, took[k]);
      }
      (absl::IsDataLoss(outcome) ? data_loss : other).Update(outcome);
    }
    std::erase_if(pending, [&](size_t i) { return done[i]; });
    absl::MutexLock l(&use_mu);
    stranded = !use_error.ok() ||
               std::any_of(pending.begin(), pending.end(), [&](size_t i) { return choose(i) == shards_.size(); });
  }
  absl::Status status;
  if (stranded) {
    absl::MutexLock l(&use_mu);
    status = !use_error.ok() ? use_error : !data_loss.ok() ? data_loss : other;
  }
  if (options_.link != nullptr) options_.link->Transfer(bytes, start);
  absl::MutexLock l(&mu_);
  if (status.ok()) {
    stats_.blocks_read += static_cast<int64_t>(names.size());
  } else {
    stats_.read_failures++;
  }
  return status;
}

void StorePrefixes::Repair(const PrefixName& name, absl::string_view block, size_t from,
                           absl::Span<const size_t> lacking) {
  absl::InlinedVector<size_t, 4> to(lacking.begin(), lacking.end());
  {
    absl::MutexLock l(&mu_);
    if (auto hint = repair_hints_.find(name); hint != repair_hints_.end()) {
      for (size_t s : hint->second) {
        if (!absl::c_linear_search(to, s)) to.push_back(s);
      }
      repair_hints_.erase(hint);
    }
  }
  to.erase(std::remove(to.begin(), to.end(), from), to.end());
  if (to.empty()) return;
  const auto shared = std::make_shared<const std::string>(block);  // copied outside the lock
  absl::MutexLock l(&mu_);
  for (size_t s : to) QueuePut(s, name, shared);
}

bool StorePrefixes::OutboxFull(size_t s) const {
  return outboxes_[s].bytes > options_.max_publish_queue_bytes / static_cast<int64_t>(shards_.size());
}

void StorePrefixes::QueuePut(size_t s, const PrefixName& name, const std::shared_ptr<const std::string>& block) {
  if (OutboxFull(s)) {
    stats_.shards[s].publish_dropped++;
    return;
  }
  outboxes_[s].bytes += static_cast<int64_t>(block->size());
  outboxes_[s].puts.push_back({ToKey(name), block});
}

absl::Status StorePrefixes::ReadFromShard(size_t s, absl::Span<const PrefixName> names, absl::Span<const size_t> idx,
                                          const cachestore::BlockLayout& want, bool pass_over, int64_t* bytes,
                                          std::vector<size_t>* handed, std::vector<size_t>* lacked,
                                          const BlockUse& use) {
  cachestore::StoreClient& client = *shards_[s].client;
  cachestore::UcxReader* const reader = shards_[s].reader.get();
  // One-sided reads go out in batches (about two round trips per batch); inline reads one block
  // at a time.
  std::vector<cachestore::BlockKey> keys;
  for (size_t i : idx) keys.push_back(ToKey(names[i]));
  // Remote blocks land in a buffer of the store's, one slot per block of the layout we want (a
  // block of another size does not fit and fails its read), at most 16 MiB of slots per batch.
  // Buffers are kept for the next read: a shard's read may run on a thread made for it.
  const size_t slot = cachestore::BlockBytes(want);
  const size_t per_batch = std::max<size_t>(1, (size_t{16} << 20) / slot);
  std::vector<char> buffer;
  {
    absl::MutexLock l(&buffers_mu_);
    if (!buffers_.empty()) {
      buffer = std::move(buffers_.back());
      buffers_.pop_back();
    }
  }
  struct GiveBack {
    StorePrefixes* p;
    std::vector<char>* buffer;
    ~GiveBack() {
      absl::MutexLock l(&p->buffers_mu_);
      p->buffers_.push_back(std::move(*buffer));
    }
  } give_back{this, &buffer};
  std::vector<absl::StatusOr<size_t>> sizes;
  absl::Status first_lacked;
  // A block the shard lacks (kNotFound; kDataLoss: a bad copy, which the client deletes) is
  // passed over with `pass_over`; any other error ends the read.
  const auto lacks = [&](size_t b, const absl::Status& st) {
    if (!absl::IsNotFound(st) && !absl::IsDataLoss(st)) return false;
    lacked->push_back(idx[b]);
    first_lacked.Update(st);
    return pass_over;
  };
  // A block that passes every check of its bytes but holds a NaN or infinity is no K/V a model
  // computes: it is deleted from the store (best effort), so that the prefix is computed and put
  // again rather than read and refused on every request.
  const auto refuse_values = [&](const cachestore::BlockKey& key) {
    client.Delete(key).IgnoreError();
    return absl::DataLossError(absl::StrCat("block ", key.Hex(), " holds a NaN or infinite value"));
  };
  for (size_t b = 0; b < keys.size(); ++b) {
    const cachestore::BlockKey& key = keys[b];
    if (reader != nullptr && b % per_batch == 0) {
      const size_t count = std::min(per_batch, keys.size() - b);
      if (buffer.size() < slot * count) buffer.resize(slot * count);
      std::vector<absl::Span<char>> slots;
      for (size_t i = 0; i < count; ++i) slots.emplace_back(buffer.data() + i * slot, slot);
      sizes = client.GetRemoteBatchInto(absl::MakeConstSpan(keys).subspan(b, count), slots, reader,
                                        &fingerprint_);
      // Every block of the batch, so that a read refused at its first such block still deletes
      // the others it fetched.
      for (size_t i = 0; i < count; ++i) {
        if (!sizes[i].ok()) continue;
        const absl::string_view got(buffer.data() + i * slot, *sizes[i]);
        const absl::StatusOr<cachestore::BlockHeader> gh = cachestore::DecodeBlockHeader(got);
        if (gh.ok() && gh->layout == want && !cachestore::BlockValuesFinite(got, *gh)) sizes[i] = refuse_values(keys[b + i]);
      }
    }
    absl::StatusOr<std::string> inline_block;
    absl::string_view block;
    if (reader != nullptr) {
      const absl::StatusOr<size_t>& size = sizes[b % per_batch];
      if (!size.ok()) {
        if (lacks(b, size.status())) continue;
        return size.status();
      }
      block = absl::string_view(buffer.data() + (b % per_batch) * slot, *size);
    } else {
      inline_block = client.Get(key, &fingerprint_);
      if (!inline_block.ok()) {
        if (lacks(b, inline_block.status())) continue;
        return inline_block.status();
      }
      block = *inline_block;
    }
    // Remote reads checked the checksums end to end; inline bytes are checked here. The model and
    // the layout are ours to check.
    absl::StatusOr<cachestore::BlockHeader> h = reader != nullptr ? cachestore::DecodeBlockHeader(block)
                                                                   : cachestore::VerifyBlock(block, fingerprint_);
    if (h.ok() && h->fingerprint != fingerprint_) {
      h = absl::DataLossError(absl::StrCat("block ", key.Hex(), " belongs to another model"));
    }
    if (h.ok() && h->layout != want) {
      h = absl::DataLossError(absl::StrCat("block ", key.Hex(), " has another KV layout"));
    }
    if (reader == nullptr && h.ok() && h->layout == want && !cachestore::BlockValuesFinite(block, *h)) {
      h = refuse_values(key);
    }
    if (!h.ok()) {
      if (lacks(b, h.status())) continue;
      return h.status();
    }
    *bytes += static_cast<int64_t>(block.size());
    VC_RETURN_IF_ERROR(use(idx[b], block, *h));
    handed->push_back(idx[b]);
  }
  return first_lacked;
}

absl::Status StorePrefixes::Read(absl::Span<const PrefixName> names, const PagedDest& dest) {
  const int64_t bt = options_.block_tokens;
  const int64_t row = layout_.row_bytes();
  if (dest.dtype() != layout_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("a read of ", DTypeName(layout_.dtype), " blocks into a ",
                                                   DTypeName(dest.dtype()), " cache"));
  }
  // Each block has its own place in dest, so the shards' blocks may come in any order.
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status read = ReadBlocks(names, FullLayout(), /*in_order=*/false,
                    [&](size_t b, absl::string_view block, const cachestore::BlockHeader& h) {
    for (int l = 0; l < layout_.num_layers; ++l) {
      const absl::string_view payload = cachestore::BlockLayerPayload(block, h, l);
      const char* k = payload.data();
      const char* v = k + bt * row;
      // Destination blocks hold layout_.block_size positions each, contiguous within a block.
      for (int64_t t = 0; t < bt; t += layout_.block_size) {
        const int64_t pos = static_cast<int64_t>(b) * bt + t;
        std::memcpy(dest.KRow(l, pos), k + t * row, layout_.block_size * row);
        std::memcpy(dest.VRow(l, pos), v + t * row, layout_.block_size * row);
      }
    }
    return absl::OkStatus();
  });
  if (read.ok()) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    absl::MutexLock l(&mu_);
    stats_.timed_read_bytes += static_cast<int64_t>(names.size()) * bt * layout_.bytes_per_token();
    stats_.read_seconds += seconds;
  }
  return read;
}

std::vector<PrefixName> StorePrefixes::CompressedNames(absl::string_view tenant, absl::Span<const int32_t> tokens,
                                                       const KiviBlockFormat& format) const {
  if (!HasCompressedForm(format, options_.block_tokens)) return {};
  return ChainNames(absl::StrCat("/kivi", format.bits, "g", format.group), tenant, tokens);
}

absl::Status StorePrefixes::ReadCompressed(absl::Span<const PrefixName> names, CompressedKvCache& cache, SeqId seq) {
  KiviBlockCodec* codec = cache.block_codec();
  if (codec == nullptr) return absl::FailedPreconditionError(absl::StrCat(cache.spec(), " has no stored block form"));
  const cachestore::BlockLayout want = CompressedLayout(codec->format());
  // Appended one after another: in order.
  return ReadBlocks(names, want, /*in_order=*/true, [&](size_t, absl::string_view block, const cachestore::BlockHeader& h) {
    std::vector<absl::string_view> layers;
    for (int l = 0; l < layout_.num_layers; ++l) layers.push_back(cachestore::BlockLayerPayload(block, h, l));
    return codec->AppendBlock(seq, options_.block_tokens, layers);
  });
}

void StorePrefixes::PublishCompressed(absl::Span<const PrefixName> names, int from, int to,
                                      const CompressedKvCache& cache, const PagedKvCache& full, SeqId seq) {
  const KiviBlockCodec* codec = cache.block_codec();
  if (codec == nullptr) return;
  const cachestore::BlockLayout bl = CompressedLayout(codec->format());
  std::vector<std::string> layers;
  Enqueue(names, from, to, [&](int b) -> absl::StatusOr<std::string> {
    VC_RETURN_IF_ERROR(
        codec->EncodeBlock(full, seq, int64_t{b} * options_.block_tokens, options_.block_tokens, &layers));
    return cachestore::EncodeBlock(fingerprint_, bl, std::vector<absl::string_view>(layers.begin(), layers.end()));
  });
}

void StorePrefixes::Publish(absl::Span<const PrefixName> names, int from, int to, const PagedKvCache& cache,
                            SeqId seq) {
  const int64_t bt = options_.block_tokens;
  const int64_t row = layout_.row_bytes();
  const cachestore::BlockLayout bl = FullLayout();
  std::vector<std::string> layers(layout_.num_layers);
  // A cache of another dtype than the store's names say has nothing to publish under them.
  if (cache.layout().dtype != layout_.dtype) return;
  Enqueue(names, from, to, [&](int b) {
    std::vector<absl::string_view> views;
    for (int l = 0; l < layout_.num_layers; ++l) {
      std::string& s = layers[l];
      s.resize(static_cast<size_t>(bl.layer_bytes()));
      char* k = s.data();
      char* v = k + bt * row;
      for (int64_t t = 0; t < bt; ++t) {
        const int64_t pos = int64_t{b} * bt + t;
        std::memcpy(k + t * row, cache.KRow(l, seq, pos), row);
        std::memcpy(v + t * row, cache.VRow(l, seq, pos), row);
      }
      views.push_back(s);
    }
    return cachestore::EncodeBlock(fingerprint_, bl, views);
  });
}

void StorePrefixes::Enqueue(absl::Span<const PrefixName> names, int from, int to,
                            const std::function<absl::StatusOr<std::string>(int)>& encode) {
  // Each shard's puts wait in its own outbox, of its share of the byte limit; a block is encoded
  // once for all its replicas, and not at all when all their outboxes are full.
  for (int b = from; b < to; ++b) {
    absl::InlinedVector<size_t, 4> to_shards;
    const absl::InlinedVector<size_t, 4> shards = ShardsOf(names[b]);  // hashing, outside the lock
    {
      absl::MutexLock l(&mu_);
      for (size_t s : shards) {
        if (OutboxFull(s)) {
          stats_.shards[s].publish_dropped++;
        } else {
          to_shards.push_back(s);
        }
      }
    }
    if (to_shards.empty()) continue;
    absl::StatusOr<std::string> block = encode(b);
    absl::MutexLock l(&mu_);
    if (!block.ok()) {
      stats_.shards[to_shards.front()].publish_failures++;  // one block, not one per copy
      continue;
    }
    const auto shared = std::make_shared<const std::string>(std::move(*block));
    for (size_t s : to_shards) QueuePut(s, names[b], shared);
  }
}

void StorePrefixes::PublishLoop(size_t s) {
  struct Wake {
    StorePrefixes* p;
    size_t s;
  } wake{this, s};
  while (true) {
    Put job;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](Wake* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->p->stop_ || !w->p->outboxes_[w->s].puts.empty(); },
          &wake));
      if (stop_) return;  // blocks not yet put are dropped: publishing is best effort
      job = std::move(outboxes_[s].puts.front());
      outboxes_[s].puts.pop_front();
      outboxes_[s].in_progress++;
    }
    const absl::Status st = shards_[s].client->Put(job.key, *job.block);
    absl::MutexLock l(&mu_);
    outboxes_[s].in_progress--;
    outboxes_[s].bytes -= static_cast<int64_t>(job.block->size());
    (st.ok() ? stats_.shards[s].blocks_published : stats_.shards[s].publish_failures)++;
  }
}

bool StorePrefixes::Flush(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
      +[](StorePrefixes* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
        for (const Outbox& o : p->outboxes_) {
          if (!o.puts.empty() || o.in_progress > 0) return false;
        }
        return true;
      },
      this), timeout);
}

StorePrefixStats StorePrefixes::stats() const {
  absl::MutexLock l(&mu_);
  // Counts kept per shard are summed here; blocks_hit, blocks_read and read_failures are counted
  // per prompt or per read.
  StorePrefixStats out = stats_;
  for (const StoreShardStats& s : stats_.shards) {
    out.lookups += s.lookups;
    out.lookup_failures += s.lookup_failures;
    out.lookups_skipped += s.lookups_skipped;
    out.bytes_read += s.bytes_read;
    out.blocks_published += s.blocks_published;
    out.publish_failures += s.publish_failures;
    out.publish_dropped += s.publish_dropped;
  }
  return out;
}

}  // namespace vc
