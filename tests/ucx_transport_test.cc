// One-sided UCX gets from a registered region (the caller's memory, or memory UCX allocated), in
// both error-handling modes, on this host.
#include <random>

#include "cachestore/ucx_transport.h"
#include "gtest/gtest.h"

namespace vc::cachestore {
namespace {

class UcxTransport : public ::testing::TestWithParam<UcxErrorMode> {};

TEST_P(UcxTransport, GetsReadTheRegion) {
  std::vector<char> region(4 << 20);
  std::mt19937 rng(3);
  for (char& c : region) c = static_cast<char>(rng());
  auto server = UcxRegionServer::Create(region.data(), region.size(), GetParam());
  ASSERT_TRUE(server.ok()) << server.status();
  auto reader = UcxReader::Create(GetParam());
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (size_t off : {size_t{0}, size_t{4096}, size_t{1} << 20, region.size() - 65536}) {
    std::vector<char> got(65536);
    ASSERT_TRUE((*reader)->Get((*server)->worker_address(), (*server)->rkey(), (*server)->base() + off, got.data(),
                               got.size())
                    .ok());
    EXPECT_EQ(0, std::memcmp(got.data(), region.data() + off, got.size())) << off;
  }
  // A whole-region read.
  std::vector<char> all(region.size());
  ASSERT_TRUE((*reader)->Get((*server)->worker_address(), (*server)->rkey(), (*server)->base(), all.data(), all.size()).ok());
  EXPECT_EQ(all, region);
}

TEST_P(UcxTransport, GetsReadARegionUcxAllocated) {
  auto server = UcxRegionServer::Allocate(3 << 20, GetParam());
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GE((*server)->region_bytes(), size_t{3} << 20);
  EXPECT_EQ(reinterpret_cast<uint64_t>((*server)->region()), (*server)->base());
  std::mt19937 rng(5);
  for (size_t i = 0; i < (size_t{3} << 20); ++i) (*server)->region()[i] = static_cast<char>(rng());
  auto reader = UcxReader::Create(GetParam());
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (size_t off : {size_t{0}, size_t{12345}, (size_t{3} << 20) - (size_t{1} << 20)}) {
    std::vector<char> got(size_t{1} << 20);
    ASSERT_TRUE((*reader)->Get((*server)->worker_address(), (*server)->rkey(), (*server)->base() + off, got.data(),
                               got.size())
                    .ok());
    EXPECT_EQ(0, std::memcmp(got.data(), (*server)->region() + off, got.size())) << off;
  }
  // A write after a read is seen by the next read: the reader maps the region, it keeps no copy.
  (*server)->region()[7] ^= 1;
  char byte = 0;
  ASSERT_TRUE((*reader)->Get((*server)->worker_address(), (*server)->rkey(), (*server)->base() + 7, &byte, 1).ok());
  EXPECT_EQ(byte, (*server)->region()[7]);
}

// Map: a region UCX allocated in shared memory is readable in place in error mode none; peer mode
// and memory UCX cannot share say kUnimplemented (the caller reads with Get instead).
TEST_P(UcxTransport, MapsARegionUcxAllocatedInModeNone) {
  auto server = UcxRegionServer::Allocate(3 << 20, GetParam());
  ASSERT_TRUE(server.ok()) << server.status();
  std::mt19937 rng(6);
  for (size_t i = 0; i < (size_t{3} << 20); ++i) (*server)->region()[i] = static_cast<char>(rng());
  auto reader = UcxReader::Create(GetParam());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const size_t off = 12345, size = size_t{1} << 20;
  absl::StatusOr<const char*> p =
      (*reader)->Map((*server)->worker_address(), (*server)->rkey(), (*server)->base() + off, size);
  if (GetParam() == UcxErrorMode::kPeer) {
    EXPECT_EQ(p.status().code(), absl::StatusCode::kUnimplemented) << p.status();
    return;
  }
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(0, std::memcmp(*p, (*server)->region() + off, size));
  (*server)->region()[off + 7] ^= 1;  // the server's writes show through the mapping
  EXPECT_EQ((*p)[7], (*server)->region()[off + 7]);
  // The mapping is cached with the rkey: the same address maps to the same place.
  EXPECT_EQ(*(*reader)->Map((*server)->worker_address(), (*server)->rkey(), (*server)->base() + off, 1), *p);
}

TEST(UcxMap, CallerMemoryIsNotMapped) {
  std::vector<char> region(1 << 20, 'x');
  auto server = UcxRegionServer::Create(region.data(), region.size(), UcxErrorMode::kNone);
  ASSERT_TRUE(server.ok()) << server.status();
  auto reader = UcxReader::Create(UcxErrorMode::kNone);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<const char*> p = (*reader)->Map((*server)->worker_address(), (*server)->rkey(), (*server)->base(), 4096);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnimplemented) << p.status();
  char byte = 0;  // Get still works
  ASSERT_TRUE((*reader)->Get((*server)->worker_address(), (*server)->rkey(), (*server)->base() + 3, &byte, 1).ok());
  EXPECT_EQ(byte, 'x');
}

INSTANTIATE_TEST_SUITE_P(Modes, UcxTransport, ::testing::Values(UcxErrorMode::kNone, UcxErrorMode::kPeer),
                         [](const auto& info) { return info.param == UcxErrorMode::kNone ? "none" : "peer"; });

TEST(UcxErrorModeSetting, Parses) {
  EXPECT_EQ(*ParseUcxErrorMode("peer"), UcxErrorMode::kPeer);
  EXPECT_FALSE(ParseUcxErrorMode("fast").ok());
}

}  // namespace
}  // namespace vc::cachestore
