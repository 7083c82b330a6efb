#include "services/cli/args.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include <sys/stat.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "grpcpp/security/credentials.h"
#include "worker/runtime/model.h"

namespace vc::cli {

std::string ListeningOn(absl::string_view listen, int port) {
  if (absl::StartsWith(listen, "unix:")) return std::string(listen);
  return absl::StrCat("port ", port);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  if (u == 0) return absl::StrFormat("%.0f B", bytes);
  return absl::StrFormat(bytes < 10 ? "%.2f %s" : bytes < 100 ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

void WarnIfOthersCanRead(const std::string& path, absl::string_view what) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  std::cerr << absl::StrFormat("vericache: warning: %s %s can be read by other users (mode %04o): chmod 600 it\n",
                               what, path, st.st_mode & 07777);
}

absl::Status MakeDirPrivate(const std::string& dir, absl::string_view flag, std::ostream& out) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", dir, ": cannot create it: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  if ((st.st_mode & 077) == 0) return absl::OkStatus();
  if (chmod(dir.c_str(), st.st_mode & 0700) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", dir, " can be read by other users and cannot be made private: ", std::strerror(errno)));
  }
  out << absl::StrFormat("%s %s could be reached by other users (mode %04o): made it %04o\n", flag, dir,
                         st.st_mode & 07777, st.st_mode & 0700);
  return absl::OkStatus();
}

Flag TokenFlag(std::string help) { return Flag::Str("token", "", std::move(help)).Value("TOKEN"); }

Flag TokenFileFlag() {
  return Flag::Str("token-file", "",
                   "the same, read from the first line of a file (on a shared machine, --token is visible to every "
                   "local user)")
      .Value("FILE");
}

absl::StatusOr<std::string> ClientToken(const Args& a) {
  if (a.Has("token") && a.Has("token-file")) return absl::InvalidArgumentError("give one of --token, --token-file");
  if (a.Has("token-file")) return ReadBearerTokenFile(a.Str("token-file"));
  if (a.Has("token")) VC_RETURN_IF_ERROR(CheckBearerToken(a.Str("token"), "--token"));
  return a.Str("token");
}

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path) {
  VC_ASSIGN_OR_RETURN(const std::string text, ReadFileLimited(path, 1 << 20, "token file"));
  WarnIfOthersCanRead(path, "the token file");
  const size_t end = text.find('\n');
  const std::string line(absl::StripAsciiWhitespace(text.substr(0, end)));
  if (line.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no token"));
  if (end != std::string::npos && !absl::StripAsciiWhitespace(absl::string_view(text).substr(end)).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds more than one line; a token file holds one token"));
  }
  VC_RETURN_IF_ERROR(CheckBearerToken(line, absl::StrCat("the token in ", path)));
  return line;
}

Flag DraftWindowFlag() {
  return Flag::Str("draft-window", "auto",
                   "tokens drafted per verify pass: a fixed K in 1..64, at most what the compressor rolls back, or "
                   "auto (0 says the same), chosen per sequence from its acceptance and measured costs")
      .Value("K|auto");
}

absl::StatusOr<int> DraftWindow(const Args& a) {
  const std::string window = a.Str("draft-window");
  if (window == "auto") return 0;
  VC_ASSIGN_OR_RETURN(const int64_t k, ParseIntFlag("draft-window", window, 0, 64));
  return static_cast<int>(k);
}

Flag KvDTypeFlag() {
  return Flag::Str("kv-dtype", "auto",
                   "the element type of the full KV: auto (the checkpoint's torch_dtype, else its weights'), bf16, "
                   "f16 or f32. 16-bit KV halves the memory of every full-KV holder, the bytes a fetch moves and "
                   "the store's space per token")
      .Value("auto|bf16|f16|f32");
}

absl::StatusOr<std::optional<DType>> KvDType(const Args& a) {
  absl::StatusOr<std::optional<DType>> d = ParseKvDType(a.Str("kv-dtype"));
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", d.status().message()));
  return d;
}

Flag KeepaliveFlag(std::string help) { return Flag::Int("keepalive-ms", 20000, 0, 86400000, std::move(help)); }

absl::StatusOr<int64_t> KeepaliveMs(const Args& a) {
  const int64_t ms = a.Int("keepalive-ms");
  // Pings closer together than the servers accept (every 500 ms) would have connections closed.
  if (ms > 0 && ms < 1000) return absl::InvalidArgumentError("--keepalive-ms must be 0 or at least 1000");
  return ms;
}

Flag HotFractionFlag() {
  return Flag::Number("ram-hot-fraction", 0.5, 0, 1,
                      "share of RAM kept for blocks read since they were put (0: plain LRU); the rest holds new "
                      "blocks, evicted first. vericache size-tiers replays a trace to choose it")
      .Value("F");
}

Flag RamSlotBytesFlag() {
  return Flag::Int("ram-slot-bytes", 4096, 64, int64_t{1} << 50,
                   "RAM is handed out in slots of N bytes times a power of two (a multiple of 64, at most the RAM); "
                   "with N a block's size over a power of two, blocks of that size fill their slots (vericache "
                   "size-tiers prints the value for a model)");
}

absl::StatusOr<uint64_t> RamSlotBytes(const Args& a, uint64_t ram) {
  VC_RETURN_IF_ERROR(a.CheckAtMost("ram-slot-bytes", static_cast<int64_t>(std::max<uint64_t>(ram, 64))));
  const int64_t n = a.Int("ram-slot-bytes");
  if (n % 64 != 0) return absl::InvalidArgumentError("--ram-slot-bytes must be a multiple of 64");
  return static_cast<uint64_t>(n);
}

Flag TlsCertFlag() {
  return Flag::Str("tls-cert", "", "serve clients over TLS with this certificate (PEM), and --tls-key").Value("PEM");
}

Flag TlsKeyFlag() { return Flag::Str("tls-key", "", "the private key of --tls-cert (PEM)").Value("PEM"); }

Flag TlsCaFlag() { return Flag::Str("tls-ca", "", "the target serves TLS: its root certificates").Value("PEM"); }

Flag MetricsListenFlag(absl::string_view what) {
  return Flag::Str("metrics-listen", "",
                   absl::StrCat("serve Prometheus metrics (", what,
                                ") at http://HOST:PORT/metrics, plain HTTP without authentication"))
      .Value("HOST:PORT")
      .ShownDefault("none");
}

Flag HttpListenFlag() {
  return Flag::Str("http-listen", "",
                   "serve OpenAI's HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health) at "
                   "http://HOST:PORT (https with --tls-cert), bearer tokens as on gRPC")
      .Value("HOST:PORT")
      .ShownDefault("none");
}

Flag DrainSecondsFlag() {
  return Flag::Int("drain-seconds", 30, 0, 86400,
                   "on SIGTERM or SIGINT, report NOT_SERVING, refuse new calls, and let those admitted finish for up "
                   "to N seconds before stopping; a second signal stops at once");
}

Flag ClientWriteTimeoutFlag() {
  return Flag::Int("client-write-timeout-ms", 60000, 1, 86400000,
                   "a client that takes no streamed tokens for this long has its call cancelled; a router "
                   "cancels its call to the worker with it");
}

int RunSubcommand(const FlagSet& flags, const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                  const std::function<absl::Status(const Args&, std::ostream&)>& run) {
  absl::StatusOr<Args> parsed = Args::Parse(args, flags);
  const absl::Status s = parsed.ok() ? run(*parsed, out) : parsed.status();
  if (s.ok()) return 0;
  if (IsHelpRequested(s)) {
    out << Usage(flags);
    return 0;
  }
  // One line that names the problem (--help gives the usage).
  err << "vericache " << flags.command << ": " << s.message() << "\n";
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

absl::StatusOr<std::map<std::string, std::string>> ReadClientTokens(const std::string& path) {
  VC_ASSIGN_OR_RETURN(const std::string text, ReadFileLimited(path, 16 << 20, "client token file"));
  WarnIfOthersCanRead(path, "the client token file");
  std::map<std::string, std::string> tokens;
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    const absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t[0] == '#') continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(t, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (parts.size() > 2) return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": expected 'token [tenant]'"));
    VC_RETURN_IF_ERROR(CheckBearerToken(parts[0], absl::StrCat("the token at ", path, ":", n)));
    if (parts.size() == 2) VC_RETURN_IF_ERROR(CheckBearerToken(parts[1], absl::StrCat("the tenant at ", path, ":", n)));
    if (!tokens.emplace(parts[0], parts.size() == 2 ? parts[1] : "").second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": this token is listed already"));
    }
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " lists no token"));
  return tokens;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what) {
  VC_ASSIGN_OR_RETURN(std::string text, ReadFileLimited(path, 1 << 20, what));
  if (absl::StripAsciiWhitespace(text).empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  return text;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what, absl::string_view label) {
  VC_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, what));
  // "-----BEGIN CERTIFICATE-----", or for a key "-----BEGIN PRIVATE KEY-----", "... RSA PRIVATE KEY-----", ...
  const std::string begin = "-----BEGIN ";
  for (size_t at = text.find(begin); at != std::string::npos; at = text.find(begin, at + 1)) {
    const size_t end = text.find("-----", at + begin.size());
    if (end != std::string::npos && absl::EndsWith(text.substr(at + begin.size(), end - at - begin.size()), label)) {
      return text;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " holds no PEM block of a ", absl::AsciiStrToLower(label),
                                                 " (-----BEGIN ...", label, "-----)"));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTls(const Args& a) {
  if (a.Has("tls-cert") != a.Has("tls-key")) return absl::InvalidArgumentError("give both --tls-cert and --tls-key");
  if (!a.Has("tls-cert")) return std::shared_ptr<grpc::ServerCredentials>();
  grpc::SslServerCredentialsOptions ssl;
  VC_ASSIGN_OR_RETURN(std::string cert, ReadPemFile(a.Str("tls-cert"), "TLS certificate", "CERTIFICATE"));
  VC_ASSIGN_OR_RETURN(std::string key, ReadPemFile(a.Str("tls-key"), "TLS key", "PRIVATE KEY"));
  WarnIfOthersCanRead(a.Str("tls-key"), "the TLS key");
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

sigset_t BlockStopSignals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return sigs;
}

StopSignalWatch::StopSignalWatch(const sigset_t& sigs, std::function<void()> on_signal)
    : thread_([this, sigs, on_signal = std::move(on_signal)] {
        bool seen = false;
        while (!done_) {
          const timespec tick{0, 100'000'000};
          if (sigtimedwait(&sigs, nullptr, &tick) <= 0) continue;
          if (seen) std::_Exit(1);
          seen = true;
          on_signal();
        }
      }) {}

StopSignalWatch::~StopSignalWatch() {
  done_ = true;
  thread_.join();
}

void WaitAndDrain(const sigset_t& sigs, int64_t drain_seconds, std::ostream& out,
                  const std::function<void()>& stop_admitting, const std::function<void(absl::Time)>& shutdown) {
  int sig = 0;
  sigwait(&sigs, &sig);
  out << "signal " << sig << ": draining (up to " << drain_seconds << " s; a second signal stops at once)"
      << std::endl;
  // Load balancers see NOT_SERVING and move on; what was admitted finishes. Clients holding a
  // connection are told to reconnect (elsewhere).
  stop_admitting();
  const StopSignalWatch second(sigs, [&out] {
    out << "second signal: stopping now" << std::endl;
    std::_Exit(1);
  });
  shutdown(absl::Now() + absl::Seconds(drain_seconds));
}

}  // namespace vc::cli
