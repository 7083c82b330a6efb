// The host tier returns exactly what was appended, across its internal chunk boundaries, after a
// prefix of any length, and into any block placement, for float32 and bf16 K/V.
#include "worker/prefixes/full_kv_tier.h"

#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "worker/runtime/kv_cache.h"

namespace vc {
namespace {

const KvLayout kLayout{/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/8, /*block_size=*/16};

KvLayout LayoutOf(DType dtype) {
  KvLayout l = kLayout;
  l.dtype = dtype;
  return l;
}

// A cache holding `n` positions of random K/V in sequence 0.
PagedKvCache RandomCache(int64_t n, uint64_t seed, DType dtype = DType::kF32) {
  const KvLayout layout = LayoutOf(dtype);
  PagedKvCache c(layout, n / layout.block_size + 2, seed);
  const SeqId s = c.NewSequence();
  EXPECT_TRUE(c.Reserve(s, n).ok());
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-1, 1);
  const int row = kLayout.num_kv_heads * kLayout.head_dim;
  std::vector<float> k(row), v(row);
  for (int l = 0; l < kLayout.num_layers; ++l) {
    for (int64_t p = 0; p < n; ++p) {
      for (int i = 0; i < row; ++i) k[i] = u(rng), v[i] = u(rng);
      c.Write(l, s, p, k.data(), v.data());
    }
  }
  c.Commit(s, n);
  return c;
}

// Positions [from, to) of sequence 0 of a and sequence sb of b hold the same bits.
void ExpectSame(const PagedKvCache& a, const PagedKvCache& b, SeqId sb, int64_t from, int64_t to) {
  ASSERT_EQ(a.layout().dtype, b.layout().dtype);
  const size_t bytes = static_cast<size_t>(a.layout().row_bytes());
  for (int l = 0; l < kLayout.num_layers; ++l) {
    for (int64_t p = from; p < to; ++p) {
      ASSERT_EQ(0, std::memcmp(a.KRow(l, 0, p), b.KRow(l, sb, p), bytes)) << "K layer " << l << " position " << p;
      ASSERT_EQ(0, std::memcmp(a.VRow(l, 0, p), b.VRow(l, sb, p), bytes)) << "V layer " << l << " position " << p;
    }
  }
}

class HostKvTierOf : public ::testing::TestWithParam<DType> {};

TEST_P(HostKvTierOf, AppendsInPiecesAcrossChunksFetchBitwise) {
  // Over two of the tier's 64 KiB chunks (1024 positions of this layout in float32, 2048 in bf16).
  const int64_t n = 4500;
  const KvLayout layout = LayoutOf(GetParam());
  const PagedKvCache src = RandomCache(n, 3, GetParam());
  HostKvTier tier(layout, 0);
  // Pieces that end inside a block, on a chunk boundary and across one.
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 1000}, {1000, 1024}, {1024, 1031}, {1031, 2048}, {2048, 2500},
                      {2500, n}}) {
    ASSERT_TRUE(tier.Append(7, src, 0, b, e).ok());
  }
  EXPECT_EQ(tier.Length(7), n);
  EXPECT_FALSE(tier.Append(7, src, 0, 5, 9).ok());  // not at the end
  // A cache of another dtype does not go into the tier's chunks.
  const PagedKvCache other = RandomCache(100, 4, GetParam() == DType::kF32 ? DType::kBF16 : DType::kF32);
  EXPECT_EQ(tier.Append(8, other, 0, 0, 100).code(), absl::StatusCode::kInvalidArgument);

  for (int64_t length : {int64_t{1}, int64_t{1024}, int64_t{1500}, int64_t{2049}, n}) {
    PagedKvCache dest(layout, n / layout.block_size + 2, /*placement_seed=*/length);
    const SeqId s = dest.NewSequence();
    ASSERT_TRUE(dest.Reserve(s, length).ok());
    ASSERT_TRUE(tier.Fetch(7, 0, length, &dest, s)->Wait().ok());
    ExpectSame(src, dest, s, 0, length);
  }
  PagedKvCache dest(layout, 4);
  const SeqId s = dest.NewSequence();
  EXPECT_FALSE(tier.Fetch(7, 0, n + 1, &dest, s)->Wait().ok());  // more than it holds
}

// A fetch from a position inside the attached prefix reads the prefix whole; one from past it does
// not read it at all.
TEST_P(HostKvTierOf, PrefixThenAppendsAtAnUnalignedBase) {
  const int64_t base = 1037, n = 3100;  // the tier's own positions start mid-block
  const KvLayout layout = LayoutOf(GetParam());
  const PagedKvCache src = RandomCache(n, 5, GetParam());
  HostKvTier tier(layout, 0);
  int reads = 0;
  ASSERT_TRUE(tier.AttachPrefix(9, base, [&](const PagedDest& d) {
                    ++reads;
                    const size_t bytes = static_cast<size_t>(layout.row_bytes());
                    for (int l = 0; l < layout.num_layers; ++l) {
                      for (int64_t p = 0; p < base; ++p) {
                        std::memcpy(d.KRow(l, p), src.KRow(l, 0, p), bytes);
                        std::memcpy(d.VRow(l, p), src.VRow(l, 0, p), bytes);
                      }
                    }
                    return absl::OkStatus();
                  }).ok());
  ASSERT_TRUE(tier.Append(9, src, 0, base, 2100).ok());
  ASSERT_TRUE(tier.Append(9, src, 0, 2100, n).ok());
  PagedKvCache dest(layout, n / layout.block_size + 2, /*placement_seed=*/11);
  const SeqId s = dest.NewSequence();
  ASSERT_TRUE(dest.Reserve(s, n).ok());
  ASSERT_TRUE(tier.Fetch(9, 0, n, &dest, s)->Wait().ok());
  ExpectSame(src, dest, s, 0, n);
  EXPECT_EQ(reads, 1);
  for (const auto& [from, read_again] : {std::pair<int64_t, int>{base - 1, 1}, {base, 0}, {2200, 0}}) {
    PagedKvCache part(layout, n / layout.block_size + 2, /*placement_seed=*/from);
    const SeqId ps = part.NewSequence();
    ASSERT_TRUE(part.Reserve(ps, n).ok());
    const int before = reads;
    std::shared_ptr<FetchHandle> f = tier.Fetch(9, from, n, &part, ps);
    ASSERT_TRUE(f->Wait().ok());
    EXPECT_EQ(reads - before, read_again) << from;
    const int64_t first = read_again ? 0 : from;
    EXPECT_EQ(f->bytes(), (n - first) * layout.bytes_per_token()) << from;
    ExpectSame(src, part, ps, first, n);
  }
  EXPECT_EQ(tier.Fetch(9, n + 1, n, &dest, s)->Wait().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, HostKvTierOf, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(DTypeName(i.param)); });

// A budget in whole chunks (1024 positions of this layout, 256 KiB over both layers' K and V):
// reservations share it, appends past a reservation take more only where it has room, a prefix
// read from elsewhere keeps its share (it is held here should its read fail), Erase gives it all
// back.
TEST(HostKvTier, BudgetIsSharedByReservations) {
  constexpr int64_t kChunkSet = 1024 * 2 * 8 * 4 * 2 * 2;
  const PagedKvCache src = RandomCache(1100, 5);
  HostKvTier tier(kLayout, 0, 1, 3 * kChunkSet);
  EXPECT_TRUE(tier.CanHold(3 * 1024).ok());
  EXPECT_EQ(tier.CanHold(3 * 1024 + 1).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(tier.Reserve(1, 2048).ok());
  EXPECT_EQ(tier.Reserve(2, 2048).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(tier.Reserve(2, 1000).ok());
  EXPECT_EQ(tier.reserved_bytes(), 3 * kChunkSet);
  ASSERT_TRUE(tier.Append(2, src, 0, 0, 1000).ok());
  EXPECT_EQ(tier.Append(2, src, 0, 1000, 1100).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tier.Length(2), 1000);
  tier.Erase(1);
  EXPECT_EQ(tier.reserved_bytes(), kChunkSet);
  ASSERT_TRUE(tier.Append(2, src, 0, 1000, 1100).ok());  // room now
  EXPECT_EQ(tier.reserved_bytes(), 2 * kChunkSet);
  EXPECT_EQ(tier.Reserve(3, 1500).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(tier.Reserve(3, 1000).ok());
  ASSERT_TRUE(tier.AttachPrefix(3, 1000, [](const PagedDest&) { return absl::OkStatus(); }).ok());
  EXPECT_EQ(tier.reserved_bytes(), 3 * kChunkSet);
  tier.Erase(2);
  tier.Erase(3);
  EXPECT_EQ(tier.reserved_bytes(), 0);
}

}  // namespace
}  // namespace vc
