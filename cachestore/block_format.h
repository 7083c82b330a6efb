// The stored form of one KV block: a fixed header, then one payload per layer. The header carries
// the format version, the model fingerprint, the layout (with the encoding of the payloads), the
// token count and a CRC-32C of every layer's payload and of itself, so a reader can stream and
// check the block layer by layer. A block that fails any check is kDataLoss and must be dropped,
// never served.
//
// Encodings (BlockLayout::encoding):
//  - kFloat32 (format version 1): per layer K [tokens, kv_heads, head_dim] then V of the same
//    shape, float32, little-endian. The full KV a verify pass reads.
//  - kBFloat16, kFloat16 (format version 2): the same full KV in the model's 16-bit dtype (bf16 or
//    IEEE half), half the bytes.
//  - kKivi (format version 2): the compressed variant a worker drafts from. Per layer, per KV head
//    in order: K codes [tokens / group, head_dim, group * bits / 8] (per channel over each group
//    of `group` tokens), K scale and K min [tokens / group, head_dim] float32, V codes [tokens,
//    head_dim * bits / 8] (per token over groups of min(group, head_dim) channels), V scale and V
//    min [tokens, head_dim / min(group, head_dim)] float32. Codes are packed little-endian within
//    bytes (code i at bit i * bits); a value is min + code * scale.
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
inline constexpr uint16_t kBlockFormatVersion = 1;         // float32 blocks
inline constexpr uint16_t kEncodedBlockFormatVersion = 2;  // blocks of another encoding

enum class BlockEncoding : uint8_t { kFloat32 = 0, kKivi = 1, kBFloat16 = 2, kFloat16 = 3 };

// Whether blocks of `e` hold the full KV, element by element (float32, bf16 or f16).
inline bool IsFullKv(BlockEncoding e) {
  return e == BlockEncoding::kFloat32 || e == BlockEncoding::kBFloat16 || e == BlockEncoding::kFloat16;
}
// Bytes of one element of a full-KV encoding.
inline uint64_t FullKvElementBytes(BlockEncoding e) { return e == BlockEncoding::kFloat32 ? 4 : 2; }

struct BlockLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens = 0;  // tokens in this block
  BlockEncoding encoding = BlockEncoding::kFloat32;
  uint8_t bits = 0;     // kKivi: 2, 4 or 8
  uint16_t group = 0;   // kKivi: tokens per key group; divides tokens
  // Bytes of one layer's payload.
  uint64_t layer_bytes() const;
  // A kKivi layer's payload holds, for each KV head in turn, `codes` bytes of K codes, `k_floats`
  // floats of K scales then minimums, `codes` bytes of V codes and `v_floats` floats of V scales
  // then minimums. For a valid() kKivi layout only.
  struct KiviHead {
    uint64_t codes = 0, k_floats = 0, v_floats = 0;
    uint64_t bytes() const { return 2 * codes + 4 * (k_floats + v_floats); }
  };
  KiviHead kivi_head() const;
  // Whether the encoding's parameters fit the shape (a kKivi group divides the tokens, ...).
  bool valid() const;
  bool operator==(const BlockLayout&) const = default;
};

struct BlockHeader {
  uint16_t version = kBlockFormatVersion;
  std::array<uint8_t, 32> fingerprint{};  // model fingerprint (SHA-256)
  BlockLayout layout;
  std::vector<uint32_t> layer_crc;  // [num_layers]
};

// Serialized header size of a float32 block of `num_layers` layers.
size_t BlockHeaderBytes(uint32_t num_layers);
// Serialized header size of a block of `layout`.
size_t BlockHeaderBytes(const BlockLayout& layout);
// The bytes of a whole block of `layout`: its header and every layer's payload.
size_t BlockBytes(const BlockLayout& layout);

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
// The same checks for a block of any model (against its own fingerprint).
absl::StatusOr<BlockHeader> VerifyBlock(absl::string_view bytes);

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

// Whether every float a verified block holds is finite: a full block's K and V (float32, bf16 or
// f16), a KIVI block's scales and minimums (its codes are integers). A checksum vouches for the bytes as they were put,
// not for what they mean: K or V that no model computes would turn every logit that reads them
// into NaN.
bool BlockValuesFinite(absl::string_view block, const BlockHeader& header);

// Appends the low `bytes` bytes of v, least significant first; reads them back from in[at].
void PutLittleEndian(std::string* out, uint64_t v, int bytes);
uint64_t GetLittleEndian(absl::string_view in, size_t at, int bytes);

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_BLOCK_FORMAT_H_
