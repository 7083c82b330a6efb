// A store process killed with SIGKILL and restarted serves the blocks its disk tier kept, and
// nothing half-written.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "cachestore/block_format.h"
#include "cachestore/store_client.h"
#include "gtest/gtest.h"
#include "tests/testing/blocks.h"
#include "tests/testing/tiny_model.h"

namespace vc {
namespace {

std::string MakeBlock(uint32_t seed) { return testing::RandomBlock(seed, 0); }

// Waits up to 20 s for the store to answer; false if it exited or never answered.
bool WaitUp(pid_t pid, const std::string& target) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return false;
    // A new channel each time: one that failed to connect waits out gRPC's reconnect backoff.
    if ((*cachestore::StoreClient::Create({target, "tok", 300, ""}))->Lookup({}).ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Starts `vericache store` on a fixed loopback port.
pid_t StartStore(const std::string& dir, const std::string& tokens, int port) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string bin = std::string(VC_BINARY_DIR) + "/services/vericache";
    const std::string listen = "127.0.0.1:" + std::to_string(port);
    execl(bin.c_str(), bin.c_str(), "store", "--listen", listen.c_str(), "--data-dir", dir.c_str(), "--tokens",
          tokens.c_str(), "--ram-bytes", "16777216", "--disk-bytes", "268435456", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

TEST(StoreCrash, KillNineThenRestart) {
  const std::string dir = testing::TempDir("store_crash");
  const std::string tokens = dir + "/tokens";
  std::ofstream(tokens) << "tok alice\n";
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  auto client = *cachestore::StoreClient::Create({"127.0.0.1:" + std::to_string(port), "tok", 2000, ""});
  std::vector<cachestore::BlockKey> keys;
  for (int i = 0; i < 20; ++i) keys.push_back(cachestore::ChainBlockKeys({"m", "l", "", 1}, {i, i})[1]);

  const std::string target = "127.0.0.1:" + std::to_string(port);
  pid_t pid = StartStore(dir + "/db", tokens, port);
  // Whatever fails below, no store process outlives the test.
  struct Reaper {
    pid_t* pid;
    ~Reaper() {
      if (*pid > 0 && waitpid(*pid, nullptr, WNOHANG) == 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, nullptr, 0);
      }
    }
  } reaper{&pid};
  ASSERT_TRUE(WaitUp(pid, target)) << "store did not start";
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client->Put(keys[i], MakeBlock(i)).ok());
  // Then blocks of 64 KiB, put one after another until the store dies: it is killed while one is
  // on its way in.
  constexpr int kLate = 200;
  std::vector<cachestore::BlockKey> late_keys;
  for (int i = 0; i < kLate; ++i) late_keys.push_back(cachestore::ChainBlockKeys({"late", "l", "", 1}, {i})[0]);
  const auto late_block = [](int i) { return testing::LargeRandomBlock(1000 + i, 0, 4); };
  std::atomic<int> acked{0};
  std::thread writer([&] {
    auto c = *cachestore::StoreClient::Create({target, "tok", 2000, ""});
    for (int i = 0; i < kLate && c->Put(late_keys[i], late_block(i)).ok(); ++i) acked++;
  });
  for (int i = 0; i < 2000 && acked.load() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  waitpid(pid, nullptr, 0);
  writer.join();
  const int acked_before_kill = acked.load();
  ASSERT_GE(acked_before_kill, 5);
  ASSERT_LT(acked_before_kill, kLate) << "every put finished before the kill";

  pid = StartStore(dir + "/db", tokens, port);
  ASSERT_TRUE(WaitUp(pid, target)) << "store did not restart";
  for (int i = 0; i < 20; ++i) {
    auto g = client->Get(keys[i]);
    ASSERT_TRUE(g.ok()) << i << ": " << g.status();
    EXPECT_EQ(*g, MakeBlock(i));
  }
  // Every acknowledged put is served whole; the one in flight is whole or absent.
  for (int i = 0; i <= acked_before_kill && i < kLate; ++i) {
    auto g = client->Get(late_keys[i]);
    if (i == acked_before_kill && absl::IsNotFound(g.status())) continue;
    ASSERT_TRUE(g.ok()) << "late block " << i << " of " << acked_before_kill << " acknowledged: " << g.status();
    EXPECT_TRUE(*g == late_block(i)) << i;
  }
  for (int i = acked_before_kill + 1; i < kLate; ++i) {
    const auto st = client->Get(late_keys[i]).status();
    EXPECT_TRUE(absl::IsNotFound(st)) << "never put: " << i << " " << st;
  }
  client.reset();
  // SIGTERM stops the store; a store that does not stop within 10 s fails the test (and is killed).
  kill(pid, SIGTERM);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 200 && !exited; ++i) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (exited) pid = -1;
  EXPECT_TRUE(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "store did not stop cleanly on SIGTERM";
}

}  // namespace
}  // namespace vc
