// The client workers use to reach a cache store's control plane. Thread-safe (gRPC stubs are).
#ifndef VC_CACHESTORE_STORE_CLIENT_H_
#define VC_CACHESTORE_STORE_CLIENT_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cachestore/block_key.h"
#include "cachestore/store.h"
#include "cachestore/ucx_transport.h"
#include "vericache/v1/cache_store.grpc.pb.h"

namespace vc::cachestore {

struct StoreClientOptions {
  std::string target;  // host:port
  std::string token;   // bearer token of this client's tenant
  int64_t timeout_ms = 5000;
  std::string tls_root_certs_pem;  // empty: plaintext (loopback, tests)
};

class StoreClient {
 public:
  // Creates a channel (connects lazily). kInvalidArgument for an empty target.
  static absl::StatusOr<std::unique_ptr<StoreClient>> Create(const StoreClientOptions& options);
  ~StoreClient();

  // Leading keys the store holds, and how many of them are in its RAM tier.
  absl::StatusOr<std::pair<uint32_t, uint32_t>> Lookup(absl::Span<const BlockKey> keys);
  absl::Status Put(const BlockKey& key, absl::string_view block);
  // kNotFound when absent; kDataLoss when the stored copy failed its checks (it is gone then).
  absl::StatusOr<std::string> Get(const BlockKey& key, const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  // Like Get, but a block the store holds in RAM is read with a one-sided UCX get through
  // `reader` (inline otherwise) under a lease, released after the read; the block is checked end
  // to end, and one that fails is deleted from the store and reported as kDataLoss. kAborted
  // when the lease expired before it was released (the read may have raced a reuse of the slot;
  // the bytes are discarded, the stored block is kept, and the call can be retried); the release
  // call's own error when the store could not confirm the lease.
  absl::StatusOr<std::string> GetRemote(const BlockKey& key, UcxReader* reader,
                                        const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  // GetRemote for several blocks with their round trips overlapped: every lease request goes out
  // at once, each block is read as its lease arrives and its release sent at once, and the blocks
  // are checked while the releases are in flight. A batch costs about two round trips, not two
  // per block. One result per key, in order, each what GetRemote would have returned.
  std::vector<absl::StatusOr<std::string>> GetRemoteBatch(absl::Span<const BlockKey> keys, UcxReader* reader,
                                                          const std::array<uint8_t, 32>* expect_fingerprint = nullptr);
  absl::Status Delete(const BlockKey& key);
  absl::StatusOr<StoreStats> Stats();

 private:
  StoreClient() = default;
  // Adds the bearer token and the deadline to a call.
  void Prepare(grpc::ClientContext* ctx) const;
  StoreClientOptions options_;
  std::unique_ptr<vericache::v1::CacheStore::Stub> stub_;
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_STORE_CLIENT_H_
