// Checks of text that reaches gRPC as it is: a bearer token goes into a header (gRPC aborts the
// process on a header value with control bytes), a prompt into a proto string (UTF-8 only).
#ifndef VC_COMMON_TEXT_CHECKS_H_
#define VC_COMMON_TEXT_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace vc {

// OK when `token` is non-empty printable ASCII without spaces; `what` names it in the error.
inline absl::Status CheckBearerToken(absl::string_view token, absl::string_view what) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  for (const char c : token) {
    if (c == ' ') return absl::InvalidArgumentError(absl::StrCat(what, " holds a space"));
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " holds a byte other than printable ASCII (", static_cast<int>(static_cast<uint8_t>(c)), ")"));
    }
  }
  return absl::OkStatus();
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
inline bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // cut short
    for (int k = 1; k <= n; ++k) {
      const uint8_t t = static_cast<uint8_t>(s[i + k]);
      if ((t & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3f);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// The port of a "host:port" address (the digits after its last ':', up to 99999999), or -1 when it
// has none there (unix:PATH, dns:..., a bare host). gRPC takes a port past 65535 modulo 65536, so
// callers refuse those.
inline int64_t PortOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return -1;
  const absl::string_view digits = address.substr(colon + 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != absl::string_view::npos) return -1;
  if (digits.size() > 8) return 99999999;
  int64_t port = 0;
  for (const char c : digits) port = port * 10 + (c - '0');
  return port;
}

// The host of a "host:port" address, without the brackets of an IPv6 one ("[::1]:80": "::1");
// empty for ":80".
inline std::string HostOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::string(host);
}

// Whether gRPC will take `address` as meant, to listen on (`listen`) or to dial: unix:PATH; to
// dial, also another named scheme (unix-abstract:, dns:, ipv4:, ...) as it is; else host:port with
// a port up to 65535 (0 only to listen: any free port), where gRPC itself would take a port past
// it modulo 65536. kInvalidArgument naming `what`.
inline absl::Status CheckAddress(absl::string_view what, absl::string_view address, bool listen) {
  auto bad = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(what, " ", address, ": ", why)); };
  if (absl::StartsWith(address, "unix:")) return address.size() > 5 ? absl::OkStatus() : bad("names no socket path");
  if (!listen) {
    for (absl::string_view scheme : {"unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:"}) {
      if (absl::StartsWith(address, scheme)) return absl::OkStatus();
    }
  }
  const int64_t port = PortOf(address);
  if (port < 0 || (port == 0 && !listen) || address.front() == ':') return bad("give host:port");
  if (port > 65535) return bad("port past 65535");
  return absl::OkStatus();
}

}  // namespace vc

#endif  // VC_COMMON_TEXT_CHECKS_H_
