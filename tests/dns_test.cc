// Store shards from DNS SRV records, against a DNS server on loopback that answers what each test
// sets: the lookup itself (targets, missing names, a server that does not answer, answers that
// make no sense), and a worker that finds a real store that way.
#include "common/dns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/inference_client.h"
#include "services/servers.h"
#include "tests/testing/servers.h"
#include "worker/prefixes/store_prefixes.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;

// A DNS server over UDP on loopback. For a name set with Srv it answers its SRV records; with
// Silent it does not answer; with Garbage it answers an SRV record too short to be one; any other
// name is NXDOMAIN.
class FakeDns {
 public:
  struct Record {
    std::string target;
    int port;
  };

  FakeDns() {
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeDns() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Srv(const std::string& name, std::vector<Record> records) {
    absl::MutexLock l(&mu_);
    srv_[name] = std::move(records);
  }
  void Silent(const std::string& name) {
    absl::MutexLock l(&mu_);
    silent_[name] = true;
  }
  void Garbage(const std::string& name) {
    absl::MutexLock l(&mu_);
    garbage_[name] = true;
  }
  int queries() const { return queries_.load(); }

 private:
  static void Name(const std::string& name, std::string* out) {
    for (absl::string_view label : absl::StrSplit(name, '.', absl::SkipEmpty())) {
      out->push_back(static_cast<char>(label.size()));
      out->append(label.data(), label.size());
    }
    out->push_back('\0');
  }
  static void U16(int v, std::string* out) {
    out->push_back(static_cast<char>(v >> 8));
    out->push_back(static_cast<char>(v & 255));
  }

  void Loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) != 1) continue;
      char buf[512];
      sockaddr_in from{};
      socklen_t from_len = sizeof(from);
      const ssize_t n = recvfrom(fd_, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n < 12) continue;
      ++queries_;
      // The question: labels from byte 12, then type and class.
      std::string qname;
      size_t at = 12;
      while (at < static_cast<size_t>(n) && buf[at] != 0) {
        const int l = static_cast<unsigned char>(buf[at]);
        if (!qname.empty()) qname.push_back('.');
        qname.append(buf + at + 1, std::min<size_t>(l, n - at - 1));
        at += 1 + l;
      }
      const size_t question_end = at + 5;  // the 0 byte, type, class
      if (question_end > static_cast<size_t>(n)) continue;
      std::string reply(buf, 2);  // the id
      absl::MutexLock l(&mu_);
      if (silent_.count(qname)) continue;
      if (garbage_.count(qname)) {
        // A well-formed message whose one SRV record holds 4 bytes: too short for one.
        U16(0x8180, &reply);
        for (int count : {1, 1, 0, 0}) U16(count, &reply);
        reply.append(buf + 12, question_end - 12);
        for (int v : {0xc00c, 33, 1, 0, 30, 4, 0, 10}) U16(v, &reply);
      } else {
        auto it = srv_.find(qname);
        U16(it == srv_.end() ? 0x8183 : 0x8180, &reply);  // a response, recursion; NXDOMAIN or not
        U16(1, &reply);
        U16(it == srv_.end() ? 0 : static_cast<int>(it->second.size()), &reply);
        U16(0, &reply);
        U16(0, &reply);
        reply.append(buf + 12, question_end - 12);
        if (it != srv_.end()) {
          for (const Record& r : it->second) {
            U16(0xc00c, &reply);  // the question's name
            U16(33, &reply);      // SRV
            U16(1, &reply);       // IN
            U16(0, &reply);
            U16(30, &reply);  // TTL
            std::string rdata;
            U16(0, &rdata);  // priority
            U16(10, &rdata);  // weight
            U16(r.port, &rdata);
            Name(r.target, &rdata);
            U16(static_cast<int>(rdata.size()), &reply);
            reply += rdata;
          }
        }
      }
      sendto(fd_, reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> queries_{0};
  absl::Mutex mu_;
  std::map<std::string, std::vector<Record>> srv_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> silent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> garbage_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST(ResolveSrv, TargetsSortedWithoutDuplicates) {
  FakeDns dns;
  dns.Srv("_grpc._tcp.stores.test",
          {{"store-1.stores.test.", 7071}, {"store-0.stores.test", 7070}, {"store-1.stores.test", 7071}});
  auto got = ResolveSrv("_grpc._tcp.stores.test.", dns.address());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"store-0.stores.test:7070", "store-1.stores.test:7071"}));
}

TEST(ResolveSrv, WhatCannotBeHadIsAClearError) {
  FakeDns dns;
  dns.Silent("_grpc._tcp.silent.test");
  dns.Garbage("_grpc._tcp.garbage.test");
  dns.Srv("_grpc._tcp.nowhere.test", {{".", 0}});  // "no such service here"
  auto missing = ResolveSrv("_grpc._tcp.missing.test.", dns.address());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  auto nowhere = ResolveSrv("_grpc._tcp.nowhere.test.", dns.address());
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kNotFound) << nowhere.status();
  const auto t0 = std::chrono::steady_clock::now();
  auto silent = ResolveSrv("_grpc._tcp.silent.test.", dns.address());
  EXPECT_EQ(silent.status().code(), absl::StatusCode::kUnavailable) << silent.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  const auto t1 = std::chrono::steady_clock::now();
  auto garbage = ResolveSrv("_grpc._tcp.garbage.test.", dns.address());
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kUnavailable) << garbage.status();
  EXPECT_NE(garbage.status().message().find("too short"), std::string::npos) << garbage.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 0.9) << "answered, not timed out";
  EXPECT_EQ(ResolveSrv("", dns.address()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveSrv("x.test", "nonsense").status().code(), absl::StatusCode::kInvalidArgument);
}

// A worker given srv:NAME finds the store behind it, publishes there and reads back; a name with
// no records stops it at start, naming the name.
TEST(StoreShardsFromDns, AWorkerFindsItsStoreBySrvRecords) {
  testing::TinyStack t = testing::MakeTinyStack("dns");
  auto store = StoreServer::Start(t.store);
  ASSERT_TRUE(store.ok()) << store.status();
  FakeDns dns;
  dns.Srv("_grpc._tcp.stores.test", {{"127.0.0.1", (*store)->port()}});

  WorkerServerOptions& wo = t.worker;
  wo.store_target = "srv:_grpc._tcp.stores.test.";
  wo.dns_server = dns.address();
  auto worker = WorkerServer::Start(wo);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->store_shards(), std::vector<std::string>{(*store)->target()});
  auto stub = InferenceStub((*worker)->target());
  const v1::GenerateRequest req = testing::IdsRequest(100, 4);
  const std::vector<int32_t> want = testing::FullOutput(wo.model_dir, req);
  ASSERT_FALSE(want.empty());
  GenerateReply first = CallGenerate(*stub, req);
  ASSERT_TRUE(first.status.ok()) << first.status;
  (*worker)->prefixes()->Flush();
  EXPECT_EQ((*store)->store().Stats().ram_blocks, 3u);
  GenerateReply second = CallGenerate(*stub, req);
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.stats.prefix_store_tokens(), 96u);
  EXPECT_EQ(first.tokens, want);
  EXPECT_EQ(second.tokens, want);

  wo.store_target = "srv:_grpc._tcp.none.test.";
  auto none = WorkerServer::Start(wo);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find("srv:_grpc._tcp.none.test."), std::string::npos) << none.status();
}

// A worker that expects more shards than DNS lists yet looks again until it does, or gives up at
// the end of its wait, saying how many it found.
TEST(StoreShardsFromDns, WaitsForTheShardsItExpects) {
  FakeDns dns;
  dns.Srv("_grpc._tcp.stores.test", {{"store-0.stores.test", 7070}});
  const std::string name = "srv:_grpc._tcp.stores.test.";
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    dns.Srv("_grpc._tcp.stores.test", {{"store-0.stores.test", 7070}, {"store-1.stores.test", 7070}});
  });
  auto two = ResolveTargets(name, dns.address(), 2, absl::Seconds(10));
  later.get();
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::vector<std::string>{"store-0.stores.test:7070", "store-1.stores.test:7070"}));
  const int asked = dns.queries();
  auto three = ResolveTargets(name, dns.address(), 3, absl::Seconds(2));
  EXPECT_GE(dns.queries() - asked, 2) << "looked again";
  EXPECT_EQ(three.status().code(), absl::StatusCode::kUnavailable) << three.status();
  EXPECT_NE(three.status().message().find("lists 2 store shards"), std::string::npos) << three.status();
  // Without shards to wait for, a name without records fails at once.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(ResolveTargets("srv:_grpc._tcp.none.test.", dns.address(), 0, absl::Seconds(60)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 5.0);
  // Listed targets need no DNS, and a count applies to srv: items only.
  auto listed = ResolveTargets("a:1,b:2", "", 5, absl::Seconds(0));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
}

}  // namespace
}  // namespace vc
