#include "common/dns.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vc {

absl::StatusOr<std::vector<std::string>> ResolveSrv(const std::string& name, const std::string& nameserver) {
  if (name.empty() || name.size() > 253) {
    return absl::InvalidArgumentError(absl::StrCat("SRV name '", name, "' is not a DNS name"));
  }
  struct __res_state state;
  std::memset(&state, 0, sizeof(state));
  if (res_ninit(&state) != 0) return absl::UnavailableError("cannot initialize the DNS resolver");
  // res_nclose frees what res_ninit made for its first nscount servers: restore that count.
  struct Closer {
    res_state s;
    int nscount;
    ~Closer() {
      s->nscount = std::max(nscount, s->nscount);
      res_nclose(s);
    }
  } closer{&state, state.nscount};
  if (!nameserver.empty()) {
    const size_t colon = nameserver.rfind(':');
    int port = 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    if (colon == std::string::npos || !absl::SimpleAtoi(nameserver.substr(colon + 1), &port) || port <= 0 ||
        port > 65535 || inet_pton(AF_INET, nameserver.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("nameserver '", nameserver, "' is not ip:port"));
    }
    addr.sin_port = htons(static_cast<uint16_t>(port));
    state.nsaddr_list[0] = addr;
    state.nscount = 1;
    state.retrans = 1;  // seconds per try
    state.retry = 2;
  }
  std::vector<unsigned char> answer(65536);
  const int len = res_nsearch(&state, name.c_str(), ns_c_in, ns_t_srv, answer.data(), static_cast<int>(answer.size()));
  if (len < 0) {
    switch (state.res_h_errno) {
      case HOST_NOT_FOUND:
      case NO_DATA:
        return absl::NotFoundError(absl::StrCat("DNS has no SRV records for ", name));
      default:
        return absl::UnavailableError(absl::StrCat("no DNS answer for the SRV records of ", name));
    }
  }
  ns_msg msg;
  if (ns_initparse(answer.data(), std::min(len, static_cast<int>(answer.size())), &msg) != 0) {
    return absl::UnavailableError(absl::StrCat("the DNS answer for ", name, " cannot be parsed"));
  }
  std::vector<std::string> out;
  for (int i = 0; i < ns_msg_count(msg, ns_s_an); ++i) {
    ns_rr rr;
    if (ns_parserr(&msg, ns_s_an, i, &rr) != 0) {
      return absl::UnavailableError(absl::StrCat("the DNS answer for ", name, " cannot be parsed"));
    }
    if (ns_rr_type(rr) != ns_t_srv) continue;  // a CNAME on the way, say
    // priority, weight, port (2 bytes each), then the target's name.
    if (ns_rr_rdlen(rr) < 7) {
      return absl::UnavailableError(absl::StrCat("an SRV record for ", name, " is too short"));
    }
    const unsigned char* rdata = ns_rr_rdata(rr);
    const int port = (rdata[4] << 8) | rdata[5];
    char target[NS_MAXDNAME];
    if (dn_expand(ns_msg_base(msg), ns_msg_end(msg), rdata + 6, target, sizeof(target)) < 0) {
      return absl::UnavailableError(absl::StrCat("an SRV record for ", name, " names no target"));
    }
    std::string host(target);
    while (!host.empty() && host.back() == '.') host.pop_back();
    if (host.empty() || port == 0) continue;  // "." means no service there
    out.push_back(absl::StrCat(host, ":", port));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return absl::NotFoundError(absl::StrCat("DNS has no SRV records for ", name));
  return out;
}

}  // namespace vc
