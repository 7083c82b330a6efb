// The servers, ready to run in a process of their own (`vericache store`, `vericache worker`,
// `vericache router`) or together in one (`vericache demo`, the end-to-end tests): each owns its
// state, its gRPC server (with the standard health service) and, for the store, its UCX data plane.
#ifndef VC_SERVICES_SERVERS_H_
#define VC_SERVICES_SERVERS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cachestore/store.h"
#include "cachestore/ucx_transport.h"
#include "grpcpp/grpcpp.h"
#include "services/http/http_server.h"
#include "services/metrics.h"
#include "services/router_service.h"
#include "services/store_service.h"
#include "services/worker_service.h"
#include "worker/prefixes/full_kv_tier.h"
#include "worker/prefixes/store_prefixes.h"
#include "worker/runtime/model.h"

namespace vc {

struct StoreServerOptions {
  std::string listen = "127.0.0.1:0";  // port 0: any free port (see port())
  cachestore::StoreOptions store;
  StoreServiceOptions service;  // tokens, secret (ucx is filled in)
  // "none" or "peer": the RAM tier lives in a region UCX allocates (only such memory can be read
  // one-sided without RDMA hardware) and is served for one-sided reads; "off": inline gRPC only.
  std::string ucx = "none";
  // A lease's UCX key reaches the whole RAM region, every tenant's blocks in it: with one-sided
  // reads on and more than one tenant in service.tokens, Start refuses unless this is set.
  bool ucx_across_tenants = false;
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null: plaintext
  // HOST:PORT of a Prometheus /metrics endpoint (plain HTTP, no authentication); empty: none.
  std::string metrics_listen;
  // Once writes to the disk tier have been failing this long (puts refused, and the tier's own
  // probes and reopens of RocksDB failing too: see DiskTier::Maintain), other than for want of
  // room, the health service's "liveness" entry turns NOT_SERVING, so that a liveness probe
  // restarts the store (elsewhere, perhaps, on a disk that works). A full disk recovers by itself
  // once it has room, and a restart would only lose the RAM tier. The entry turns SERVING again if
  // writes succeed first. 0: never. The server's own entry ("") stays SERVING: reads go on.
  int64_t disk_failure_grace_ms = 60'000;
};

// The health service entry that says whether a store or a worker should be restarted.
inline constexpr char kLivenessService[] = "liveness";

// Calls `tick` every `interval` on a thread of its own, until destroyed.
class Ticker {
 public:
  Ticker(absl::Duration interval, std::function<void()> tick);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

 private:
  absl::Notification stop_;
  std::thread thread_;
};

class StoreServer {
 public:
  // kUnavailable when the port or the metrics address cannot be bound or the data directory cannot
  // be opened; kInvalidArgument for a malformed address.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(StoreServerOptions options);
  ~StoreServer();  // shuts down, in-flight calls get up to 2 s

  int port() const { return port_; }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  cachestore::BlockStore& store() { return *store_; }
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }  // 0: no endpoint

 private:
  StoreServer() = default;
  // Probes the disk tier's writes while they fail and keeps the liveness entry up to date.
  void WatchDisk(absl::Duration grace);
  std::unique_ptr<cachestore::UcxRegionServer> ucx_;  // holds the RAM tier's region: outlives store_
  std::unique_ptr<cachestore::BlockStore> store_;
  std::unique_ptr<CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  int port_ = 0;
  bool live_ = true;  // the liveness entry, as WatchDisk last set it (its thread only)
  std::unique_ptr<Ticker> disk_watch_;  // stopped first
};

struct WorkerServerOptions {
  std::string model_dir = "models/vc-code-4m";
  // The full KV's element type; unset: the checkpoint's (ModelOptions::kv_dtype).
  std::optional<DType> kv_dtype;
  // The kernel backend by name (kernels::BackendByName); empty: kernels::DefaultBackend(), which
  // the command line picks with VC_KERNELS.
  std::string kernels;
  std::string listen = "127.0.0.1:0";
  // The cache store (host:port), or its shards (host:port,host:port,...); empty: none (every
  // prefix is computed, nothing is published). An item srv:NAME stands for the targets of NAME's
  // DNS SRV records (a Kubernetes headless Service's pods), looked up once, at start.
  std::string store_target;
  std::string dns_server;  // "ip:port" to ask for srv: items instead of the system's resolvers (tests)
  // With srv: items, the shards the worker expects: the lookup is made again, every second for
  // store_shards_wait_ms, until DNS lists at least this many (a store pod that is being created has
  // no record yet, and a worker that started without it would hash blocks over fewer shards than
  // the others for as long as it runs).
  int min_store_shards = 0;
  int64_t store_shards_wait_ms = 120'000;
  int store_replicas = 1;  // shards holding each block, up to the number of shards
  std::string store_token;
  std::string store_tls_root_certs_pem;  // the store serves TLS: its root certificates; empty: plaintext
  int64_t store_timeout_ms = 2000;
  std::string ucx = "none";  // one-sided reads: "none", "peer"; "off": inline gRPC
  int block_tokens = 256;    // tokens per store block
  // > 0: paces every full-KV fetch (store prefix and the worker's own host copy) to this rate,
  // standing for a slower link than loopback (benchmarks).
  double fetch_bytes_per_second = 0;
  // Worker memory, in bytes: full KV staged for verification, MODE_FULL sequences' KV, the
  // compressed prefixes kept for reuse, the host tier holding VeriCache sequences' full KV (each
  // reserves its prompt and max_tokens, its store prefix's share included: it is held here should
  // the prefix's read fail), and the compressed KV those sequences draft from (each reserves the
  // most its compressor can hold for its prompt and max_tokens).
  int64_t staging_bytes = int64_t{512} << 20;
  int64_t full_kv_bytes = int64_t{256} << 20;
  int64_t prefix_cache_bytes = int64_t{256} << 20;
  int64_t host_kv_bytes = int64_t{1024} << 20;
  int64_t compressed_kv_bytes = int64_t{512} << 20;
  WorkerServiceOptions service;  // engine options, limits, client tokens
  // A client (a router) with calls in flight, silent this long, is pinged; no answer within as
  // long again ends its calls, freeing their batch slots. 0: gRPC's default (two hours).
  int64_t keepalive_ms = 20'000;
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null: plaintext
  // HOST:PORT of a Prometheus /metrics endpoint (plain HTTP, no authentication: every tenant's
  // counts, as GetStats gives the default tenant's tokens); empty: none.
  std::string metrics_listen;
  // HOST:PORT of the OpenAI-compatible HTTP API (services/http/http_server.h); empty: none.
  std::string http_listen;
  // PEM files of its certificate and key: HTTPS; empty: plain HTTP.
  std::string http_tls_cert_file, http_tls_key_file;
  // The chat template (a Jinja file); empty: the checkpoint's (see LoadChatFormat).
  std::string chat_template_file;
  // The model's name for clients (OpenAI's `model`); empty: the checkpoint folder's name.
  std::string served_model_name;
  // Once the scheduler has held requests this long with neither its loop coming round nor a forward
  // pass finishing (an engine step that does not return: a bug, a hung device or read; a long
  // prefill's passes are progress), the health service's "liveness" entry
  // and its own ("") turn NOT_SERVING: a router sends it nothing more, and a liveness probe
  // restarts it. Both turn SERVING again (the own entry unless draining) if the loop comes round
  // first. 0: never.
  int64_t stall_grace_ms = 60'000;
};

class WorkerServer {
 public:
  // Loads the model and connects (lazily) to the store. Errors from the model or options as they
  // are; kUnavailable when the port or the metrics address cannot be bound; ResolveTargets' errors for
  // srv: stores.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(WorkerServerOptions options);
  ~WorkerServer();

  int port() const { return port_; }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  const Model& model() const { return *model_; }
  StorePrefixes* prefixes() { return prefixes_.get(); }  // null without a store
  const std::vector<std::string>& store_shards() const { return store_shards_; }  // srv: items resolved
  // Draining before a stop: the health service reports NOT_SERVING (readiness probes fail, so
  // load balancers move on), new requests are refused with UNAVAILABLE, and those admitted run to
  // their end. WaitIdle: whether none is left, waiting up to `timeout`.
  void StopAdmitting();
  bool WaitIdle(absl::Duration timeout) { return service_->WaitIdle(timeout); }
  // Stops the gRPC server: clients are told to go elsewhere (HTTP/2 GOAWAY, so those holding a
  // connection to this worker reconnect, to another one behind a Service), calls in flight go on
  // until `deadline` and are cancelled then. Returns when none is left. Call it once, from one
  // thread, while the server is otherwise left alone; the destructor's own stop is then a no-op.
  void Shutdown(absl::Time deadline) { server_->Shutdown(absl::ToChronoTime(deadline)); }
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }  // 0: no endpoint
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }           // 0: no HTTP API

 private:
  WorkerServer() = default;
  // Keeps the liveness entry (and the server's own) up to date with the scheduler's stalls.
  void WatchStalls(absl::Duration grace);
  std::unique_ptr<Model> model_;
  std::unique_ptr<HostKvTier> tier_;
  std::unique_ptr<StorePrefixes> prefixes_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<http::HttpServer> http_;  // stopped before the gRPC server
  std::vector<std::string> store_shards_;
  int port_ = 0;
  // The health entries: StopAdmitting and the stall watch set them under health_mu_.
  std::mutex health_mu_;
  bool draining_ = false, live_ = true;
  std::unique_ptr<Ticker> stall_watch_;  // stopped first
};

// A list of targets, comma-separated host:port items and srv:NAME items (a worker's store shards,
// a router's workers): kInvalidArgument naming `what` for a malformed address or an srv: item
// without a name; otherwise whether it has srv: items.
absl::StatusOr<bool> CheckTargets(absl::string_view targets, absl::string_view what);

// The targets such a list names, srv: items replaced by the targets of their SRV records (looked
// up now, through `dns_server` when it is not empty; again every second for up to `wait` while a
// resolver does not answer, and, with `min_shards` > 0, while a name has no records or they list
// fewer in all). The lookup's error, or kUnavailable for too few; messages call the targets `what`.
absl::StatusOr<std::vector<std::string>> ResolveTargets(const std::string& targets, const std::string& dns_server,
                                                        int min_shards, absl::Duration wait,
                                                        absl::string_view what = "store shards");

struct RouterServerOptions {
  std::string listen = "127.0.0.1:0";
  RouterServiceOptions service;  // its worker_keepalive_ms is set from keepalive_ms
  // Both ways: a client with calls in flight, and a worker with the router's calls in flight,
  // silent this long, is pinged; no answer within as long again ends the calls (a worker's with
  // UNAVAILABLE to their clients). 0: gRPC's defaults (clients: two hours; workers: never, a call
  // waits for its deadline).
  int64_t keepalive_ms = 20'000;
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null: plaintext
  // HOST:PORT of a Prometheus /metrics endpoint (the RouterStats counts); empty: none.
  std::string metrics_listen;
  // HOST:PORT of the OpenAI-compatible HTTP API; empty: none.
  std::string http_listen;
  // PEM files of its certificate and key: HTTPS; empty: plain HTTP.
  std::string http_tls_cert_file, http_tls_key_file;
};

// A router (services/router_service.h) serving Inference and Router on one port.
class RouterServer {
 public:
  // RouterService::Create's errors; kUnavailable when the port or the metrics address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(RouterServerOptions options);
  ~RouterServer();

  int port() const { return port_; }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  RouterService& service() { return *service_; }
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }
  // Its health (service "") is SERVING while some worker serves and it is not draining: a router
  // that could only answer UNAVAILABLE is not ready for calls.
  // As WorkerServer's: NOT_SERVING first, then the server's stop with calls in flight let run
  // until `deadline`.
  void StopAdmitting();
  void Shutdown(absl::Time deadline) { server_->Shutdown(absl::ToChronoTime(deadline)); }

 private:
  RouterServer() = default;
  // `serving_workers` -1: the count as it was.
  void SetHealth(int serving_workers, bool draining);
  std::mutex health_mu_;
  int serving_workers_ = 0;  // under health_mu_
  bool draining_ = false;    // under health_mu_
  int reported_ = -1;        // under health_mu_: the health last set (1 serving, 0 not), -1 none
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<RouterStatsService> stats_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<http::HttpServer> http_;  // stopped before the gRPC server
  int port_ = 0;
};

// Hex of a fingerprint.
std::string HexString(const std::array<uint8_t, 32>& bytes);

}  // namespace vc

#endif  // VC_SERVICES_SERVERS_H_
