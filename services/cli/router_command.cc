#include "services/cli/router_command.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/cli/args.h"
#include "services/servers.h"

namespace vc::cli {
namespace {

constexpr char kUsage[] =
    "usage: vericache router --listen HOST:PORT --workers HOST:PORT|srv:NAME[,...]\n"
    "                        [--policy prefix|least-loaded|round-robin] [--balance-slack N]\n"
    "                        [--affinity-blocks N] [--block-tokens N] [--text-block-bytes N]\n"
    "                        [--health-interval-ms N] [--refresh-seconds N] [--worker-timeout-ms N]\n"
    "                        [--client-write-timeout-ms N] [--keepalive-ms N]\n"
    "                        [--model-fingerprint HEX] [--worker-token-file FILE] [--worker-tls-ca PEM]\n"
    "                        [--tls-cert PEM --tls-key PEM]\n"
    "                        [--metrics-listen HOST:PORT] [--drain-seconds N] [--unready-seconds N]\n"
    "  One Inference endpoint for clients in front of several workers: each Generate call goes to\n"
    "  one worker, and is moved to another if the worker refuses it before sending a token.\n"
    "  --workers LIST          the workers; srv:NAME stands for the targets of NAME's DNS SRV records\n"
    "                          (a headless Service: srv:_grpc._tcp.vericache-worker), looked up again\n"
    "                          every --refresh-seconds (default 10). At most 64 workers\n"
    "  --policy P              'prefix' (default): the worker that served the longest leading part of\n"
    "                          the prompt, when it is at least half the prompt's blocks, or else the\n"
    "                          least busy one; 'least-loaded'; 'round-robin'\n"
    "  --balance-slack N       a worker with N more calls in flight than the least busy is passed over\n"
    "                          (default 4)\n"
    "  --affinity-blocks N     prompt blocks remembered, about 40 bytes each (default 1048576)\n"
    "  --block-tokens N        token-id prompts are hashed in blocks of the workers' store block, or\n"
    "                          of N tokens when they have no store (default 256)\n"
    "  --text-block-bytes N    text prompts are hashed in blocks of N bytes (default 1024)\n"
    "  --health-interval-ms N  how often each worker's health is checked (default 1000): a draining\n"
    "                          worker gets no new calls, nor one serving another model than the first\n"
    "  --worker-timeout-ms N   deadline of health checks and model queries (default 2000)\n"
    "  --client-write-timeout-ms N  a client that takes no streamed tokens for this long has its\n"
    "                          call cancelled, and the worker's with it (default 60000)\n"
    "  --keepalive-ms N        a worker or client with calls in flight that has been silent for N ms\n"
    "                          is pinged, and its calls are ended when it does not answer within N ms\n"
    "                          more: a worker's with UNAVAILABLE, so a worker whose host vanished does\n"
    "                          not hold its clients' calls (default 20000; 0: gRPC's defaults, two\n"
    "                          hours for clients, never for workers)\n"
    "  --model-fingerprint HEX the checkpoint the workers must serve (GetModelInfo's fingerprint_hex);\n"
    "                          by default the one most workers serve when the router first reaches any,\n"
    "                          and after a rollout the one most serve once none has served it for 30 s\n"
    "  --worker-token-file FILE  the bearer token the router's own model queries present to workers\n"
    "                          that take client tokens (one line; any tenant's)\n"
    "  --worker-tls-ca PEM     the workers serve TLS: their root certificates\n"
    "  --tls-cert, --tls-key   serve clients over TLS with this certificate and key (PEM)\n"
    "  --metrics-listen HOST:PORT  serve Prometheus metrics (GetRouterStats' counts) at\n"
    "                          http://HOST:PORT/metrics, plain HTTP without authentication\n"
    "  --drain-seconds N       on SIGTERM or SIGINT, report NOT_SERVING and let calls in flight finish\n"
    "                          for up to N seconds (default 30; a second signal stops at once)\n"
    "  --unready-seconds N     of those, the first N (default 0) go on serving new calls too, with\n"
    "                          NOT_SERVING reported, so that load balancers (a Service's endpoints)\n"
    "                          stop sending before the port closes: the time they take to see a\n"
    "                          pod being deleted (less than --drain-seconds)\n"
    "  The router's health is SERVING while some worker serves and it is not draining.\n"
    "  Clients' authorization metadata goes to the workers, which authenticate them. GetStats sums\n"
    "  the serving workers' stats; GetRouterStats (vericache stats --router) gives the router's.\n";

absl::Status Run(const std::vector<std::string>& argv, std::ostream& out) {
  const sigset_t sigs = BlockStopSignals();  // before gRPC starts a thread
  VC_ASSIGN_OR_RETURN(
      Args a, Args::Parse(argv,
                          {"listen", "workers", "policy", "balance-slack", "affinity-blocks", "block-tokens",
                           "text-block-bytes", "health-interval-ms", "refresh-seconds", "worker-timeout-ms",
                           "client-write-timeout-ms", "keepalive-ms", "worker-tls-ca", "model-fingerprint",
                           "worker-token-file", "tls-cert", "tls-key", "metrics-listen", "drain-seconds",
                           "unready-seconds"},
                          {}));
  for (const char* req : {"listen", "workers"}) {
    if (!a.Has(req)) return absl::InvalidArgumentError(absl::StrCat("--", req, " is required"));
  }
  RouterServerOptions o;
  o.listen = a.Str("listen");
  o.metrics_listen = a.Str("metrics-listen", "");
  RouterServiceOptions& s = o.service;
  s.workers = a.Str("workers");
  s.policy = a.Str("policy", s.policy);
  VC_ASSIGN_OR_RETURN(const int64_t slack, a.Int("balance-slack", 4, 1, 1 << 20));
  s.balance_slack = static_cast<int>(slack);
  VC_ASSIGN_OR_RETURN(s.affinity_blocks, a.Int("affinity-blocks", int64_t{1} << 20, 2, int64_t{1} << 32));
  VC_ASSIGN_OR_RETURN(const int64_t block_tokens, a.Int("block-tokens", 256, 1, 1 << 20));
  s.ids_block_tokens = static_cast<int>(block_tokens);
  VC_ASSIGN_OR_RETURN(const int64_t text_block, a.Int("text-block-bytes", 1024, 1, 1 << 24));
  s.text_block_bytes = static_cast<int>(text_block);
  VC_ASSIGN_OR_RETURN(s.health_interval_ms, a.Int("health-interval-ms", 1000, 10, 3600000));
  VC_ASSIGN_OR_RETURN(const int64_t refresh, a.Int("refresh-seconds", 10, 1, 86400));
  s.refresh_interval_ms = refresh * 1000;
  if (a.Has("refresh-seconds") && s.workers.find("srv:") == std::string::npos) {
    return absl::InvalidArgumentError("--refresh-seconds looks srv: workers up again, and --workers names none");
  }
  VC_ASSIGN_OR_RETURN(s.worker_timeout_ms, a.Int("worker-timeout-ms", 2000, 1, 600000));
  VC_ASSIGN_OR_RETURN(s.client_write_timeout_ms, a.Int("client-write-timeout-ms", 60000, 1, 86400000));
  VC_ASSIGN_OR_RETURN(o.keepalive_ms, KeepaliveMs(a));
  s.model_fingerprint_hex = a.Str("model-fingerprint", "");
  if (!s.model_fingerprint_hex.empty() &&
      (s.model_fingerprint_hex.size() != 64 ||
       s.model_fingerprint_hex.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return absl::InvalidArgumentError("--model-fingerprint is not 64 lowercase hex digits (a SHA-256)");
  }
  if (a.Has("worker-token-file")) {
    VC_ASSIGN_OR_RETURN(s.worker_token, ReadBearerTokenFile(a.Str("worker-token-file")));
  }
  if (a.Has("worker-tls-ca")) {
    VC_ASSIGN_OR_RETURN(s.worker_tls_root_certs_pem, ReadPemFile(a.Str("worker-tls-ca"), "worker TLS root certificates", "CERTIFICATE"));
  }
  VC_ASSIGN_OR_RETURN(o.credentials, ServerTls(a));
  VC_ASSIGN_OR_RETURN(const int64_t drain_seconds, a.Int("drain-seconds", 30, 0, 86400));
  VC_ASSIGN_OR_RETURN(const int64_t unready_seconds, a.Int("unready-seconds", 0, 0, 86400));
  // (Calls taken in the unready window need drain time after it.)
  if (unready_seconds > 0 && unready_seconds >= drain_seconds) {
    return absl::InvalidArgumentError(absl::StrCat("--unready-seconds ", unready_seconds,
                                                   " leaves no time of --drain-seconds ", drain_seconds));
  }
  VC_ASSIGN_OR_RETURN(std::unique_ptr<RouterServer> r, RouterServer::Start(o));
  out << "vericache router listening on " << ListeningOn(o.listen, r->port()) << " (workers " << s.workers
      << ", policy " << s.policy
      << (s.worker_tls_root_certs_pem.empty() ? "" : ", workers over TLS")
      << (o.credentials != nullptr ? ", clients over TLS" : "") << ")" << std::endl;
  if (r->metrics_port() != 0) {
    out << "metrics at http://" << o.metrics_listen << "/metrics (port " << r->metrics_port() << ")" << std::endl;
  }
  WaitAndDrain(sigs, drain_seconds, out, [&] { r->StopAdmitting(); }, [&](absl::Time t) {
    if (unready_seconds > 0) {
      out << "serving on, unready, for " << unready_seconds << " s" << std::endl;
      absl::SleepFor(absl::Seconds(unready_seconds));
    }
    r->Shutdown(t);
  });
  out << "shutting down" << std::endl;
  return absl::OkStatus();
}

}  // namespace

int RunRouterCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand("router", kUsage, args, out, err, Run);
}

}  // namespace vc::cli
