#include "tests/testing/blocks.h"

#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "cachestore/block_format.h"
#include "cachestore/block_key.h"

namespace vc::testing {

namespace {

std::string RandomBlockOf(uint32_t seed, uint8_t fingerprint_byte, const cachestore::BlockLayout& layout,
                          std::array<uint8_t, 32>* fingerprint) {
  std::array<uint8_t, 32> fp{};
  fp[0] = fingerprint_byte;
  if (fingerprint != nullptr) *fingerprint = fp;
  std::mt19937 rng(seed);
  std::vector<std::string> layers(2, std::string(layout.layer_bytes(), '\0'));
  for (auto& l : layers) {
    for (char& c : l) c = static_cast<char>(rng());
  }
  return *cachestore::EncodeBlock(fp, layout, {layers[0], layers[1]});
}

// Calls edit(bytes, size) on the stored copy in `store`'s RAM tier of `tenant`'s block `key`,
// found under a lease. *released (when given): whether the lease was still live when released.
absl::Status EditInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                       const cachestore::BlockKey& key, const std::function<absl::Status(char*, size_t)>& edit,
                       bool* released) {
  const std::string salt = cachestore::BlockStore::TenantSalt(secret, tenant);
  absl::StatusOr<cachestore::BlockLease> lease = store.ram().Lease(cachestore::BlockStore::Scoped(salt, key));
  if (!lease.ok()) return lease.status();
  const absl::Status edited = edit(const_cast<char*>(store.ram().region()) + lease->offset, lease->size);
  const bool live = store.ram().Release(lease->id).ok();
  if (released != nullptr) *released = live;
  return edited;
}

}  // namespace

std::string RandomBlock(uint32_t seed, uint8_t fingerprint_byte, std::array<uint8_t, 32>* fingerprint) {
  return RandomBlockOf(seed, fingerprint_byte, cachestore::BlockLayout{2, 2, 8, 16}, fingerprint);
}

std::string LargeRandomBlock(uint32_t seed, uint8_t fingerprint_byte, int tokens) {
  return RandomBlockOf(seed, fingerprint_byte, cachestore::BlockLayout{2, 8, 128, static_cast<uint32_t>(tokens)}, nullptr);
}

absl::Status CorruptInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                          const cachestore::BlockKey& key, size_t from_end, uint8_t mask, bool* released) {
  return EditInRam(
      store, secret, tenant, key,
      [&](char* block, size_t size) {
        block[size - from_end] ^= static_cast<char>(mask);
        return absl::OkStatus();
      },
      released);
}

absl::Status PoisonInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                         const cachestore::BlockKey& key) {
  return EditInRam(
      store, secret, tenant, key,
      [](char* at, size_t size) -> absl::Status {
        const absl::string_view block(at, size);
        absl::StatusOr<cachestore::BlockHeader> h = cachestore::VerifyBlock(block);
        if (!h.ok()) return h.status();
        std::vector<std::string> layers;
        for (uint32_t l = 0; l < h->layout.num_layers; ++l) layers.emplace_back(cachestore::BlockLayerPayload(block, *h, l));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(layers[0].data(), &nan, 4);
        absl::StatusOr<std::string> poisoned = cachestore::EncodeBlock(
            h->fingerprint, h->layout, std::vector<absl::string_view>(layers.begin(), layers.end()));
        if (!poisoned.ok()) return poisoned.status();
        std::memcpy(at, poisoned->data(), poisoned->size());
        return absl::OkStatus();
      },
      nullptr);
}

}  // namespace vc::testing
