// The cache store over gRPC on loopback: a real server, real clients.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "cachestore/block_format.h"
#include "cachestore/store_client.h"
#include "common/clock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"
#include "gtest/gtest.h"
#include "services/store_service.h"
#include "tests/testing/blocks.h"
#include "tests/testing/tiny_model.h"

namespace vc {
namespace {

using cachestore::BlockKey;
using cachestore::StoreClient;
using cachestore::StoreClientOptions;

std::string MakeBlock(uint32_t seed, std::array<uint8_t, 32>* fp = nullptr) {
  return testing::RandomBlock(seed, 42, fp);
}

// Damages every UCX location a LeaseBlocks answer carries, while `*on`: each rkey is cut to half
// its length (which UCX, handed it, crashed on in a trial), the checksum left as the store set it.
class DamageLocations final : public grpc::experimental::Interceptor {
 public:
  explicit DamageLocations(const std::atomic<bool>* on) : on_(on) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using grpc::experimental::InterceptionHookPoints;
    if (on_->load() && m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      if (const void* msg = m->GetSendMessage(); msg != nullptr) {
        damaged_ = *static_cast<const vericache::v1::LeaseBlocksResponse*>(msg);
        for (vericache::v1::LeasedBlock& b : *damaged_.mutable_blocks()) {
          if (b.has_remote()) b.mutable_remote()->mutable_rkey()->resize(b.remote().rkey().size() / 2);
        }
        m->ModifySendMessage(&damaged_);
      }
    }
    m->Proceed();
  }

 private:
  const std::atomic<bool>* const on_;
  vericache::v1::LeaseBlocksResponse damaged_;  // sent in place of the answer: lives as long as the call
};

// Puts an interceptor I(arg) on every LeaseBlocks call.
template <typename I, typename Arg>
class OnLeaseBlocks final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit OnLeaseBlocks(Arg arg) : arg_(arg) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return std::string(info->method()) == "/vericache.v1.CacheStore/LeaseBlocks" ? new I(arg_) : nullptr;
  }

 private:
  const Arg arg_;
};

// Holds each LeaseBlocks call for `*delay_ms` after its request arrives, before the service takes
// it up (0: not at all): a call whose client's deadline passes meanwhile. The call goes on from a
// thread of its own, so that gRPC's threads see the cancellation meanwhile.
class DelayLeases final : public grpc::experimental::Interceptor {
 public:
  explicit DelayLeases(const std::atomic<int>* delay_ms) : delay_ms_(delay_ms) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using grpc::experimental::InterceptionHookPoints;
    const int delay = delay_ms_->load();
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) && delay > 0) {
      std::thread([m, delay] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        m->Proceed();
      }).detach();
      return;
    }
    m->Proceed();
  }

 private:
  const std::atomic<int>* const delay_ms_;
};

// Where the RAM tier lives: memory the tier allocated (UCX emulates gets from it), or a region UCX
// allocated in shared memory (as `vericache store` runs it; read in place in error mode none).
enum class Region { kTier, kUcx };

class StoreServer {
 public:
  // `clock` (may be null: the steady clock) times the RAM tier's leases.
  // `lease_cap`: RAM one tenant's leases may pin (0: no cap).
  explicit StoreServer(const std::string& dir, const Clock* clock = nullptr, Region region = Region::kTier,
                       cachestore::UcxErrorMode mode = cachestore::UcxErrorMode::kNone, uint64_t lease_cap = 0) {
    cachestore::StoreOptions o;
    o.ram.capacity_bytes = 8 << 20;
    o.ram.clock = clock;
    o.ram.max_leased_bytes_per_owner = lease_cap;
    o.disk.path = dir;
    o.disk.capacity_bytes = 64 << 20;
    if (region == Region::kUcx) {
      ucx_ = *cachestore::UcxRegionServer::Allocate(o.ram.capacity_bytes, mode);
      o.ram.region = ucx_->region();
    }
    store_ = *cachestore::BlockStore::Open(o);
    if (region == Region::kTier) {
      ucx_ = *cachestore::UcxRegionServer::Create(store_->ram().region(), store_->ram().region_bytes(), mode);
    }
    service_ = std::make_unique<CacheStoreService>(
        store_.get(), StoreServiceOptions{{{"token-a", "alice"}, {"token-b", "bob"}}, "secret", ucx_.get(), {"alice"}});
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.SetMaxReceiveMessageSize(256 << 20);
    b.RegisterService(service_.get());
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    using Damage = OnLeaseBlocks<DamageLocations, const std::atomic<bool>*>;
    using Delay = OnLeaseBlocks<DelayLeases, const std::atomic<int>*>;
    interceptors.push_back(std::make_unique<Damage>(&damage_locations));
    interceptors.push_back(std::make_unique<Delay>(&delay_leases_ms));
    b.experimental().SetInterceptorCreators(std::move(interceptors));
    server_ = b.BuildAndStart();
  }
  ~StoreServer() {
    server_->Shutdown();
    store_.reset();  // before the region it may live in
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  // `clock` (may be null: the steady clock) times the client's trust in its leases.
  std::unique_ptr<StoreClient> Client(const std::string& token, const Clock* clock = nullptr) {
    return *StoreClient::Create({target(), token, 5000, "", clock});
  }

  cachestore::BlockStore& store() { return *store_; }

  // While set, the UCX locations of every LeaseBlocks answer arrive damaged (DamageLocations).
  std::atomic<bool> damage_locations{false};
  // While positive, LeaseBlocks calls wait this long before the service takes them up.
  std::atomic<int> delay_leases_ms{0};

 private:
  std::unique_ptr<cachestore::BlockStore> store_;
  std::unique_ptr<cachestore::UcxRegionServer> ucx_;
  std::unique_ptr<CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

std::vector<BlockKey> Chain(int n, int salt) {
  std::vector<int32_t> tokens(n * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + salt) % 256);
  return cachestore::ChainBlockKeys({"model", "f32:bs16", "", 16}, tokens);
}

TEST(StoreService, PutLookupGetDeleteRoundTrip) {
  StoreServer server(testing::TempDir("store_rt"));
  auto a = server.Client("token-a");
  const auto keys = Chain(4, 1);
  std::array<uint8_t, 32> fp;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(i, &fp)).ok());
  auto look = a->Lookup(keys);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->first, 3u);  // the fourth block is missing
  EXPECT_EQ(look->second, 3u);
  auto got = a->Get(keys[1], &fp);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, MakeBlock(1));
  std::array<uint8_t, 32> other{};
  EXPECT_EQ(a->Get(keys[1], &other).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a->Delete(keys[0]).ok());
  EXPECT_EQ(a->Lookup(keys)->first, 0u);  // a chain is only as long as its first gap
  EXPECT_EQ(a->Get(keys[0]).status().code(), absl::StatusCode::kNotFound);
  auto stats = a->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->disk_blocks, 2u);
  EXPECT_EQ(stats->ram_blocks, 2u);
  EXPECT_EQ(stats->ram_block_bytes, MakeBlock(1).size() + MakeBlock(2).size());
  EXPECT_GE(stats->ram_used_bytes, stats->ram_block_bytes);  // the blocks' slots
  EXPECT_GT(stats->disk_used_bytes, 0u);
  EXPECT_GE(stats->disk_footprint_bytes, stats->disk_used_bytes);  // the files hold the blocks and more
}

// A Put of a different block under a key being read is refused by both tiers alike: the RAM copy
// being read stays and so does the disk's, so a restart cannot serve another block than RAM did.
TEST(StoreService, DifferentBlockUnderALeasedKeyIsRefusedByBothTiers) {
  StoreServer server(testing::TempDir("store_leased_put"));
  cachestore::BlockStore& store = server.store();
  const BlockKey key = Chain(1, 3)[0];
  ASSERT_TRUE(store.Put(key, MakeBlock(1)).ok());
  auto lease = store.Lease(key, "reader");
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(store.Put(key, MakeBlock(1)).ok());  // the same block: nothing to do
  EXPECT_EQ(store.Put(key, MakeBlock(2)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store.ram().Delete(key).ok());  // what disk holds is what RAM served
  bool from_ram = true;
  EXPECT_EQ(*store.Get(key, &from_ram), MakeBlock(1));
  EXPECT_FALSE(from_ram);
  EXPECT_TRUE(store.Release(lease->id, "reader").ok());
  ASSERT_TRUE(store.Put(key, MakeBlock(2)).ok());  // no reader now
  EXPECT_EQ(*store.Get(key, &from_ram), MakeBlock(2));
  ASSERT_TRUE(store.ram().Delete(key).ok());
  EXPECT_EQ(*store.Get(key, &from_ram), MakeBlock(2));
}

TEST(StoreService, RemoteReadsOverUcxAreCheckedEndToEnd) {
  StoreServer server(testing::TempDir("store_ucx"));
  auto a = server.Client("token-a");
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(3, 7);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(20 + i)).ok());
  for (int i = 0; i < 3; ++i) {
    auto got = a->GetRemote(keys[i], reader.get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, MakeBlock(20 + i));
  }
  // A bit flipped in the store's RAM: the reader's check catches it, and the block is gone.
  bool released = false;
  ASSERT_TRUE(testing::CorruptInRam(server.store(), "secret", "alice", keys[1], 5, 4, &released).ok());
  ASSERT_TRUE(released);
  EXPECT_EQ(a->GetRemote(keys[1], reader.get()).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a->Get(keys[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->Lookup(keys)->first, 1u);
}

// A location damaged on its way from the store is refused before UCX sees it, in every read path,
// and costs that read only: the block stays stored, and reads once the damage stops.
TEST(StoreService, DamagedLocationsAreRefusedBeforeUcxSeesThem) {
  StoreServer server(testing::TempDir("store_damaged"));
  auto a = server.Client("token-a");
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(3, 9);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(60 + i)).ok());
  server.damage_locations = true;
  const auto refused = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kDataLoss && absl::StrContains(s.message(), "UCX location");
  };
  const absl::StatusOr<std::string> one = a->GetRemote(keys[0], reader.get());
  EXPECT_TRUE(refused(one.status())) << one.status();
  for (const absl::StatusOr<std::string>& r : a->GetRemoteBatch(keys, reader.get())) {
    EXPECT_TRUE(refused(r.status())) << r.status();
  }
  std::vector<std::string> buffers(3, std::string(1 << 20, '\0'));
  std::vector<absl::Span<char>> dest;
  for (std::string& b : buffers) dest.emplace_back(b.data(), b.size());
  for (const absl::StatusOr<size_t>& r : a->GetRemoteBatchInto(keys, dest, reader.get())) {
    EXPECT_TRUE(refused(r.status())) << r.status();
  }
  server.damage_locations = false;
  EXPECT_EQ(a->Lookup(keys)->first, 3u);
  for (int i = 0; i < 3; ++i) {
    const absl::StatusOr<std::string> got = a->GetRemote(keys[i], reader.get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, MakeBlock(60 + i));
  }
}

TEST(StoreService, BatchedRemoteReadsKeepOrderAndPerBlockOutcomes) {
  StoreServer server(testing::TempDir("store_batch"));
  auto a = server.Client("token-a");
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(6, 11);
  for (int i : {0, 1, 3, 4, 5}) ASSERT_TRUE(a->Put(keys[i], MakeBlock(50 + i)).ok());  // not 2
  // Block 4's stored copy goes bad.
  bool released = false;
  ASSERT_TRUE(testing::CorruptInRam(server.store(), "secret", "alice", keys[4], 9, 16, &released).ok());
  ASSERT_TRUE(released);
  auto got = a->GetRemoteBatch(keys, reader.get());
  ASSERT_EQ(got.size(), 6u);
  for (int i : {0, 1, 3, 5}) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(*got[i], MakeBlock(50 + i)) << i;
  }
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got[4].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a->Get(keys[4]).status().code(), absl::StatusCode::kNotFound);  // dropped
  EXPECT_TRUE(a->GetRemoteBatch({}, reader.get()).empty());
}

// A bit of a tenant's stored block flipped in RAM.
void CorruptInRam(StoreServer& server, const std::string& tenant, const BlockKey& key, size_t from_end) {
  // The lease taken to find it may have expired already under a leaping clock.
  const absl::Status s = testing::CorruptInRam(server.store(), "secret", tenant, key, from_end, 8);
  ASSERT_TRUE(s.ok()) << s;
}

// Reads into caller buffers, on each data path: the tier's own memory (UCX gets), a UCX-allocated
// region in error mode none (mapped, copied and checked in one pass) and in error mode peer (TCP
// gets, never mapped).
struct PathCase {
  Region region;
  cachestore::UcxErrorMode mode;
  bool mapped;  // whether the reader can map the region
};

class StoreReadPaths : public ::testing::TestWithParam<PathCase> {};

TEST_P(StoreReadPaths, BatchIntoCallerBuffersRoundTripsAndDropsCorruptBlocks) {
  const PathCase& c = GetParam();
  StoreServer server(testing::TempDir("store_into"), nullptr, c.region, c.mode);
  auto a = server.Client("token-a");
  auto reader = *cachestore::UcxReader::Create(c.mode);
  const auto keys = Chain(6, 15);
  std::array<uint8_t, 32> fp;
  for (int i : {0, 1, 3, 4, 5}) ASSERT_TRUE(a->Put(keys[i], MakeBlock(100 + i, &fp)).ok());  // not 2

  // The path under test is the one taken: the reader maps the leased block exactly when expected.
  {
    auto stub =
        vericache::v1::CacheStore::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token-a");
    vericache::v1::LeaseBlocksRequest req;
    req.add_keys(std::string(reinterpret_cast<const char*>(keys[0].bytes.data()), 32));
    vericache::v1::LeaseBlocksResponse resp;
    ASSERT_TRUE(stub->LeaseBlocks(&ctx, req, &resp).ok());
    ASSERT_TRUE(resp.blocks(0).has_remote());
    const vericache::v1::RemoteBlock& r = resp.blocks(0).remote();
    // The location carries its checksum, which a damaged rkey or address fails (UCX would take
    // them: a truncated rkey crashed the reader in a trial), and one without it passes.
    ASSERT_TRUE(r.has_location_crc32c());
    EXPECT_TRUE(cachestore::CheckRemoteLocation(r).ok());
    for (int damage = 0; damage < 3; ++damage) {
      vericache::v1::RemoteBlock bad = r;
      if (damage == 0) bad.mutable_rkey()->resize(r.rkey().size() / 2);
      if (damage == 1) (*bad.mutable_rkey())[3] ^= 0x10;
      if (damage == 2) bad.set_address(r.address() + 4096);
      EXPECT_EQ(cachestore::CheckRemoteLocation(bad).code(), absl::StatusCode::kDataLoss) << damage;
      bad.clear_location_crc32c();
      EXPECT_TRUE(cachestore::CheckRemoteLocation(bad).ok());
    }
    std::string copied;
    const absl::Status mapped = reader->WithMapping(r.worker_address(), r.rkey(), r.address(), r.size_bytes(),
                                                    [&](const char* p) { copied.assign(p, r.size_bytes()); });
    EXPECT_EQ(mapped.ok(), c.mapped) << mapped;
    if (mapped.ok()) {
      EXPECT_EQ(copied, MakeBlock(100));
    }
    grpc::ClientContext rctx;
    rctx.AddMetadata("authorization", "Bearer token-a");
    vericache::v1::ReleaseLeasesRequest rreq;
    rreq.add_lease_ids(r.lease_id());
    vericache::v1::ReleaseLeasesResponse rresp;
    ASSERT_TRUE(stub->ReleaseLeases(&rctx, rreq, &rresp).ok());
  }

  const size_t block_bytes = MakeBlock(0).size();
  std::vector<std::string> buffers(6, std::string(block_bytes + 100, '\0'));
  std::vector<absl::Span<char>> dest;
  for (std::string& b : buffers) dest.emplace_back(b.data(), b.size());
  for (int round = 0; round < 2; ++round) {  // the same buffers, reused
    for (std::string& b : buffers) std::fill(b.begin(), b.end(), '?');
    auto got = a->GetRemoteBatchInto(keys, dest, reader.get(), &fp);
    ASSERT_EQ(got.size(), 6u);
    for (int i : {0, 1, 3, 4, 5}) {
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
      ASSERT_EQ(*got[i], block_bytes);
      EXPECT_EQ(buffers[i].substr(0, block_bytes), MakeBlock(100 + i)) << i;
    }
    EXPECT_EQ(got[2].status().code(), absl::StatusCode::kNotFound);
  }

  // A corrupted stored copy is kDataLoss and is deleted; the rest of the batch is unaffected.
  CorruptInRam(server, "alice", keys[4], 3);
  CorruptInRam(server, "alice", keys[1], MakeBlock(0).size() - 20);  // in the header
  auto got = a->GetRemoteBatchInto(keys, dest, reader.get());
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kDataLoss) << got[1].status();
  EXPECT_EQ(got[4].status().code(), absl::StatusCode::kDataLoss) << got[4].status();
  for (int i : {0, 3, 5}) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(buffers[i].substr(0, block_bytes), MakeBlock(100 + i)) << i;
  }
  EXPECT_EQ(a->Get(keys[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->Get(keys[4]).status().code(), absl::StatusCode::kNotFound);

  // A buffer too small for its block, and a buffer count that does not match the keys.
  std::string small(block_bytes - 1, '\0');
  std::vector<absl::Span<char>> mixed = {dest[0], absl::Span<char>(small.data(), small.size())};
  auto two = a->GetRemoteBatchInto({keys[0], keys[3]}, mixed, reader.get());
  ASSERT_TRUE(two[0].ok()) << two[0].status();
  EXPECT_EQ(two[1].status().code(), absl::StatusCode::kOutOfRange);
  for (const auto& r : a->GetRemoteBatchInto(keys, {dest[0]}, reader.get())) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // GetRemoteBatch, the string-returning form, takes the same path.
  auto strings = a->GetRemoteBatch({keys[5], keys[0]}, reader.get());
  ASSERT_TRUE(strings[0].ok() && strings[1].ok());
  EXPECT_EQ(*strings[0], MakeBlock(105));
  // Every lease went back (the releases are asynchronous): all blocks can be deleted and freed.
  a.reset();
  auto b = server.Client("token-a");
  for (const BlockKey& k : keys) (void)b->Delete(k);
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

// A batch leased in several rounds, each round's LeaseBlocks call in flight while the round before
// is read: every round's blocks land in their own buffers, and one round's failures (a missing key,
// a corrupt block) stay that round's blocks' own.
TEST_P(StoreReadPaths, PipelinedRoundsKeepEveryRoundsResults) {
  const PathCase& c = GetParam();
  StoreServer server(testing::TempDir("store_rounds"), nullptr, c.region, c.mode);
  const size_t block_bytes = MakeBlock(0).size();
  const size_t buffer_bytes = block_bytes + 100;
  // Rounds of three blocks: [0, 3), [3, 6), [6, 9), [9, 11).
  StoreClientOptions options{server.target(), "token-a", 5000, ""};
  options.lease_round_bytes = 3 * buffer_bytes;
  auto a = *StoreClient::Create(options);
  auto reader = *cachestore::UcxReader::Create(c.mode);
  const auto keys = Chain(11, 23);
  std::array<uint8_t, 32> fp;
  for (int i = 0; i < 11; ++i) {
    if (i != 7) {  // 7: missing, in the third round
      ASSERT_TRUE(a->Put(keys[i], MakeBlock(200 + i, &fp)).ok());
    }
  }
  std::vector<std::string> buffers(11, std::string(buffer_bytes, '?'));
  std::vector<absl::Span<char>> dest;
  for (std::string& b : buffers) dest.emplace_back(b.data(), b.size());
  auto got = a->GetRemoteBatchInto(keys, dest, reader.get(), &fp);
  ASSERT_EQ(got.size(), 11u);
  EXPECT_EQ(a->lease_calls(), 4);  // one LeaseBlocks call per round
  for (int i = 0; i < 11; ++i) {
    if (i == 7) continue;
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    ASSERT_EQ(*got[i], block_bytes);
    EXPECT_EQ(buffers[i].substr(0, block_bytes), MakeBlock(200 + i)) << i;
  }
  EXPECT_EQ(got[7].status().code(), absl::StatusCode::kNotFound) << got[7].status();

  // A corrupt block in the second round is kDataLoss and deleted; every other round is unaffected.
  CorruptInRam(server, "alice", keys[4], 3);
  for (std::string& b : buffers) std::fill(b.begin(), b.end(), '?');
  got = a->GetRemoteBatchInto(keys, dest, reader.get(), &fp);
  EXPECT_EQ(got[4].status().code(), absl::StatusCode::kDataLoss) << got[4].status();
  EXPECT_EQ(got[7].status().code(), absl::StatusCode::kNotFound) << got[7].status();
  for (int i = 0; i < 11; ++i) {
    if (i == 4 || i == 7) continue;
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(buffers[i].substr(0, block_bytes), MakeBlock(200 + i)) << i;
  }
  EXPECT_EQ(a->Get(keys[4]).status().code(), absl::StatusCode::kNotFound);

  // Rounds sized from the buffers under the default (about 16 MiB a round): 2 MiB buffers, rounds
  // of eight blocks; and the same keys in one call of one block a round.
  auto d = server.Client("token-a");
  std::vector<std::string> big(11, std::string(size_t{2} << 20, '?'));
  std::vector<absl::Span<char>> big_dest;
  for (std::string& b : big) big_dest.emplace_back(b.data(), b.size());
  options.lease_round_bytes = 1;
  auto one = *StoreClient::Create(options);
  for (StoreClient* client : {d.get(), one.get()}) {
    const int64_t calls = client->lease_calls();
    got = client->GetRemoteBatchInto(keys, big_dest, reader.get());
    EXPECT_EQ(client->lease_calls() - calls, client == d.get() ? 2 : 11);
    for (int i = 0; i < 11; ++i) {
      if (i == 4 || i == 7) {
        EXPECT_EQ(got[i].status().code(), absl::StatusCode::kNotFound) << i << ": " << got[i].status();
        continue;
      }
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
      EXPECT_EQ(big[i].substr(0, block_bytes), MakeBlock(200 + i)) << i;
    }
  }

  // Every round's leases went back: once the clients are gone (they wait for their releases), all
  // blocks can be deleted and their RAM freed.
  a.reset();
  d.reset();
  one.reset();
  auto b = server.Client("token-a");
  for (const BlockKey& k : keys) (void)b->Delete(k);
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, StoreReadPaths,
    ::testing::Values(PathCase{Region::kTier, cachestore::UcxErrorMode::kNone, false},
                      PathCase{Region::kUcx, cachestore::UcxErrorMode::kNone, true},
                      PathCase{Region::kUcx, cachestore::UcxErrorMode::kPeer, false}),
    [](const auto& info) {
      return std::string(info.param.region == Region::kTier ? "TierMemory" : "UcxRegion") +
             (info.param.mode == cachestore::UcxErrorMode::kNone ? "None" : "Peer");
    });

// A clock that jumps a minute, twice the default lease time, every time it is read: every lease
// has expired by the store's next look at the clock.
class LeapingClock final : public Clock {
 public:
  absl::Duration Now() const override { return absl::Minutes(++reads_); }

 private:
  mutable std::atomic<int64_t> reads_{0};
};

TEST(StoreService, ReadsUnderAnExpiredLeaseAreDiscarded) {
  LeapingClock clock;
  StoreServer server(testing::TempDir("store_expiry"), &clock);
  // Store and client share the clock: by the client's clock the read ends a minute after the
  // lease was asked for, past its time to live, and the store has dropped the lease by the release.
  auto a = server.Client("token-a", &clock);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(3, 8);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(30 + i)).ok());
  // The client cannot know the slot was not reused meanwhile, so it returns no bytes, and leaves
  // the stored block alone.
  EXPECT_EQ(a->GetRemote(keys[0], reader.get()).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(*a->Get(keys[0]), MakeBlock(30));
  for (const auto& got : a->GetRemoteBatch(keys, reader.get())) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  }
}

// The same on the mapped path, where the check runs during the copy: a read that may have
// outlived its lease is kAborted even when its bytes fail their check (the slot may have been
// reused), and the stored block is kept.
TEST(StoreService, MappedReadsUnderAnExpiredLeaseAreDiscardedNotDropped) {
  LeapingClock clock;
  StoreServer server(testing::TempDir("store_expiry_mapped"), &clock, Region::kUcx);
  auto a = server.Client("token-a", &clock);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(2, 16);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(110 + i)).ok());
  CorruptInRam(server, "alice", keys[1], 3);
  std::vector<std::string> buffers(2, std::string(MakeBlock(0).size(), '\0'));
  std::vector<absl::Span<char>> dest = {absl::Span<char>(buffers[0].data(), buffers[0].size()),
                                        absl::Span<char>(buffers[1].data(), buffers[1].size())};
  for (const auto& got : a->GetRemoteBatchInto(keys, dest, reader.get())) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted) << got.status();
  }
  EXPECT_EQ(a->Lookup(keys)->first, 2u);  // both still stored
}

// Every round has its own trust window and release: under a clock that outruns every lease, each
// round's reads are kAborted on the release's answer, and nothing is dropped.
TEST(StoreService, PipelinedRoundsUnderExpiredLeasesAreDiscarded) {
  LeapingClock clock;
  StoreServer server(testing::TempDir("store_expiry_rounds"), &clock, Region::kUcx);
  StoreClientOptions options{server.target(), "token-a", 5000, "", &clock};
  options.lease_round_bytes = 1;  // a round per block
  auto a = *StoreClient::Create(options);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(3, 17);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(120 + i)).ok());
  std::vector<std::string> buffers(3, std::string(MakeBlock(0).size(), '\0'));
  std::vector<absl::Span<char>> dest;
  for (std::string& b : buffers) dest.emplace_back(b.data(), b.size());
  for (const auto& got : a->GetRemoteBatchInto(keys, dest, reader.get())) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted) << got.status();
  }
  EXPECT_EQ(a->lease_calls(), 3);  // a round, and its own lease call, per block
  EXPECT_EQ(a->Lookup(keys)->first, 3u);
}

TEST(StoreService, ReadsWithinTheLeaseTimeAreTrustedWithoutTheRelease) {
  // The store's clock leaps past every lease's expiry, so no release could vouch for a read; the
  // client's never moves, so by its clock every read ends within the lease's time to live.
  LeapingClock store_clock;
  StoreServer server(testing::TempDir("store_trust"), &store_clock);
  ManualClock client_clock;
  auto a = server.Client("token-a", &client_clock);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(2, 12);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(70 + i)).ok());
  // The default lease lives 30 s; the client trusts reads that end within 24 s.
  EXPECT_EQ(StoreClient::LeaseTrustWindow(absl::Seconds(30)), absl::Seconds(24));
  EXPECT_EQ(StoreClient::LeaseTrustWindow(absl::Seconds(2)), absl::Seconds(1));
  auto got = a->GetRemoteBatch(keys, reader.get());
  ASSERT_TRUE(got[0].ok() && got[1].ok()) << got[0].status() << " " << got[1].status();
  EXPECT_EQ(*got[1], MakeBlock(71));
}

TEST(StoreService, LeaseBlocksAndReleaseLeases) {
  StoreServer server(testing::TempDir("store_lease_blocks"));
  auto a = server.Client("token-a");
  const auto keys = Chain(3, 13);
  std::array<uint8_t, 32> fp;
  for (int i : {0, 2}) ASSERT_TRUE(a->Put(keys[i], MakeBlock(80 + i, &fp)).ok());  // not 1
  auto stub =
      vericache::v1::CacheStore::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  auto lease = [&](const std::string& token, std::string fingerprint, vericache::v1::LeaseBlocksResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    vericache::v1::LeaseBlocksRequest req;
    for (const BlockKey& k : keys) req.add_keys(std::string(reinterpret_cast<const char*>(k.bytes.data()), 32));
    req.set_expect_fingerprint(std::move(fingerprint));
    return stub->LeaseBlocks(&ctx, req, resp).error_code();
  };
  auto release = [&](const std::string& token, const std::vector<uint64_t>& ids,
                     vericache::v1::ReleaseLeasesResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    vericache::v1::ReleaseLeasesRequest req;
    for (uint64_t id : ids) req.add_lease_ids(id);
    return stub->ReleaseLeases(&ctx, req, resp).error_code();
  };

  vericache::v1::LeaseBlocksResponse got;
  ASSERT_EQ(lease("token-a", std::string(reinterpret_cast<const char*>(fp.data()), 32), &got), grpc::StatusCode::OK);
  EXPECT_EQ(got.lease_ttl_ms(), 30'000u);
  ASSERT_EQ(got.blocks_size(), 3);
  EXPECT_EQ(got.blocks(1).status_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_FALSE(got.blocks(1).has_remote());
  std::vector<uint64_t> ids;
  for (int i : {0, 2}) {
    ASSERT_EQ(got.blocks(i).status_code(), 0) << got.blocks(i).status_message();
    ASSERT_TRUE(got.blocks(i).has_remote());
    EXPECT_EQ(got.blocks(i).remote().size_bytes(), MakeBlock(80 + i).size());
    ids.push_back(got.blocks(i).remote().lease_id());
  }
  EXPECT_NE(ids[0], ids[1]);
  // The leased bytes are the blocks'.
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const vericache::v1::RemoteBlock& r = got.blocks(2).remote();
  std::string bytes(r.size_bytes(), '\0');
  ASSERT_TRUE(reader->Get(r.worker_address(), r.rkey(), r.address(), bytes.data(), bytes.size()).ok());
  EXPECT_EQ(bytes, MakeBlock(82));

  // Another model's fingerprint leases nothing.
  vericache::v1::LeaseBlocksResponse other;
  ASSERT_EQ(lease("token-a", std::string(32, '\7'), &other), grpc::StatusCode::OK);
  for (int i : {0, 2}) {
    EXPECT_EQ(other.blocks(i).status_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  }
  // Bob sees none of Alice's blocks, cannot end her leases, and a bad token gets nothing at all.
  vericache::v1::LeaseBlocksResponse bobs;
  ASSERT_EQ(lease("token-b", "", &bobs), grpc::StatusCode::OK);
  ASSERT_EQ(bobs.blocks_size(), 3);
  for (const auto& b : bobs.blocks()) {
    EXPECT_EQ(b.status_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
    EXPECT_FALSE(b.has_remote());
  }
  vericache::v1::ReleaseLeasesResponse rel;
  ASSERT_EQ(release("token-b", ids, &rel), grpc::StatusCode::OK);
  EXPECT_EQ(rel.live_leases(), 0u);
  EXPECT_EQ(lease("token-x", "", &bobs), grpc::StatusCode::UNAUTHENTICATED);

  // Alice's release ends both leases (and an unknown id changes nothing); releasing again is
  // harmless and finds nothing live.
  rel.Clear();
  ASSERT_EQ(release("token-a", {ids[0], 999'999, ids[1]}, &rel), grpc::StatusCode::OK);
  EXPECT_EQ(rel.live_leases(), 2u);
  ASSERT_EQ(rel.was_live_size(), 3);
  EXPECT_TRUE(rel.was_live(0));
  EXPECT_FALSE(rel.was_live(1));
  EXPECT_TRUE(rel.was_live(2));
  rel.Clear();
  ASSERT_EQ(release("token-a", ids, &rel), grpc::StatusCode::OK);
  EXPECT_EQ(rel.live_leases(), 0u);
  EXPECT_EQ(*a->Get(keys[0]), MakeBlock(80));  // the blocks themselves are untouched
}

// A tenant's leases pin at most its cap of RAM; past it, blocks come inline (and one on disk is not
// read and promoted for a lease that would be refused).
TEST(StoreService, LeasesPastATenantsCapAreServedInline) {
  uint64_t slot = 4096;  // the RAM tier's slot for these blocks: 4 KiB times a power of two
  while (slot < MakeBlock(90).size()) slot *= 2;
  StoreServer server(testing::TempDir("store_lease_cap"), nullptr, Region::kTier, cachestore::UcxErrorMode::kNone,
                     2 * slot);
  auto a = server.Client("token-a");
  auto b = server.Client("token-b");
  const auto keys = Chain(5, 17);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a->Put(keys[i], MakeBlock(90 + i)).ok());
    ASSERT_TRUE(b->Put(keys[i], MakeBlock(190 + i)).ok());
  }
  auto stub =
      vericache::v1::CacheStore::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  auto lease = [&](const std::string& token, vericache::v1::LeaseBlocksResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    vericache::v1::LeaseBlocksRequest req;
    for (const BlockKey& k : keys) req.add_keys(std::string(reinterpret_cast<const char*>(k.bytes.data()), 32));
    return stub->LeaseBlocks(&ctx, req, resp).error_code();
  };
  // Alice's last block is on disk only.
  const BlockKey on_disk =
      cachestore::BlockStore::Scoped(cachestore::BlockStore::TenantSalt("secret", "alice"), keys[4]);
  ASSERT_TRUE(server.store().ram().Delete(on_disk).ok());
  // Alice's first two blocks are leased; the rest would pass her cap.
  vericache::v1::LeaseBlocksResponse alice;
  ASSERT_EQ(lease("token-a", &alice), grpc::StatusCode::OK);
  ASSERT_EQ(alice.blocks_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(alice.blocks(i).status_code(), i < 2 ? 0 : static_cast<int>(absl::StatusCode::kResourceExhausted)) << i;
  }
  EXPECT_FALSE(server.store().ram().Contains(on_disk)) << "read from disk for a lease past the cap";
  // Bob's cap is his own.
  vericache::v1::LeaseBlocksResponse bob;
  ASSERT_EQ(lease("token-b", &bob), grpc::StatusCode::OK);
  EXPECT_EQ(bob.blocks(0).status_code(), 0);
  EXPECT_EQ(bob.blocks(1).status_code(), 0);
  // While her leases are held, alice's reads still get every block: inline, and checked.
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  auto got = a->GetRemoteBatch(keys, reader.get());
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(*got[i], MakeBlock(90 + i)) << i;
  }
}

// A LeaseBlocks call whose client has gone when the store takes it up (its deadline passed) leases
// nothing: the ids would never reach the client to be released, and the blocks would stay pinned,
// against the tenant's cap, until the leases expired.
TEST(StoreService, ALeaseCallWhoseClientHasGoneLeavesNothingLeased) {
  uint64_t slot = 4096;
  while (slot < MakeBlock(90).size()) slot *= 2;
  StoreServer server(testing::TempDir("store_lease_gone"), nullptr, Region::kTier, cachestore::UcxErrorMode::kNone,
                     2 * slot);
  auto a = server.Client("token-a");
  const auto keys = Chain(2, 29);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(90 + i)).ok());
  auto stub =
      vericache::v1::CacheStore::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  auto lease = [&](absl::Duration timeout, vericache::v1::LeaseBlocksResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token-a");
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    vericache::v1::LeaseBlocksRequest req;
    for (const BlockKey& k : keys) req.add_keys(std::string(reinterpret_cast<const char*>(k.bytes.data()), 32));
    return stub->LeaseBlocks(&ctx, req, resp).error_code();
  };
  server.delay_leases_ms = 600;
  vericache::v1::LeaseBlocksResponse gone;
  ASSERT_EQ(lease(absl::Milliseconds(100), &gone), grpc::StatusCode::DEADLINE_EXCEEDED);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the store takes the call up
  server.delay_leases_ms = 0;
  // Both blocks lease again: nothing of the first call holds the cap.
  vericache::v1::LeaseBlocksResponse again;
  ASSERT_EQ(lease(absl::Seconds(5), &again), grpc::StatusCode::OK);
  ASSERT_EQ(again.blocks_size(), 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(again.blocks(i).status_code(), 0) << again.blocks(i).status_message();
}

// A block deleted while a reader holds its lease, then put again, is read again at once (inline
// until the old copy's readers are done), not reported missing.
TEST(StoreService, BlockPutAgainWhileItsDeletedCopyIsLeasedIsReadable) {
  StoreServer server(testing::TempDir("store_dead_reput"));
  auto a = server.Client("token-a");
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(1, 23);
  ASSERT_TRUE(a->Put(keys[0], MakeBlock(70)).ok());
  const BlockKey scoped =
      cachestore::BlockStore::Scoped(cachestore::BlockStore::TenantSalt("secret", "alice"), keys[0]);
  auto held = server.store().Lease(scoped, "someone");  // a reader that has not finished
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(a->Delete(keys[0]).ok());
  ASSERT_TRUE(a->Put(keys[0], MakeBlock(71)).ok());
  auto got = a->GetRemoteBatch(keys, reader.get());
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(*got[0], MakeBlock(71));
  EXPECT_TRUE(server.store().Release(held->id, "someone").ok());
  got = a->GetRemoteBatch(keys, reader.get());
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(*got[0], MakeBlock(71));
}

// LeaseBlocks ends the caller's finished leases it carries before leasing, by ReleaseLeases' rules.
TEST(StoreService, LeaseBlocksEndsTheLeasesItCarries) {
  StoreServer server(testing::TempDir("store_lease_carry"));
  auto a = server.Client("token-a");
  const auto keys = Chain(2, 18);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(130 + i)).ok());
  auto stub =
      vericache::v1::CacheStore::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  auto lease = [&](const std::string& token, const BlockKey& key, const std::vector<uint64_t>& release_ids,
                   vericache::v1::LeaseBlocksResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    vericache::v1::LeaseBlocksRequest req;
    req.add_keys(std::string(reinterpret_cast<const char*>(key.bytes.data()), 32));
    for (uint64_t id : release_ids) req.add_release_lease_ids(id);
    return stub->LeaseBlocks(&ctx, req, resp).error_code();
  };
  auto live_after_release = [&](uint64_t id) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token-a");
    vericache::v1::ReleaseLeasesRequest req;
    req.add_lease_ids(id);
    vericache::v1::ReleaseLeasesResponse resp;
    EXPECT_TRUE(stub->ReleaseLeases(&ctx, req, &resp).ok());
    return resp.live_leases() == 1;
  };

  vericache::v1::LeaseBlocksResponse first;
  ASSERT_EQ(lease("token-a", keys[0], {}, &first), grpc::StatusCode::OK);
  ASSERT_TRUE(first.has_released_leases());  // a store that takes release_lease_ids says so
  EXPECT_EQ(first.released_leases(), 0u);
  ASSERT_TRUE(first.blocks(0).has_remote());
  const uint64_t id0 = first.blocks(0).remote().lease_id();

  // Bob's call carrying Alice's lease (and an unknown id) is answered as usual and ends nothing.
  vericache::v1::LeaseBlocksResponse bobs;
  ASSERT_EQ(lease("token-b", keys[1], {id0, 999'999}, &bobs), grpc::StatusCode::OK);
  EXPECT_EQ(bobs.released_leases(), 0u);
  ASSERT_EQ(bobs.blocks_size(), 1);
  EXPECT_EQ(bobs.blocks(0).status_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  // Alice's next call carries it, with ids that are not live: hers ends (it was still live after
  // Bob's call), the others change nothing, and the new lease is granted.
  vericache::v1::LeaseBlocksResponse second;
  ASSERT_EQ(lease("token-a", keys[1], {id0, 999'999, id0}, &second), grpc::StatusCode::OK);
  EXPECT_EQ(second.released_leases(), 1u);
  ASSERT_EQ(second.blocks(0).status_code(), 0) << second.blocks(0).status_message();
  ASSERT_TRUE(second.blocks(0).has_remote());
  const uint64_t id1 = second.blocks(0).remote().lease_id();
  EXPECT_FALSE(live_after_release(id0));
  // Too many ids make a malformed call: it leases nothing and ends nothing.
  vericache::v1::LeaseBlocksResponse too_many;
  EXPECT_EQ(lease("token-a", keys[0], std::vector<uint64_t>(4097, id1), &too_many),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(too_many.blocks_size(), 0);
  EXPECT_TRUE(live_after_release(id1));
  // No lease is left: the blocks can be deleted and freed at once.
  for (const BlockKey& k : keys) ASSERT_TRUE(a->Delete(k).ok());
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

// A client's trusted reads release their leases on its next LeaseBlocks call (any thread's), and
// its destructor sends the ones still waiting.
TEST(StoreService, ClientReleasesRideOnItsNextLeaseCall) {
  StoreServer server(testing::TempDir("store_release_ride"));
  StoreClientOptions options{server.target(), "token-a", 5000, ""};
  options.release_delay_ms = 600'000;  // never due here: only a LeaseBlocks call or the destructor sends them
  auto a = *StoreClient::Create(options);
  auto b = server.Client("token-a");
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(3, 19);
  ASSERT_TRUE(b->Put(keys[2], MakeBlock(142)).ok());
  const uint64_t one_block = server.store().ram().used_bytes();
  ASSERT_GT(one_block, 0u);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(b->Put(keys[i], MakeBlock(140 + i)).ok());
  const uint64_t three_blocks = server.store().ram().used_bytes();

  for (const auto& got : a->GetRemoteBatch({keys[0], keys[1]}, reader.get())) ASSERT_TRUE(got.ok()) << got.status();
  // Their leases wait for the next call: deleted, the blocks stay pinned and keep their RAM.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(b->Delete(keys[i]).ok());
  EXPECT_EQ(server.store().ram().used_bytes(), three_blocks);
  // Another thread's read carries them: they are freed by the time it returns.
  std::thread([&] {
    auto got = a->GetRemoteBatch({keys[2]}, reader.get());
    ASSERT_TRUE(got[0].ok()) << got[0].status();
    EXPECT_EQ(*got[0], MakeBlock(142));
  }).join();
  EXPECT_EQ(server.store().ram().used_bytes(), one_block);
  // That read's lease waits in turn; the destructor sends it.
  ASSERT_TRUE(b->Delete(keys[2]).ok());
  EXPECT_EQ(server.store().ram().used_bytes(), one_block);
  a.reset();
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

// A client that reads no more still releases within release_delay_ms.
TEST(StoreService, WaitingReleasesAreFlushedAfterTheDelay) {
  StoreServer server(testing::TempDir("store_release_flush"));
  StoreClientOptions options{server.target(), "token-a", 5000, ""};
  options.release_delay_ms = 20;
  auto a = *StoreClient::Create(options);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(2, 20);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(150 + i)).ok());
  for (const auto& got : a->GetRemoteBatch(keys, reader.get())) ASSERT_TRUE(got.ok()) << got.status();
  auto b = server.Client("token-a");
  for (const BlockKey& k : keys) ASSERT_TRUE(b->Delete(k).ok());
  // The client lives on, idle: its flush thread sends the releases.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server.store().ram().used_bytes() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

// A read that finished past its trust window needs the release's answer: its round's leases go
// back at once and the answer is waited for, whatever release_delay_ms says.
TEST(StoreService, ReadsPastTheTrustWindowReleaseAtOnce) {
  // The store's clock is steady, so its leases stay live; the client's leaps a minute a read, so
  // every read ends past the trust window by its clock.
  StoreServer server(testing::TempDir("store_release_confirm"));
  LeapingClock client_clock;
  StoreClientOptions options{server.target(), "token-a", 5000, "", &client_clock};
  options.release_delay_ms = 600'000;
  auto a = *StoreClient::Create(options);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(2, 21);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(160 + i)).ok());
  auto got = a->GetRemoteBatch(keys, reader.get());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();  // the release found the lease live
    EXPECT_EQ(*got[i], MakeBlock(160 + i));
  }
  // Nothing waits for a later call: the blocks are unpinned while the client lives.
  auto b = server.Client("token-a");
  for (const BlockKey& k : keys) ASSERT_TRUE(b->Delete(k).ok());
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

TEST(StoreService, ClientsDestroyedWithReleasesInFlightAreSafe) {
  StoreServer server(testing::TempDir("store_release_in_flight"));
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  const auto keys = Chain(4, 14);
  {
    auto a = server.Client("token-a");
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(90 + i)).ok());
  }
  for (int round = 0; round < 20; ++round) {
    auto a = server.Client("token-a");
    for (const auto& got : a->GetRemoteBatch(keys, reader.get())) ASSERT_TRUE(got.ok()) << got.status();
  }  // each client goes with its ReleaseLeases call possibly still in flight
  auto a = server.Client("token-a");
  for (const auto& got : a->GetRemoteBatch(keys, reader.get())) ASSERT_TRUE(got.ok()) << got.status();
  a.reset();
  // Every lease went back: deleted blocks are freed at once, none is held by a leaked pin.
  auto b = server.Client("token-a");
  for (const BlockKey& k : keys) ASSERT_TRUE(b->Delete(k).ok());
  EXPECT_EQ(server.store().ram().used_bytes(), 0u);
}

// A client that outlives its store: its releases fail at once, and their answers come on a gRPC
// callback thread while the client is being destroyed. The channel, whose context each call holds,
// must not die on that thread: with no other channel or server alive, gRPC would then join the
// thread from itself and free the completion queue the thread polls next. The window is narrow:
// without the fix this test aborted in 1 of 3 runs of 60 rounds (0 of 5 of 200), and a 20 ms sleep
// at the end of the callback, holding the window open, made worker_service_test abort.
TEST(StoreService, AClientOutlivingItsStoreIsDestroyedSafely) {
  const auto keys = Chain(2, 15);
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  for (int round = 0; round < 100; ++round) {
    auto server = std::make_unique<StoreServer>(testing::TempDir("store_outlived"));
    StoreClientOptions options{server->target(), "token-a", 5000, ""};
    options.release_delay_ms = 600'000;  // the leases wait for the destructor
    auto a = *StoreClient::Create(options);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(170 + i)).ok());
    for (const auto& got : a->GetRemoteBatch(keys, reader.get())) ASSERT_TRUE(got.ok()) << got.status();
    server.reset();
    a.reset();
  }
}

TEST(StoreService, OnlyTheLeasingTenantReleasesALease) {
  StoreServer server(testing::TempDir("store_lease_owner"));
  auto a = server.Client("token-a");
  const auto keys = Chain(1, 9);
  absl::Status put = a->Put(keys[0], MakeBlock(40));
  ASSERT_TRUE(put.ok()) << put;
  auto stub =
      vericache::v1::CacheStore::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext get_ctx;
  get_ctx.AddMetadata("authorization", "Bearer token-a");
  vericache::v1::GetRequest req;
  req.set_key(std::string(reinterpret_cast<const char*>(keys[0].bytes.data()), 32));
  req.set_remote(true);
  vericache::v1::GetResponse resp;
  ASSERT_TRUE(stub->Get(&get_ctx, req, &resp).ok());
  ASSERT_TRUE(resp.has_remote());
  auto release = [&](const std::string& token) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    vericache::v1::ReleaseLeaseRequest rel;
    rel.set_lease_id(resp.remote().lease_id());
    vericache::v1::ReleaseLeaseResponse rr;
    return stub->ReleaseLease(&ctx, rel, &rr).error_code();
  };
  EXPECT_EQ(release("token-b"), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(release("token-a"), grpc::StatusCode::OK);
  EXPECT_EQ(release("token-a"), grpc::StatusCode::NOT_FOUND);
}

TEST(StoreService, AuthenticationAndTenantIsolation) {
  StoreServer server(testing::TempDir("store_auth"));
  auto a = server.Client("token-a");
  auto b = server.Client("token-b");
  auto nobody = server.Client("token-x");
  const auto keys = Chain(2, 2);
  ASSERT_TRUE(a->Put(keys[0], MakeBlock(0)).ok());
  // The store-wide counts are Alice's to read (--stats-tenants), not Bob's: they hold her activity.
  EXPECT_EQ(b->Stats().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(nobody->Stats().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(nobody->Lookup(keys).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(nobody->Put(keys[1], MakeBlock(1)).code(), absl::StatusCode::kUnauthenticated);
  // Bob's lookups of Alice's prefix find nothing, and his reads miss.
  EXPECT_EQ(b->Lookup(keys)->first, 0u);
  EXPECT_EQ(b->Get(keys[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->Lookup(keys)->first, 1u);
  // The client's stats carry the store's counts, puts and disk state among them.
  absl::StatusOr<cachestore::StoreStats> stats = a->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->puts, 1u);
  EXPECT_EQ(stats->disk_blocks, 1u);
  EXPECT_EQ(stats->misses, 1u);
  EXPECT_FALSE(stats->disk_full);
}

TEST(StoreService, MalformedRequestsAreRefused) {
  StoreServer server(testing::TempDir("store_bad"));
  auto a = server.Client("token-a");
  const auto keys = Chain(1, 3);
  std::string block = MakeBlock(0);
  block[block.size() / 2] ^= 1;  // a payload bit flipped in transit
  EXPECT_EQ(a->Put(keys[0], block).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Put(keys[0], "not a block").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Lookup(keys)->first, 0u);  // nothing half-stored
  // A key that is not a 32-byte digest, through the raw stub.
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  auto stub = vericache::v1::CacheStore::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer token-a");
  vericache::v1::GetRequest req;
  req.set_key("short");
  vericache::v1::GetResponse resp;
  EXPECT_EQ(stub->Get(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(StoreService, RestartKeepsDiskTier) {
  const std::string dir = testing::TempDir("store_restart");
  const auto keys = Chain(3, 4);
  {
    StoreServer server(dir);
    auto a = server.Client("token-a");
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(10 + i)).ok());
  }
  StoreServer server(dir);
  auto a = server.Client("token-a");
  auto look = a->Lookup(keys);
  ASSERT_TRUE(look.ok());
  EXPECT_EQ(look->first, 3u);
  EXPECT_EQ(look->second, 0u);  // RAM starts empty
  EXPECT_EQ(*a->Get(keys[2]), MakeBlock(12));
  EXPECT_EQ(a->Lookup(keys)->second, 1u);  // promoted on the hit
}

// Blocks of 1 MiB, twice what the 8 MiB RAM tier holds: reads promote blocks from disk while
// others are evicted and their slots reused, under concurrent puts and reads of the same keys.
// A read either misses or returns the block put (a torn copy would fail the store's checks and
// come back as an error, so any error but NotFound counts), and every block reads back at the end.
TEST(StoreService, ConcurrentClientsNeverSeeTornBlocks) {
  StoreServer server(testing::TempDir("store_conc"));
  const auto keys = Chain(16, 5);
  std::vector<std::string> blocks;
  for (int k = 0; k < 16; ++k) blocks.push_back(testing::LargeRandomBlock(k, 42, 64));
  std::atomic<int> bad{0}, read{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      auto c = server.Client("token-a");
      for (int i = 0; i < 40; ++i) {
        const int k = (t * 5 + i) % 16;
        if (i % 2 == 0) {
          // A put racing another of the same key is told to retry (UNAVAILABLE), as a client does.
          absl::Status st = c->Put(keys[k], blocks[k]);
          for (int retry = 0; retry < 100 && absl::IsUnavailable(st); ++retry) st = c->Put(keys[k], blocks[k]);
          if (!st.ok()) bad++, ADD_FAILURE() << st;
        } else if (auto g = c->Get(keys[k]); g.ok()) {
          read++;
          if (*g != blocks[k]) bad++;
        } else if (!absl::IsNotFound(g.status())) {
          bad++;
          ADD_FAILURE() << g.status();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(read.load(), 0);
  auto c = server.Client("token-a");
  for (int k = 0; k < 16; ++k) {
    auto g = c->Get(keys[k]);
    ASSERT_TRUE(g.ok()) << k << ": " << g.status();
    EXPECT_TRUE(*g == blocks[k]) << k;
  }
  EXPECT_GT(server.store().Stats().ram_evictions, 0u);
}

}  // namespace
}  // namespace vc
