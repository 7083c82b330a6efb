// A PrefixStore in memory for engine tests: full KV of prefix blocks named by a chained hash of
// their tokens, with switches that make reads fail or deliver corrupt K/V, or hold lookups or reads.
// Thread-safe, as a PrefixStore must be (engines look up and read on threads of their own).
#ifndef VC_TESTS_TESTING_MEMORY_PREFIX_STORE_H_
#define VC_TESTS_TESTING_MEMORY_PREFIX_STORE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/prefixes/prefix_store.h"

namespace vc::testing {

// Full KV of prefix blocks kept in memory, named by a chained hash of their tokens. A switch makes
// reads fail (after scribbling over the destination) and another corrupts what they deliver.
class MemoryPrefixStore final : public PrefixStore {
 public:
  explicit MemoryPrefixStore(int block_tokens) : block_tokens_(block_tokens) {}

  int block_tokens() const override { return block_tokens_; }
  std::vector<PrefixName> Names(absl::string_view tenant, absl::Span<const int32_t> tokens) const override {
    std::vector<PrefixName> names;
    uint64_t h = 1469598103934665603ull;
    for (const char c : tenant) h = Mix(h ^ static_cast<uint8_t>(c));
    for (size_t b = 0; (b + 1) * block_tokens_ <= tokens.size(); ++b) {
      for (size_t i = b * block_tokens_; i < (b + 1) * block_tokens_; ++i) {
        h = Mix(h ^ static_cast<uint32_t>(tokens[i]));
      }
      PrefixName name{};
      for (int i = 0; i < 8; ++i) name[i] = static_cast<uint8_t>(h >> (8 * i));
      names.push_back(name);
    }
    return names;
  }
  // SplitMix64's finalizer: a bijection that spreads every input bit.
  static uint64_t Mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  int Lookup(absl::Span<const PrefixName> names, bool /*read_follows*/) override {
    while (hold_lookups) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> l(mu_);
    ++lookups;
    int n = 0;
    while (n < static_cast<int>(names.size()) && blocks_.count(names[n])) ++n;
    return n;
  }
  absl::Status Read(absl::Span<const PrefixName> names, const PagedDest& dest) override {
    while (hold_reads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> l(mu_);
    ++reads;
    for (size_t b = 0; b < names.size(); ++b) {
      auto it = blocks_.find(names[b]);
      if (it == blocks_.end()) return absl::NotFoundError("block evicted");
      const Block& blk = it->second;
      if (blk.dtype != dest.dtype()) return absl::InvalidArgumentError("block of another KV dtype");
      for (size_t l = 0; l < dest.layers.size(); ++l) {
        const int64_t kvd = int64_t{dest.layers[l].num_kv_heads} * dest.layers[l].head_dim;
        const int64_t row = kvd * static_cast<int64_t>(DTypeSize(blk.dtype));
        for (int i = 0; i < block_tokens_; ++i) {
          const int64_t pos = static_cast<int64_t>(b) * block_tokens_ + i;
          const size_t off = (l * block_tokens_ + i) * row;
          std::memcpy(dest.KRow(static_cast<int>(l), pos), blk.k.data() + off, row);
          std::memcpy(dest.VRow(static_cast<int>(l), pos), blk.v.data() + off, row);
          if (fail_reads || corrupt_reads) {
            std::vector<float> junk(static_cast<size_t>(kvd));
            for (int64_t j = 0; j < kvd; ++j) junk[j] = 3.0f * ((j % 7) - 3);
            NarrowFromF32(junk.data(), kvd, blk.dtype, dest.KRow(static_cast<int>(l), pos));
          }
        }
      }
      if (fail_reads) return absl::UnavailableError("store down");
    }
    return absl::OkStatus();
  }
  void Publish(absl::Span<const PrefixName> names, int from, int to, const PagedKvCache& cache, SeqId seq) override {
    std::lock_guard<std::mutex> l(mu_);
    const KvLayout& layout = cache.layout();
    const int64_t row = layout.row_bytes();
    for (int b = from; b < to; ++b) {
      ++published;
      Block blk;
      blk.dtype = layout.dtype;
      blk.k.resize(static_cast<size_t>(layout.num_layers * block_tokens_ * row));
      blk.v.resize(blk.k.size());
      for (int l = 0; l < layout.num_layers; ++l) {
        for (int i = 0; i < block_tokens_; ++i) {
          const int64_t pos = int64_t{b} * block_tokens_ + i;
          const size_t off = (static_cast<size_t>(l) * block_tokens_ + i) * row;
          std::memcpy(blk.k.data() + off, cache.KRow(l, seq, pos), row);
          std::memcpy(blk.v.data() + off, cache.VRow(l, seq, pos), row);
        }
      }
      blocks_[names[b]] = std::move(blk);
    }
  }

  std::atomic<bool> fail_reads = false;
  std::atomic<bool> corrupt_reads = false;
  std::atomic<bool> hold_lookups = false;  // lookups wait while it is set
  std::atomic<bool> hold_reads = false;    // reads wait while it is set
  std::atomic<int> lookups = 0;
  std::atomic<int> reads = 0;
  std::atomic<int> published = 0;
  size_t size() const {
    std::lock_guard<std::mutex> l(mu_);
    return blocks_.size();
  }

 private:
  struct Block {
    DType dtype = DType::kF32;
    std::vector<char> k, v;  // [layers, block_tokens, num_kv_heads * head_dim] elements of dtype
  };
  const int block_tokens_;
  mutable std::mutex mu_;
  std::map<PrefixName, Block> blocks_;
};

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_MEMORY_PREFIX_STORE_H_
