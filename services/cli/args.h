// What the vericache subcommands share: running one (RunSubcommand), flags that several take
// (declared here once) and reading them, files of tokens and certificates, and stopping on a signal.
#ifndef VC_SERVICES_CLI_ARGS_H_
#define VC_SERVICES_CLI_ARGS_H_

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "grpcpp/security/server_credentials.h"
#include "services/cli/flags.h"

namespace vc::cli {

// `bytes` in B, KiB, MiB, ... (the largest unit it is one of), to 3 significant digits.
std::string FormatBytes(double bytes);

// Where a server listens, for its first line: "port N" for a TCP address, the address itself for a
// unix socket (whose port gRPC reports as 1).
std::string ListeningOn(absl::string_view listen, int port);

// The bearer token on the first line of the file at `path` (whitespace around it dropped);
// kInvalidArgument when there is none or it is not a valid token.
absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path);

// A worker's client tokens: lines of "token tenant", or "token" alone (the default tenant, ""),
// '#' lines and blank ones skipped; kInvalidArgument, with the line, for anything else, a token
// listed twice, or no token.
absl::StatusOr<std::map<std::string, std::string>> ReadClientTokens(const std::string& path);

// A line on stderr when the file at `path`, which holds `what` (a token, a key), may be read by
// users other than its owner (group or other permission bits): any local user could take it.
void WarnIfOthersCanRead(const std::string& path, absl::string_view what);

// Makes `dir` (named `flag` in messages) its user's alone: creates it with mode 0700 when missing
// (its parent must exist), or takes the group and other permission bits off it, saying so on
// `out`. kInvalidArgument when neither can be done.
absl::Status MakeDirPrivate(const std::string& dir, absl::string_view flag, std::ostream& out);

// --token TOKEN and --token-file FILE of a client: the bearer token it presents. On a shared
// machine a token on the command line is visible to every local user (/proc), so --token-file is
// the one to use there.
Flag TokenFlag(std::string help);
Flag TokenFileFlag();
// The token of --token or --token-file (empty with neither); kInvalidArgument for both, or for a
// token that is not one.
absl::StatusOr<std::string> ClientToken(const Args& a);

// A secret, certificate or key file: at most 1 MiB, and not empty (kInvalidArgument naming `what`).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what);
// ReadSmallFile of a PEM file that holds at least one block whose label ends with `label`
// ("CERTIFICATE", "PRIVATE KEY"): a file of something else is refused here, where gRPC would
// only fail every connection.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what, absl::string_view label);

// Server credentials from --tls-cert and --tls-key (both or neither): TLS with that certificate,
// or null (plaintext) when neither is given.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTls(const Args& a);

// Blocks SIGINT and SIGTERM for this thread and the threads it starts afterwards, so that only
// WaitAndDrain or a StopSignalWatch receives them: call it before anything starts a thread
// (RocksDB, gRPC).
sigset_t BlockStopSignals();

// While it lives, takes SIGINT and SIGTERM (`sigs`, as BlockStopSignals gave them) on a thread of
// its own: the first calls on_signal(); the next ends the process at once (exit status 1).
class StopSignalWatch {
 public:
  StopSignalWatch(const sigset_t& sigs, std::function<void()> on_signal);
  ~StopSignalWatch();
  StopSignalWatch(const StopSignalWatch&) = delete;
  StopSignalWatch& operator=(const StopSignalWatch&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Waits for SIGINT or SIGTERM (`sigs`, as BlockStopSignals gave them), then drains a server:
// stop_admitting() (health NOT_SERVING, new calls refused), then shutdown(deadline), which returns
// once the calls in flight have ended or at `drain_seconds`, having cancelled them. A second
// signal meanwhile ends the process at once (exit status 1).
void WaitAndDrain(const sigset_t& sigs, int64_t drain_seconds, std::ostream& out,
                  const std::function<void()>& stop_admitting, const std::function<void(absl::Time)>& shutdown);

// Flags that several subcommands take, each declared here once, and what reads them.

// --draft-window K|auto: "auto" or 0, which let the engine choose each sequence's window, or a
// fixed window of 1 to 64 tokens.
Flag DraftWindowFlag();
// Its value as EngineOptions::draft_window (0 for auto); kInvalidArgument for anything else.
absl::StatusOr<int> DraftWindow(const Args& a);

// --kv-dtype auto|bf16|f16|f32: the element type of the full KV.
Flag KvDTypeFlag();
// Its value as ModelOptions::kv_dtype (nullopt for auto); kInvalidArgument naming the flag otherwise.
absl::StatusOr<std::optional<DType>> KvDType(const Args& a);

// --keepalive-ms of a server, `help` saying what it does there.
Flag KeepaliveFlag(std::string help);
// Its value: 0 (gRPC's defaults) or at least 1000; kInvalidArgument for 1 to 999.
absl::StatusOr<int64_t> KeepaliveMs(const Args& a);

// --ram-hot-fraction (cachestore::RamTierOptions::hot_fraction).
Flag HotFractionFlag();

// --ram-slot-bytes (cachestore::RamTierOptions::min_slot_bytes).
Flag RamSlotBytesFlag();
// Its value; kInvalidArgument past `ram` or for one that is not a multiple of 64.
absl::StatusOr<uint64_t> RamSlotBytes(const Args& a, uint64_t ram);

// --tls-cert and --tls-key of a server, which ServerTls reads.
Flag TlsCertFlag();
Flag TlsKeyFlag();

// --tls-ca of a client: the root certificates of a target serving TLS.
Flag TlsCaFlag();

// --metrics-listen of a server whose metrics are `what` ("tier use, hits, misses").
Flag MetricsListenFlag(absl::string_view what);
// --http-listen of a worker or a router: the OpenAI-compatible HTTP API.
Flag HttpListenFlag();

// --drain-seconds of a server, for WaitAndDrain.
Flag DrainSecondsFlag();

// --client-write-timeout-ms of a server streaming tokens to clients.
Flag ClientWriteTimeoutFlag();

// Runs one subcommand: parses `args` against `flags`, calls run(parsed, out) and turns its status
// into an exit code (0 ok, and the usage printed when --help asked for it; 2 bad input: invalid
// argument, not found, data loss, out of range; 1 anything else, a server's overload included),
// printing "vericache <command>: <message>" to `err`.
int RunSubcommand(const FlagSet& flags, const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                  const std::function<absl::Status(const Args&, std::ostream&)>& run);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_ARGS_H_
