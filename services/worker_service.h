// The Inference gRPC service (proto/vericache/v1/inference.proto): a worker that serves many
// concurrent streams with continuous batching.
//
// One scheduler thread owns the engines. gRPC handler threads validate a request, queue it and
// then stream what the engine verifies for it; the scheduler admits queued requests between
// passes, forwards cancellations, and steps the engines while any request is in flight.
//   MODE_VERICACHE  VeriCacheEngine: draft from compressed KV, verify against the full KV
//                   (from the cache store when a PrefixStore is configured)
//   MODE_FULL       FullKvEngine: full KV in worker memory, prefix read from the store
// Both give the output of sequential full-KV decoding; only verified tokens are ever sent.
#ifndef VC_SERVICES_WORKER_SERVICE_H_
#define VC_SERVICES_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/call_metadata.h"
#include "grpcpp/grpcpp.h"
#include "services/write_watchdog.h"
#include "vericache/v1/inference.grpc.pb.h"
#include "worker/engines/full_engine.h"
#include "worker/engines/scheduler.h"
#include "worker/engines/vericache_engine.h"
#include "worker/prefixes/full_kv_tier.h"
#include "worker/prefixes/prefix_store.h"
#include "worker/chat/chat_format.h"
#include "worker/runtime/model.h"

namespace vc {

struct WorkerServiceOptions {
  EngineOptions engine;  // staging_blocks must be > 0
  // KV blocks of MODE_FULL requests (worker memory for their whole KV); 0 refuses MODE_FULL.
  int64_t full_kv_blocks = 0;
  int full_max_batch = 16;
  // Requests queued or in flight; beyond this a request is refused with RESOURCE_EXHAUSTED.
  int max_requests = 256;
  // The same for each tenant's requests (see client_tokens), so that one tenant cannot take every
  // slot; 0: only max_requests.
  int max_requests_per_tenant = 0;
  // Sequences of one tenant in each engine's batch, so that one tenant's long requests leave room
  // for another's; -1: when client_tokens name more than one tenant, the batch less an eighth of
  // it (at least one sequence), else no cap; 0: no cap.
  int max_batch_per_tenant = -1;
  // Bearer tokens accepted from clients, each with its tenant: requests of one tenant use and
  // share prefixes (in the store and in the worker) that no other tenant's can find. An empty
  // tenant is the worker's default, whose prefixes are those of a worker without tenants, and
  // whose tokens alone may read GetStats (it counts every tenant's requests). Empty: no
  // authentication (loopback, tests), every request of the default tenant.
  std::map<std::string, std::string> client_tokens;
  // What ChatPrompt requests are rendered with; null: they are refused (FAILED_PRECONDITION).
  std::shared_ptr<const ChatFormat> chat;
  std::string model_name;       // reported by GetModelInfo: the name clients give the model
  std::string fingerprint_hex;  // reported by GetModelInfo
  std::string numerics;         // the kernels' (kernels::Backend::numerics()), reported by GetModelInfo
  // A write to a client that has not returned within this long (the client stopped reading)
  // cancels the call, so the handler does not wait for it for good.
  int64_t client_write_timeout_ms = 60'000;
  // Tests only: called on the scheduler thread before each round of engine steps (a test stalls
  // the scheduler in it). Null: nothing.
  std::function<void()> before_steps;
};

// Thread-safe. `model`, `tier` and `prefixes` (may be null) must outlive the service.
class WorkerService final : public vericache::v1::Inference::Service {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerService>> Create(const Model& model, FullKvTier* tier,
                                                              PrefixStore* prefixes,
                                                              const WorkerServiceOptions& options);
  // Ends every request still in flight with UNAVAILABLE and stops the scheduler.
  ~WorkerService() override;

  grpc::Status Generate(grpc::ServerContext* ctx, const vericache::v1::GenerateRequest* req,
                        grpc::ServerWriter<vericache::v1::GenerateResponse>* writer) override;
  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const vericache::v1::GetModelInfoRequest* req,
                            vericache::v1::ModelInfo* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const vericache::v1::GetStatsRequest* req,
                        vericache::v1::WorkerStats* resp) override;
  // What GetStats answers, without asking who calls (the metrics endpoint).
  void CurrentStats(vericache::v1::WorkerStats* resp) const;
  // Draining before a stop: new requests are refused with UNAVAILABLE from now on, while those
  // queued or in flight run to their end. WaitIdle: whether none is left, waiting up to `timeout`.
  void StopAdmitting();
  bool WaitIdle(absl::Duration timeout);
  // How long the scheduler has held requests with neither its loop coming round nor a forward pass
  // of the model finishing (an engine step that does not return; a long prefill is one step of
  // many passes); zero while it holds none. Passes are seen when this is called: call it often.
  absl::Duration StalledFor() const;

 private:
  WorkerService(const Model& model, const WorkerServiceOptions& options, PrefixStore* prefixes);
  // The request as the engines take it; kInvalidArgument naming the problem.
  absl::StatusOr<EngineRequest> Parse(const vericache::v1::GenerateRequest& req) const;
  // The caller's tenant, or kUnauthenticated.
  absl::StatusOr<std::string> Authenticate(grpc::ServerContext* ctx) const;

  const Model& model_;
  const WorkerServiceOptions options_;
  PrefixStore* const prefixes_;
  // Read for their memory gauges only (thread-safe there); the engine runs on the scheduler's thread.
  const VeriCacheEngine* vericache_ = nullptr;
  const FullKvTier* tier_ = nullptr;
  std::string compressor_;
  const absl::Duration started_;  // SteadyClock() time
  std::atomic<int64_t> invalid_{0};  // calls refused before admission as invalid or unauthenticated
  bool has_full_ = false;  // MODE_FULL requests are served (by the engine kFull)
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<WriteWatchdog<grpc::ServerContext>> watchdog_;
  // StalledFor's view of the model's passes: the count it last saw, and when that changed.
  mutable absl::Mutex passes_mu_;
  mutable uint64_t passes_seen_ ABSL_GUARDED_BY(passes_mu_) = 0;
  mutable absl::Duration passes_changed_ ABSL_GUARDED_BY(passes_mu_) = SteadyClock()->Now();
};

}  // namespace vc

#endif  // VC_SERVICES_WORKER_SERVICE_H_
