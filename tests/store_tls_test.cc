// The cache store's control plane over TLS on loopback: a certificate made at test time (OpenSSL),
// the real CacheStore service behind gRPC's TLS server credentials, real clients with and without
// the right root.
#include <memory>

#include "cachestore/block_format.h"
#include "cachestore/store_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/inference_client.h"
#include "services/servers.h"
#include "services/store_service.h"
#include "tests/testing/blocks.h"
#include "tests/testing/servers.h"
#include "tests/testing/tiny_model.h"
#include "tests/testing/tls.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;

using cachestore::BlockKey;
using cachestore::StoreClient;

std::string MakeBlock(uint32_t seed) { return testing::RandomBlock(seed, 7); }

std::vector<BlockKey> Chain(int n) {
  std::vector<int32_t> tokens(n * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 251);
  return cachestore::ChainBlockKeys({"model", "f32:bs16", "", 16}, tokens);
}

// The store as `vericache store --tls-cert --tls-key` runs it, in process, on a loopback port.
class TlsStoreServer {
 public:
  TlsStoreServer(const std::string& dir, const testing::CertAndKey& identity) {
    cachestore::StoreOptions o;
    o.ram.capacity_bytes = 8 << 20;
    o.disk.path = dir;
    o.disk.capacity_bytes = 64 << 20;
    store_ = *cachestore::BlockStore::Open(o);
    ucx_ = *cachestore::UcxRegionServer::Create(store_->ram().region(), store_->ram().region_bytes(),
                                                cachestore::UcxErrorMode::kNone);
    service_ = std::make_unique<CacheStoreService>(store_.get(),
                                                   StoreServiceOptions{{{"token-a", "alice"}}, "secret", ucx_.get(), {"alice"}});
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({identity.key_pem, identity.cert_pem});
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
  }
  ~TlsStoreServer() {
    if (server_ != nullptr) server_->Shutdown();
  }
  bool running() const { return server_ != nullptr && port_ != 0; }
  std::unique_ptr<StoreClient> Client(const std::string& token, const std::string& root_pem) {
    // Short deadlines: a failed handshake should fail the call now, not after five seconds.
    return *StoreClient::Create({"127.0.0.1:" + std::to_string(port_), token, 3000, root_pem});
  }

 private:
  std::unique_ptr<cachestore::BlockStore> store_;
  std::unique_ptr<cachestore::UcxRegionServer> ucx_;
  std::unique_ptr<CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

class StoreTls : public ::testing::Test {
 protected:
  void SetUp() override {
    identity_ = testing::SelfSignedCert("vericache-store");
    ASSERT_FALSE(identity_.cert_pem.empty()) << "OpenSSL could not make a certificate";
    server_ = std::make_unique<TlsStoreServer>(testing::TempDir("store_tls"), identity_);
    ASSERT_TRUE(server_->running());
  }

  testing::CertAndKey identity_;
  std::unique_ptr<TlsStoreServer> server_;
};

TEST_F(StoreTls, RightRootAndTokenRoundTrip) {
  auto a = server_->Client("token-a", identity_.cert_pem);
  const auto keys = Chain(3);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->Put(keys[i], MakeBlock(i)).ok());
  auto look = a->Lookup(keys);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->first, 2u);
  auto got = a->Get(keys[1]);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, MakeBlock(1));
  // The lease goes over TLS, the bytes over UCX.
  auto reader = *cachestore::UcxReader::Create(cachestore::UcxErrorMode::kNone);
  auto remote = a->GetRemote(keys[0], reader.get());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(*remote, MakeBlock(0));
  // TLS authenticates the store, not the tenant: a bad token is still refused.
  EXPECT_EQ(server_->Client("token-x", identity_.cert_pem)->Lookup(keys).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(StoreTls, PlaintextClientIsRefused) {
  auto plain = server_->Client("token-a", "");
  const auto keys = Chain(1);
  absl::Status s = plain->Put(keys[0], MakeBlock(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(plain->Lookup(keys).status().code(), absl::StatusCode::kUnavailable);
  auto look = server_->Client("token-a", identity_.cert_pem)->Lookup(keys);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->first, 0u);  // nothing reached the store
}

TEST_F(StoreTls, ClientWithAnotherRootIsRefused) {
  const testing::CertAndKey impostor = testing::SelfSignedCert("vericache-store");  // same name, another key
  ASSERT_FALSE(impostor.cert_pem.empty());
  auto wrong = server_->Client("token-a", impostor.cert_pem);
  const auto keys = Chain(1);
  absl::Status s = wrong->Put(keys[0], MakeBlock(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  auto look = server_->Client("token-a", identity_.cert_pem)->Lookup(keys);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->first, 0u);
}

// A worker serving its clients over TLS, with its store over TLS too (as `vericache worker
// --tls-cert --tls-key --store-tls-ca` runs it): a client that trusts the worker's root gets exact
// output, the worker publishes its prefix to the store and reads it back; a plaintext client is
// refused.
TEST(WorkerTls, ClientsAndStoreOverTls) {
  testing::TinyStack t = testing::MakeTinyStack("worker_tls");
  const testing::CertAndKey store_id = testing::SelfSignedCert("vericache-store");
  const testing::CertAndKey worker_id = testing::SelfSignedCert("vericache-worker");
  ASSERT_FALSE(store_id.cert_pem.empty() || worker_id.cert_pem.empty());
  const auto creds = [](const testing::CertAndKey& id) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({id.key_pem, id.cert_pem});
    return grpc::SslServerCredentials(ssl);
  };
  t.store.credentials = creds(store_id);
  auto store = StoreServer::Start(t.store);
  ASSERT_TRUE(store.ok()) << store.status();
  WorkerServerOptions& wo = t.worker;
  wo.store_target = (*store)->target();
  wo.store_tls_root_certs_pem = store_id.cert_pem;
  wo.credentials = creds(worker_id);
  auto worker = WorkerServer::Start(wo);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const v1::GenerateRequest req = testing::IdsRequest(100, 6);
  const std::vector<int32_t> want = testing::FullOutput(wo.model_dir, req);
  ASSERT_FALSE(want.empty());

  auto stub = InferenceStub((*worker)->target(), worker_id.cert_pem);
  const GenerateReply first = CallGenerate(*stub, req, "", absl::Seconds(30));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.tokens, want);
  (*worker)->prefixes()->Flush();
  EXPECT_EQ((*store)->store().Stats().ram_blocks, 3u) << "the prefix went to the store over TLS";
  const GenerateReply second = CallGenerate(*stub, req, "", absl::Seconds(30));
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.tokens, want);
  EXPECT_EQ(second.stats.prefix_store_tokens(), 96u);
  const GenerateReply plain = CallGenerate(*InferenceStub((*worker)->target()), req, "", absl::Seconds(5));
  EXPECT_EQ(plain.status.code(), absl::StatusCode::kUnavailable) << plain.status;
}

}  // namespace
}  // namespace vc
