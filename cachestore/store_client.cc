#include "cachestore/store_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cachestore/block_format.h"
#include "grpcpp/grpcpp.h"

namespace vc::cachestore {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

std::string KeyBytes(const BlockKey& k) { return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32); }

}  // namespace

StoreClient::~StoreClient() = default;

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Create(const StoreClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("store target is empty");
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // Reconnect quickly after a store restart (gRPC's default backoff grows to minutes). The minimum
  // backoff is left alone: gRPC also uses it as the connect timeout, and at 100 ms a busy host
  // fails connections whose handshake is merely slow.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->options_ = options;
  c->stub_ = vericache::v1::CacheStore::NewStub(grpc::CreateCustomChannel(options.target, creds, args));
  return c;
}

void StoreClient::Prepare(grpc::ClientContext* ctx) const {
  ctx->AddMetadata("authorization", "Bearer " + options_.token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms));
}

absl::StatusOr<std::pair<uint32_t, uint32_t>> StoreClient::Lookup(absl::Span<const BlockKey> keys) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::LookupRequest req;
  for (const BlockKey& k : keys) req.add_keys(KeyBytes(k));
  vericache::v1::LookupResponse resp;
  absl::Status s = FromGrpc(stub_->Lookup(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::make_pair(resp.cached_blocks(), resp.ram_blocks());
}

absl::Status StoreClient::Put(const BlockKey& key, absl::string_view block) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::PutRequest req;
  req.set_key(KeyBytes(key));
  req.set_block(std::string(block));
  vericache::v1::PutResponse resp;
  return FromGrpc(stub_->Put(&ctx, req, &resp));
}

absl::StatusOr<std::string> StoreClient::Get(const BlockKey& key, const std::array<uint8_t, 32>* fp) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::GetRequest req;
  req.set_key(KeyBytes(key));
  if (fp != nullptr) req.set_expect_fingerprint(std::string(reinterpret_cast<const char*>(fp->data()), 32));
  vericache::v1::GetResponse resp;
  absl::Status s = FromGrpc(stub_->Get(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::move(*resp.mutable_block());
}

absl::StatusOr<std::string> StoreClient::GetRemote(const BlockKey& key, UcxReader* reader,
                                                   const std::array<uint8_t, 32>* fp) {
  return std::move(GetRemoteBatch(absl::MakeConstSpan(&key, 1), reader, fp)[0]);
}

namespace {

// One unary call in flight on the callback API: what it sends, what comes back, and when.
template <typename Request, typename Response>
struct AsyncCall {
  grpc::ClientContext ctx;
  Request req;
  Response resp;
  grpc::Status status;
  absl::Notification done;
};

}  // namespace

std::vector<absl::StatusOr<std::string>> StoreClient::GetRemoteBatch(absl::Span<const BlockKey> keys,
                                                                     UcxReader* reader,
                                                                     const std::array<uint8_t, 32>* fp) {
  using GetCall = AsyncCall<vericache::v1::GetRequest, vericache::v1::GetResponse>;
  using ReleaseCall = AsyncCall<vericache::v1::ReleaseLeaseRequest, vericache::v1::ReleaseLeaseResponse>;
  const size_t n = keys.size();
  std::vector<std::unique_ptr<GetCall>> gets(n);
  for (size_t i = 0; i < n; ++i) {
    GetCall* c = (gets[i] = std::make_unique<GetCall>()).get();
    Prepare(&c->ctx);
    c->req.set_key(KeyBytes(keys[i]));
    c->req.set_remote(true);
    if (fp != nullptr) c->req.set_expect_fingerprint(std::string(reinterpret_cast<const char*>(fp->data()), 32));
    stub_->async()->Get(&c->ctx, &c->req, &c->resp, [c](grpc::Status st) {
      c->status = std::move(st);
      c->done.Notify();
    });
  }
  // Read each block as its lease arrives, and hand the lease back at once.
  std::vector<absl::StatusOr<std::string>> out(n, absl::UnknownError("not read"));
  std::vector<std::unique_ptr<ReleaseCall>> releases(n);
  for (size_t i = 0; i < n; ++i) {
    GetCall& g = *gets[i];
    g.done.WaitForNotification();
    if (!g.status.ok()) {
      out[i] = FromGrpc(g.status);
      continue;
    }
    if (!g.resp.has_remote()) {
      out[i] = std::move(*g.resp.mutable_block());
      continue;
    }
    const vericache::v1::RemoteBlock& r = g.resp.remote();
    std::string block(r.size_bytes(), '\0');
    absl::Status read = reader->Get(r.worker_address(), r.rkey(), r.address(), block.data(), block.size());
    out[i] = read.ok() ? absl::StatusOr<std::string>(std::move(block)) : read;
    ReleaseCall* c = (releases[i] = std::make_unique<ReleaseCall>()).get();
    Prepare(&c->ctx);
    c->req.set_lease_id(r.lease_id());
    stub_->async()->ReleaseLease(&c->ctx, &c->req, &c->resp, [c](grpc::Status st) {
      c->status = std::move(st);
      c->done.Notify();
    });
  }
  // Check the blocks while the releases are in flight; a block counts only if its lease was still
  // live at its release (tiers.h): past its expiry the slot may hold another block that passes
  // every check.
  std::vector<absl::Status> checks(n);
  for (size_t i = 0; i < n; ++i) {
    if (!out[i].ok()) continue;
    absl::StatusOr<BlockHeader> h = DecodeBlockHeader(*out[i]);
    checks[i] = h.ok() ? VerifyBlock(*out[i], h->fingerprint).status() : h.status();
  }
  for (size_t i = 0; i < n; ++i) {
    if (releases[i] != nullptr) {
      releases[i]->done.WaitForNotification();
      if (!out[i].ok()) continue;  // the read failed
      const absl::Status released = FromGrpc(releases[i]->status);
      if (absl::IsNotFound(released)) {
        out[i] = absl::AbortedError("the block's lease expired before its read finished; the bytes were discarded");
        continue;
      }
      if (!released.ok()) {
        out[i] = released;
        continue;
      }
    }
    if (out[i].ok() && !checks[i].ok()) {
      (void)Delete(keys[i]);
      out[i] = absl::DataLossError(
          absl::StrCat("block failed its checks after the read and was deleted: ", checks[i].message()));
    }
  }
  return out;
}

absl::Status StoreClient::Delete(const BlockKey& key) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::DeleteRequest req;
  req.set_key(KeyBytes(key));
  vericache::v1::DeleteResponse resp;
  return FromGrpc(stub_->Delete(&ctx, req, &resp));
}

absl::StatusOr<StoreStats> StoreClient::Stats() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::StatsRequest req;
  vericache::v1::StatsResponse r;
  absl::Status s = FromGrpc(stub_->Stats(&ctx, req, &r));
  if (!s.ok()) return s;
  StoreStats out;
  out.ram_used_bytes = r.ram_used_bytes();
  out.ram_capacity_bytes = r.ram_capacity_bytes();
  out.ram_blocks = r.ram_blocks();
  out.disk_used_bytes = r.disk_used_bytes();
  out.disk_capacity_bytes = r.disk_capacity_bytes();
  out.disk_blocks = r.disk_blocks();
  out.hits_ram = r.hits_ram();
  out.hits_disk = r.hits_disk();
  out.misses = r.misses();
  out.corrupt_dropped = r.corrupt_blocks_dropped();
  return out;
}

}  // namespace vc::cachestore
