#include "services/cli/args.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "grpcpp/security/credentials.h"

namespace vc::cli {
namespace {

constexpr absl::string_view kHelpPayload = "vericache.dev/help";

}  // namespace

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::set<std::string>& valued,
                                 const std::set<std::string>& switches) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s == "--help" || s == "-h") return HelpRequested();
    if (s.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", s, "'"));
    std::string name = s.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (a.values_.count(name)) return absl::InvalidArgumentError(absl::StrCat("--", name, " is given twice"));
    if (switches.count(name)) {
      if (inline_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      a.values_[name].assign(1, '1');  // not = "1": GCC 12 misreports -Wrestrict on that
    } else if (valued.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      a.values_[name] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    }
  }
  return a;
}

std::string Args::Str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::Int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer in [", lo, ", ", hi, "], got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> Args::Double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be a finite number, got '", it->second, "'"));
  }
  return v;
}

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

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path) {
  VC_ASSIGN_OR_RETURN(const std::string text, ReadFileLimited(path, 1 << 20, "token file"));
  const size_t end = text.find('\n');
  const std::string line(absl::StripAsciiWhitespace(text.substr(0, end)));
  if (line.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no token"));
  if (end != std::string::npos && !absl::StripAsciiWhitespace(absl::string_view(text).substr(end)).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds more than one line; a token file holds one token"));
  }
  VC_RETURN_IF_ERROR(CheckBearerToken(line, absl::StrCat("the token in ", path)));
  return line;
}

absl::StatusOr<int> DraftWindow(const Args& a) {
  if (a.Str("draft-window", "auto") == "auto") return 0;
  VC_ASSIGN_OR_RETURN(const int64_t k, a.Int("draft-window", 0, 0, 64));
  return static_cast<int>(k);
}

absl::StatusOr<int64_t> KeepaliveMs(const Args& a) {
  VC_ASSIGN_OR_RETURN(const int64_t ms, a.Int("keepalive-ms", 20000, 0, 86400000));
  // Pings closer together than the servers accept (every 500 ms) would have connections closed.
  if (ms > 0 && ms < 1000) return absl::InvalidArgumentError("--keepalive-ms must be 0 or at least 1000");
  return ms;
}

absl::StatusOr<double> HotFraction(const Args& a) {
  VC_ASSIGN_OR_RETURN(const double f, a.Double("ram-hot-fraction", 0.5));
  if (f < 0 || f > 1) return absl::InvalidArgumentError("--ram-hot-fraction must be in [0, 1]");
  return f;
}

absl::StatusOr<uint64_t> RamSlotBytes(const Args& a, uint64_t ram) {
  VC_ASSIGN_OR_RETURN(const int64_t n, a.Int("ram-slot-bytes", 4096, 64, static_cast<int64_t>(std::max<uint64_t>(ram, 64))));
  if (n % 64 != 0) return absl::InvalidArgumentError("--ram-slot-bytes must be a multiple of 64");
  return static_cast<uint64_t>(n);
}

absl::Status HelpRequested() {
  absl::Status s = absl::CancelledError("help requested");
  s.SetPayload(kHelpPayload, absl::Cord("1"));
  return s;
}

bool IsHelpRequested(const absl::Status& s) { return s.GetPayload(kHelpPayload).has_value(); }

int RunSubcommand(absl::string_view name, absl::string_view usage, const std::vector<std::string>& args,
                  std::ostream& out, std::ostream& err,
                  const std::function<absl::Status(const std::vector<std::string>&, std::ostream&)>& run) {
  const absl::Status s = run(args, out);
  if (s.ok()) return 0;
  if (IsHelpRequested(s)) {
    out << usage;
    return 0;
  }
  // One line that names the problem (--help gives the usage).
  err << "vericache " << name << ": " << s.message() << "\n";
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
