// Block keys and the block format: chaining, isolation by model, layout and tenant, every
// corruption detected, and the checksum's fast version against its reference.
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "absl/strings/escaping.h"
#include "cachestore/block_format.h"
#include "common/dtype.h"
#include "cachestore/block_key.h"
#include "cachestore/crc32c.h"
#include "gtest/gtest.h"

namespace vc::cachestore {
namespace {

TEST(Sha256, KnownAnswer) {
  BlockKey k;
  k.bytes = Sha256("abc");
  EXPECT_EQ(k.Hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Crc32c, KnownAnswers) {
  for (auto crc : {&Crc32c, &Crc32cPortable}) {
    EXPECT_EQ(crc("123456789", 0), 0xe3069283u);  // the CRC-32C check value
    EXPECT_EQ(crc("", 0), 0u);
    EXPECT_EQ(crc(std::string(32, '\0'), 0), 0x8a9136aau);  // RFC 3720 B.4
    EXPECT_EQ(crc(std::string(32, '\xff'), 0), 0x62a8ab43u);
  }
}

// The fast version against the reference, bit for bit: lengths around each stretch boundary of
// the three-way split, every start alignment, and continued CRCs.
TEST(Crc32c, FastMatchesReference) {
  std::mt19937 rng(11);
  std::string buf(3 * 8192 * 3 + 64, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 3 * 256 * 2 + 5, 24575, 24576, 24577,
                                 3 * 8192 * 2 + 3 * 256 + 13, 3 * 8192 * 3};
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % (buf.size() - 8));
  for (size_t len : lengths) {
    for (size_t align = 0; align < 8; ++align) {
      const absl::string_view d(buf.data() + align, len);
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(Crc32c(d, seed), Crc32cPortable(d, seed)) << "length " << len << ", offset " << align;
      ASSERT_EQ(crc32c_internal::Crc32cSse42(d, seed), Crc32cPortable(d, seed)) << "length " << len;
    }
  }
  const absl::string_view all(buf);
  EXPECT_EQ(Crc32c(all.substr(1000), Crc32c(all.substr(0, 1000))), Crc32cPortable(all));
  std::cout << "Crc32c implementation: " << Crc32cImplementation() << "\n";
}

// The fused copy and checksum: the same CRC as the reference, the same bytes as the source, nothing
// written outside the destination; random lengths, source and destination alignments, seeds.
TEST(Crc32c, CopyMatchesReference) {
  std::mt19937 rng(12);
  std::string src(3 * 8192 * 3 + 64, '\0');
  for (char& c : src) c = static_cast<char>(rng());
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 24575, 24576, 24577, 3 * 8192 * 3};
  for (int i = 0; i < 300; ++i) lengths.push_back(rng() % (src.size() - 8));
  std::string dest(src.size() + 32, '\0');
  for (size_t len : lengths) {
    const size_t from = rng() % 8, to = rng() % 16;
    const uint32_t seed = static_cast<uint32_t>(rng());
    std::fill(dest.begin(), dest.end(), '\x5a');
    const absl::string_view s(src.data() + from, len);
    ASSERT_EQ(CopyCrc32c(dest.data() + 8 + to, s, seed), Crc32cPortable(s, seed))
        << "length " << len << ", source offset " << from << ", destination offset " << to;
    ASSERT_EQ(absl::string_view(dest.data() + 8 + to, len), s) << "length " << len;
    for (size_t i = 0; i < 8 + to; ++i) ASSERT_EQ(dest[i], '\x5a');
    for (size_t i = 8 + to + len; i < dest.size(); ++i) ASSERT_EQ(dest[i], '\x5a');
    std::fill(dest.begin(), dest.end(), '\x5a');
    ASSERT_EQ(crc32c_internal::CopyCrc32cSse42(dest.data() + to, s, seed), Crc32cPortable(s, seed)) << len;
    ASSERT_EQ(absl::string_view(dest.data() + to, len), s);
    for (size_t i = to + len; i < dest.size(); ++i) ASSERT_EQ(dest[i], '\x5a');
    std::fill(dest.begin(), dest.end(), '\x5a');
    ASSERT_EQ(CopyCrc32cStreaming(dest.data() + 8 + to, s, seed), Crc32cPortable(s, seed)) << len;
    ASSERT_EQ(absl::string_view(dest.data() + 8 + to, len), s) << "length " << len;
    for (size_t i = 0; i < 8 + to; ++i) ASSERT_EQ(dest[i], '\x5a');
    for (size_t i = 8 + to + len; i < dest.size(); ++i) ASSERT_EQ(dest[i], '\x5a');
    std::fill(dest.begin(), dest.end(), '\x5a');
    ASSERT_EQ(CopyCrc32cPortable(dest.data() + to, s, seed), Crc32cPortable(s, seed));
    ASSERT_EQ(absl::string_view(dest.data() + to, len), s);
  }
  // Block-sized buffers (the long passes and the fold loop at length).
  std::string big((1 << 20) + 300, '\0');
  for (char& c : big) c = static_cast<char>(rng());
  std::string big_dest(big.size(), '\0');
  for (size_t len : {size_t{1} << 18, (size_t{1} << 20) + 257, size_t{100003}}) {
    const absl::string_view s(big.data() + 3, len);
    const uint32_t want = Crc32cPortable(s, 5);
    ASSERT_EQ(CopyCrc32c(big_dest.data(), s, 5), want) << len;
    ASSERT_EQ(absl::string_view(big_dest.data(), len), s);
    ASSERT_EQ(crc32c_internal::CopyCrc32cSse42(big_dest.data() + 1, s, 5), want) << len;
    for (size_t to : {0, 5, 64}) {
      std::fill(big_dest.begin(), big_dest.end(), '\0');
      ASSERT_EQ(CopyCrc32cStreaming(big_dest.data() + to, s.substr(0, len - to), 5),
                Crc32cPortable(s.substr(0, len - to), 5)) << len;
      ASSERT_EQ(absl::string_view(big_dest.data() + to, len - to), s.substr(0, len - to));
    }
    ASSERT_EQ(Crc32c(s, 5), want) << len;
    ASSERT_EQ(crc32c_internal::Crc32cSse42(s, 5), want) << len;
  }
  // Continued CRCs compose as Crc32c's do.
  const absl::string_view all(src);
  const uint32_t first = CopyCrc32c(dest.data(), all.substr(0, 1000));
  EXPECT_EQ(CopyCrc32c(dest.data() + 1000, all.substr(1000), first), Crc32cPortable(all));
  EXPECT_EQ(absl::string_view(dest.data(), all.size()), all);
}

TEST(BlockKeys, ChainPrefixAndIsolation) {
  KeyContext c{"model-a", "f32:bs4", "tenant-1", 4};
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto keys = ChainBlockKeys(c, t);
  ASSERT_EQ(keys.size(), 2u);  // the partial third block has no key
  // Shared prefixes share keys; a change in block 1 changes block 2's key too.
  std::vector<int32_t> u = t;
  u[7] = 99;
  auto other = ChainBlockKeys(c, u);
  EXPECT_EQ(keys[0], other[0]);
  EXPECT_NE(keys[1], other[1]);
  u = t;
  u[0] = 99;
  other = ChainBlockKeys(c, u);
  EXPECT_NE(keys[0], other[0]);
  EXPECT_NE(keys[1], other[1]);
  // Same tokens under another model, layout or tenant never match.
  for (KeyContext d : {KeyContext{"model-b", "f32:bs4", "tenant-1", 4}, KeyContext{"model-a", "bf16:bs4", "tenant-1", 4},
                       KeyContext{"model-a", "f32:bs4", "tenant-2", 4}}) {
    auto k2 = ChainBlockKeys(d, t);
    EXPECT_NE(k2[0], keys[0]);
    EXPECT_NE(k2[1], keys[1]);
  }
  // Field boundaries are unambiguous ("ab" + "c" differs from "a" + "bc").
  EXPECT_NE(ChainBlockKeys({"ab", "c", "", 4}, t)[0], ChainBlockKeys({"a", "bc", "", 4}, t)[0]);
}

std::string Payload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(BlockFormat, RoundTripAndEveryCorruptionDetected) {
  std::array<uint8_t, 32> fp{};
  fp[0] = 7;
  BlockLayout layout{3, 2, 8, 16};
  std::vector<std::string> layers;
  for (uint32_t l = 0; l < 3; ++l) layers.push_back(Payload(layout.layer_bytes(), l));
  auto block = EncodeBlock(fp, layout, {layers[0], layers[1], layers[2]});
  ASSERT_TRUE(block.ok());
  auto h = VerifyBlock(*block, fp);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->layout.tokens, 16u);
  EXPECT_EQ(BlockLayerPayload(*block, *h, 2), layers[2]);

  std::array<uint8_t, 32> other = fp;
  other[1] = 1;
  EXPECT_EQ(VerifyBlock(*block, other).status().code(), absl::StatusCode::kFailedPrecondition);
  // Flip one bit anywhere: header or payload, always caught.
  for (size_t at : {size_t{0}, size_t{5}, size_t{20}, size_t{45}, size_t{60}, BlockHeaderBytes(3) + 3,
                    block->size() - 1}) {
    std::string bad = *block;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    auto r = VerifyBlock(bad, fp);
    EXPECT_FALSE(r.ok()) << "flip at " << at;
    if (at >= 8 && at < 40) continue;  // a flipped fingerprint reads as another model's
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "flip at " << at;
  }
  for (size_t cut : {size_t{0}, size_t{10}, BlockHeaderBytes(3) - 1, block->size() - 1}) {
    EXPECT_EQ(VerifyBlock(block->substr(0, cut), fp).status().code(), absl::StatusCode::kDataLoss) << cut;
  }
  EXPECT_FALSE(EncodeBlock(fp, layout, {layers[0], layers[1]}).ok());
  EXPECT_FALSE(EncodeBlock(fp, layout, {layers[0], layers[1], "short"}).ok());
}

// A block's floats: K and V of a float32 block, scales and minimums of a KIVI block (whose codes
// may be any bytes). One NaN or infinity anywhere among them is found.
TEST(BlockFormat, ValuesFiniteLooksAtEveryFloatAndOnlyAtFloats) {
  std::array<uint8_t, 32> fp{};
  const auto with = [&](const BlockLayout& layout, size_t layer, size_t at, float value) {
    std::vector<std::string> layers;
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      std::vector<float> f(layout.layer_bytes() / 4);
      for (size_t i = 0; i < f.size(); ++i) f[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
      layers.emplace_back(reinterpret_cast<const char*>(f.data()), f.size() * 4);
    }
    if (layer < layers.size()) std::memcpy(layers[layer].data() + at, &value, 4);
    std::vector<absl::string_view> views(layers.begin(), layers.end());
    auto block = EncodeBlock(fp, layout, views);
    EXPECT_TRUE(block.ok()) << block.status();
    return BlockValuesFinite(*block, *VerifyBlock(*block, fp));
  };
  const BlockLayout f32{3, 2, 8, 16};
  EXPECT_TRUE(with(f32, 99, 0, 0));
  for (size_t at : {size_t{0}, size_t{4 * 17}, f32.layer_bytes() - 4}) {
    EXPECT_FALSE(with(f32, 2, at, std::numeric_limits<float>::quiet_NaN())) << at;
    EXPECT_FALSE(with(f32, 0, at, -std::numeric_limits<float>::infinity())) << at;
    EXPECT_TRUE(with(f32, 1, at, std::numeric_limits<float>::max())) << at;
    EXPECT_TRUE(with(f32, 1, at, std::numeric_limits<float>::denorm_min())) << at;
  }
  // 24 floats a layer: 16 in vectors, 8 after them.
  const BlockLayout odd{1, 1, 4, 3};
  for (size_t at : {size_t{0}, size_t{4 * 15}, size_t{4 * 16}, size_t{4 * 23}}) {
    EXPECT_FALSE(with(odd, 0, at, std::numeric_limits<float>::infinity())) << at;
  }
  EXPECT_TRUE(with(odd, 99, 0, 0));
  // KIVI 4-bit, group 8, 16 tokens, 2 heads of 8 dimensions. Per head: 64 bytes of K codes, 2 * 2 * 8
  // floats of K scales and minimums, 64 bytes of V codes, 2 * 16 * 1 floats of V scales and minimums.
  BlockLayout kivi{2, 2, 8, 16, BlockEncoding::kKivi, 4, 8};
  ASSERT_TRUE(kivi.valid());
  const size_t head = 64 + 128 + 64 + 128;
  ASSERT_EQ(kivi.layer_bytes(), 2 * head);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(with(kivi, 99, 0, 0));
  EXPECT_TRUE(with(kivi, 1, 0, nan));            // K codes: bytes, any value
  EXPECT_TRUE(with(kivi, 1, head + 192, nan));   // the second head's V codes
  EXPECT_FALSE(with(kivi, 1, 64, nan));          // the first K scale
  EXPECT_FALSE(with(kivi, 0, 64 + 124, nan));    // the last K minimum
  EXPECT_FALSE(with(kivi, 1, head + 256, nan));  // the second head's first V scale
  EXPECT_FALSE(with(kivi, 1, 2 * head - 4, nan));
}

// The one-pass copy and check agrees with VerifyBlock on good, corrupted, truncated and padded
// blocks, and a good block arrives intact.
// Full KV in the model's 16-bit dtype: half a float32 block's payload, format version 2 naming
// the encoding, every bit checked like a float32 block's; a NaN or infinity among its elements is
// found (bf16 and half have exponent fields of their own), and float32 blocks, version 1, still
// read.
TEST(BlockFormat, SixteenBitFullBlocksRoundTripAndAreChecked) {
  std::array<uint8_t, 32> fp{};
  fp[3] = 9;
  const BlockLayout f32{2, 2, 8, 16};
  for (const BlockEncoding e : {BlockEncoding::kBFloat16, BlockEncoding::kFloat16}) {
    BlockLayout layout = f32;
    layout.encoding = e;
    ASSERT_TRUE(layout.valid());
    EXPECT_EQ(layout.layer_bytes(), f32.layer_bytes() / 2);
    const auto make = [&](size_t at, uint16_t value) {
      std::vector<std::string> layers;
      for (uint32_t l = 0; l < 2; ++l) {
        std::vector<uint16_t> h(layout.layer_bytes() / 2);
        for (size_t i = 0; i < h.size(); ++i) {
          const float x = 0.25f * static_cast<float>(i % 7) - 0.5f;
          h[i] = e == BlockEncoding::kBFloat16 ? vc::F32ToBF16(x) : vc::F32ToF16(x);
        }
        if (l == 1 && at < h.size()) h[at] = value;
        layers.emplace_back(reinterpret_cast<const char*>(h.data()), h.size() * 2);
      }
      return *EncodeBlock(fp, layout, {layers[0], layers[1]});
    };
    const std::string block = make(SIZE_MAX, 0);
    auto h = VerifyBlock(block, fp);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->version, kEncodedBlockFormatVersion);
    EXPECT_EQ(h->layout, layout);
    EXPECT_EQ(block.size(), BlockBytes(layout));
    EXPECT_TRUE(BlockValuesFinite(block, *h));
    const uint16_t nan = e == BlockEncoding::kBFloat16 ? 0x7fc0 : 0x7e00;
    const uint16_t inf = e == BlockEncoding::kBFloat16 ? 0xff80 : 0xfc00;
    for (size_t at : {size_t{0}, size_t{77}, layout.layer_bytes() / 2 - 1}) {
      EXPECT_FALSE(BlockValuesFinite(make(at, nan), *h)) << at;
      EXPECT_FALSE(BlockValuesFinite(make(at, inf), *h)) << at;
    }
    std::string bad = block;
    bad[BlockHeaderBytes(layout) + 5] ^= 1;
    EXPECT_EQ(VerifyBlock(bad, fp).status().code(), absl::StatusCode::kDataLoss);
    // A reader that wants float32 sees another layout, not float32 values.
    EXPECT_NE(h->layout, f32);
  }
  std::vector<std::string> layers(2, std::string(f32.layer_bytes(), '\0'));
  auto old = VerifyBlock(*EncodeBlock(fp, f32, {layers[0], layers[1]}), fp);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->version, kBlockFormatVersion);
}

TEST(BlockFormat, CopyAndVerifyMatchesVerify) {
  std::array<uint8_t, 32> fp{};
  fp[0] = 7;
  BlockLayout layout{3, 2, 8, 16};
  std::vector<std::string> layers;
  for (uint32_t l = 0; l < 3; ++l) layers.push_back(Payload(layout.layer_bytes(), 10 + l));
  auto block = EncodeBlock(fp, layout, {layers[0], layers[1], layers[2]});
  ASSERT_TRUE(block.ok());
  std::string dest(block->size() + 64, '\0');
  auto h = CopyAndVerifyBlock(block->data(), block->size(), dest.data(), &fp);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(dest.substr(0, block->size()), *block);
  EXPECT_EQ(h->layer_crc, VerifyBlock(*block, fp)->layer_crc);
  EXPECT_TRUE(CopyAndVerifyBlock(block->data(), block->size(), dest.data(), nullptr).ok());
  std::fill(dest.begin(), dest.end(), '\0');
  ASSERT_TRUE(CopyAndVerifyBlock(block->data(), block->size(), dest.data() + 3, &fp, /*streaming=*/true).ok());
  EXPECT_EQ(dest.substr(3, block->size()), *block);
  std::array<uint8_t, 32> other = fp;
  other[1] = 1;
  EXPECT_EQ(CopyAndVerifyBlock(block->data(), block->size(), dest.data(), &other).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<std::string> cases;
  for (size_t at = 0; at < block->size(); at += 7) {
    std::string bad = *block;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    cases.push_back(bad);
  }
  for (size_t cut : {size_t{0}, size_t{10}, size_t{56}, BlockHeaderBytes(3) - 1, BlockHeaderBytes(3), block->size() - 1}) {
    cases.push_back(block->substr(0, cut));
  }
  cases.push_back(*block + "x");
  std::string many_layers = *block;
  many_layers[40] = '\xff';  // a layer count far beyond the block's size
  cases.push_back(many_layers);
  for (const std::string& bad : cases) {
    auto want = VerifyBlock(bad, fp);
    auto got = CopyAndVerifyBlock(bad.data(), bad.size(), dest.data(), &fp);
    ASSERT_FALSE(want.ok());
    EXPECT_EQ(got.status().code(), want.status().code()) << got.status() << " vs " << want.status();
    EXPECT_EQ(CopyAndVerifyBlock(bad.data(), bad.size(), dest.data(), &fp, true).status().code(),
              want.status().code());
  }
}

// The compressed (KIVI) variant: version 2 header, payload sizes from the encoding, the same
// checks as float32 blocks, and parameters that do not fit the shape refused.
TEST(BlockFormat, KiviVariantRoundTripsAndIsChecked) {
  std::array<uint8_t, 32> fp{};
  fp[3] = 9;
  BlockLayout layout{2, 2, 32, 64, BlockEncoding::kKivi, 4, 32};
  ASSERT_TRUE(layout.valid());
  // Per head: K and V codes 64 * 32 / 2 bytes each, K scale+min 2 * 2 * 32 floats, V scale+min
  // 2 * 64 * 1 floats.
  EXPECT_EQ(layout.layer_bytes(), 2u * (2 * 1024 + 2 * 2 * 32 * 4 + 2 * 64 * 4));
  std::vector<std::string> layers = {Payload(layout.layer_bytes(), 1), Payload(layout.layer_bytes(), 2)};
  auto block = EncodeBlock(fp, layout, {layers[0], layers[1]});
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->size(), BlockHeaderBytes(layout) + 2 * layout.layer_bytes());
  auto h = VerifyBlock(*block, fp);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->version, kEncodedBlockFormatVersion);
  EXPECT_EQ(h->layout.encoding, BlockEncoding::kKivi);
  EXPECT_EQ(h->layout.bits, 4);
  EXPECT_EQ(h->layout.group, 32);
  EXPECT_EQ(BlockLayerPayload(*block, *h, 1), layers[1]);
  std::string dest(block->size(), '\0');
  auto copied = CopyAndVerifyBlock(block->data(), block->size(), dest.data(), &fp);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(dest, *block);
  for (size_t at = 0; at < BlockHeaderBytes(layout); ++at) {
    if (at >= 8 && at < 40) continue;  // the fingerprint: another model's block
    std::string bad = *block;
    bad[at] = static_cast<char>(bad[at] ^ 0x04);
    EXPECT_EQ(VerifyBlock(bad, fp).status().code(), absl::StatusCode::kDataLoss) << "flip at " << at;
  }
  std::string bad = *block;
  bad[block->size() - 3] ^= 1;
  EXPECT_EQ(VerifyBlock(bad, fp).status().code(), absl::StatusCode::kDataLoss);

  for (BlockLayout wrong : {BlockLayout{2, 2, 32, 64, BlockEncoding::kKivi, 3, 32},
                            BlockLayout{2, 2, 32, 64, BlockEncoding::kKivi, 4, 0},
                            BlockLayout{2, 2, 32, 48, BlockEncoding::kKivi, 4, 32},
                            BlockLayout{2, 2, 32, 64, BlockEncoding::kFloat32, 4, 0},
                            BlockLayout{2, 2, 32, 64, static_cast<BlockEncoding>(7), 4, 32}}) {
    EXPECT_FALSE(wrong.valid());
    EXPECT_EQ(EncodeBlock(fp, wrong, {layers[0], layers[1]}).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A float32 block keeps the version 1 header, byte for byte what earlier builds wrote.
  BlockLayout f32{2, 2, 32, 64};
  std::vector<std::string> fl = {Payload(f32.layer_bytes(), 3), Payload(f32.layer_bytes(), 4)};
  auto old = EncodeBlock(fp, f32, {fl[0], fl[1]});
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(VerifyBlock(*old, fp)->version, kBlockFormatVersion);
  EXPECT_EQ(old->size(), BlockHeaderBytes(2) + 2 * f32.layer_bytes());
  // The header the encoder wrote before the KIVI encoding existed (7efc8f5^), for these inputs.
  EXPECT_EQ(absl::BytesToHexString(old->substr(0, BlockHeaderBytes(2))),
            "56434b56010000000000000900000000000000000000000000000000000000000000000000000000020000000200"
            "000020000000400000009f395b453a24a4cc90fef695");
}

}  // namespace
}  // namespace vc::cachestore
