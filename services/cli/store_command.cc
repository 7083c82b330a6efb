#include "services/cli/store_command.h"

#include <signal.h>

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "services/cli/args.h"
#include "services/servers.h"
#include "services/store_service.h"

namespace vc::cli {
namespace {

constexpr char kUsage[] =
    "usage: vericache store --listen HOST:PORT --data-dir DIR --tokens FILE [--ram-bytes N] [--disk-bytes N]\n"
    "                       [--secret-file FILE] [--tls-cert PEM --tls-key PEM] [--ucx none|peer|off]\n"
    "                       [--ucx-across-tenants]\n"
    "                       [--lease-ttl-ms N] [--lease-bytes-per-tenant N] [--ram-hot-fraction F]\n"
    "                       [--ram-slot-bytes N] [--metrics-listen HOST:PORT] [--disk-failure-grace-ms N]\n"
    "                       [--disk-reserve-bytes N]\n"
    "  --tokens FILE    lines of 'token tenant'; requests without a listed Bearer token are refused\n"
    "  --ucx MODE       'none' (the default) or 'peer': one-sided UCX reads of the RAM tier (the two\n"
    "                   are the same here: the error-handling mode is the reader's, the worker's\n"
    "                   --ucx); 'off' serves every block inline over gRPC\n"
    "  --ucx-across-tenants\n"
    "                   let tenants share one-sided reads: a lease's UCX key reaches the whole RAM\n"
    "                   region, every tenant's blocks in it. Without it a store whose --tokens name\n"
    "                   more than one tenant does not start with --ucx on (use --ucx off, or a store\n"
    "                   per tenant, where tenants must not read each other's blocks)\n"
    "  --lease-ttl-ms N how long a remote read's lease pins its block if the reader never releases\n"
    "                   it (default 30000, at least 2000); a read outlasting its lease is discarded\n"
    "                   by the client\n"
    "  --lease-bytes-per-tenant N\n"
    "                   RAM one tenant's live leases may pin (default half of --ram-bytes; 0: no\n"
    "                   cap); past it its blocks are served inline over gRPC\n"
    "  --ram-hot-fraction F\n"
    "                   share of RAM kept for blocks read since they were put (default 0.5; 0: plain\n"
    "                   LRU); the rest holds new blocks, evicted first. vericache size-tiers replays\n"
    "                   a trace to choose it\n"
    "  --ram-slot-bytes N\n"
    "                   RAM is handed out in slots of N bytes times a power of two (default 4096, a\n"
    "                   multiple of 64); with N a block's size over a power of two, blocks of that\n"
    "                   size fill their slots (vericache size-tiers prints the value for a model)\n"
    "  --metrics-listen HOST:PORT\n"
    "                   serve Prometheus metrics (tier use, hits, misses) at http://HOST:PORT/metrics,\n"
    "                   plain HTTP without authentication (default: none)\n"
    "  --disk-failure-grace-ms N\n"
    "                   once writes to disk have failed this long (puts refused, a probe every second\n"
    "                   failing too) other than for want of room, the gRPC health entry \"liveness\"\n"
    "                   says NOT_SERVING, for a liveness probe to restart the store (RocksDB recovers\n"
    "                   from some errors only when reopened; from a full disk, by itself once it has\n"
    "                   room); default 60000, 0: never. Reads go on meanwhile\n"
    "  --disk-reserve-bytes N\n"
    "                   room kept free on --data-dir's filesystem: under it, puts evict blocks beyond\n"
    "                   --disk-bytes. RocksDB's files take more than the blocks (its logs, and the\n"
    "                   garbage of evicted blocks until it collects it: up to 2.3x --disk-bytes under\n"
    "                   churn), and a filesystem they fill takes no more puts until cleared by hand.\n"
    "                   Default 268435456 (256 MiB); 0: never\n";

// --data-dir: a directory, or a new one in a directory that exists (RocksDB makes the last
// component only).
absl::Status CheckDataDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "dir/"
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) return absl::InvalidArgumentError(absl::StrCat("--data-dir ", dir, " is not a directory"));
    return absl::OkStatus();
  }
  if (!fs::is_directory(path.parent_path(), ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--data-dir ", dir, ": its parent ", path.parent_path().string(),
                                                   " is not a directory that exists"));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& argv, std::ostream& out) {
  // Before anything starts a thread (RocksDB, gRPC: credentials alone start gRPC's).
  const sigset_t sigs = BlockStopSignals();
  VC_ASSIGN_OR_RETURN(Args a, Args::Parse(argv, {"listen", "data-dir", "tokens", "ram-bytes", "disk-bytes",
                                                 "secret-file", "tls-cert", "tls-key", "ucx", "lease-ttl-ms",
                                                 "lease-bytes-per-tenant", "ram-hot-fraction", "ram-slot-bytes",
                                                 "metrics-listen", "disk-failure-grace-ms", "disk-reserve-bytes"},
                                          {"ucx-across-tenants"}));
  for (const char* req : {"listen", "data-dir", "tokens"}) {
    if (!a.Has(req)) return absl::InvalidArgumentError(absl::StrCat("--", req, " is required"));
  }
  StoreServerOptions server;
  VC_ASSIGN_OR_RETURN(server.disk_failure_grace_ms,
                      a.Int("disk-failure-grace-ms", server.disk_failure_grace_ms, 0, int64_t{24} * 3600 * 1000));
  cachestore::StoreOptions o;
  VC_ASSIGN_OR_RETURN(int64_t ram, a.Int("ram-bytes", int64_t{1} << 30, 1 << 20, int64_t{1} << 40));
  VC_ASSIGN_OR_RETURN(int64_t disk, a.Int("disk-bytes", int64_t{16} << 30, 1 << 20, int64_t{1} << 50));
  // A reader trusts a read without asking the store afterwards whether its lease was still live
  // only within the lease less a fifth of it, at least 1 s (StoreClient::LeaseTrustWindow): under
  // 2 s that is under 1 s, at 1 s or less nothing, and reads slower than the lease are all thrown
  // away (at 5 ms every stored prefix was recomputed while the store counted hits).
  VC_ASSIGN_OR_RETURN(o.ram.lease_ttl_ms, a.Int("lease-ttl-ms", o.ram.lease_ttl_ms, 2000, int64_t{24} * 3600 * 1000));
  o.ram.capacity_bytes = static_cast<uint64_t>(ram);
  VC_ASSIGN_OR_RETURN(int64_t lease_cap, a.Int("lease-bytes-per-tenant", ram / 2, 0, ram));
  o.ram.max_leased_bytes_per_owner = static_cast<uint64_t>(lease_cap);
  VC_ASSIGN_OR_RETURN(o.ram.hot_fraction, HotFraction(a));
  VC_ASSIGN_OR_RETURN(o.ram.min_slot_bytes, RamSlotBytes(a, static_cast<uint64_t>(ram)));
  o.disk.path = a.Str("data-dir");
  VC_RETURN_IF_ERROR(CheckDataDir(o.disk.path));
  o.disk.capacity_bytes = static_cast<uint64_t>(disk);
  VC_ASSIGN_OR_RETURN(int64_t reserve, a.Int("disk-reserve-bytes", static_cast<int64_t>(o.disk.reserve_bytes), 0,
                                               int64_t{1} << 50));
  o.disk.reserve_bytes = static_cast<uint64_t>(reserve);
  StoreServiceOptions so;
  VC_ASSIGN_OR_RETURN(so.tokens, ReadTokenFile(a.Str("tokens")));
  if (so.tokens.empty()) return absl::InvalidArgumentError("the token file lists no tenant");
  if (a.Has("secret-file")) {
    VC_ASSIGN_OR_RETURN(so.secret, ReadSmallFile(a.Str("secret-file"), "secret file"));
  }
  server.listen = a.Str("listen");
  server.store = o;
  server.service = so;
  server.ucx = a.Str("ucx", "none");
  server.ucx_across_tenants = a.Has("ucx-across-tenants");
  if (server.ucx_across_tenants && server.ucx == "off") {
    return absl::InvalidArgumentError("--ucx-across-tenants has no effect with --ucx off");
  }
  server.metrics_listen = a.Str("metrics-listen", "");
  VC_ASSIGN_OR_RETURN(server.credentials, ServerTls(a));
  VC_ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> running, StoreServer::Start(server));
  std::set<std::string> tenants;
  for (const auto& [token, tenant] : so.tokens) tenants.insert(tenant);
  out << "vericache store listening on " << ListeningOn(server.listen, running->port()) << " (" << so.tokens.size()
      << " tokens of "
      << tenants.size() << " tenants, RAM "
      << (ram >> 20) << " MiB, disk " << (disk >> 20) << " MiB at " << o.disk.path << ", UCX " << server.ucx
      << ", leases " << o.ram.lease_ttl_ms << " ms, "
      << (lease_cap > 0 ? absl::StrCat("at most ", lease_cap, " bytes of them a tenant") : std::string("no cap per tenant"))
      << ")" << std::endl;
  if (running->metrics_port() != 0) {
    out << "metrics at http://" << server.metrics_listen << "/metrics (port " << running->metrics_port() << ")"
        << std::endl;
  }
  int sig = 0;
  sigwait(&sigs, &sig);
  out << "signal " << sig << ": shutting down" << std::endl;  // in-flight calls get 2 s
  return absl::OkStatus();
}

}  // namespace

int RunStoreCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand("store", kUsage, args, out, err, Run);
}

}  // namespace vc::cli
