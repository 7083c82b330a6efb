#include "services/servers.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cachestore/store_client.h"
#include "common/dns.h"
#include "common/memory.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/support/server_interceptor.h"
#include "kernels/backends.h"
#include "services/inference_client.h"
#include "services/metrics.h"
#include "services/protobuf_log.h"
#include "worker/compression/registry.h"

namespace vc {
namespace {

absl::Status CannotListen(const std::string& address, bool tls) {
  return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                             tls ? " (the address is taken, or the TLS certificate or key is not valid)"
                                                 : " (the address is taken or not this host's)"));
}

// gRPC parses a request before the service sees it, and answers one it cannot parse with a status
// that says nothing: INTERNAL with an empty message from a sync service, UNIMPLEMENTED from a
// callback one. This makes that answer INVALID_ARGUMENT naming the method; the call has done nothing.
// Only for methods that take one request (every method here): in a client stream, the end of the
// stream is a null message too.
class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  // `method` is the registered method's name, which outlives the call.
  explicit ParseErrorInterceptor(const char* method) : method_(method != nullptr ? method : "?") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using grpc::experimental::InterceptionHookPoints;
    // The server hands the hook the parsed request, or null when it could not parse it.
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) && m->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) && unparsed_) {
      m->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       absl::StrCat("the request to ", method_,
                                                    " is not a valid protocol buffer of the method's request type")));
    }
    m->Proceed();
  }

 private:
  const char* const method_;
  bool unparsed_ = false;
};

class ParseErrorInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
    return new ParseErrorInterceptor(info->method());
  }
};

// What a store call may carry; the Inference servers' calls are far smaller (a prompt of a million
// token ids is about 5 MB), and a larger limit would let each call cost that much memory.
constexpr int kMaxInferenceMessageBytes = 32 << 20;

// `keepalive_ms` > 0: a client connection with calls in flight that has been silent that long is
// pinged, and closed, its calls cancelled, when no answer comes within as long again (a client
// whose host vanished would otherwise hold its calls, and a worker's batch slots, to the end of
// each request: the engine does not wait for the writes, and the write watchdog sees only a write
// that blocks).
std::unique_ptr<grpc::Server> Listen(const std::string& address, std::shared_ptr<grpc::ServerCredentials> creds,
                                     const std::vector<grpc::Service*>& services, int max_message_bytes,
                                     int64_t keepalive_ms, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  // Without SO_REUSEPORT, which gRPC sets by default: a second server on a port in use must fail,
  // not share the port's connections with the first.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients' keepalive pings (a router's, InferenceChannel's) are welcome every 500 ms while calls
  // are open. gRPC documents its default as taking a ping less than 5 minutes after the last one,
  // while the server has sent nothing (a long prefill), as abuse, and the third as reason to close
  // the connection, ending every call on it (1.51, here, was not seen to, with pings every second).
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  for (const auto& [name, value] : KeepaliveArgs(keepalive_ms)) b.AddChannelArgument(name, value);
  b.AddListeningPort(address, creds != nullptr ? creds : grpc::InsecureServerCredentials(), port);
  // What gRPC may hold for this server's calls, messages read (whole, before their token or
  // anything in them is checked) and answers being sent alike: four of the largest messages.
  // Past it, calls are refused (RESOURCE_EXHAUSTED) instead of each holding its message: twelve
  // clients sending 30 MB prompts at once took a worker from 0.8 to 1.3 GB without it, to 1.1 GB
  // with it. (A store's is 1 GiB, shared by the blocks it answers inline, without UCX.)
  grpc::ResourceQuota quota("vericache-server");
  quota.Resize(static_cast<size_t>(4) * static_cast<size_t>(max_message_bytes));
  b.SetResourceQuota(quota);
  b.SetMaxReceiveMessageSize(max_message_bytes);
  b.SetMaxSendMessageSize(max_message_bytes);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<ParseErrorInterceptorFactory>());
  b.experimental().SetInterceptorCreators(std::move(interceptors));
  for (grpc::Service* service : services) b.RegisterService(service);
  return b.BuildAndStart();
}

// How often a watch with this grace looks: a quarter of it, at most a second.
absl::Duration WatchInterval(absl::Duration grace) { return std::min(absl::Seconds(1), grace / 4); }

// The /metrics endpoint at `listen` rendering `service`'s CurrentStats (a Stats message), or none
// when `listen` is empty.
template <typename Stats, typename Service>
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetrics(const std::string& listen, Service* service,
                                                              const char* prefix) {
  if (listen.empty()) return nullptr;
  return MetricsEndpoint::Start(listen, [service, prefix] {
    Stats stats;
    service->CurrentStats(&stats);
    return PrometheusText(stats, prefix);
  });
}

// The OpenAI-compatible HTTP API at `listen` (HTTPS with a certificate and key), speaking to
// `server`'s Inference service in process.
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartHttp(const std::string& listen, const std::string& cert_file,
                                                           const std::string& key_file, grpc::Server& server,
                                                           std::function<bool()> healthy) {
  http::HttpServerOptions o;
  o.listen = listen;
  o.tls_cert_file = cert_file;
  o.tls_key_file = key_file;
  o.healthy = std::move(healthy);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxInferenceMessageBytes);
  args.SetMaxSendMessageSize(kMaxInferenceMessageBytes);
  return http::HttpServer::Start(o, server.InProcessChannel(args));
}

}  // namespace

std::string HexString(const std::array<uint8_t, 32>& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

absl::StatusOr<bool> CheckTargets(absl::string_view targets, absl::string_view what) {
  bool from_dns = false;
  for (absl::string_view t : absl::StrSplit(targets, ',')) {
    if (absl::ConsumePrefix(&t, "srv:")) {
      if (t.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": srv: names no DNS name"));
      from_dns = true;
      continue;
    }
    VC_RETURN_IF_ERROR(CheckAddress(what, t, false));
  }
  return from_dns;
}

absl::StatusOr<std::vector<std::string>> ResolveTargets(const std::string& targets, const std::string& dns_server,
                                                        int min_shards, absl::Duration wait, absl::string_view what) {
  const absl::Time until = absl::Now() + wait;
  while (true) {
    std::vector<std::string> out;
    absl::Status failed;
    bool from_dns = false;
    for (absl::string_view t : absl::StrSplit(targets, ',')) {
      if (!absl::ConsumePrefix(&t, "srv:")) {
        out.emplace_back(t);
        continue;
      }
      from_dns = true;
      absl::StatusOr<std::vector<std::string>> found = ResolveSrv(std::string(t), dns_server);
      if (!found.ok()) {
        failed = absl::Status(found.status().code(),
                              absl::StrCat(what, " from srv:", t, ": ", found.status().message()));
        break;
      }
      out.insert(out.end(), found->begin(), found->end());
    }
    if (failed.ok() && (!from_dns || static_cast<int>(out.size()) >= min_shards)) return out;
    if (failed.ok()) {
      failed = absl::UnavailableError(absl::StrCat("DNS lists ", out.size(), " ", what, " for ", targets,
                                                   ", fewer than the ", min_shards, " expected"));
    }
    // Records come and go while store pods start: look again until the wait is over. A name
    // without records fails at once unless shards are expected; a resolver that did not answer is
    // asked again either way.
    const bool retry = min_shards > 0 || !absl::IsNotFound(failed);
    if (!retry || absl::Now() + absl::Seconds(1) > until) return failed;
    absl::SleepFor(absl::Seconds(1));
  }
}

Ticker::Ticker(absl::Duration interval, std::function<void()> tick)
    : thread_([this, interval, tick = std::move(tick)] {
        while (!stop_.WaitForNotificationWithTimeout(interval)) tick();
      }) {}

Ticker::~Ticker() {
  stop_.Notify();
  thread_.join();
}

namespace {

// The host of a listen address (HOST:PORT, [V6]:PORT); a Unix socket's clients are on this host.
std::string ListenHost(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:")) return "127.0.0.1";
  const size_t colon = listen.rfind(':');
  return std::string(colon == absl::string_view::npos ? listen : listen.substr(0, colon));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(StoreServerOptions options) {
  RateLimitProtobufLog();
  std::unique_ptr<StoreServer> s(new StoreServer());
  VC_RETURN_IF_ERROR(CheckAddress("listen address", options.listen, true));
  if (options.disk_failure_grace_ms < 0) return absl::InvalidArgumentError("the disk failure grace is negative");
  VC_RETURN_IF_ERROR(CheckFitsInMemory(options.store.ram.capacity_bytes, "the RAM tier (--ram-bytes)"));
  if (options.ucx != "off") {
    std::set<std::string> tenants;
    for (const auto& [token, tenant] : options.service.tokens) tenants.insert(tenant);
    if (tenants.size() > 1 && !options.ucx_across_tenants) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tokens name ", tenants.size(), " tenants, and a one-sided UCX read can reach every tenant's blocks in "
          "the RAM region: give --ucx off (blocks inline over gRPC) or a store per tenant, or --ucx-across-tenants "
          "if the tenants may read each other's blocks"));
    }
    VC_ASSIGN_OR_RETURN(cachestore::UcxErrorMode mode, cachestore::ParseUcxErrorMode(options.ucx));
    // UCX's TCP transport listens where gRPC does, not on every interface.
    VC_ASSIGN_OR_RETURN(const std::string devices, cachestore::UcxNetDevicesFor(ListenHost(options.listen)));
    VC_ASSIGN_OR_RETURN(s->ucx_, cachestore::UcxRegionServer::Allocate(options.store.ram.capacity_bytes, mode, devices));
    options.store.ram.region = s->ucx_->region();
    options.service.ucx = s->ucx_.get();
  }
  VC_ASSIGN_OR_RETURN(s->store_, cachestore::BlockStore::Open(options.store));
  s->service_ = std::make_unique<CacheStoreService>(s->store_.get(), options.service);
  // The store's calls are short and carry deadlines: no keepalive of its own.
  s->server_ = Listen(options.listen, options.credentials, {s->service_.get()}, cachestore::kMaxStoreMessageBytes, 0,
                     &s->port_);
  if (s->server_ == nullptr || s->port_ == 0) return CannotListen(options.listen, options.credentials != nullptr);
  VC_ASSIGN_OR_RETURN(s->metrics_, StartMetrics<vericache::v1::StatsResponse>(
                                     options.metrics_listen, s->service_.get(), "vericache_store"));
  if (grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(kLivenessService, true);
  }
  if (options.disk_failure_grace_ms > 0) {
    const absl::Duration grace = absl::Milliseconds(options.disk_failure_grace_ms);
    s->disk_watch_ = std::make_unique<Ticker>(WatchInterval(grace), [p = s.get(), grace] { p->WatchDisk(grace); });
  }
  return s;
}

void StoreServer::WatchDisk(absl::Duration grace) {
  cachestore::DiskTier& disk = store_->disk();
  (void)disk.ProbeWrites();  // a no-op while writes succeed
  const cachestore::DiskWriteFailure failure = disk.write_failure();
  // A full disk is left to recover by itself: a restart would lose the RAM tier, and its reopen
  // would find no room either.
  const bool live = failure.duration < grace || failure.no_space;
  if (live == live_) return;
  live_ = live;
  if (live) {
    std::fprintf(stderr, "disk writes succeed again, or fail for want of room only: live\n");
  } else {
    std::fprintf(stderr, "disk writes have failed for %.1f s, and reopening RocksDB did not help: not live "
                 "(health entry \"%s\" NOT_SERVING)\n", absl::ToDoubleSeconds(failure.duration), kLivenessService);
  }
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(kLivenessService, live);
  }
}

StoreServer::~StoreServer() {
  disk_watch_.reset();
  metrics_.reset();  // it reads the service
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

namespace {

// What the engine would take in silence: a fixed draft window past what the compressor can roll
// back (it would run at that limit), a store with a compressor that chooses positions by the
// prompt's queries (which no stored block carries: requests would neither read nor publish
// prefixes), and compressed prefixes in the store from a compressor without a stored form.
absl::Status CheckDrafting(const EngineOptions& eo, const WorkerServerOptions& options, const KvLayout& layout,
                           int num_heads) {
  VC_ASSIGN_OR_RETURN(const std::unique_ptr<CompressedKvCache> drafts,
                      MakeCompressedKvCache(eo.compressor, layout, num_heads));
  VC_RETURN_IF_ERROR(CheckDraftWindow(*drafts, eo.draft_window));
  if (options.store_target.empty()) return absl::OkStatus();
  if (drafts->needs() == CompressorNeeds::kPromptQueries) {
    return absl::InvalidArgumentError(absl::StrCat(
        drafts->spec(), " chooses positions by the prompt's queries, which blocks from the store do not carry: ",
        "its requests would neither read prefixes from the store nor publish them (give another compressor, ",
        "or no --store)"));
  }
  if (eo.stored_compressed_prefixes && !StorePrefixes::HasCompressedForm(drafts->block_format(), options.block_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compressed prefixes in the store need a kivi compressor alone whose group divides the store's block of ",
        options.block_tokens, " tokens; ", drafts->spec(), " has no stored form there"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(WorkerServerOptions options) {
  RateLimitProtobufLog();
  std::unique_ptr<WorkerServer> w(new WorkerServer());
  VC_RETURN_IF_ERROR(CheckAddress("listen address", options.listen, true));
  if (options.host_kv_bytes < 1) return absl::InvalidArgumentError("the host KV tier has no memory");
  if (options.compressed_kv_bytes < 1) return absl::InvalidArgumentError("the compressed KV has no memory");
  if (options.stall_grace_ms < 0) return absl::InvalidArgumentError("the stall grace is negative");
  VC_RETURN_IF_ERROR(CheckFitsInMemory(
      static_cast<uint64_t>(options.staging_bytes) + options.full_kv_bytes + options.prefix_cache_bytes +
          options.host_kv_bytes + options.compressed_kv_bytes,
      "--staging-mib, --full-kv-mib, --prefix-cache-mib, --host-kv-mib and --compressed-kv-mib together"));
  if (options.kernels.empty()) VC_RETURN_IF_ERROR(kernels::CheckKernelsFromEnv());
  const kernels::Backend* backend = &kernels::DefaultBackend();
  if (!options.kernels.empty()) {
    backend = kernels::BackendByName(options.kernels);
    if (backend == nullptr) return absl::InvalidArgumentError(absl::StrCat("no kernels \"", options.kernels, "\" here"));
  }
  ModelOptions mo;
  mo.backend = backend;
  mo.kv_dtype = options.kv_dtype;
  VC_ASSIGN_OR_RETURN(w->model_, Model::Load(options.model_dir, mo));
  using Fingerprint = std::array<uint8_t, 32>;
  VC_ASSIGN_OR_RETURN(Fingerprint fingerprint, ModelFingerprint(options.model_dir));
  EngineOptions& eo = options.service.engine;
  const KvLayout layout = w->model_->kv_layout(eo.block_size);
  const int64_t block_bytes = layout.block_size * layout.bytes_per_token();
  eo.staging_blocks = options.staging_bytes / block_bytes;
  eo.prefix_cache_bytes = options.prefix_cache_bytes;
  eo.compressed_bytes = options.compressed_kv_bytes;
  options.service.full_kv_blocks = options.full_kv_bytes / block_bytes;
  options.service.fingerprint_hex = HexString(fingerprint);
  // 16-bit KV gives other outputs than float32 KV, as other kernels do: a router keeps workers of
  // one numerics together. Float32 KV keeps the kernels' own name (what workers reported before).
  options.service.numerics = backend->numerics();
  if (layout.dtype != DType::kF32) {
    absl::StrAppend(&options.service.numerics, "+kv-", absl::AsciiStrToLower(DTypeName(layout.dtype)));
  }
  if (eo.staging_blocks < 1) return absl::InvalidArgumentError("the staging memory holds no KV block");
  if (options.full_kv_bytes > 0 && options.service.full_kv_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the full-KV memory holds no KV block (", block_bytes, " bytes): MODE_FULL would be refused"));
  }
  VC_RETURN_IF_ERROR(CheckDrafting(eo, options, layout, w->model_->config().num_heads));
  w->tier_ = std::make_unique<HostKvTier>(layout, options.fetch_bytes_per_second, options.store_target.empty() ? 1 : 4,
                                          options.host_kv_bytes);
  if (!options.store_target.empty()) {
    if (options.block_tokens > w->model_->config().max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("a store block of ", options.block_tokens,
                                                     " tokens is longer than the model's context of ",
                                                     w->model_->config().max_position_embeddings));
    }
    StorePrefixOptions po;
    VC_ASSIGN_OR_RETURN(po.shards, ResolveTargets(options.store_target, options.dns_server, options.min_store_shards,
                                               absl::Milliseconds(options.store_shards_wait_ms)));
    w->store_shards_ = po.shards;
    po.replicas = options.store_replicas;
    po.store.token = options.store_token;
    po.store.tls_root_certs_pem = options.store_tls_root_certs_pem;
    po.store.timeout_ms = options.store_timeout_ms;
    po.ucx = options.ucx;
    po.block_tokens = options.block_tokens;
    po.numerics = backend->numerics();
    po.link = w->tier_->link();
    VC_ASSIGN_OR_RETURN(w->prefixes_, StorePrefixes::Create(po, fingerprint, layout));
  }
  VC_ASSIGN_OR_RETURN(std::optional<ChatFormat> chat, LoadChatFormat(options.model_dir, options.chat_template_file));
  if (chat.has_value()) options.service.chat = std::make_shared<const ChatFormat>(*std::move(chat));
  options.service.model_name = options.served_model_name;
  if (options.service.model_name.empty()) {
    absl::string_view dir = absl::StripSuffix(options.model_dir, "/");
    options.service.model_name = std::string(dir.substr(dir.rfind('/') + 1));
  }
  VC_ASSIGN_OR_RETURN(w->service_, WorkerService::Create(*w->model_, w->tier_.get(), w->prefixes_.get(), options.service));
  w->server_ = Listen(options.listen, options.credentials, {w->service_.get()}, kMaxInferenceMessageBytes,
                      options.keepalive_ms, &w->port_);
  if (w->server_ == nullptr || w->port_ == 0) return CannotListen(options.listen, options.credentials != nullptr);
  VC_ASSIGN_OR_RETURN(w->metrics_, StartMetrics<vericache::v1::WorkerStats>(
                                     options.metrics_listen, w->service_.get(), "vericache_worker"));
  if (!options.http_listen.empty()) {
    VC_ASSIGN_OR_RETURN(w->http_, StartHttp(options.http_listen, options.http_tls_cert_file,
                                            options.http_tls_key_file, *w->server_, [p = w.get()] {
                          std::lock_guard<std::mutex> l(p->health_mu_);
                          return !p->draining_ && p->live_;
                        }));
  }
  if (grpc::HealthCheckServiceInterface* health = w->server_->GetHealthCheckService()) {
    health->SetServingStatus(kLivenessService, true);
  }
  if (options.stall_grace_ms > 0) {
    const absl::Duration grace = absl::Milliseconds(options.stall_grace_ms);
    w->stall_watch_ = std::make_unique<Ticker>(WatchInterval(grace), [p = w.get(), grace] { p->WatchStalls(grace); });
  }
  return w;
}

void WorkerServer::WatchStalls(absl::Duration grace) {
  const absl::Duration stalled = service_->StalledFor();
  const bool live = stalled < grace;
  std::lock_guard<std::mutex> l(health_mu_);
  if (live == live_) return;
  live_ = live;
  if (live) {
    std::fprintf(stderr, "the scheduler makes progress again: live\n");
  } else {
    std::fprintf(stderr, "the scheduler has held requests for %.1f s with no step ending and no forward pass "
                 "finishing: not live (health entries \"%s\" and \"\" NOT_SERVING)\n",
                 absl::ToDoubleSeconds(stalled), kLivenessService);
  }
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(kLivenessService, live);
    health->SetServingStatus("", live && !draining_);
  }
}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(RouterServerOptions options) {
  RateLimitProtobufLog();
  std::unique_ptr<RouterServer> r(new RouterServer());
  VC_RETURN_IF_ERROR(CheckAddress("listen address", options.listen, true));
  options.service.worker_keepalive_ms = options.keepalive_ms;
  VC_ASSIGN_OR_RETURN(r->service_, RouterService::Create(options.service));
  r->stats_ = std::make_unique<RouterStatsService>(r->service_.get());
  r->server_ = Listen(options.listen, options.credentials, {r->service_.get(), r->stats_.get()},
                     kMaxInferenceMessageBytes, options.keepalive_ms, &r->port_);
  if (r->server_ == nullptr || r->port_ == 0) return CannotListen(options.listen, options.credentials != nullptr);
  r->service_->OnServingCount([p = r.get()](int n) { p->SetHealth(n, false); });
  VC_ASSIGN_OR_RETURN(r->metrics_, StartMetrics<vericache::v1::RouterStats>(
                                     options.metrics_listen, r->service_.get(), "vericache_router"));
  if (!options.http_listen.empty()) {
    VC_ASSIGN_OR_RETURN(r->http_, StartHttp(options.http_listen, options.http_tls_cert_file,
                                            options.http_tls_key_file, *r->server_, [p = r.get()] {
                          std::lock_guard<std::mutex> l(p->health_mu_);
                          return p->serving_workers_ > 0 && !p->draining_;
                        }));
  }
  return r;
}

void RouterServer::SetHealth(int serving_workers, bool draining) {
  std::lock_guard<std::mutex> l(health_mu_);
  if (serving_workers >= 0) serving_workers_ = serving_workers;
  draining_ = draining_ || draining;
  const int serving = serving_workers_ > 0 && !draining_ ? 1 : 0;
  if (serving == reported_) return;  // (every set is sent to every health watcher)
  reported_ = serving;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus("", serving == 1);
  }
}

void RouterServer::StopAdmitting() { SetHealth(-1, true); }

RouterServer::~RouterServer() {
  http_.reset();
  metrics_.reset();
  // No more health updates from the checking thread into a server that is going.
  if (service_ != nullptr) service_->OnServingCount([](int) {});
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  service_.reset();
}

void WorkerServer::StopAdmitting() {
  {
    std::lock_guard<std::mutex> l(health_mu_);
    draining_ = true;
    // The server's own entry only: SetServingStatus(false) would set "liveness" too, and a liveness
    // probe would restart the worker in the middle of its drain.
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus("", false);
    }
  }
  service_->StopAdmitting();
}

WorkerServer::~WorkerServer() {
  http_.reset();
  stall_watch_.reset();
  metrics_.reset();  // it reads the service
  // Calls still streaming end when the service goes (UNAVAILABLE) or within the grace period.
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  service_.reset();
}

}  // namespace vc
