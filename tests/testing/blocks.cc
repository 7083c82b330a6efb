#include "tests/testing/blocks.h"

#include <cstring>
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

}  // namespace

std::string RandomBlock(uint32_t seed, uint8_t fingerprint_byte, std::array<uint8_t, 32>* fingerprint) {
  return RandomBlockOf(seed, fingerprint_byte, cachestore::BlockLayout{2, 2, 8, 16}, fingerprint);
}

std::string LargeRandomBlock(uint32_t seed, uint8_t fingerprint_byte, int tokens) {
  return RandomBlockOf(seed, fingerprint_byte, cachestore::BlockLayout{2, 8, 128, static_cast<uint32_t>(tokens)}, nullptr);
}

absl::Status CorruptInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                          const cachestore::BlockKey& key, size_t from_end, uint8_t mask, bool* released) {
  const std::string salt = cachestore::BlockStore::TenantSalt(secret, tenant);
  absl::StatusOr<cachestore::BlockLease> lease = store.ram().Lease(cachestore::BlockStore::Scoped(salt, key));
  if (!lease.ok()) return lease.status();
  const_cast<char*>(store.ram().region())[lease->offset + lease->size - from_end] ^= static_cast<char>(mask);
  const bool live = store.ram().Release(lease->id).ok();
  if (released != nullptr) *released = live;
  return absl::OkStatus();
}

absl::Status PoisonInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                         const cachestore::BlockKey& key) {
  const std::string salt = cachestore::BlockStore::TenantSalt(secret, tenant);
  absl::StatusOr<cachestore::BlockLease> lease = store.ram().Lease(cachestore::BlockStore::Scoped(salt, key));
  if (!lease.ok()) return lease.status();
  char* at = const_cast<char*>(store.ram().region()) + lease->offset;
  const absl::string_view block(at, lease->size);
  absl::StatusOr<cachestore::BlockHeader> h = cachestore::VerifyBlock(block);
  absl::Status status = h.status();
  if (h.ok()) {
    std::vector<std::string> layers;
    for (uint32_t l = 0; l < h->layout.num_layers; ++l) {
      layers.emplace_back(cachestore::BlockLayerPayload(block, *h, l));
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(layers[0].data(), &nan, 4);
    absl::StatusOr<std::string> poisoned =
        cachestore::EncodeBlock(h->fingerprint, h->layout, std::vector<absl::string_view>(layers.begin(), layers.end()));
    status = poisoned.status();
    if (poisoned.ok()) std::memcpy(at, poisoned->data(), poisoned->size());
  }
  store.ram().Release(lease->id).IgnoreError();
  return status;
}

}  // namespace vc::testing
