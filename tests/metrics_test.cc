// The Prometheus text of stats messages, and the /metrics endpoint against real sockets: what it
// answers, that bad or stalled clients get an error or are dropped without holding it up, and what
// a real store and worker report through it.
#include "services/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "gtest/gtest.h"
#include "services/cli/stats_command.h"
#include "services/inference_client.h"
#include "services/servers.h"
#include "tests/testing/blocks.h"
#include "tests/testing/failing_fs.h"
#include "tests/testing/servers.h"
#include "vericache/v1/inference.pb.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;

// A connected loopback socket to `port`, or -1.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` on a new connection and returns all that comes back before the server closes
// it (or 10 s pass).
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "(no connection)";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) != 1) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

v1::WorkerStats SomeStats() {
  v1::WorkerStats s;
  s.set_uptime_micros(5);
  s.set_requests_in_flight(2);
  s.set_requests_ended(7);
  for (const char* name : {"", "a\"b\\c"}) {
    v1::TenantStats* t = s.add_tenants();
    t->set_tenant(name);
    t->set_requests_ended(name[0] == '\0' ? 3 : 4);
    t->set_requests_in_flight(1);
  }
  v1::StoreLinkStats* link = s.mutable_store();
  link->set_lookups(11);
  for (const char* target : {"h1:1", "h2:2"}) {
    v1::StoreShardStats* sh = link->add_shards();
    sh->set_target(target);
    sh->set_bytes_read(target[1] == '1' ? 100 : 200);
  }
  return s;
}

TEST(PrometheusText, CountersGaugesLabelsAndContiguousFamilies) {
  const std::string text = PrometheusText(SomeStats(), "vericache_worker");
  for (const char* line : {
           "# TYPE vericache_worker_uptime_micros gauge\nvericache_worker_uptime_micros 5\n",
           "# TYPE vericache_worker_requests_in_flight gauge\nvericache_worker_requests_in_flight 2\n",
           "# TYPE vericache_worker_requests_ended_total counter\nvericache_worker_requests_ended_total 7\n",
           "# TYPE vericache_worker_tenant_requests_ended_total counter\n"
           "vericache_worker_tenant_requests_ended_total{tenant=\"\"} 3\n"
           "vericache_worker_tenant_requests_ended_total{tenant=\"a\\\"b\\\\c\"} 4\n",
           "# TYPE vericache_worker_tenant_requests_in_flight gauge\n",
           "vericache_worker_store_lookups_total 11\n",
           "# TYPE vericache_worker_store_shard_bytes_read_total counter\n"
           "vericache_worker_store_shard_bytes_read_total{target=\"h1:1\"} 100\n"
           "vericache_worker_store_shard_bytes_read_total{target=\"h2:2\"} 200\n",
       }) {
    EXPECT_TRUE(absl::StrContains(text, line)) << line << "\nnot in:\n" << text;
  }
  // No string field becomes a sample, and each metric has one TYPE line.
  EXPECT_FALSE(absl::StrContains(text, "_tenant_tenant")) << text;
  EXPECT_FALSE(absl::StrContains(text, "_shard_target")) << text;
  std::set<std::string> types;
  for (absl::string_view l : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(l, "# TYPE ")) continue;
    EXPECT_TRUE(types.insert(std::string(l)).second) << "twice: " << l;
  }
  // A message without its optional parts has none of their samples.
  EXPECT_FALSE(absl::StrContains(PrometheusText(v1::WorkerStats(), "w"), "w_store_")) << "no store";
}

// A list whose elements have no string field labels them by place; names of lists lose their
// plural s (but not the s of a word ending in ss).
TEST(PrometheusText, ListsWithoutNamesAreLabeledByIndex) {
  google::protobuf::FileDescriptorProto file;
  file.set_name("metrics_test_dynamic.proto");
  file.set_syntax("proto3");
  google::protobuf::DescriptorProto* inner = file.add_message_type();
  inner->set_name("Inner");
  google::protobuf::FieldDescriptorProto* n = inner->add_field();
  n->set_name("n");
  n->set_number(1);
  n->set_type(google::protobuf::FieldDescriptorProto::TYPE_UINT64);
  n->set_label(google::protobuf::FieldDescriptorProto::LABEL_OPTIONAL);
  google::protobuf::DescriptorProto* outer = file.add_message_type();
  outer->set_name("Outer");
  for (const char* list : {"items", "class"}) {
    google::protobuf::FieldDescriptorProto* f = outer->add_field();
    f->set_name(list);
    f->set_number(outer->field_size());
    f->set_type(google::protobuf::FieldDescriptorProto::TYPE_MESSAGE);
    f->set_type_name("Inner");
    f->set_label(google::protobuf::FieldDescriptorProto::LABEL_REPEATED);
  }
  google::protobuf::DescriptorPool pool;
  ASSERT_NE(pool.BuildFile(file), nullptr);
  google::protobuf::DynamicMessageFactory factory(&pool);
  std::unique_ptr<google::protobuf::Message> m(factory.GetPrototype(pool.FindMessageTypeByName("Outer"))->New());
  const google::protobuf::Reflection* r = m->GetReflection();
  for (const char* list : {"items", "class"}) {
    const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(list);
    for (uint64_t v : {5, 6}) {
      google::protobuf::Message* e = r->AddMessage(m.get(), f);
      e->GetReflection()->SetUInt64(e, e->GetDescriptor()->FindFieldByName("n"), v);
    }
  }
  const std::string text = PrometheusText(*m, "x");
  EXPECT_TRUE(absl::StrContains(text, "# TYPE x_item_n_total counter\nx_item_n_total{index=\"0\"} 5\n"
                                      "x_item_n_total{index=\"1\"} 6\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "x_class_n_total{index=\"1\"} 6\n")) << text;
}

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = MetricsEndpoint::Start("127.0.0.1:0", [this] {
      ++renders_;
      return PrometheusText(SomeStats(), "vericache_worker");
    });
    ASSERT_TRUE(e.ok()) << e.status();
    endpoint_ = std::move(*e);
    ASSERT_GT(endpoint_->port(), 0);
  }
  std::atomic<int> renders_{0};
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

TEST_F(EndpointTest, AnswersGetMetrics) {
  const std::string r = Exchange(endpoint_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200 OK\r\n")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n")) << r;
  const std::string body = PrometheusText(SomeStats(), "vericache_worker");
  EXPECT_TRUE(absl::StrContains(r, "Content-Length: " + std::to_string(body.size()) + "\r\n")) << r;
  EXPECT_TRUE(absl::EndsWith(r, "\r\n\r\n" + body)) << r;
  // A query string is ignored; HEAD gets the headers alone.
  EXPECT_TRUE(absl::EndsWith(Exchange(endpoint_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n"), body));
  const std::string head = Exchange(endpoint_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << head;
  EXPECT_EQ(renders_.load(), 3);
}

TEST_F(EndpointTest, BadRequestsGetErrorsAndStalledClientsAreDropped) {
  const int port = endpoint_->port();
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(post, "HTTP/1.1 405 ")) << post;
  EXPECT_TRUE(absl::StrContains(post, "\r\nAllow: GET, HEAD\r\n")) << post;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /other HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 ")) << "path";
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "hello\r\n\r\n"), "HTTP/1.1 400 ")) << "request line";
  static constexpr char kOddHeader[] = "GET /metrics HTTP/1.1\r\n\0\xff\r\n\r\n";
  EXPECT_TRUE(absl::StartsWith(Exchange(port, std::string(kOddHeader, sizeof(kOddHeader) - 1)), "HTTP/1.1 200 "))
      << "header bytes are not read";
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a')),
                               "HTTP/1.1 431 "))
      << "endless headers";
  // A client that connects and sends half a request, and one that sends nothing, are dropped
  // after 2 s each; the next client is answered, and nothing was rendered for them.
  const int before = renders_.load();
  const int half = Connect(port), silent = Connect(port);
  ASSERT_GE(half, 0);
  ASSERT_GE(silent, 0);
  send(half, "GET /met", 8, MSG_NOSIGNAL);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string r = Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200 ")) << r;
  EXPECT_LT(waited, 8.0);
  EXPECT_EQ(renders_.load(), before + 1);
  char c;
  pollfd p{half, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "the stalled connection is still open";
  EXPECT_EQ(recv(half, &c, 1, 0), 0) << "the stalled connection was closed";
  close(half);
  close(silent);
}

TEST(MetricsEndpoint, AddressesThatCannotWorkAreRefused) {
  auto render = [] { return std::string(); };
  EXPECT_EQ(MetricsEndpoint::Start("nonsense", render).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsEndpoint::Start("127.0.0.1:99999", render).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsEndpoint::Start("unix:/tmp/m", render).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = MetricsEndpoint::Start("127.0.0.1:0", render);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(MetricsEndpoint::Start("127.0.0.1:" + std::to_string((*first)->port()), render).status().code(),
            absl::StatusCode::kUnavailable);
}

// A store and a worker with tenants, both with metrics: after requests, what each endpoint serves
// is what Stats and GetStats answer, in the Prometheus format.
TEST(ServerMetrics, StoreAndWorkerServeTheirStats) {
  testing::TinyStack t = testing::MakeTinyStack("metrics");
  t.store.metrics_listen = "127.0.0.1:0";
  auto store = StoreServer::Start(t.store);
  ASSERT_TRUE(store.ok()) << store.status();
  WorkerServerOptions& wo = t.worker;
  wo.store_target = (*store)->target();
  wo.service.client_tokens = {{"ops", ""}, {"tok-a", "a"}};
  wo.metrics_listen = "127.0.0.1:0";
  auto worker = WorkerServer::Start(wo);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_GT((*worker)->metrics_port(), 0);
  auto stub = InferenceStub((*worker)->target());
  const v1::GenerateRequest req = testing::IdsRequest(100, 4);
  for (const char* token : {"ops", "tok-a", "tok-a"}) ASSERT_TRUE(CallGenerate(*stub, req, token).status.ok());
  (*worker)->prefixes()->Flush();

  v1::WorkerStats stats;
  ASSERT_TRUE(testing::GetWorkerStats(*stub, "ops", &stats).ok());
  const std::string worker_text = Exchange((*worker)->metrics_port(), "GET /metrics HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(absl::StartsWith(worker_text, "HTTP/1.1 200 OK\r\n")) << worker_text;
  // Everything but the uptime, which moves between the two reads.
  for (absl::string_view line : absl::StrSplit(PrometheusText(stats, "vericache_worker"), '\n', absl::SkipEmpty())) {
    if (absl::StrContains(line, "uptime")) continue;
    EXPECT_TRUE(absl::StrContains(worker_text, absl::StrCat("\n", line, "\n"))) << line;
  }
  EXPECT_TRUE(absl::StrContains(worker_text, "\nvericache_worker_requests_ended_total 3\n")) << worker_text;
  EXPECT_TRUE(absl::StrContains(worker_text, "\nvericache_worker_tenant_requests_ended_total{tenant=\"a\"} 2\n"))
      << worker_text;
  EXPECT_GT(stats.store().blocks_published(), 0u);
  EXPECT_TRUE(absl::StrContains(
      worker_text, absl::StrCat("\nvericache_worker_store_shard_blocks_read_total{target=\"", (*store)->target(), "\"} ")))
      << worker_text;

  const std::string store_text = Exchange((*store)->metrics_port(), "GET /metrics HTTP/1.1\r\n\r\n");
  const uint64_t blocks = (*store)->store().Stats().ram_blocks;
  EXPECT_GT(blocks, 0u);
  EXPECT_TRUE(absl::StrContains(store_text, absl::StrCat("\nvericache_store_ram_blocks ", blocks, "\n"))) << store_text;
  EXPECT_TRUE(absl::StrContains(store_text, "\nvericache_store_ram_capacity_bytes 67108864\n")) << store_text;
  // What the disk tier's files take goes down as well as up: a gauge.
  EXPECT_TRUE(absl::StrContains(store_text, "# TYPE vericache_store_disk_footprint_bytes gauge\n")) << store_text;
}

// The local addresses of the TCP sockets this process listens on ("127.0.0.1", "::1", ...), from
// /proc/net/tcp and tcp6, for the sockets among its open files.
std::multiset<std::string> ListeningAddresses() {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (absl::StartsWith(target, "socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::multiset<std::string> out;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.contains(inode)) continue;  // 0A: LISTEN
      const std::string hex = local.substr(0, local.find(':'));
      unsigned char bytes[16] = {};
      for (size_t i = 0; i < hex.size() / 2; ++i) bytes[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
      char text[INET6_ADDRSTRLEN] = {};
      if (hex.size() == 8) {
        const unsigned char v4[4] = {bytes[3], bytes[2], bytes[1], bytes[0]};  // a 32-bit word in host order
        inet_ntop(AF_INET, v4, text, sizeof(text));
      } else {
        // tcp6 writes four 32-bit words, each in host order.
        unsigned char v6[16];
        for (int w = 0; w < 4; ++w) {
          for (int b = 0; b < 4; ++b) v6[4 * w + b] = bytes[4 * w + 3 - b];
        }
        inet_ntop(AF_INET6, v6, text, sizeof(text));
      }
      out.insert(text);
    }
  }
  return out;
}

// With --listen on one address, UCX's TCP transport (the only one in mode peer on one host)
// listens on that address's interface alone, as gRPC does; with a wildcard, on every interface.
TEST(StoreStart, UcxListensWhereGrpcDoes) {
  testing::TinyStack t = testing::MakeTinyStack("ucx_listen");
  t.store.ucx = "peer";
  t.store.listen = "127.0.0.1:0";
  const std::multiset<std::string> before = ListeningAddresses();
  auto store = StoreServer::Start(t.store);
  ASSERT_TRUE(store.ok()) << store.status();
  std::multiset<std::string> added = ListeningAddresses();
  for (const std::string& a : before) added.erase(added.find(a));
  EXPECT_GE(added.size(), 2u);  // gRPC's and UCX's
  for (const std::string& a : added) {
    EXPECT_TRUE(a == "127.0.0.1" || a == "::1" || a == "::ffff:127.0.0.1") << "a listener on " << a;
  }
  // An address no interface here holds: refused at start, naming it.
  t.store.listen = "192.0.2.254:0";
  const absl::Status refused = StoreServer::Start(t.store).status();
  EXPECT_FALSE(refused.ok());
}

// A lease's UCX key reaches the whole RAM region: a store of several tenants starts with one-sided
// reads on only when told that its tenants may read each other's blocks.
TEST(StoreStart, SeveralTenantsShareUcxReadsOnlyWhenTold) {
  testing::TinyStack t = testing::MakeTinyStack("ucx_tenants");
  t.store.service.tokens = {{"tok-a", "a"}, {"tok-b", "b"}, {"tok-a2", "a"}};
  const absl::Status refused = StoreServer::Start(t.store).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("2 tenants"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("--ucx-across-tenants"), std::string::npos) << refused;
  t.store.ucx_across_tenants = true;
  EXPECT_TRUE(StoreServer::Start(t.store).ok());
  t.store.ucx_across_tenants = false;
  t.store.ucx = "off";
  EXPECT_TRUE(StoreServer::Start(t.store).ok());
  t.store.ucx = "none";
  t.store.service.tokens = {{"tok-a", "a"}, {"tok-a2", "a"}};
  EXPECT_TRUE(StoreServer::Start(t.store).ok());
}

// A store whose disk writes fail says so on its metrics and in `vericache stats`, and on its health
// service's "liveness" entry once they have failed for its grace, unless the disk is only full: that
// recovers by itself once there is room (the store probes, with no put coming), and a restart would
// not help. Writes failing with EIO past the grace turn the entry NOT_SERVING, until the tier's own
// reopen of RocksDB takes writes again. The server's own entry stays SERVING throughout: reads go on.
TEST(StoreHealth, LivenessFollowsDiskWrites) {
  using Fault = testing::FailingFileSystem::Fault;
  testing::TinyStack t = testing::MakeTinyStack("liveness");
  testing::FailingDisk disk;
  const auto& fs = disk.fs;
  t.store.store.disk.env = disk.env.get();
  t.store.metrics_listen = "127.0.0.1:0";
  t.store.disk_failure_grace_ms = 1000;
  t.store.service.stats_tenants = {"workers"};  // `vericache stats` below asks as this tenant
  auto store = StoreServer::Start(t.store);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string target = (*store)->target();
  cachestore::BlockStore& blocks = (*store)->store();
  const auto key = [](uint8_t i) {
    cachestore::BlockKey k;
    k.bytes[0] = i;
    return k;
  };
  const auto liveness = [&] { return testing::HealthStatus(target, kLivenessService); };
  const auto metric = [&](const std::string& name) {
    const std::string text = Exchange((*store)->metrics_port(), "GET /metrics HTTP/1.1\r\n\r\n");
    const std::string line = "\nvericache_store_" + name + " ";
    const size_t at = text.find(line);
    return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + line.size());
  };
  ASSERT_TRUE(blocks.Put(key(1), testing::RandomBlock(1, 7)).ok());
  EXPECT_EQ(liveness(), 1);
  EXPECT_EQ(testing::HealthStatus(target), 1);
  EXPECT_EQ(metric("disk_writes_failing_ms"), 0);

  fs->fault = Fault::kNoSpace;
  EXPECT_EQ(blocks.Put(key(2), testing::RandomBlock(2, 7)).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(testing::Eventually([&] { return metric("disk_writes_failing_ms") >= 2000; }));
  EXPECT_EQ(metric("disk_full"), 1);
  EXPECT_EQ(liveness(), 1);  // past the grace, but only full
  std::ostringstream out, err;
  ASSERT_EQ(cli::RunStatsCommand({"--target", target, "--token", "tok"}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("disk writes failing for "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("(no space left)"), std::string::npos) << out.str();
  fs->fault = Fault::kNone;
  const absl::Time room = absl::Now();
  EXPECT_TRUE(testing::Eventually([&] { return metric("disk_writes_failing_ms") == 0; }));
  std::printf("writes taken again %.1f s after the disk had room\n", absl::ToDoubleSeconds(absl::Now() - room));
  EXPECT_EQ(metric("disk_full"), 0);
  EXPECT_TRUE(blocks.Put(key(2), testing::RandomBlock(2, 7)).ok());

  // Writes that fail with EIO for longer than the grace: RocksDB takes none, a reopen does not
  // help, and the entry turns NOT_SERVING. Reads from RAM go on.
  fs->fault = Fault::kIoError;
  EXPECT_EQ(blocks.Put(key(3), testing::RandomBlock(3, 7)).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(testing::Eventually([&] { return liveness() == 2; }));
  EXPECT_GE(metric("disk_writes_failing_ms"), 1000);
  EXPECT_EQ(metric("disk_full"), 0);
  EXPECT_EQ(testing::HealthStatus(target), 1);
  bool from_ram = false;
  EXPECT_TRUE(blocks.Get(key(1), &from_ram).ok());
  // Once the disk works again, the tier reopens RocksDB by itself (no restart), and the store is
  // live and takes puts again.
  fs->fault = Fault::kNone;
  EXPECT_TRUE(testing::Eventually([&] { return liveness() == 1; }));
  EXPECT_TRUE(blocks.Put(key(3), testing::RandomBlock(3, 7)).ok());
  EXPECT_GE(blocks.disk().reopens(), 1u);
  EXPECT_EQ(metric("disk_writes_failing_ms"), 0);
}

}  // namespace
}  // namespace vc
