// Names of KV blocks in the cache store: a chain of SHA-256 digests over fixed token blocks.
//
//   h_0 = 0^32,  h_i = SHA-256(h_{i-1} || fingerprint || layout || tenant salt || tokens of block i)
//
// with every variable-length field length-prefixed. A block's key commits to the whole prefix
// before it, to the model and KV layout (the same tokens under another model never match) and to
// the tenant (one tenant's prefixes are invisible to another, whose lookups cannot even probe
// them). Collision resistance matters: a collision would feed wrong KV into a pass whose output is
// promised exact.
#ifndef VC_CACHESTORE_BLOCK_KEY_H_
#define VC_CACHESTORE_BLOCK_KEY_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace vc::cachestore {

struct BlockKey {
  std::array<uint8_t, 32> bytes{};
  std::string Hex() const;
  bool operator==(const BlockKey& o) const { return bytes == o.bytes; }
  bool operator!=(const BlockKey& o) const { return bytes != o.bytes; }
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine_contiguous(std::move(h), k.bytes.data(), k.bytes.size());
  }
};

// What a chain of keys is bound to. The tenant salt is derived by the server from the
// authenticated tenant, never taken from a request.
struct KeyContext {
  std::string model_fingerprint;  // e.g. ModelFingerprint() of the checkpoint
  std::string layout;             // e.g. KvLayoutTag() of the cache layout
  std::string tenant_salt;
  int block_tokens = 16;
};

// SHA-256 of `data`. Thread-safe.
std::array<uint8_t, 32> Sha256(absl::string_view data);

// Keys of the full blocks of `tokens` (a trailing partial block gets none). Thread-safe.
std::vector<BlockKey> ChainBlockKeys(const KeyContext& context, absl::Span<const int32_t> tokens);

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_BLOCK_KEY_H_
