#include "services/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "google/protobuf/descriptor.h"

namespace vc {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

bool IsGauge(absl::string_view field) {
  return field == "uptime_micros" || field == "serving" || field == "disk_full" || absl::EndsWith(field, "_in_flight") ||
         absl::EndsWith(field, "_used_bytes") || absl::EndsWith(field, "_capacity_bytes") ||
         absl::EndsWith(field, "_blocks") || absl::EndsWith(field, "_block_bytes") ||
         absl::EndsWith(field, "_failing_ms") || absl::EndsWith(field, "_footprint_bytes");
}

// A label value with backslash, double quote and newline escaped.
std::string Escape(absl::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string Value(const Message& m, const FieldDescriptor* f) {
  const Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return absl::StrCat(r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64: return absl::StrCat(r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32: return absl::StrCat(r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64: return absl::StrCat(r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE: return absl::StrCat(r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT: return absl::StrCat(r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL: return r->GetBool(m, f) ? "1" : "0";
    default: return "";
  }
}

// Messages whose samples form the same metrics (the elements of a repeated field), each with its
// labels ("" or `a="x",b="y"`).
struct Labeled {
  const Message* m;
  std::string labels;
};

// The label of element `index` of a list: its first string field, or its place in the list.
std::string ElementLabel(const Message& el, int index) {
  const google::protobuf::Descriptor* d = el.GetDescriptor();
  for (int j = 0; j < d->field_count(); ++j) {
    const FieldDescriptor* f = d->field(j);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !f->is_repeated()) {
      return absl::StrCat(f->name(), "=\"", Escape(el.GetReflection()->GetString(el, f)), "\"");
    }
  }
  return absl::StrCat("index=\"", index, "\"");
}

// The messages field f of `msgs` holds, with their labels: a set message keeps its parent's, a
// list's elements add theirs.
std::vector<Labeled> Children(const std::vector<Labeled>& msgs, const FieldDescriptor* f) {
  std::vector<Labeled> out;
  for (const Labeled& x : msgs) {
    const Reflection* r = x.m->GetReflection();
    if (!f->is_repeated()) {
      if (r->HasField(*x.m, f)) out.push_back({&r->GetMessage(*x.m, f), x.labels});
      continue;
    }
    for (int e = 0; e < r->FieldSize(*x.m, f); ++e) {
      const Message& el = r->GetRepeatedMessage(*x.m, f, e);
      out.push_back({&el, absl::StrCat(x.labels, x.labels.empty() ? "" : ",", ElementLabel(el, e))});
    }
  }
  return out;
}

void Render(const std::vector<Labeled>& msgs, const std::string& prefix, std::string* out) {
  if (msgs.empty()) return;
  const google::protobuf::Descriptor* d = msgs[0].m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    std::string name = absl::StrCat(prefix, "_", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      // A list's elements are named in the singular (tenants: tenant, shards: shard).
      if (f->is_repeated() && absl::EndsWith(name, "s") && !absl::EndsWith(name, "ss")) name.pop_back();
      Render(Children(msgs, f), name, out);
      continue;
    }
    if (f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ||
        f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
      continue;
    }
    const bool gauge = IsGauge(f->name());
    const std::string metric = gauge ? name : absl::StrCat(name, "_total");
    absl::StrAppend(out, "# TYPE ", metric, gauge ? " gauge\n" : " counter\n");
    for (const Labeled& x : msgs) {
      absl::StrAppend(out, metric, x.labels.empty() ? "" : absl::StrCat("{", x.labels, "}"), " ", Value(*x.m, f),
                      "\n");
    }
  }
}

constexpr int kRequestLimit = 8192;             // bytes of request line and headers
constexpr auto kClientTime = std::chrono::seconds(2);  // to send the request and take the answer

using Deadline = std::chrono::steady_clock::time_point;

// Waits for `events` on fd until `deadline`; false on timeout, error, or a byte on `wake` (the
// endpoint stopping).
bool WaitFor(int fd, short events, Deadline deadline, int wake) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p[2] = {{fd, events, 0}, {wake, POLLIN, 0}};
    const int n = poll(p, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    return n > 0 && p[1].revents == 0 && (p[0].revents & events) != 0;
  }
}

void SendAll(int fd, absl::string_view data, Deadline deadline, int wake) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline, wake)) return;
    } else {
      return;
    }
  }
}

std::string Response(absl::string_view status, absl::string_view content_type, absl::string_view body,
                     absl::string_view extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type, "\r\nContent-Length: ", body.size(),
                      "\r\n", extra_headers, "Connection: close\r\n\r\n", body);
}

}  // namespace

std::string PrometheusText(const Message& stats, absl::string_view prefix) {
  std::string out;
  Render({{&stats, ""}}, std::string(prefix), &out);
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                        std::function<std::string()> render) {
  VC_RETURN_IF_ERROR(CheckAddress("metrics address", address, true));
  if (absl::StartsWith(address, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address ", address, ": must be HOST:PORT"));
  }
  const std::string host = HostOf(address);
  const std::string port = std::to_string(PortOf(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address ", address, ": the host does not resolve"));
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on metrics address ", address,
                                               " (the address is taken or not this host's)"));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint(fd, bound_port, std::move(render)));
  if (pipe2(e->wake_, O_CLOEXEC) != 0) return absl::InternalError("metrics endpoint: cannot make its wake pipe");
  e->thread_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

MetricsEndpoint::MetricsEndpoint(int fd, int port, std::function<std::string()> render)
    : listen_fd_(fd), port_(port), render_(std::move(render)) {}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    const char stop = 1;
    (void)!write(wake_[1], &stop, 1);
    thread_.join();
  }
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
  close(listen_fd_);
}

void MetricsEndpoint::Loop() {
  // After an error that may last (no descriptors left, say), the listening socket stays readable:
  // wait a while before the next try rather than spin.
  const auto pause = [this] {
    pollfd w{wake_[0], POLLIN, 0};
    poll(&w, 1, 100);
  };
  while (true) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int n = poll(p, 2, -1);
    if (n < 0 && errno != EINTR) pause();
    if (n <= 0) continue;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) {
      pause();  // POLLERR and the like
      continue;
    }
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) pause();
      continue;
    }
    // The connection's 2 s cover the request, the answer and the close.
    const Deadline until = std::chrono::steady_clock::now() + kClientTime;
    Answer(conn, until);
    // A lingering close: closing with unread request bytes would reset the connection, and the
    // client could lose the answer with it. Read until the client closes (it has the answer), or
    // until the deadline, which a client that keeps sending would otherwise put off for ever.
    shutdown(conn, SHUT_WR);
    char sink[4096];
    while (std::chrono::steady_clock::now() < until) {
      const ssize_t got = recv(conn, sink, sizeof(sink), 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
      if (got < 0 && !WaitFor(conn, POLLIN, until, wake_[0])) break;
    }
    close(conn);
  }
}

void MetricsEndpoint::Answer(int conn, Deadline deadline) {
  const int wake = wake_[0];
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos) {
    if (request.size() > kRequestLimit) {
      return SendAll(conn, Response("431 Request Header Fields Too Large", "text/plain", "request too large\n"),
                     deadline, wake);
    }
    const ssize_t n = recv(conn, buf, sizeof(buf), 0);
    if (n > 0) {
      request.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!WaitFor(conn, POLLIN, deadline, wake)) return;  // too slow: dropped
    } else {
      return;  // closed before a whole request
    }
  }
  const absl::string_view line = absl::string_view(request).substr(0, request.find_first_of("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return SendAll(conn, Response("400 Bad Request", "text/plain", "malformed request line\n"), deadline, wake);
  }
  if (parts[0] != "GET" && parts[0] != "HEAD") {
    return SendAll(conn, Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n", "Allow: GET, HEAD\r\n"),
                   deadline, wake);
  }
  const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") {
    return SendAll(conn, Response("404 Not Found", "text/plain", "only /metrics\n"), deadline, wake);
  }
  std::string reply = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
  if (parts[0] == "HEAD") reply.resize(reply.find("\r\n\r\n") + 4);
  SendAll(conn, reply, deadline, wake);
}

}  // namespace vc
