#include "worker/store_prefixes.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

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
  std::unique_ptr<StorePrefixes> p(new StorePrefixes(options, fingerprint, layout));
  VC_ASSIGN_OR_RETURN(p->client_, cachestore::StoreClient::Create(options.store));
  // A store that refuses the token, or a target that is no store, would only ever look like a
  // store without prefixes: an error now. (One that is down may come up later.)
  if (const absl::Status st = p->client_->Stats().status();
      absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st) || absl::IsUnimplemented(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the store at ", options.store.target, " refused this worker: ", st.message()));
  }
  if (options.ucx != "off") {
    VC_ASSIGN_OR_RETURN(cachestore::UcxErrorMode mode, cachestore::ParseUcxErrorMode(options.ucx));
    VC_ASSIGN_OR_RETURN(p->reader_, cachestore::UcxReader::Create(mode));
  }
  p->publisher_ = std::thread([raw = p.get()] { raw->PublishLoop(); });
  return p;
}

StorePrefixes::~StorePrefixes() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (publisher_.joinable()) publisher_.join();
}

std::vector<PrefixName> StorePrefixes::Names(absl::Span<const int32_t> tokens) const {
  std::vector<PrefixName> out;
  for (const cachestore::BlockKey& k : cachestore::ChainBlockKeys(keys_, tokens)) out.push_back(k.bytes);
  return out;
}

int StorePrefixes::Lookup(absl::Span<const PrefixName> names) {
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() < skip_lookups_until_) {
      stats_.lookups_skipped++;
      return 0;
    }
  }
  std::vector<cachestore::BlockKey> keys;
  for (const PrefixName& n : names) keys.push_back(ToKey(n));
  const absl::Time start = absl::Now();
  auto got = client_->Lookup(keys);
  const absl::Time end = absl::Now();
  absl::MutexLock l(&mu_);
  stats_.lookups++;
  if (!got.ok()) {
    stats_.lookup_failures++;
    skip_lookups_until_ = end + std::max(8 * (end - start), absl::Milliseconds(50));
    return 0;
  }
  stats_.blocks_hit += got->first;
  return static_cast<int>(std::min<size_t>(got->first, names.size()));
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
                                       const std::function<absl::Status(size_t, absl::string_view,
                                                                        const cachestore::BlockHeader&)>& use) {
  int64_t bytes = 0;
  absl::Status status;
  const auto start = std::chrono::steady_clock::now();
  // One-sided reads go out in batches (about two round trips per batch); inline reads one block
  // at a time.
  std::vector<cachestore::BlockKey> keys;
  for (const PrefixName& n : names) keys.push_back(ToKey(n));
  // Remote blocks land in this thread's reusable buffer, one slot per block of the layout we want
  // (a block of another size does not fit and fails its read), at most 16 MiB of slots per batch.
  const size_t slot = cachestore::BlockBytes(want);
  const size_t per_batch = std::max<size_t>(1, (size_t{16} << 20) / slot);
  thread_local std::vector<char> buffer;
  std::vector<absl::StatusOr<size_t>> sizes;
  for (size_t b = 0; b < names.size() && status.ok(); ++b) {
    const cachestore::BlockKey& key = keys[b];
    if (reader_ != nullptr && b % per_batch == 0) {
      const size_t count = std::min(per_batch, names.size() - b);
      if (buffer.size() < slot * count) buffer.resize(slot * count);
      std::vector<absl::Span<char>> slots;
      for (size_t i = 0; i < count; ++i) slots.emplace_back(buffer.data() + i * slot, slot);
      sizes = client_->GetRemoteBatchInto(absl::MakeConstSpan(keys).subspan(b, count), slots, reader_.get(),
                                          &fingerprint_);
    }
    absl::StatusOr<std::string> inline_block;
    absl::string_view block;
    if (reader_ != nullptr) {
      const absl::StatusOr<size_t>& size = sizes[b % per_batch];
      if (!size.ok()) {
        status = size.status();
        break;
      }
      block = absl::string_view(buffer.data() + (b % per_batch) * slot, *size);
    } else {
      inline_block = client_->Get(key, &fingerprint_);
      if (!inline_block.ok()) {
        status = inline_block.status();
        break;
      }
      block = *inline_block;
    }
    // Remote reads checked the checksums end to end; inline bytes are checked here. The model and
    // the layout are ours to check.
    absl::StatusOr<cachestore::BlockHeader> h = reader_ != nullptr ? cachestore::DecodeBlockHeader(block)
                                                                   : cachestore::VerifyBlock(block, fingerprint_);
    if (h.ok() && h->fingerprint != fingerprint_) {
      h = absl::DataLossError(absl::StrCat("block ", key.Hex(), " belongs to another model"));
    }
    if (!h.ok()) {
      status = h.status();
      break;
    }
    if (h->layout != want) {
      status = absl::DataLossError(absl::StrCat("block ", key.Hex(), " has another KV layout"));
      break;
    }
    status = use(b, block, *h);
    bytes += static_cast<int64_t>(block.size());
  }
  if (options_.link != nullptr) options_.link->Transfer(bytes, start);
  absl::MutexLock l(&mu_);
  stats_.bytes_read += bytes;
  if (status.ok()) {
    stats_.blocks_read += static_cast<int64_t>(names.size());
  } else {
    stats_.read_failures++;
  }
  return status;
}

absl::Status StorePrefixes::Read(absl::Span<const PrefixName> names, const PagedDest& dest) {
  const int64_t bt = options_.block_tokens;
  const int64_t row = int64_t{layout_.num_kv_heads} * layout_.head_dim;
  return ReadBlocks(names, FullLayout(), [&](size_t b, absl::string_view block, const cachestore::BlockHeader& h) {
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
  return ReadBlocks(names, want, [&](size_t, absl::string_view block, const cachestore::BlockHeader& h) {
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
  for (int b = from; b < to; ++b) {
    {
      absl::MutexLock l(&mu_);
      if (queued_bytes_ > options_.max_publish_queue_bytes) {
        stats_.publish_dropped += to - b;
        return;
      }
    }
    absl::StatusOr<std::string> block = encode(b);
    absl::MutexLock l(&mu_);
    if (!block.ok()) {
      stats_.publish_failures++;
      continue;
    }
    queued_bytes_ += static_cast<int64_t>(block->size());
    queue_.emplace_back(ToKey(names[b]), std::move(*block));
  }
}

void StorePrefixes::PublishLoop() {
  while (true) {
    std::pair<cachestore::BlockKey, std::string> job;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](StorePrefixes* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->queue_.empty(); },
          this));
      if (stop_) return;  // blocks not yet put are dropped: publishing is best effort
      job = std::move(queue_.front());
      queue_.pop_front();
      in_progress_++;
    }
    const absl::Status st = client_->Put(job.first, job.second);
    absl::MutexLock l(&mu_);
    in_progress_--;
    queued_bytes_ -= static_cast<int64_t>(job.second.size());
    if (st.ok()) {
      stats_.blocks_published++;
    } else {
      stats_.publish_failures++;
    }
  }
}

void StorePrefixes::Flush() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](StorePrefixes* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->queue_.empty() && p->in_progress_ == 0; },
      this));
}

StorePrefixStats StorePrefixes::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

}  // namespace vc
