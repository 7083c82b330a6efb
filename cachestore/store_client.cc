#include "cachestore/store_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
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
  // Reconnect quickly after a store restart (gRPC's default backoff grows to minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->options_ = options;
  c->stub_ = vericache::v1::CacheStore::NewStub(grpc::CreateCustomChannel(options.target, creds, args));
  return c;
}

#define VC_CLIENT_CONTEXT(ctx)                                                                      \
  grpc::ClientContext ctx;                                                                          \
  ctx.AddMetadata("authorization", "Bearer " + options_.token);                                     \
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms))

absl::StatusOr<std::pair<uint32_t, uint32_t>> StoreClient::Lookup(absl::Span<const BlockKey> keys) {
  VC_CLIENT_CONTEXT(ctx);
  vericache::v1::LookupRequest req;
  for (const BlockKey& k : keys) req.add_keys(KeyBytes(k));
  vericache::v1::LookupResponse resp;
  absl::Status s = FromGrpc(stub_->Lookup(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::make_pair(resp.cached_blocks(), resp.ram_blocks());
}

absl::Status StoreClient::Put(const BlockKey& key, absl::string_view block) {
  VC_CLIENT_CONTEXT(ctx);
  vericache::v1::PutRequest req;
  req.set_key(KeyBytes(key));
  req.set_block(std::string(block));
  vericache::v1::PutResponse resp;
  return FromGrpc(stub_->Put(&ctx, req, &resp));
}

absl::StatusOr<std::string> StoreClient::Get(const BlockKey& key, const std::array<uint8_t, 32>* fp) {
  VC_CLIENT_CONTEXT(ctx);
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
  vericache::v1::GetResponse resp;
  {
    VC_CLIENT_CONTEXT(ctx);
    vericache::v1::GetRequest req;
    req.set_key(KeyBytes(key));
    req.set_remote(true);
    if (fp != nullptr) req.set_expect_fingerprint(std::string(reinterpret_cast<const char*>(fp->data()), 32));
    absl::Status s = FromGrpc(stub_->Get(&ctx, req, &resp));
    if (!s.ok()) return s;
  }
  std::string block;
  if (!resp.has_remote()) {
    block = std::move(*resp.mutable_block());
  } else {
    const vericache::v1::RemoteBlock& r = resp.remote();
    block.resize(r.size_bytes());
    absl::Status read = reader->Get(r.worker_address(), r.rkey(), r.address(), block.data(), block.size());
    VC_CLIENT_CONTEXT(ctx);
    vericache::v1::ReleaseLeaseRequest rel;
    rel.set_lease_id(r.lease_id());
    vericache::v1::ReleaseLeaseResponse rr;
    absl::Status released = FromGrpc(stub_->ReleaseLease(&ctx, rel, &rr));
    if (!read.ok()) return read;
    // Only a lease still live at its release covered the whole read; past its expiry the slot may
    // hold another block that passes every check (tiers.h).
    if (absl::IsNotFound(released)) {
      return absl::AbortedError("the block's lease expired before its read finished; the bytes were discarded");
    }
    if (!released.ok()) return released;
  }
  absl::StatusOr<BlockHeader> h = DecodeBlockHeader(block);
  absl::Status check = h.ok() ? VerifyBlock(block, h->fingerprint).status() : h.status();
  if (!check.ok()) {
    (void)Delete(key);
    return absl::DataLossError(absl::StrCat("block failed its checks after the read and was deleted: ", check.message()));
  }
  return block;
}

absl::Status StoreClient::Delete(const BlockKey& key) {
  VC_CLIENT_CONTEXT(ctx);
  vericache::v1::DeleteRequest req;
  req.set_key(KeyBytes(key));
  vericache::v1::DeleteResponse resp;
  return FromGrpc(stub_->Delete(&ctx, req, &resp));
}

absl::StatusOr<StoreStats> StoreClient::Stats() {
  VC_CLIENT_CONTEXT(ctx);
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

#undef VC_CLIENT_CONTEXT

}  // namespace vc::cachestore
