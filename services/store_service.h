// The CacheStore gRPC service (proto/vericache/v1/cache_store.proto) over a BlockStore.
#ifndef VC_SERVICES_STORE_SERVICE_H_
#define VC_SERVICES_STORE_SERVICE_H_

#include <map>
#include <set>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cachestore/store.h"
#include "cachestore/ucx_transport.h"
#include "grpcpp/grpcpp.h"
#include "vericache/v1/cache_store.grpc.pb.h"

namespace vc {

// absl::Status -> grpc::Status, code for code.
grpc::Status ToGrpcStatus(const absl::Status& s);

struct StoreServiceOptions {
  std::map<std::string, std::string> tokens;  // bearer token -> tenant name
  std::string secret;                         // server secret mixed into every tenant salt
  // The UCX server of the store's RAM region; null serves every Get inline.
  const cachestore::UcxRegionServer* ucx = nullptr;
  // Tenants whose tokens may read Stats: its counts are the whole store's, every tenant's activity
  // in them, so other tenants are refused (PERMISSION_DENIED). Empty: nobody (the metrics endpoint
  // still serves them, to the operator's network).
  std::set<std::string> stats_tenants;
};

// Thread-safe. Handlers run on gRPC's callback threads; they block on the store (RocksDB), which
// is bounded by one block's I/O.
//
// Leases from Get and LeaseBlocks are owned by the caller's tenant and expire after the RAM tier's
// lease_ttl_ms (which LeaseBlocks reports). ReleaseLease answers OK only for a lease of the caller's
// tenant that was still live, and NOT_FOUND otherwise (released, expired, another tenant's);
// ReleaseLeases reports the same per id, and LeaseBlocks ends the leases in its release_lease_ids
// by the same rule (reporting only how many were live). A client must discard bytes it read under a lease unless
// the read finished within the lease's time to live by its own clock, or the release said the
// lease was live (see cachestore/tiers.h).
class CacheStoreService final : public vericache::v1::CacheStore::CallbackService {
 public:
  CacheStoreService(cachestore::BlockStore* store, StoreServiceOptions options);

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const vericache::v1::LookupRequest* req,
                                   vericache::v1::LookupResponse* resp) override;
  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* ctx, const vericache::v1::PutRequest* req,
                                vericache::v1::PutResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const vericache::v1::GetRequest* req,
                                vericache::v1::GetResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseLease(grpc::CallbackServerContext* ctx,
                                         const vericache::v1::ReleaseLeaseRequest* req,
                                         vericache::v1::ReleaseLeaseResponse* resp) override;
  grpc::ServerUnaryReactor* LeaseBlocks(grpc::CallbackServerContext* ctx,
                                        const vericache::v1::LeaseBlocksRequest* req,
                                        vericache::v1::LeaseBlocksResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseLeases(grpc::CallbackServerContext* ctx,
                                          const vericache::v1::ReleaseLeasesRequest* req,
                                          vericache::v1::ReleaseLeasesResponse* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const vericache::v1::DeleteRequest* req,
                                   vericache::v1::DeleteResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const vericache::v1::StatsRequest* req,
                                  vericache::v1::StatsResponse* resp) override;
  // What Stats answers, without asking who calls (the metrics endpoint).
  void CurrentStats(vericache::v1::StatsResponse* resp) const;

 private:
  // The caller's tenant, and its salt, from its bearer token; kUnauthenticated without a known one.
  absl::StatusOr<std::string> Tenant(grpc::CallbackServerContext* ctx) const;
  absl::StatusOr<std::string> TenantSalt(grpc::CallbackServerContext* ctx) const;
  // The tenant-scoped key of a request key; kInvalidArgument unless it is 32 bytes.
  absl::StatusOr<cachestore::BlockKey> ScopedKey(const std::string& salt, const std::string& key) const;
  // Leases `key` for the tenant (only its own release ends the lease early) and fills `out` for a
  // one-sided read. A block whose fingerprint is not `expect_fingerprint` (when that is not empty)
  // is released again: kFailedPrecondition. `out` is written only on success.
  absl::Status LeaseRemote(const cachestore::BlockKey& key, const std::string& salt,
                           const std::string& expect_fingerprint, vericache::v1::RemoteBlock* out);

  cachestore::BlockStore* const store_;
  const StoreServiceOptions options_;
};

// Reads "token tenant" lines (blank lines and # comments skipped); kInvalidArgument naming the line
// for anything else, kNotFound for a missing file.
absl::StatusOr<std::map<std::string, std::string>> ReadTokenFile(const std::string& path);

}  // namespace vc

#endif  // VC_SERVICES_STORE_SERVICE_H_
