// The router: one Inference endpoint in front of several workers.
//
// Each Generate call goes to one worker, chosen so that prompts sharing a prefix meet the worker
// that already holds it. The prompt's leading blocks are hashed in a chain (a block's hash covers
// every block before it, and the caller's token, since a worker finds a tenant's prefixes for its
// own requests only). The router remembers which workers served each block; a call goes to the
// worker that served the longest run of the prompt's leading blocks, when that run is at least half
// of them. Otherwise it goes to the least busy worker (ties broken by a rendezvous order keyed by the
// prompt, the same on every router replica). Affinity gives way to load: a worker with
// `balance_slack` more calls in flight than the least busy one is passed over.
//
// A call that a worker refuses or cannot take (UNAVAILABLE, RESOURCE_EXHAUSTED) before it sent a
// token is tried on the next worker: nothing has reached the client, and every worker gives the
// same output for the same request. Once a token is sent, the call is the worker's to the end.
// Deadline and cancellation pass through to the worker, and so does the caller's authorization
// metadata: the workers authenticate clients, the router does not.
//
// Workers are checked every `health_interval_ms` with the standard health service (a draining
// worker reports NOT_SERVING and gets no new calls) and must serve one checkpoint: the one named in
// the options, or else the one most of them served when the router first reached any. srv: names
// are looked up again every `refresh_interval_ms`, so workers that are added or removed are found.
#ifndef VC_SERVICES_ROUTER_SERVICE_H_
#define VC_SERVICES_ROUTER_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "grpcpp/grpcpp.h"
#include "services/write_watchdog.h"
#include "vericache/v1/inference.grpc.pb.h"

namespace vc {

struct RouterServiceOptions {
  // The workers: host:port items and srv:NAME items (the targets of NAME's DNS SRV records),
  // comma-separated. At most kMaxRouterWorkers in all.
  std::string workers;
  std::string dns_server;  // "ip:port" to ask for srv: items instead of the system's resolvers (tests)
  std::string worker_tls_root_certs_pem;  // the workers serve TLS: their root certificates; empty: plaintext
  // The bearer token the router's own model queries present, when the workers take client tokens.
  std::string worker_token;
  // "prefix" (above), "least-loaded" (fewest calls in flight), "round-robin".
  std::string policy = "prefix";
  int balance_slack = 4;
  // Prompt blocks remembered (about 40 bytes each); the least recently routed are forgotten first.
  int64_t affinity_blocks = int64_t{1} << 20;
  // Block sizes of the prompt hash: token ids in blocks of the workers' store block
  // (ModelInfo.prefix_block_tokens; this when they have no store), text in blocks of bytes.
  int ids_block_tokens = 256;
  int text_block_bytes = 1024;
  int64_t health_interval_ms = 1000;
  int64_t refresh_interval_ms = 10000;
  int64_t worker_timeout_ms = 2000;  // health checks and model queries
  // > 0: the channels to workers ping a worker that has calls in flight and has been silent this
  // long, and end its calls with UNAVAILABLE when it does not answer within as long again
  // (InferenceChannel). 0: a call to a worker whose host vanished waits for its deadline.
  int64_t worker_keepalive_ms = 0;
  // A client that takes no streamed tokens for this long (its call open, its window full) has its
  // call cancelled, as the worker does with its own --client-write-timeout-ms.
  int64_t client_write_timeout_ms = 60'000;
  // The checkpoint (ModelInfo.fingerprint_hex) the workers must serve; empty: the one most of the
  // workers serve at the first check that reaches any, given up for the one most of them then
  // serve once none has served it for `repin_after_ms` (a rollout of another checkpoint). The
  // numerics of the workers' kernels (ModelInfo.numerics) are pinned with it, those of the most
  // workers serving it, so that a request's output does not depend on the worker it lands on.
  std::string model_fingerprint_hex;
  int64_t repin_after_ms = 30'000;
};

inline constexpr int kMaxRouterWorkers = 64;

// A two-generation table of prompt block hash -> the workers (a bit each) that served it: lookups
// move an entry into the current generation, which becomes the previous one when it holds half
// the capacity, and the previous one is dropped then. Not thread-safe.
class AffinityTable {
 public:
  explicit AffinityTable(int64_t capacity) : half_(std::max<int64_t>(1, capacity / 2)) {}
  uint64_t Get(uint64_t block);
  // The longest run of `blocks` from the first whose every block some worker of `*mask` served:
  // its length, with *mask narrowed to the workers that served all of it (unchanged for none).
  // The run's entries move to the current generation together, so that a roll on the way does
  // not drop the rest of them (the current generation may pass half the capacity by one run).
  int LongestRun(absl::Span<const uint64_t> blocks, uint64_t* mask);
  void Add(uint64_t block, uint64_t workers);
  void Forget(uint64_t workers);  // clears these workers' bits everywhere
  int64_t size() const { return static_cast<int64_t>(current_.size() + previous_.size()); }

 private:
  void Roll();
  const int64_t half_;
  absl::flat_hash_map<uint64_t, uint64_t> current_, previous_;
};

// The chained hashes of the prompt's leading full blocks (ids in blocks of `ids_block_tokens`,
// text in blocks of `text_block_bytes` bytes), keyed by `seed`.
std::vector<uint64_t> PromptBlockHashes(const vericache::v1::GenerateRequest& req, uint64_t seed,
                                        int ids_block_tokens, int text_block_bytes);

class RouterService final : public vericache::v1::Inference::Service {
 public:
  // Resolves the workers (kInvalidArgument for a malformed list or DNS name; a name without records
  // yet, or a resolver that does not answer, is looked up again at every check while the router has
  // no worker) and starts checking them; calls are refused with UNAVAILABLE until one is serving.
  static absl::StatusOr<std::unique_ptr<RouterService>> Create(RouterServiceOptions options);
  ~RouterService() override;

  grpc::Status Generate(grpc::ServerContext* ctx, const vericache::v1::GenerateRequest* req,
                        grpc::ServerWriter<vericache::v1::GenerateResponse>* writer) override;
  // The model the router's workers serve; UNAVAILABLE while none has answered.
  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const vericache::v1::GetModelInfoRequest* req,
                            vericache::v1::ModelInfo* info) override;
  // The serving workers' GetStats (asked with the caller's authorization) summed: counts added,
  // uptime the longest, tenants and store shards matched by name. A worker's error as it is.
  grpc::Status GetStats(grpc::ServerContext* ctx, const vericache::v1::GetStatsRequest* req,
                        vericache::v1::WorkerStats* stats) override;

  void CurrentStats(vericache::v1::RouterStats* stats);
  // Waits until `n` workers are serving, up to `timeout`; whether they are.
  bool WaitServing(int n, absl::Duration timeout);
  // Calls `f` with the number of workers serving now, and again after every round of health
  // checks (from the checking thread, with the router's lock held: `f` must not call back).
  void OnServingCount(std::function<void(int)> f);

 private:
  struct Upstream;
  RouterService(RouterServiceOptions options, bool from_dns);
  // The workers serving now, in list order, and their count. Need mu_.
  std::vector<std::shared_ptr<Upstream>> ServingWorkers() const;
  int ServingCount() const;
  // For a call passed on to the workers (GetModelInfo, GetStats): the caller's authorization into
  // *auth (refused when gRPC could not send it on) and the workers serving now (UNAVAILABLE when
  // none is).
  grpc::Status ForwardTo(const grpc::ServerContext& ctx, std::string* auth,
                         std::vector<std::shared_ptr<Upstream>>* workers);
  // The client context of one such call: the caller's deadline, at most worker_timeout_ms, and its
  // authorization.
  std::unique_ptr<grpc::ClientContext> ForwardedCall(const grpc::ServerContext& ctx, const std::string& auth) const;
  // The serving workers in the order to try them, best first (counting a prefix match or a spill).
  std::vector<std::shared_ptr<Upstream>> Choose(const std::vector<uint64_t>& blocks);
  void Remember(const std::vector<uint64_t>& blocks, const Upstream& w);
  void SetWorkers(const std::vector<std::string>& targets);
  // One worker's health check and, when it serves and its model has not been compared with the
  // router's since it last failed, its model.
  struct Probe {
    std::shared_ptr<Upstream> w;
    uint64_t downs = 0;  // Upstream::downs when the probe began
    absl::Status health;
    bool healthy = false;
    bool asked_model = false;
    grpc::Status model_status;
    vericache::v1::ModelInfo info;
  };
  Probe Check(const std::shared_ptr<Upstream>& w);
  // A round of probes, in the workers' order: pins the model when none is, and sets who serves.
  void Apply(const std::vector<Probe>& probes);
  void CheckLoop();
  int BlockTokens() const;

  const RouterServiceOptions options_;
  const bool from_dns_;  // options_.workers has srv: items, looked up again now and then
  const absl::Duration started_ = SteadyClock()->Now();

  std::mutex mu_;
  std::condition_variable changed_;  // a worker's serving state changed, or stop_
  std::function<void(int)> on_serving_count_;  // under mu_
  std::vector<std::shared_ptr<Upstream>> workers_;
  uint64_t free_slots_ = ~uint64_t{0};
  AffinityTable table_;
  std::unique_ptr<vericache::v1::ModelInfo> model_;  // pinned by the first worker that answered
  absl::Duration model_last_served_ = SteadyClock()->Now();  // when a worker last served model_
  uint64_t round_robin_ = 0;
  bool stop_ = false;

  std::unique_ptr<WriteWatchdog<grpc::ServerContext>> watchdog_;  // bounds writes to clients

  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> routed_{0}, unrouted_{0}, prefix_routed_{0}, prefix_blocks_{0}, spills_{0}, retries_{0},
      failovers_{0};
  std::thread checker_;
};

// The Router service's one method, over a RouterService's counts.
class RouterStatsService final : public vericache::v1::Router::Service {
 public:
  explicit RouterStatsService(RouterService* router) : router_(router) {}
  grpc::Status GetRouterStats(grpc::ServerContext*, const vericache::v1::GetRouterStatsRequest*,
                              vericache::v1::RouterStats* stats) override {
    router_->CurrentStats(stats);
    return grpc::Status::OK;
  }

 private:
  RouterService* const router_;
};

}  // namespace vc

#endif  // VC_SERVICES_ROUTER_SERVICE_H_
