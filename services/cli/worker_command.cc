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

constexpr char kUsage[] =
    "usage: vericache worker --model DIR --listen HOST:PORT [--store HOST:PORT|srv:NAME[,...]\n"
    "                        --store-token-file FILE] [--store-replicas N] [--store-shards N]\n"
    "                        [--ucx none|peer|off] [--block-tokens N] [--compressor SPEC] [--max-batch N]\n"
    "                        [--staging-mib N] [--full-kv-mib N] [--prefix-cache-mib N] [--host-kv-mib N]\n"
    "                        [--compressed-kv-mib N]\n"
    "                        [--max-requests N] [--max-requests-per-tenant N] [--client-write-timeout-ms N]\n"
    "                        [--client-tokens FILE] [--store-timeout-ms N] [--draft-window K|auto]\n"
    "                        [--keep-staged 0|1] [--stored-compressed 0|1] [--publish-outputs 0|1]\n"
    "                        [--metrics-listen HOST:PORT] [--drain-seconds N] [--tls-cert PEM --tls-key PEM]\n"
    "                        [--store-tls-ca PEM] [--keepalive-ms N] [--stall-grace-ms N]\n"
    "  --store HOST:PORT       the cache store: prompts' prefixes are looked up there, their full KV\n"
    "                          read over UCX while the worker drafts, and prefixes it lacked published.\n"
    "                          Several, comma-separated: blocks are spread over them by their names\n"
    "                          (every worker must list the same stores, in any order). srv:NAME\n"
    "                          stands for the targets of NAME's DNS SRV records, looked up at start\n"
    "                          (a headless Service: srv:_grpc._tcp.vericache-store)\n"
    "  --store-shards N        with srv:, how many stores DNS must list: the lookup is retried every\n"
    "                          second for up to 2 minutes until it does (default 0: what it lists)\n"
    "  --store-replicas N      stores holding each block (default 1): with N, a block is found while\n"
    "                          any N - 1 of its stores are down, for N times the puts and store space\n"
    "  --store-token-file FILE the bearer token the worker presents to the store (one line)\n"
    "  --ucx MODE              one-sided reads with UCX error handling 'none' (shared memory, CMA; the\n"
    "                          default) or 'peer' (TCP only on one host); 'off': blocks inline over gRPC\n"
    "  --block-tokens N        tokens per store block (default 256, a multiple of 16)\n"
    "  --staging-mib N         worker memory for full KV staged for verification (default 512)\n"
    "  --full-kv-mib N         worker memory for MODE_FULL requests' KV (default 256; 0 refuses them)\n"
    "  --prefix-cache-mib N    compressed prefixes kept for reuse (default 256)\n"
    "  --host-kv-mib N         host memory for the full KV of VeriCache sequences, each reserving its\n"
    "                          prompt and max_tokens (default 1024); a request waits while it is taken\n"
    "  --compressed-kv-mib N   memory for the compressed KV that VeriCache sequences draft from, each\n"
    "                          reserving the most its compressor can hold for its prompt and\n"
    "                          max_tokens (default 512); a request waits while it is taken\n"
    "  --max-requests N        requests queued or in flight; more are refused (default 256)\n"
    "  --max-requests-per-tenant N  the same for one tenant's requests (default 0: no limit of its own)\n"
    "  --client-tokens FILE    bearer tokens accepted from clients, lines of 'token [tenant]' (default:\n"
    "                          no auth): a tenant's prefixes are found by its own requests only\n"
    "  --client-write-timeout-ms N  a client that takes no streamed tokens for this long has its\n"
    "                          call cancelled (default 60000)\n"
    "  --keepalive-ms N        a client (a router) with calls in flight that has been silent for N ms\n"
    "                          is pinged, and its calls are cancelled, freeing their batch slots, when\n"
    "                          it does not answer within N ms more (default 20000; 0: gRPC's two hours)\n"
    "  --stall-grace-ms N      once the scheduler has held requests for N ms with no engine step ending\n"
    "                          and no forward pass finishing (a step that does not return; a long\n"
    "                          prefill's passes count as progress), the gRPC health entries \"liveness\"\n"
    "                          and \"\" say NOT_SERVING, for a liveness probe to restart the worker\n"
    "                          (default 60000; 0: never)\n"
    "  --store-timeout-ms N    the deadline of each gRPC call to a store (default 2000); a prefix\n"
    "                          whose lookup or read fails is computed by the worker instead\n"
    "  --compressor SPEC       the compressed KV that sequences draft from (default\n"
    "                          kivi:bits=4,group=32,residual=32; see vericache generate --help); with\n"
    "                          --store, not snapkv (it chooses by the prompt's queries, which stored\n"
    "                          blocks do not carry)\n"
    "  --max-batch N           sequences drafting and verifying together (default 16)\n"
    "  --draft-window K|auto   tokens drafted per verify pass: a fixed K in 1..64, at most what the\n"
    "                          compressor rolls back, or auto (the default; 0 says the same), chosen per\n"
    "                          sequence from its acceptance and measured costs\n"
    "  --keep-staged 0|1       keep a sequence's full KV staged between verify passes while no other\n"
    "                          sequence needs the room (default 1); 0 fetches it for every verify\n"
    "  --stored-compressed 0|1 also publish prefixes' compressed (KIVI) variants, and draft from the\n"
    "                          store's variant of a prefix this worker has no compressed copy of\n"
    "                          (default 0; needs a kivi compressor alone whose group divides --block-tokens)\n"
    "  --publish-outputs 0|1   when a request ends, also publish the blocks its output completed, so\n"
    "                          that a next turn extending it finds them (default 1)\n"
    "  --metrics-listen HOST:PORT  serve Prometheus metrics (GetStats' counts, every tenant's) at\n"
    "                          http://HOST:PORT/metrics, plain HTTP without authentication (default: none)\n"
    "  --tls-cert, --tls-key  serve clients over TLS with this certificate and key (PEM)\n"
    "  --store-tls-ca PEM      the store serves TLS: its root certificates (PEM); the UCX data plane\n"
    "                          is not encrypted\n"
    "  --drain-seconds N       on SIGTERM or SIGINT, report NOT_SERVING, refuse new requests, and let\n"
    "                          those admitted finish for up to N seconds before stopping (default 30;\n"
    "                          a second signal stops at once)\n";

absl::Status Run(const std::vector<std::string>& argv, std::ostream& out) {
  // Before anything starts a thread (RocksDB, gRPC: credentials alone start gRPC's).
  const sigset_t sigs = BlockStopSignals();
  VC_ASSIGN_OR_RETURN(
      Args a, Args::Parse(argv,
                          {"model", "listen", "store", "store-replicas", "store-token-file", "ucx", "block-tokens",
                           "compressor", "max-batch", "staging-mib", "full-kv-mib", "prefix-cache-mib", "host-kv-mib",
                           "compressed-kv-mib",
                           "client-write-timeout-ms", "max-requests", "max-requests-per-tenant", "client-tokens",
                           "store-timeout-ms", "draft-window", "keep-staged", "stored-compressed", "publish-outputs",
                           "metrics-listen",
                           "store-shards", "drain-seconds", "tls-cert", "tls-key", "store-tls-ca", "keepalive-ms", "stall-grace-ms"},
                          {}));
  // Flags of the link to a store say nothing without one: given alone, the store was likely forgotten.
  for (const char* f : {"store-replicas", "store-token-file", "store-timeout-ms", "stored-compressed", "store-shards",
                        "store-tls-ca", "ucx", "block-tokens", "publish-outputs"}) {
    if (a.Has(f) && !a.Has("store")) return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --store"));
  }
  for (const char* req : {"model", "listen"}) {
    if (!a.Has(req)) return absl::InvalidArgumentError(absl::StrCat("--", req, " is required"));
  }
  WorkerServerOptions o;
  o.model_dir = a.Str("model");
  o.listen = a.Str("listen");
  o.metrics_listen = a.Str("metrics-listen", "");
  o.store_target = a.Str("store");
  bool from_dns = false;  // how many stores there are is known once the worker has looked them up
  if (a.Has("store")) {
    VC_ASSIGN_OR_RETURN(from_dns, CheckTargets(o.store_target, "--store"));
  }
  VC_ASSIGN_OR_RETURN(const int64_t replicas, a.Int("store-replicas", 1, 1, 64));
  const int64_t stores = o.store_target.empty() ? 0 : 1 + std::count(o.store_target.begin(), o.store_target.end(), ',');
  if (replicas > 1 && replicas > stores && !from_dns) {
    return absl::InvalidArgumentError(absl::StrCat("--store-replicas ", replicas, " needs as many stores in --store; ",
                                                   stores, " given"));
  }
  o.store_replicas = static_cast<int>(replicas);
  VC_ASSIGN_OR_RETURN(const int64_t min_shards, a.Int("store-shards", 0, 0, 4096));
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
  o.ucx = a.Str("ucx", "none");
  if (o.ucx != "off") {
    VC_RETURN_IF_ERROR(cachestore::ParseUcxErrorMode(o.ucx).status());
  }
  VC_ASSIGN_OR_RETURN(int64_t block_tokens, a.Int("block-tokens", 256, 16, 1 << 16));
  if (block_tokens % EngineOptions{}.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--block-tokens ", block_tokens, " is not a multiple of ",
                                                   EngineOptions{}.block_size));
  }
  o.block_tokens = static_cast<int>(block_tokens);
  VC_ASSIGN_OR_RETURN(o.store_timeout_ms, a.Int("store-timeout-ms", 2000, 1, 600000));
  VC_ASSIGN_OR_RETURN(o.keepalive_ms, KeepaliveMs(a));
  VC_ASSIGN_OR_RETURN(o.stall_grace_ms, a.Int("stall-grace-ms", o.stall_grace_ms, 0, int64_t{24} * 3600 * 1000));
  VC_ASSIGN_OR_RETURN(int64_t staging, a.Int("staging-mib", 512, 1, 1 << 20));
  VC_ASSIGN_OR_RETURN(int64_t full, a.Int("full-kv-mib", 256, 0, 1 << 20));
  VC_ASSIGN_OR_RETURN(int64_t prefix, a.Int("prefix-cache-mib", 256, 0, 1 << 20));
  VC_ASSIGN_OR_RETURN(int64_t host, a.Int("host-kv-mib", 1024, 1, 1 << 20));
  o.host_kv_bytes = host << 20;
  VC_ASSIGN_OR_RETURN(int64_t compressed, a.Int("compressed-kv-mib", 512, 1, 1 << 20));
  o.compressed_kv_bytes = compressed << 20;
  VC_ASSIGN_OR_RETURN(o.service.client_write_timeout_ms, a.Int("client-write-timeout-ms", 60000, 1, 86400000));
  o.staging_bytes = staging << 20;
  o.full_kv_bytes = full << 20;
  o.prefix_cache_bytes = prefix << 20;
  EngineOptions& eo = o.service.engine;
  eo.compressor = a.Str("compressor", eo.compressor);
  VC_ASSIGN_OR_RETURN(int64_t batch, a.Int("max-batch", 16, 1, 4096));
  eo.max_batch = static_cast<int>(batch);
  VC_ASSIGN_OR_RETURN(eo.draft_window, DraftWindow(a));
  VC_ASSIGN_OR_RETURN(int64_t keep, a.Int("keep-staged", 1, 0, 1));
  eo.keep_staged = keep != 0;
  VC_ASSIGN_OR_RETURN(int64_t stored_compressed, a.Int("stored-compressed", 0, 0, 1));
  eo.stored_compressed_prefixes = stored_compressed != 0;
  VC_ASSIGN_OR_RETURN(int64_t publish_outputs, a.Int("publish-outputs", 1, 0, 1));
  eo.publish_outputs = publish_outputs != 0;
  o.service.full_max_batch = eo.max_batch;
  VC_ASSIGN_OR_RETURN(int64_t max_requests, a.Int("max-requests", 256, 1, 1 << 20));
  o.service.max_requests = static_cast<int>(max_requests);
  VC_ASSIGN_OR_RETURN(int64_t per_tenant, a.Int("max-requests-per-tenant", 0, 0, max_requests));
  o.service.max_requests_per_tenant = static_cast<int>(per_tenant);
  if (a.Has("client-tokens")) {
    VC_ASSIGN_OR_RETURN(o.service.client_tokens, ReadClientTokens(a.Str("client-tokens")));
  }
  VC_ASSIGN_OR_RETURN(const int64_t drain_seconds, a.Int("drain-seconds", 30, 0, 86400));
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

int RunWorkerCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand("worker", kUsage, args, out, err, Run);
}

}  // namespace vc::cli
