#include "services/store_service.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cachestore/crc32c.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "common/text_checks.h"

namespace vc {

using vericache::v1::DeleteRequest;
using vericache::v1::DeleteResponse;
using vericache::v1::GetRequest;
using vericache::v1::GetResponse;
using vericache::v1::LookupRequest;
using vericache::v1::LookupResponse;
using vericache::v1::PutRequest;
using vericache::v1::PutResponse;
using vericache::v1::StatsRequest;
using vericache::v1::StatsResponse;

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), std::string(s.message()));
}

namespace {

using cachestore::kMaxKeysPerLeaseCall;

// Whether the caller has gone: its call cancelled, or past its deadline (where its client gives up,
// whether or not the cancellation has reached this side yet).
bool CallerGone(const grpc::CallbackServerContext& ctx) {
  return ctx.IsCancelled() || std::chrono::system_clock::now() >= ctx.deadline();
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}

}  // namespace

CacheStoreService::CacheStoreService(cachestore::BlockStore* store, StoreServiceOptions options)
    : store_(store), options_(std::move(options)) {}

absl::StatusOr<std::string> CacheStoreService::Tenant(grpc::CallbackServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return absl::UnauthenticatedError("missing authorization metadata (Bearer token)");
  absl::string_view v(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&v, "Bearer ")) return absl::UnauthenticatedError("authorization is not a Bearer token");
  auto t = options_.tokens.find(std::string(v));
  if (t == options_.tokens.end()) return absl::UnauthenticatedError("unknown token");
  return t->second;
}

absl::StatusOr<std::string> CacheStoreService::TenantSalt(grpc::CallbackServerContext* ctx) const {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return tenant.status();
  return cachestore::BlockStore::TenantSalt(options_.secret, *tenant);
}

absl::StatusOr<cachestore::BlockKey> CacheStoreService::ScopedKey(const std::string& salt,
                                                                  const std::string& key) const {
  if (key.size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat("block key of ", key.size(), " bytes; keys are 32-byte digests"));
  }
  cachestore::BlockKey k;
  std::memcpy(k.bytes.data(), key.data(), 32);
  return cachestore::BlockStore::Scoped(salt, k);
}

grpc::ServerUnaryReactor* CacheStoreService::Lookup(grpc::CallbackServerContext* ctx, const LookupRequest* req,
                                                    LookupResponse* resp) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  // A prompt of 2M tokens in 512-token blocks; each key costs store time, so no call asks for more.
  if (req->keys_size() > kMaxKeysPerLeaseCall) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat("more than ", kMaxKeysPerLeaseCall, " keys in one lookup")));
  }
  std::vector<cachestore::BlockKey> keys;
  for (const std::string& k : req->keys()) {
    absl::StatusOr<cachestore::BlockKey> sk = ScopedKey(*salt, k);
    if (!sk.ok()) return Done(ctx, sk.status());
    keys.push_back(*sk);
  }
  auto [n, ram] = store_->Lookup(keys, req->count_as_use());
  resp->set_cached_blocks(n);
  resp->set_ram_blocks(ram);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheStoreService::Put(grpc::CallbackServerContext* ctx, const PutRequest* req,
                                                 PutResponse* resp) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  absl::StatusOr<cachestore::BlockKey> key = ScopedKey(*salt, req->key());
  if (!key.ok()) return Done(ctx, key.status());
  absl::Status s = store_->Put(*key, req->block());
  if (s.ok()) resp->set_stored_size_bytes(req->block().size());
  return Done(ctx, s);
}

grpc::ServerUnaryReactor* CacheStoreService::Get(grpc::CallbackServerContext* ctx, const GetRequest* req,
                                                 GetResponse* resp) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  absl::StatusOr<cachestore::BlockKey> key = ScopedKey(*salt, req->key());
  if (!key.ok()) return Done(ctx, key.status());
  if (!req->expect_fingerprint().empty() && req->expect_fingerprint().size() != 32) {
    return Done(ctx, absl::InvalidArgumentError("expect_fingerprint must be 32 bytes or empty"));
  }
  if (req->remote() && options_.ucx != nullptr) {
    absl::Status s = LeaseRemote(*key, *salt, req->expect_fingerprint(), resp->mutable_remote());
    if (s.ok()) {
      resp->set_from_ram(true);
      return Done(ctx, absl::OkStatus());
    }
    resp->clear_remote();
    if (!absl::IsResourceExhausted(s)) return Done(ctx, s);
    // RAM cannot take it now: serve it inline below.
  }
  bool from_ram = false;
  absl::StatusOr<std::string> block = store_->Get(*key, &from_ram);
  if (!block.ok()) return Done(ctx, block.status());
  if (!req->expect_fingerprint().empty() &&
      std::memcmp(block->data() + 8, req->expect_fingerprint().data(), 32) != 0) {
    return Done(ctx, absl::FailedPreconditionError("block belongs to another model"));
  }
  resp->set_block(std::move(*block));
  resp->set_from_ram(from_ram);
  return Done(ctx, absl::OkStatus());
}

absl::Status CacheStoreService::LeaseRemote(const cachestore::BlockKey& key, const std::string& salt,
                                            const std::string& expect_fingerprint, vericache::v1::RemoteBlock* out) {
  absl::StatusOr<cachestore::BlockLease> lease = store_->Lease(key, salt);
  if (!lease.ok()) return lease.status();
  const char* at = store_->ram().region() + lease->offset;
  if (!expect_fingerprint.empty() && std::memcmp(at + 8, expect_fingerprint.data(), 32) != 0) {
    (void)store_->Release(lease->id, salt);
    return absl::FailedPreconditionError("block belongs to another model");
  }
  out->set_lease_id(lease->id);
  out->set_worker_address(options_.ucx->worker_address());
  out->set_rkey(options_.ucx->rkey());
  out->set_address(options_.ucx->base() + lease->offset);
  out->set_size_bytes(lease->size);
  out->set_location_crc32c(
      cachestore::LocationCrc32c(out->worker_address(), out->rkey(), out->address(), out->size_bytes()));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CacheStoreService::ReleaseLease(grpc::CallbackServerContext* ctx,
                                                          const vericache::v1::ReleaseLeaseRequest* req,
                                                          vericache::v1::ReleaseLeaseResponse*) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  return Done(ctx, store_->Release(req->lease_id(), *salt));
}

grpc::ServerUnaryReactor* CacheStoreService::LeaseBlocks(grpc::CallbackServerContext* ctx,
                                                         const vericache::v1::LeaseBlocksRequest* req,
                                                         vericache::v1::LeaseBlocksResponse* resp) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  if (req->keys_size() > kMaxKeysPerLeaseCall) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat("more than ", kMaxKeysPerLeaseCall, " keys in one call")));
  }
  if (req->release_lease_ids_size() > kMaxKeysPerLeaseCall) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("more than ", kMaxKeysPerLeaseCall, " leases to release in one call")));
  }
  if (!req->expect_fingerprint().empty() && req->expect_fingerprint().size() != 32) {
    return Done(ctx, absl::InvalidArgumentError("expect_fingerprint must be 32 bytes or empty"));
  }
  if (options_.ucx == nullptr) {
    return Done(ctx, absl::FailedPreconditionError("the store runs no UCX data plane; use Get"));
  }
  // Every key is checked before any lease is taken, so a malformed request pins nothing.
  std::vector<cachestore::BlockKey> keys;
  keys.reserve(req->keys_size());
  for (const std::string& k : req->keys()) {
    absl::StatusOr<cachestore::BlockKey> sk = ScopedKey(*salt, k);
    if (!sk.ok()) return Done(ctx, sk.status());
    keys.push_back(*sk);
  }
  // The caller's finished leases end first, so their blocks are no longer pinned when this call's
  // are leased. As in ReleaseLeases, only the tenant's own leases end; any other id is left alone.
  uint32_t released = 0;
  for (uint64_t id : req->release_lease_ids()) released += store_->Release(id, *salt).ok() ? 1 : 0;
  resp->set_released_leases(released);
  resp->set_lease_ttl_ms(static_cast<uint64_t>(store_->ram().lease_ttl_ms()));
  for (const cachestore::BlockKey& key : keys) {
    // A call whose client has gone (its deadline passed while blocks came up from disk) pins
    // nothing: its lease ids would never reach the client to be released.
    if (CallerGone(*ctx)) break;
    vericache::v1::LeasedBlock* out = resp->add_blocks();
    const absl::Status s = LeaseRemote(key, *salt, req->expect_fingerprint(), out->mutable_remote());
    out->set_status_code(static_cast<int32_t>(s.code()));
    if (!s.ok()) {
      out->clear_remote();
      out->set_status_message(std::string(s.message()));
    }
  }
  if (CallerGone(*ctx)) {
    for (const vericache::v1::LeasedBlock& b : resp->blocks()) {
      if (b.status_code() == 0) (void)store_->Release(b.remote().lease_id(), *salt);
    }
    return Done(ctx, absl::CancelledError("the call was cancelled; the leases it took are released"));
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheStoreService::ReleaseLeases(grpc::CallbackServerContext* ctx,
                                                           const vericache::v1::ReleaseLeasesRequest* req,
                                                           vericache::v1::ReleaseLeasesResponse* resp) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  if (req->lease_ids_size() > kMaxKeysPerLeaseCall) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat("more than ", kMaxKeysPerLeaseCall, " leases in one call")));
  }
  uint32_t live = 0;
  for (uint64_t id : req->lease_ids()) {
    const bool was_live = store_->Release(id, *salt).ok();
    resp->add_was_live(was_live);
    live += was_live ? 1 : 0;
  }
  resp->set_live_leases(live);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheStoreService::Delete(grpc::CallbackServerContext* ctx, const DeleteRequest* req,
                                                    DeleteResponse*) {
  absl::StatusOr<std::string> salt = TenantSalt(ctx);
  if (!salt.ok()) return Done(ctx, salt.status());
  absl::StatusOr<cachestore::BlockKey> key = ScopedKey(*salt, req->key());
  if (!key.ok()) return Done(ctx, key.status());
  return Done(ctx, store_->Delete(*key));
}

grpc::ServerUnaryReactor* CacheStoreService::Stats(grpc::CallbackServerContext* ctx, const StatsRequest*,
                                                   StatsResponse* resp) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return Done(ctx, tenant.status());
  if (!options_.stats_tenants.contains(*tenant)) {
    return Done(ctx, absl::PermissionDeniedError("the store's stats count every tenant's blocks and requests: they are "
                                                 "for the tenants of --stats-tenants"));
  }
  CurrentStats(resp);
  return Done(ctx, absl::OkStatus());
}

void CacheStoreService::CurrentStats(StatsResponse* resp) const {
  const cachestore::StoreStats s = store_->Stats();
  resp->set_ram_used_bytes(s.ram_used_bytes);
  resp->set_ram_capacity_bytes(s.ram_capacity_bytes);
  resp->set_ram_blocks(s.ram_blocks);
  resp->set_disk_used_bytes(s.disk_used_bytes);
  resp->set_disk_capacity_bytes(s.disk_capacity_bytes);
  resp->set_disk_blocks(s.disk_blocks);
  resp->set_disk_footprint_bytes(s.disk_footprint_bytes);
  resp->set_hits_ram(s.hits_ram);
  resp->set_hits_disk(s.hits_disk);
  resp->set_misses(s.misses);
  resp->set_corrupt_blocks_dropped(s.corrupt_dropped);
  resp->set_ram_block_bytes(s.ram_block_bytes);
  resp->set_puts(s.puts);
  resp->set_ram_evictions(s.ram_evictions);
  resp->set_disk_evictions(s.disk_evictions);
  resp->set_disk_reserve_evictions(s.disk_reserve_evictions);
  resp->set_disk_write_errors(s.disk_write_errors);
  resp->set_disk_writes_failing_ms(s.disk_writes_failing_ms);
  resp->set_disk_full(s.disk_full ? 1 : 0);
}

absl::StatusOr<std::map<std::string, std::string>> ReadTokenFile(const std::string& path) {
  VC_ASSIGN_OR_RETURN(const std::string text, ReadFileLimited(path, 16 << 20, "token file"));
  std::map<std::string, std::string> out;
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#') continue;
    std::vector<std::string> parts = absl::StrSplit(l, ' ', absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": expected 'token tenant'"));
    }
    VC_RETURN_IF_ERROR(CheckBearerToken(parts[0], absl::StrCat(path, ":", n, ": the token")));
    // A tenant names its blocks (it salts their keys) and its metrics: printable ASCII, as a
    // worker's tenants are.
    VC_RETURN_IF_ERROR(CheckBearerToken(parts[1], absl::StrCat(path, ":", n, ": the tenant")));
    if (!out.emplace(parts[0], parts[1]).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": this token is listed already"));
    }
  }
  return out;
}

}  // namespace vc
