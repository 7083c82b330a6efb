#include "services/cli/router_command.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/cli/args.h"
#include "services/servers.h"

namespace vc::cli {
namespace {

absl::Status Run(const Args& a, std::ostream& out) {
  const sigset_t sigs = BlockStopSignals();  // before gRPC starts a thread
  RouterServerOptions o;
  o.listen = a.Str("listen");
  o.metrics_listen = a.Str("metrics-listen");
  o.http_listen = a.Str("http-listen");
  o.http_tls_cert_file = a.Str("tls-cert");  // HTTPS with the gRPC port's certificate (ServerTls checks both)
  o.http_tls_key_file = a.Str("tls-key");
  RouterServiceOptions& s = o.service;
  s.workers = a.Str("workers");
  s.policy = a.Str("policy");
  s.balance_slack = static_cast<int>(a.Int("balance-slack"));
  s.affinity_blocks = a.Int("affinity-blocks");
  s.ids_block_tokens = static_cast<int>(a.Int("block-tokens"));
  s.text_block_bytes = static_cast<int>(a.Int("text-block-bytes"));
  s.health_interval_ms = a.Int("health-interval-ms");
  s.refresh_interval_ms = a.Int("refresh-seconds") * 1000;
  if (a.Has("refresh-seconds") && s.workers.find("srv:") == std::string::npos) {
    return absl::InvalidArgumentError("--refresh-seconds looks srv: workers up again, and --workers names none");
  }
  s.worker_timeout_ms = a.Int("worker-timeout-ms");
  s.client_write_timeout_ms = a.Int("client-write-timeout-ms");
  VC_ASSIGN_OR_RETURN(o.keepalive_ms, KeepaliveMs(a));
  s.model_fingerprint_hex = a.Str("model-fingerprint");
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
  const int64_t drain_seconds = a.Int("drain-seconds");
  const int64_t unready_seconds = a.Int("unready-seconds");
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
  if (r->http_port() != 0) {
    out << "OpenAI API at " << (o.http_tls_cert_file.empty() ? "http" : "https") << "://" << o.http_listen << "/v1 (port " << r->http_port() << ")" << std::endl;
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

const FlagSet& RouterFlags() {
  static const FlagSet* const flags = new FlagSet{
      "router",
      "",
      "One Inference endpoint for clients in front of several workers: each Generate call goes to one worker, and "
      "is moved to another if the worker refuses it before sending a token. The router's health is SERVING while "
      "some worker serves and it is not draining. Clients' authorization metadata goes to the workers, which "
      "authenticate them. GetStats sums the serving workers' stats; GetRouterStats (vericache stats --router) "
      "gives the router's.",
      {
          Flag::Str("listen", "", "the address to serve on").Value("HOST:PORT").Required(),
          Flag::Str("workers", "",
                    "the workers, comma-separated, at most 64; srv:NAME stands for the targets of NAME's DNS SRV "
                    "records (a headless Service: srv:_grpc._tcp.vericache-worker), looked up again every "
                    "--refresh-seconds")
              .Value("HOST:PORT|srv:NAME[,...]")
              .Required(),
          Flag::Str("policy", RouterServiceOptions{}.policy,
                    "'prefix': the worker that served the longest leading part of the prompt, when it is at least "
                    "half the prompt's blocks, or else the least busy one; 'least-loaded'; 'round-robin'")
              .Value("prefix|least-loaded|round-robin"),
          Flag::Int("balance-slack", 4, 1, 1 << 20,
                    "a worker with N more calls in flight than the least busy is passed over"),
          Flag::Int("affinity-blocks", int64_t{1} << 20, 2, int64_t{1} << 32,
                    "prompt blocks remembered, about 40 bytes each"),
          Flag::Int("block-tokens", 256, 1, 1 << 20,
                    "token-id prompts are hashed in blocks of the workers' store block, or of N tokens when they "
                    "have no store"),
          Flag::Int("text-block-bytes", 1024, 1, 1 << 24, "text prompts are hashed in blocks of N bytes"),
          Flag::Int("health-interval-ms", 1000, 10, 3600000,
                    "how often each worker's health is checked: a draining worker gets no new calls, nor one "
                    "serving another model than the first"),
          Flag::Int("refresh-seconds", 10, 1, 86400, "how often srv: workers are looked up again"),
          Flag::Int("worker-timeout-ms", 2000, 1, 600000, "deadline of health checks and model queries"),
          ClientWriteTimeoutFlag(),
          KeepaliveFlag("a worker or client with calls in flight that has been silent for N ms is pinged, and its "
                        "calls are ended when it does not answer within N ms more: a worker's with UNAVAILABLE, so "
                        "a worker whose host vanished does not hold its clients' calls; 0: gRPC's defaults, two "
                        "hours for clients, never for workers"),
          Flag::Str("model-fingerprint", "",
                    "the checkpoint the workers must serve (GetModelInfo's fingerprint_hex, 64 lowercase hex "
                    "digits); by default the one most workers serve when the router first reaches any, and after "
                    "a rollout the one most serve once none has served it for 30 s")
              .Value("HEX"),
          Flag::Str("worker-token-file", "",
                    "the bearer token the router's own model queries present to workers that take client tokens "
                    "(one line; any tenant's)")
              .Value("FILE"),
          Flag::Str("worker-tls-ca", "", "the workers serve TLS: their root certificates").Value("PEM"),
          TlsCertFlag(),
          TlsKeyFlag(),
          MetricsListenFlag("GetRouterStats' counts"),
          HttpListenFlag(),
          DrainSecondsFlag(),
          Flag::Int("unready-seconds", 0, 0, 86400,
                    "of --drain-seconds, the first N go on serving new calls too, with NOT_SERVING reported, so "
                    "that load balancers (a Service's endpoints) stop sending before the port closes: the time "
                    "they take to see a pod being deleted; less than --drain-seconds"),
      }};
  return *flags;
}

int RunRouterCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(RouterFlags(), args, out, err, Run);
}

}  // namespace vc::cli
