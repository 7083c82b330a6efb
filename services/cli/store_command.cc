#include "services/cli/store_command.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "services/cli/args.h"
#include "services/servers.h"
#include "services/store_service.h"

namespace vc::cli {
namespace {

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

absl::Status Run(const Args& a, std::ostream& out) {
  // Before anything starts a thread (RocksDB, gRPC: credentials alone start gRPC's).
  const sigset_t sigs = BlockStopSignals();
  StoreServerOptions server;
  server.disk_failure_grace_ms = a.Int("disk-failure-grace-ms");
  cachestore::StoreOptions o;
  const int64_t ram = a.Int("ram-bytes");
  const int64_t disk = a.Int("disk-bytes");
  o.ram.lease_ttl_ms = a.Int("lease-ttl-ms");
  o.ram.capacity_bytes = static_cast<uint64_t>(ram);
  VC_RETURN_IF_ERROR(a.CheckAtMost("lease-bytes-per-tenant", ram));
  const int64_t lease_cap = a.Has("lease-bytes-per-tenant") ? a.Int("lease-bytes-per-tenant") : ram / 2;
  o.ram.max_leased_bytes_per_owner = static_cast<uint64_t>(lease_cap);
  o.ram.hot_fraction = a.Double("ram-hot-fraction");
  VC_ASSIGN_OR_RETURN(o.ram.min_slot_bytes, RamSlotBytes(a, static_cast<uint64_t>(ram)));
  o.disk.path = a.Str("data-dir");
  VC_RETURN_IF_ERROR(CheckDataDir(o.disk.path));
  // The cached KV is the tenants' prompts: no other local user may reach the files.
  VC_RETURN_IF_ERROR(MakeDirPrivate(o.disk.path, "--data-dir", out));
  o.disk.capacity_bytes = static_cast<uint64_t>(disk);
  o.disk.reserve_bytes = static_cast<uint64_t>(a.Int("disk-reserve-bytes"));
  StoreServiceOptions so;
  VC_ASSIGN_OR_RETURN(so.tokens, ReadTokenFile(a.Str("tokens")));
  WarnIfOthersCanRead(a.Str("tokens"), "the token file");
  if (so.tokens.empty()) return absl::InvalidArgumentError("the token file lists no tenant");
  if (a.Has("secret-file")) {
    VC_ASSIGN_OR_RETURN(so.secret, ReadSmallFile(a.Str("secret-file"), "secret file"));
    WarnIfOthersCanRead(a.Str("secret-file"), "the secret file");
  }
  for (absl::string_view t : absl::StrSplit(a.Str("stats-tenants"), ',', absl::SkipEmpty())) {
    const std::string tenant(t);
    if (std::none_of(so.tokens.begin(), so.tokens.end(), [&](const auto& kv) { return kv.second == tenant; })) {
      return absl::InvalidArgumentError(absl::StrCat("--stats-tenants: no token of --tokens is tenant '", tenant, "'"));
    }
    so.stats_tenants.insert(tenant);
  }
  server.listen = a.Str("listen");
  server.store = o;
  server.service = so;
  server.ucx = a.Str("ucx");
  server.ucx_across_tenants = a.Has("ucx-across-tenants");
  if (server.ucx_across_tenants && server.ucx == "off") {
    return absl::InvalidArgumentError("--ucx-across-tenants has no effect with --ucx off");
  }
  server.metrics_listen = a.Str("metrics-listen");
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

const FlagSet& StoreFlags() {
  static const FlagSet* const flags = new FlagSet{
      "store",
      "",
      "Runs a cache store until SIGINT or SIGTERM: workers' full-KV blocks in a RAM tier over RocksDB on disk, "
      "served over gRPC (the CacheStore API) and read one-sided over UCX.",
      {
          Flag::Str("listen", "", "the address to serve on").Value("HOST:PORT").Required(),
          Flag::Str("data-dir", "", "the disk tier's RocksDB directory: one that exists, or a new one in one that "
                                    "does")
              .Value("DIR")
              .Required(),
          Flag::Str("tokens", "", "lines of 'token tenant'; requests without a listed Bearer token are refused")
              .Value("FILE")
              .Required(),
          Flag::Str("stats-tenants", "",
                    "tenants of --tokens whose tokens may read the store's stats (vericache stats): they count "
                    "every tenant's blocks and requests, so other tenants are refused; comma-separated "
                    "(default: none; the metrics endpoint serves them to the operator's network)")
              .Value("TENANT[,...]"),
          Flag::Int("ram-bytes", int64_t{1} << 30, 1 << 20, int64_t{1} << 40, "the RAM tier's size in bytes")
              .ShownDefault("1073741824: 1 GiB"),
          Flag::Int("disk-bytes", int64_t{16} << 30, 1 << 20, int64_t{1} << 50,
                    "the disk tier's budget in bytes: everything it writes under --data-dir (blocks, RocksDB's "
                    "logs, and the garbage of evicted blocks until it is collected); blocks get what the logs leave, "
                    "about 95% of 16 GiB, 75% of 32 MiB")
              .ShownDefault("17179869184: 16 GiB"),
          Flag::Str("secret-file", "", "a secret mixed into every tenant's salt, so that stored blocks' names "
                                       "cannot be computed from a guessed prompt without it: the file's bytes, a "
                                       "final newline included")
              .Value("FILE"),
          TlsCertFlag(),
          TlsKeyFlag(),
          Flag::Str("ucx", "none", "'none' or 'peer': one-sided UCX reads of the RAM tier (the two are the same "
                                   "here: the error-handling mode is the reader's, the worker's --ucx); 'off' "
                                   "serves every block inline over gRPC")
              .Value("none|peer|off"),
          Flag::Switch("ucx-across-tenants",
                       "let tenants share one-sided reads: a lease's UCX key reaches the whole RAM region, every "
                       "tenant's blocks in it. Without it a store whose --tokens name more than one tenant does not "
                       "start with --ucx on (use --ucx off, or a store per tenant, where tenants must not read "
                       "each other's blocks)"),
          // A reader trusts a read without asking the store afterwards whether its lease was still
          // live only within the lease less a fifth of it, at least 1 s (StoreClient::LeaseTrustWindow):
          // under 2 s that is under 1 s, at 1 s or less nothing, and reads slower than the lease are all
          // thrown away (at 5 ms every stored prefix was recomputed while the store counted hits).
          Flag::Int("lease-ttl-ms", cachestore::StoreOptions{}.ram.lease_ttl_ms, 2000, int64_t{24} * 3600 * 1000,
                    "how long a remote read's lease pins its block if the reader never releases it (at least "
                    "2000); a read outlasting its lease is discarded by the client"),
          Flag::Int("lease-bytes-per-tenant", std::nullopt, 0, int64_t{1} << 40,
                    "RAM one tenant's live leases may pin, at most --ram-bytes (0: no cap); past it its blocks are "
                    "served inline over gRPC")
              .ShownDefault("half of --ram-bytes"),
          HotFractionFlag(),
          RamSlotBytesFlag(),
          MetricsListenFlag("tier use, hits, misses"),
          Flag::Int("disk-failure-grace-ms", StoreServerOptions{}.disk_failure_grace_ms, 0, int64_t{24} * 3600 * 1000,
                    "once writes to disk have failed this long (puts refused, a probe every second and the "
                    "store's own reopens of RocksDB failing too) other than for want of room, the gRPC health "
                    "entry \"liveness\" says NOT_SERVING, for a liveness probe to restart the store; 0: never. "
                    "Reads go on meanwhile"),
          Flag::Int("disk-reserve-bytes", static_cast<int64_t>(cachestore::StoreOptions{}.disk.reserve_bytes), 0,
                    int64_t{1} << 50,
                    "room kept free on --data-dir's filesystem for others that share it: under it, puts evict "
                    "blocks beyond what --disk-bytes gives them. 0: never")
              .ShownDefault("268435456: 256 MiB"),
      }};
  return *flags;
}

int RunStoreCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(StoreFlags(), args, out, err, Run);
}

}  // namespace vc::cli
