#include "tests/testing/blocks.h"

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

}  // namespace vc::testing
