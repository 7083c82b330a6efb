// The stored form of one KV block: a fixed header, then per layer K [tokens, kv_heads, head_dim]
// and V of the same shape, float32, little-endian. The header carries the format version, the
// model fingerprint, the layout, the token count and a CRC-32C of every layer's payload and of
// itself, so a reader can stream and check the block layer by layer. A block that fails any check
// is kDataLoss and must be dropped, never served.
#ifndef VC_CACHESTORE_BLOCK_FORMAT_H_
#define VC_CACHESTORE_BLOCK_FORMAT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cachestore/crc32c.h"  // the checksum, Crc32c

namespace vc::cachestore {

inline constexpr uint32_t kBlockMagic = 0x564b4356;  // "VCKV"
inline constexpr uint16_t kBlockFormatVersion = 1;

struct BlockLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens = 0;  // tokens in this block
  // Bytes of one layer's K and V.
  uint64_t layer_bytes() const { return uint64_t{2} * tokens * num_kv_heads * head_dim * 4; }
};

struct BlockHeader {
  uint16_t version = kBlockFormatVersion;
  std::array<uint8_t, 32> fingerprint{};  // model fingerprint (SHA-256)
  BlockLayout layout;
  std::vector<uint32_t> layer_crc;  // [num_layers]
};

// Serialized header size for `num_layers` layers.
size_t BlockHeaderBytes(uint32_t num_layers);

// Builds a block from per-layer payloads (each layout.layer_bytes() long). kInvalidArgument when a
// payload has the wrong size.
absl::StatusOr<std::string> EncodeBlock(const std::array<uint8_t, 32>& fingerprint, const BlockLayout& layout,
                                        const std::vector<absl::string_view>& layers);

// Parses and checks the header at the start of `bytes` (the payload may follow or be absent).
// kDataLoss for a bad magic, version, size or header checksum.
absl::StatusOr<BlockHeader> DecodeBlockHeader(absl::string_view bytes);

// Checks a whole block: header, `expect_fingerprint` (kFailedPrecondition when another model's),
// total size and every layer checksum (kDataLoss). Returns the header.
absl::StatusOr<BlockHeader> VerifyBlock(absl::string_view bytes, const std::array<uint8_t, 32>& expect_fingerprint);

// Copies the block of `size` bytes at `src` to `dest` (at least `size` bytes, not overlapping) and
// checks the copy as VerifyBlock does, in one pass: every layer's checksum is computed from the
// bytes as they are written to `dest` (CopyCrc32c), so the result vouches for `dest` even when
// `src` is memory another process may change meanwhile. `expect_fingerprint` null: any model's
// block. On an error, `dest` holds an unspecified prefix of what was read and must not be used.
// `streaming`: the layers are copied with CopyCrc32cStreaming (for a copy that is part of more
// than the caches hold, whose destination is not read again right away).
absl::StatusOr<BlockHeader> CopyAndVerifyBlock(const char* src, size_t size, char* dest,
                                               const std::array<uint8_t, 32>* expect_fingerprint,
                                               bool streaming = false);

// The payload of `layer` inside a verified block.
absl::string_view BlockLayerPayload(absl::string_view block, const BlockHeader& header, uint32_t layer);

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_BLOCK_FORMAT_H_
