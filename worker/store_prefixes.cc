#include "worker/store_prefixes.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cachestore/block_format.h"
#include "cachestore/block_key.h"
#include "common/status_macros.h"
#include "openssl/evp.h"

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
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || absl::EndsWith(name, ".safetensors")) files.push_back(name);
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  if (std::find(files.begin(), files.end(), "config.json") == files.end()) {
    return absl::NotFoundError(absl::StrCat(dir, " has no config.json"));
  }
  if (files.size() < 2) return absl::NotFoundError(absl::StrCat(dir, " has no .safetensors weights"));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  for (const std::string& name : files) {
    const uint32_t len = static_cast<uint32_t>(name.size());
    EVP_DigestUpdate(ctx.get(), &len, sizeof(len));
    EVP_DigestUpdate(ctx.get(), name.data(), name.size());
    std::ifstream in(fs::path(dir) / name, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", dir, "/", name));
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
    }
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
  keys_.layout = absl::StrCat("f32/l", layout.num_layers, "/h", layout.num_kv_heads, "/d", layout.head_dim);
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
    // store without prefixes: an error now. (One that is down may come up later.)
    if (const absl::Status st = shard.client->Stats().status();
        absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st) || absl::IsUnimplemented(st)) {
      return absl::FailedPreconditionError(absl::StrCat("the store at ", target, " refused this worker: ", st.message()));
    }
    p->shards_.push_back(std::move(shard));
  }
  {
    absl::MutexLock l(&p->mu_);
    p->skip_lookups_until_.assign(p->shards_.size(), absl::InfinitePast());
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

std::vector<PrefixName> StorePrefixes::Names(absl::Span<const int32_t> tokens) const {
  std::vector<PrefixName> out;
  for (const cachestore::BlockKey& k : cachestore::ChainBlockKeys(keys_, tokens)) out.push_back(k.bytes);
  return out;
}

size_t StorePrefixes::ShardOf(const PrefixName& name) const {
  if (shards_.size() == 1) return 0;
  // Rendezvous hashing: the shard whose salted hash of the name is highest. Names are SHA-256
  // digests, so 8 of their bytes mixed with each shard's salt (SplitMix64's finalizer) suffice.
  uint64_t word;
  std::memcpy(&word, name.data(), sizeof(word));
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    uint64_t z = word ^ shards_[s].seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (s == 0 || z > best_score) best = s, best_score = z;
  }
  return best;
}

size_t StorePrefixes::LookupShard(size_t s, absl::Span<const cachestore::BlockKey> keys) {
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() < skip_lookups_until_[s]) {
      stats_.shards[s].lookups_skipped++;
      return 0;
    }
  }
  const absl::Time start = absl::Now();
  auto got = shards_[s].client->Lookup(std::vector<cachestore::BlockKey>(keys.begin(), keys.end()));
  const absl::Time end = absl::Now();
  absl::MutexLock l(&mu_);
  stats_.shards[s].lookups++;
  if (!got.ok()) {
    stats_.shards[s].lookup_failures++;
    skip_lookups_until_[s] = end + std::max(8 * (end - start), absl::Milliseconds(50));
    return 0;
  }
  return std::min<size_t>(got->first, keys.size());
}

int StorePrefixes::Lookup(absl::Span<const PrefixName> names) {
  // Each shard is asked about its own blocks, in prompt order; the prefix ends at the first block
  // missing from its shard.
  std::vector<std::vector<cachestore::BlockKey>> keys(shards_.size());
  std::vector<std::vector<size_t>> idx(shards_.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const size_t s = ShardOf(names[i]);
    keys[s].push_back(ToKey(names[i]));
    idx[s].push_back(i);
  }
  std::vector<size_t> found(shards_.size(), 0);
  std::vector<std::future<size_t>> asked(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (keys[s].empty()) continue;
    if (shards_.size() == 1) {
      found[s] = LookupShard(s, keys[s]);
    } else {
      asked[s] = std::async(std::launch::async, [this, s, &keys] { return LookupShard(s, keys[s]); });
    }
  }
  size_t n = names.size();
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (keys[s].empty()) continue;
    if (asked[s].valid()) found[s] = asked[s].get();
    if (found[s] < idx[s].size()) n = std::min(n, idx[s][found[s]]);
  }
  absl::MutexLock l(&mu_);
  stats_.blocks_hit += static_cast<int64_t>(n);
  return static_cast<int>(n);
}

cachestore::BlockLayout StorePrefixes::FullLayout() const {
  cachestore::BlockLayout bl;
  bl.num_layers = layout_.num_layers;
  bl.num_kv_heads = layout_.num_kv_heads;
  bl.head_dim = layout_.head_dim;
  bl.tokens = static_cast<uint32_t>(options_.block_tokens);
  return bl;
}

cachestore::BlockLayout StorePrefixes::CompressedLayout(const CompressedKvCache::BlockCodec& codec) const {
  cachestore::BlockLayout bl = FullLayout();
  bl.encoding = cachestore::BlockEncoding::kKivi;
  bl.bits = static_cast<uint8_t>(codec.bits);
  bl.group = static_cast<uint16_t>(codec.group);
  return bl;
}

absl::Status StorePrefixes::ReadBlocks(absl::Span<const PrefixName> names, const cachestore::BlockLayout& want,
                                       bool in_order,
                                       const std::function<absl::Status(size_t, absl::string_view,
                                                                        const cachestore::BlockHeader&)>& use) {
  int64_t bytes = 0;
  absl::Status status;
  const auto start = std::chrono::steady_clock::now();
  // Batches of one shard each: runs of consecutive blocks in order, or all of a shard's blocks.
  std::vector<std::pair<size_t, std::vector<size_t>>> batches;
  if (in_order) {
    for (size_t i = 0; i < names.size(); ++i) {
      const size_t s = ShardOf(names[i]);
      if (batches.empty() || batches.back().first != s) batches.push_back({s, {}});
      batches.back().second.push_back(i);
    }
  } else {
    std::vector<std::vector<size_t>> by_shard(shards_.size());
    for (size_t i = 0; i < names.size(); ++i) by_shard[ShardOf(names[i])].push_back(i);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (!by_shard[s].empty()) batches.push_back({s, std::move(by_shard[s])});
    }
  }
  // Each batch's outcome, counted for its shard.
  const auto count = [this](size_t s, const absl::Status& st, size_t blocks, int64_t b) {
    absl::MutexLock l(&mu_);
    StoreShardStats& c = stats_.shards[s];
    c.bytes_read += b;
    if (st.ok()) {
      c.blocks_read += static_cast<int64_t>(blocks);
    } else {
      c.read_failures++;
    }
  };
  // In order, one batch after another (stopping at a failure); else the shards at once, each on a
  // thread of its own (this one reads the first) with its own UCX reader: their blocks go to
  // places of their own.
  const bool at_once = !in_order && batches.size() > 1;
  std::vector<int64_t> got(batches.size(), 0);
  std::vector<std::future<absl::Status>> rest;
  for (size_t i = 1; at_once && i < batches.size(); ++i) {
    rest.push_back(std::async(std::launch::async, [&, i] {
      return ReadFromShard(batches[i].first, names, batches[i].second, want, &got[i], use);
    }));
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const absl::Status outcome = at_once && i > 0 ? rest[i - 1].get()
                                                  : ReadFromShard(batches[i].first, names, batches[i].second, want,
                                                                  &got[i], use);
    status.Update(outcome);
    bytes += got[i];
    count(batches[i].first, outcome, batches[i].second.size(), got[i]);
    if (!at_once && !status.ok()) break;
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

absl::Status StorePrefixes::ReadFromShard(size_t s, absl::Span<const PrefixName> names, absl::Span<const size_t> idx,
                                          const cachestore::BlockLayout& want, int64_t* bytes,
                                          const std::function<absl::Status(size_t, absl::string_view,
                                                                           const cachestore::BlockHeader&)>& use) {
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
  for (size_t b = 0; b < keys.size(); ++b) {
    const cachestore::BlockKey& key = keys[b];
    if (reader != nullptr && b % per_batch == 0) {
      const size_t count = std::min(per_batch, keys.size() - b);
      if (buffer.size() < slot * count) buffer.resize(slot * count);
      std::vector<absl::Span<char>> slots;
      for (size_t i = 0; i < count; ++i) slots.emplace_back(buffer.data() + i * slot, slot);
      sizes = client.GetRemoteBatchInto(absl::MakeConstSpan(keys).subspan(b, count), slots, reader,
                                        &fingerprint_);
    }
    absl::StatusOr<std::string> inline_block;
    absl::string_view block;
    if (reader != nullptr) {
      const absl::StatusOr<size_t>& size = sizes[b % per_batch];
      if (!size.ok()) return size.status();
      block = absl::string_view(buffer.data() + (b % per_batch) * slot, *size);
    } else {
      inline_block = client.Get(key, &fingerprint_);
      if (!inline_block.ok()) return inline_block.status();
      block = *inline_block;
    }
    // Remote reads checked the checksums end to end; inline bytes are checked here. The model and
    // the layout are ours to check.
    absl::StatusOr<cachestore::BlockHeader> h = reader != nullptr ? cachestore::DecodeBlockHeader(block)
                                                                   : cachestore::VerifyBlock(block, fingerprint_);
    if (h.ok() && h->fingerprint != fingerprint_) {
      h = absl::DataLossError(absl::StrCat("block ", key.Hex(), " belongs to another model"));
    }
    if (!h.ok()) return h.status();
    if (h->layout != want) return absl::DataLossError(absl::StrCat("block ", key.Hex(), " has another KV layout"));
    VC_RETURN_IF_ERROR(use(idx[b], block, *h));
    *bytes += static_cast<int64_t>(block.size());
  }
  return absl::OkStatus();
}

absl::Status StorePrefixes::Read(absl::Span<const PrefixName> names, const PagedDest& dest) {
  const int64_t bt = options_.block_tokens;
  const int64_t row = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  // Each block has its own place in dest, so the shards' blocks may come in any order.
  return ReadBlocks(names, FullLayout(), /*in_order=*/false,
                    [&](size_t b, absl::string_view block, const cachestore::BlockHeader& h) {
    for (int l = 0; l < layout_.num_layers; ++l) {
      const absl::string_view payload = cachestore::BlockLayerPayload(block, h, l);
      const float* k = reinterpret_cast<const float*>(payload.data());
      const float* v = k + bt * row;
      // Destination blocks hold layout_.block_size positions each, contiguous within a block.
      for (int64_t t = 0; t < bt; t += layout_.block_size) {
        const int64_t pos = static_cast<int64_t>(b) * bt + t;
        std::memcpy(dest.K(l, pos), k + t * row, layout_.block_size * row * 4);
        std::memcpy(dest.V(l, pos), v + t * row, layout_.block_size * row * 4);
      }
    }
    return absl::OkStatus();
  });
}

std::vector<PrefixName> StorePrefixes::CompressedNames(absl::Span<const int32_t> tokens,
                                                       const CompressedKvCache::BlockCodec& codec) const {
  if (codec.bits == 0 || options_.block_tokens % codec.group != 0) return {};
  cachestore::KeyContext k = keys_;
  k.layout = absl::StrCat(keys_.layout, "/kivi", codec.bits, "g", codec.group);
  std::vector<PrefixName> out;
  for (const cachestore::BlockKey& key : cachestore::ChainBlockKeys(k, tokens)) out.push_back(key.bytes);
  return out;
}

absl::Status StorePrefixes::ReadCompressed(absl::Span<const PrefixName> names, CompressedKvCache& cache, SeqId seq) {
  const CompressedKvCache::BlockCodec codec = cache.block_codec();
  if (codec.bits == 0) return absl::FailedPreconditionError(absl::StrCat(cache.spec(), " has no stored block form"));
  const cachestore::BlockLayout want = CompressedLayout(codec);
  // Appended one after another: in order.
  return ReadBlocks(names, want, /*in_order=*/true, [&](size_t, absl::string_view block, const cachestore::BlockHeader& h) {
    std::vector<absl::string_view> layers;
    for (int l = 0; l < layout_.num_layers; ++l) layers.push_back(cachestore::BlockLayerPayload(block, h, l));
    return cache.AppendBlock(seq, options_.block_tokens, layers);
  });
}

void StorePrefixes::PublishCompressed(absl::Span<const PrefixName> names, int from, int to,
                                      const CompressedKvCache& codec, const PagedKvCache& full, SeqId seq) {
  const CompressedKvCache::BlockCodec c = codec.block_codec();
  if (c.bits == 0) return;
  const cachestore::BlockLayout bl = CompressedLayout(c);
  std::vector<std::string> layers;
  Enqueue(names, from, to, [&](int b) -> absl::StatusOr<std::string> {
    VC_RETURN_IF_ERROR(
        codec.EncodeBlock(full, seq, int64_t{b} * options_.block_tokens, options_.block_tokens, &layers));
    return cachestore::EncodeBlock(fingerprint_, bl, std::vector<absl::string_view>(layers.begin(), layers.end()));
  });
}

void StorePrefixes::Publish(absl::Span<const PrefixName> names, int from, int to, const PagedKvCache& cache,
                            SeqId seq) {
  const int64_t bt = options_.block_tokens;
  const int64_t row = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  const cachestore::BlockLayout bl = FullLayout();
  std::vector<std::string> layers(layout_.num_layers);
  Enqueue(names, from, to, [&](int b) {
    std::vector<absl::string_view> views;
    for (int l = 0; l < layout_.num_layers; ++l) {
      std::string& s = layers[l];
      s.resize(static_cast<size_t>(bl.layer_bytes()));
      char* k = s.data();
      char* v = k + bt * row * 4;
      for (int64_t t = 0; t < bt; ++t) {
        const int64_t pos = int64_t{b} * bt + t;
        std::memcpy(k + t * row * 4, cache.K(l, seq, pos), row * 4);
        std::memcpy(v + t * row * 4, cache.V(l, seq, pos), row * 4);
      }
      views.push_back(s);
    }
    return cachestore::EncodeBlock(fingerprint_, bl, views);
  });
}

void StorePrefixes::Enqueue(absl::Span<const PrefixName> names, int from, int to,
                            const std::function<absl::StatusOr<std::string>(int)>& encode) {
  // Each shard's puts wait in its own outbox, of its share of the byte limit.
  const int64_t limit = options_.max_publish_queue_bytes / static_cast<int64_t>(shards_.size());
  for (int b = from; b < to; ++b) {
    const size_t s = ShardOf(names[b]);
    {
      absl::MutexLock l(&mu_);
      if (outboxes_[s].bytes > limit) {
        stats_.shards[s].publish_dropped++;
        continue;
      }
    }
    absl::StatusOr<std::string> block = encode(b);
    absl::MutexLock l(&mu_);
    if (!block.ok()) {
      stats_.shards[s].publish_failures++;
      continue;
    }
    outboxes_[s].bytes += static_cast<int64_t>(block->size());
    outboxes_[s].puts.push_back({ToKey(names[b]), std::move(*block)});
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
    const absl::Status st = shards_[s].client->Put(job.key, job.block);
    absl::MutexLock l(&mu_);
    outboxes_[s].in_progress--;
    outboxes_[s].bytes -= static_cast<int64_t>(job.block.size());
    (st.ok() ? stats_.shards[s].blocks_published : stats_.shards[s].publish_failures)++;
  }
}

void StorePrefixes::Flush() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](StorePrefixes* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
        for (const Outbox& o : p->outboxes_) {
          if (!o.puts.empty() || o.in_progress > 0) return false;
        }
        return true;
      },
      this));
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
