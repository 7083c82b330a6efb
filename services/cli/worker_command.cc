#include "services/cli/worker_command.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "services/cli/args.h"
#include "services/servers.h"

namespace vc::cli {
namespace {

absl::Status Run(const Args& a, std::ostream& out) {
  // Before anything starts a thread (RocksDB, gRPC: credentials alone start gRPC's).
  const sigset_t sigs = BlockStopSignals();
  // Flags of the link to a store say nothing without one: given alone, the store was likely forgotten.
  for (const char* f : {"store-replicas", "store-token-file", "store-timeout-ms", "stored-compressed", "store-shards",
                        "store-tls-ca", "ucx", "block-tokens", "publish-outputs"}) {
    if (a.Has(f) && !a.Has("store")) return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --store"));
  }
  WorkerServerOptions o;
  o.model_dir = a.Str("model");
  VC_ASSIGN_OR_RETURN(o.kv_dtype, KvDType(a));
  o.listen = a.Str("listen");
  o.metrics_listen = a.Str("metrics-listen");
  o.http_listen = a.Str("http-listen");
  o.http_tls_cert_file = a.Str("tls-cert");  // HTTPS with the gRPC port's certificate (ServerTls checks both)
  o.http_tls_key_file = a.Str("tls-key");
  o.chat_template_file = a.Str("chat-template");
  o.served_model_name = a.Str("served-model-name");
  o.store_target = a.Str("store");
  bool from_dns = false;  // how many stores there are is known once the worker has looked them up
  if (a.Has("store")) {
    VC_ASSIGN_OR_RETURN(from_dns, CheckTargets(o.store_target, "--store"));
  }
  const int64_t replicas = a.Int("store-replicas");
  const int64_t stores = o.store_target.empty() ? 0 : 1 + std::count(o.store_target.begin(), o.store_target.end(), ',');
  if (replicas > 1 && replicas > stores && !from_dns) {
    return absl::InvalidArgumentError(absl::StrCat("--store-replicas ", replicas, " needs as many stores in --store; ",
                                                   stores, " given"));
  }
  o.store_replicas = static_cast<int>(replicas);
  const int64_t min_shards = a.Int("store-shards");
  if (min_shards > 0 && !from_dns) return absl::InvalidArgumentError("--store-shards counts srv: stores only");
  if (min_shards > 0 && replicas > min_shards) {
    return absl::InvalidArgumentError(absl::StrCat("--store-replicas ", replicas, " needs as many stores; --store-shards ",
                                                   min_shards, " expects fewer"));
  }
  o.min_store_shards = static_cast<int>(min_shards);
  if (a.Has("store-token-file")) {
    VC_ASSIGN_OR_RETURN(o.store_token, ReadBearerTokenFile(a.Str("store-token-file")));
  } else if (!o.store_target.empty()) {
    return absl::InvalidArgumentError("--store needs --store-token-file");
  }
  o.ucx = a.Str("ucx");
  if (o.ucx != "off") {
    VC_RETURN_IF_ERROR(cachestore::ParseUcxErrorMode(o.ucx).status());
  }
  const int64_t block_tokens = a.Int("block-tokens");
  if (block_tokens % EngineOptions{}.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--block-tokens ", block_tokens, " is not a multiple of ",
                                                   EngineOptions{}.block_size));
  }
  o.block_tokens = static_cast<int>(block_tokens);
  o.store_timeout_ms = a.Int("store-timeout-ms");
  VC_ASSIGN_OR_RETURN(o.keepalive_ms, KeepaliveMs(a));
  o.stall_grace_ms = a.Int("stall-grace-ms");
  o.host_kv_bytes = a.Int("host-kv-mib") << 20;
  o.compressed_kv_bytes = a.Int("compressed-kv-mib") << 20;
  o.service.client_write_timeout_ms = a.Int("client-write-timeout-ms");
  o.staging_bytes = a.Int("staging-mib") << 20;
  o.full_kv_bytes = a.Int("full-kv-mib") << 20;
  o.prefix_cache_bytes = a.Int("prefix-cache-mib") << 20;
  EngineOptions& eo = o.service.engine;
  eo.compressor = a.Str("compressor");
  eo.max_batch = static_cast<int>(a.Int("max-batch"));
  VC_ASSIGN_OR_RETURN(eo.draft_window, DraftWindow(a));
  eo.keep_staged = a.Int("keep-staged") != 0;
  eo.stored_compressed_prefixes = a.Int("stored-compressed") != 0;
  eo.publish_outputs = a.Int("publish-outputs") != 0;
  o.service.full_max_batch = eo.max_batch;
  const int64_t max_requests = a.Int("max-requests");
  o.service.max_requests = static_cast<int>(max_requests);
  VC_RETURN_IF_ERROR(a.CheckAtMost("max-requests-per-tenant", max_requests));
  o.service.max_requests_per_tenant = static_cast<int>(a.Int("max-requests-per-tenant"));
  o.service.max_batch_per_tenant = static_cast<int>(a.Int("max-batch-per-tenant"));
  if (a.Has("client-tokens")) {
    VC_ASSIGN_OR_RETURN(o.service.client_tokens, ReadClientTokens(a.Str("client-tokens")));
  }
  const int64_t drain_seconds = a.Int("drain-seconds");
  VC_ASSIGN_OR_RETURN(o.credentials, ServerTls(a));
  if (a.Has("store-tls-ca")) {
    VC_ASSIGN_OR_RETURN(o.store_tls_root_certs_pem, ReadPemFile(a.Str("store-tls-ca"), "store TLS root certificates", "CERTIFICATE"));
  }
  VC_ASSIGN_OR_RETURN(std::unique_ptr<WorkerServer> w, WorkerServer::Start(o));
  out << "vericache worker listening on " << ListeningOn(o.listen, w->port()) << " (model " << o.model_dir
      << ", kernels "
      << w->model().backend().name() << ", compressor " << eo.compressor << ", store " << (o.store_target.empty() ? "none" : absl::StrJoin(w->store_shards(), ","))
      << (o.store_replicas > 1 ? absl::StrCat(" (", o.store_replicas, " replicas)") : "")
      << (o.store_tls_root_certs_pem.empty() ? "" : " over TLS") << ", UCX " << o.ucx
      << (o.credentials != nullptr ? ", clients over TLS" : "") << ")" << std::endl;
  if (w->metrics_port() != 0) {
    out << "metrics at http://" << o.metrics_listen << "/metrics (port " << w->metrics_port() << ")" << std::endl;
  }
  if (w->http_port() != 0) {
    out << "OpenAI API at " << (o.http_tls_cert_file.empty() ? "http" : "https") << "://" << o.http_listen << "/v1 (port " << w->http_port() << ")" << std::endl;
  }
  // Whether every request ended by the deadline, watched while Shutdown tells clients to go
  // elsewhere and waits (after it, no request is left either way: the deadline cancels them).
  std::atomic<bool> drained{false};
  WaitAndDrain(sigs, drain_seconds, out, [&] { w->StopAdmitting(); }, [&](absl::Time t) {
    std::thread watch([&] { drained = w->WaitIdle(t - absl::Now()); });
    w->Shutdown(t);
    watch.join();
  });
  out << (drained ? "drained: shutting down" : "shutting down with requests cancelled") << std::endl;
  // Blocks the last requests published (their prompts and outputs, for the next turn) are still
  // being put: they are given a little longer (deploy/k8s leaves 15 s of its grace period).
  if (w->prefixes() != nullptr && !w->prefixes()->Flush(absl::Seconds(10))) {
    out << "blocks still being put to the store after 10 s were dropped" << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace

const FlagSet& WorkerFlags() {
  static const FlagSet* const flags = new FlagSet{
      "worker",
      "",
      "Runs an inference worker until SIGINT or SIGTERM: serves the Inference API for a checkpoint, drafting "
      "tokens from a compressed KV cache and verifying them with the full KV, which it reads from a cache store "
      "where one holds the prompt's prefix.",
      {
          Flag::Str("model", "", "the checkpoint's directory").Value("DIR").Required(),
          Flag::Str("listen", "", "the address to serve on").Value("HOST:PORT").Required(),
          Flag::Str("store", "",
                    "the cache store: prompts' prefixes are looked up there, their full KV read over UCX while the "
                    "worker drafts, and prefixes it lacked published. Several, comma-separated: blocks are spread "
                    "over them by their names (every worker must list the same stores, in any order). srv:NAME "
                    "stands for the targets of NAME's DNS SRV records, looked up at start (a headless Service: "
                    "srv:_grpc._tcp.vericache-store)")
              .Value("HOST:PORT|srv:NAME[,...]")
              .ShownDefault("none"),
          Flag::Str("store-token-file", "", "the bearer token the worker presents to the store (one line); "
                                            "needed with --store")
              .Value("FILE"),
          Flag::Int("store-replicas", 1, 1, 64,
                    "stores holding each block: with N, a block is found while any N - 1 of its stores are down, "
                    "for N times the puts and store space"),
          Flag::Int("store-shards", 0, 0, 4096,
                    "with srv:, how many stores DNS must list: the lookup is retried every second for up to 2 "
                    "minutes until it does; 0: what it lists"),
          Flag::Str("ucx", "none", "one-sided reads with UCX error handling 'none' (shared memory, CMA) or 'peer' "
                                   "(TCP only on one host); 'off': blocks inline over gRPC")
              .Value("none|peer|off"),
          Flag::Int("block-tokens", 256, 16, 1 << 16, "tokens per store block, a multiple of 16"),
          KvDTypeFlag(),
          Flag::Str("compressor", WorkerServerOptions{}.service.engine.compressor,
                    "the compressed KV that sequences draft from (see vericache generate --help); with --store, "
                    "not snapkv (it chooses by the prompt's queries, which stored blocks do not carry)")
              .Value("SPEC"),
          Flag::Int("max-batch", 16, 1, 4096, "sequences drafting and verifying together"),
          Flag::Int("staging-mib", 512, 1, 1 << 20, "worker memory for full KV staged for verification")
              .Value("MIB"),
          Flag::Int("full-kv-mib", 256, 0, 1 << 20, "worker memory for MODE_FULL requests' KV; 0 refuses them")
              .Value("MIB"),
          Flag::Int("prefix-cache-mib", 256, 0, 1 << 20, "compressed prefixes kept for reuse").Value("MIB"),
          Flag::Int("host-kv-mib", 1024, 1, 1 << 20,
                    "host memory for the full KV of VeriCache sequences, each reserving its prompt and max_tokens; "
                    "a request waits while it is taken")
              .Value("MIB"),
          Flag::Int("compressed-kv-mib", 512, 1, 1 << 20,
                    "memory for the compressed KV that VeriCache sequences draft from, each reserving the most its "
                    "compressor can hold for its prompt and max_tokens; a request waits while it is taken")
              .Value("MIB"),
          Flag::Int("max-requests", 256, 1, 1 << 20, "requests queued or in flight; more are refused"),
          Flag::Int("max-requests-per-tenant", 0, 0, 1 << 20,
                    "the same for one tenant's requests, at most --max-requests; 0: no limit of its own"),
          Flag::Int("max-batch-per-tenant", -1, -1, 1 << 20,
                    "sequences of one tenant in the batch, so that one tenant's long requests leave room for "
                    "another's; -1: the batch less an eighth of it when --client-tokens names several tenants; "
                    "0: no cap")
              .ShownDefault("-1: auto"),
          ClientWriteTimeoutFlag(),
          Flag::Str("client-tokens", "", "bearer tokens accepted from clients, lines of 'token [tenant]': a "
                                         "tenant's prefixes are found by its own requests only")
              .Value("FILE")
              .ShownDefault("no auth"),
          Flag::Int("store-timeout-ms", 2000, 1, 600000,
                    "the deadline of each gRPC call to a store; a prefix whose lookup or read fails is computed by "
                    "the worker instead"),
          DraftWindowFlag(),
          Flag::Int("keep-staged", 1, 0, 1,
                    "keep a sequence's full KV staged between verify passes while no other sequence needs the "
                    "room; 0 fetches it for every verify")
              .Value("0|1"),
          Flag::Int("stored-compressed", 0, 0, 1,
                    "also publish prefixes' compressed (KIVI) variants, and draft from the store's variant of a "
                    "prefix this worker has no compressed copy of (needs a kivi compressor alone whose group "
                    "divides --block-tokens)")
              .Value("0|1"),
          Flag::Int("publish-outputs", 1, 0, 1,
                    "when a request ends, also publish the blocks its output completed, so that a next turn "
                    "extending it finds them")
              .Value("0|1"),
          MetricsListenFlag("GetStats' counts, every tenant's"),
          HttpListenFlag(),
          Flag::Str("chat-template", "",
                    "the Jinja chat template chat requests are rendered with; default: the checkpoint's "
                    "chat_template.jinja or tokenizer_config.json's chat_template")
              .Value("FILE")
              .ShownDefault("the checkpoint's"),
          Flag::Str("served-model-name", "", "the model's name for clients (the HTTP API's `model`)")
              .ShownDefault("the checkpoint folder's name"),
          DrainSecondsFlag(),
          TlsCertFlag(),
          TlsKeyFlag(),
          Flag::Str("store-tls-ca", "", "the store serves TLS: its root certificates (PEM); the UCX data plane is "
                                        "not encrypted")
              .Value("PEM"),
          KeepaliveFlag("a client (a router) with calls in flight that has been silent for N ms is pinged, and its "
                        "calls are cancelled, freeing their batch slots, when it does not answer within N ms more; "
                        "0: gRPC's two hours"),
          Flag::Int("stall-grace-ms", WorkerServerOptions{}.stall_grace_ms, 0, int64_t{24} * 3600 * 1000,
                    "once the scheduler has held requests for N ms with no engine step ending and no forward pass "
                    "finishing (a step that does not return; a long prefill's passes count as progress), the gRPC "
                    "health entries \"liveness\" and \"\" say NOT_SERVING, for a liveness probe to restart the "
                    "worker; 0: never"),
      }};
  return *flags;
}

int RunWorkerCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(WorkerFlags(), args, out, err, Run);
}

}  // namespace vc::cli
