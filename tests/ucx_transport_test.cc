// One-sided UCX gets from a registered region (the caller's memory, or memory UCX allocated), in
// both error-handling modes, on this host.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "absl/time/clock.h"
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
  const char* p = nullptr;
  const absl::Status st = (*reader)->WithMapping((*server)->worker_address(), (*server)->rkey(),
                                                 (*server)->base() + off, size, [&](const char* m) {
                                                   p = m;
                                                   EXPECT_EQ(0, std::memcmp(m, (*server)->region() + off, size));
                                                   (*server)->region()[off + 7] ^= 1;  // writes show through
                                                   EXPECT_EQ(m[7], (*server)->region()[off + 7]);
                                                 });
  if (GetParam() == UcxErrorMode::kPeer) {
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
    EXPECT_EQ(p, nullptr);
    return;
  }
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_NE(p, nullptr);
  // The mapping is cached with the rkey: the same address maps to the same place.
  const char* again = nullptr;
  ASSERT_TRUE((*reader)
                  ->WithMapping((*server)->worker_address(), (*server)->rkey(), (*server)->base() + off, 1,
                                [&](const char* m) { again = m; })
                  .ok());
  EXPECT_EQ(again, p);
}

// A restarted store has a new address: the keys of the old one (which would keep its shared
// memory attached) are released once it has gone unread for the idle time.
TEST_P(UcxTransport, PeersUnreadForTheIdleTimeAreForgotten) {
  UcxReader::Options o;
  o.mode = GetParam();
  o.idle = absl::Milliseconds(50);
  auto reader = UcxReader::Create(o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto first = UcxRegionServer::Allocate(1 << 20, GetParam());
  auto second = UcxRegionServer::Allocate(1 << 20, GetParam());
  ASSERT_TRUE(first.ok() && second.ok());
  (*first)->region()[0] = 'a';
  (*second)->region()[0] = 'b';
  char byte = 0;
  ASSERT_TRUE((*reader)->Get((*first)->worker_address(), (*first)->rkey(), (*first)->base(), &byte, 1).ok());
  EXPECT_EQ(byte, 'a');
  ASSERT_TRUE((*reader)->Get((*second)->worker_address(), (*second)->rkey(), (*second)->base(), &byte, 1).ok());
  EXPECT_EQ(byte, 'b');
  EXPECT_EQ((*reader)->cached_peers(), 2u);  // both read within the idle time
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  ASSERT_TRUE((*reader)->Get((*second)->worker_address(), (*second)->rkey(), (*second)->base(), &byte, 1).ok());
  EXPECT_EQ((*reader)->cached_peers(), 1u);
  // And the first is read again as a new peer.
  ASSERT_TRUE((*reader)->Get((*first)->worker_address(), (*first)->rkey(), (*first)->base(), &byte, 1).ok());
  EXPECT_EQ(byte, 'a');
}

// In error mode peer a get from a store that stops answering (here: a stopped process) ends at
// the timeout, the endpoint closed, rather than waiting for it; the reader then reads elsewhere.
// Over TCP, as between hosts: on one host UCX would otherwise read the stopped process's memory
// through CMA, which needs no answer from it.
TEST(UcxGet, APeerThatStopsAnsweringTimesOutInModePeer) {
  struct TcpOnly {
    const char* was = getenv("UCX_TLS");
    std::string before = was != nullptr ? was : "";
    TcpOnly() { setenv("UCX_TLS", "tcp", 1); }
    ~TcpOnly() { was != nullptr ? setenv("UCX_TLS", before.c_str(), 1) : unsetenv("UCX_TLS"); }
  } tcp_only;
  int to_parent[2];
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto server = UcxRegionServer::Allocate(1 << 20, UcxErrorMode::kPeer);
    if (!server.ok()) _exit(1);
    const std::string& a = (*server)->worker_address();
    const std::string& k = (*server)->rkey();
    const uint64_t sizes[3] = {a.size(), k.size(), (*server)->base()};
    if (write(to_parent[1], sizes, sizeof(sizes)) != sizeof(sizes)) _exit(1);
    if (write(to_parent[1], a.data(), a.size()) != static_cast<ssize_t>(a.size())) _exit(1);
    if (write(to_parent[1], k.data(), k.size()) != static_cast<ssize_t>(k.size())) _exit(1);
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  close(to_parent[1]);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{child};
  uint64_t sizes[3];
  ASSERT_EQ(read(to_parent[0], sizes, sizeof(sizes)), static_cast<ssize_t>(sizeof(sizes)));
  std::string address(sizes[0], '\0'), rkey(sizes[1], '\0');
  ASSERT_EQ(read(to_parent[0], address.data(), address.size()), static_cast<ssize_t>(address.size()));
  ASSERT_EQ(read(to_parent[0], rkey.data(), rkey.size()), static_cast<ssize_t>(rkey.size()));
  close(to_parent[0]);
  UcxReader::Options o;
  o.mode = UcxErrorMode::kPeer;
  o.get_timeout = absl::Milliseconds(500);
  auto reader = UcxReader::Create(o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  char page[4096];
  ASSERT_TRUE((*reader)->Get(address, rkey, sizes[2], page, sizeof(page)).ok());
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);  // stopped by now
  ASSERT_TRUE(WIFSTOPPED(status));
  const absl::Time start = absl::Now();
  const absl::Status st = (*reader)->Get(address, rkey, sizes[2], page, sizeof(page));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ((*reader)->cached_peers(), 0u);
  auto local = UcxRegionServer::Allocate(1 << 20, UcxErrorMode::kPeer);
  ASSERT_TRUE(local.ok());
  (*local)->region()[5] = 'z';
  char byte = 0;
  ASSERT_TRUE((*reader)->Get((*local)->worker_address(), (*local)->rkey(), (*local)->base() + 5, &byte, 1).ok());
  EXPECT_EQ(byte, 'z');
}

TEST(UcxMap, CallerMemoryIsNotMapped) {
  std::vector<char> region(1 << 20, 'x');
  auto server = UcxRegionServer::Create(region.data(), region.size(), UcxErrorMode::kNone);
  ASSERT_TRUE(server.ok()) << server.status();
  auto reader = UcxReader::Create(UcxErrorMode::kNone);
  ASSERT_TRUE(reader.ok()) << reader.status();
  bool used = false;
  const absl::Status st = (*reader)->WithMapping((*server)->worker_address(), (*server)->rkey(), (*server)->base(),
                                                 4096, [&](const char*) { used = true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_FALSE(used);
  char byte = 0;  // Get still works
  ASSERT_TRUE((*reader)->Get((*server)->worker_address(), (*server)->rkey(), (*server)->base() + 3, &byte, 1).ok());
  EXPECT_EQ(byte, 'x');
}

INSTANTIATE_TEST_SUITE_P(Modes, UcxTransport, ::testing::Values(UcxErrorMode::kNone, UcxErrorMode::kPeer),
                         [](const auto& info) { return info.param == UcxErrorMode::kNone ? "none" : "peer"; });

// Where UCX may listen for a listen host: every interface for a wildcard, loopback for a loopback
// address, and an error for an address this host does not hold.
TEST(UcxNetDevices, FollowTheListenHost) {
  for (const char* any : {"", "0.0.0.0", "::", "[::]", "*"}) EXPECT_EQ(*UcxNetDevicesFor(any), "") << any;
  for (const char* loopback : {"127.0.0.1", "[::1]", "::1"}) EXPECT_EQ(*UcxNetDevicesFor(loopback), "lo") << loopback;
  const absl::StatusOr<std::string> foreign = UcxNetDevicesFor("192.0.2.254");
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument) << foreign.status();
  EXPECT_FALSE(UcxNetDevicesFor("no such host.invalid").ok());
}

TEST(UcxErrorModeSetting, Parses) {
  EXPECT_EQ(*ParseUcxErrorMode("peer"), UcxErrorMode::kPeer);
  EXPECT_FALSE(ParseUcxErrorMode("fast").ok());
}

}  // namespace
}  // namespace vc::cachestore
