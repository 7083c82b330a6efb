// Prometheus metrics for operators: a stats message in the Prometheus text format, and a small
// HTTP endpoint that serves it at /metrics.
//
// The endpoint is plain HTTP without authentication (a scraper's usual terms): it is off unless a
// listen address is given, and the address should be one only the scraper reaches. It answers one
// connection at a time; a client gets 2 s to send its request and take the answer, so a client
// that stalls holds the next one up by that much at most.
#ifndef VC_SERVICES_METRICS_H_
#define VC_SERVICES_METRICS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace vc {

// The numeric fields of `stats` as samples named prefix_field: counters (with a _total suffix)
// except the fields that are levels (in flight, used and capacity bytes, blocks held, uptime,
// serving), which are gauges. A message field adds its name to the prefix; a repeated message field
// adds its name without the plural s, and labels each element's samples with the element's first
// string field (tenant="a", target="host:port"), or by its place in the list (index="0") when it
// has none. Samples of one metric are contiguous, as the format requires. Which fields are levels is
// decided by their names (see above), so a new level field needs a name that says so.
std::string PrometheusText(const google::protobuf::Message& stats, absl::string_view prefix);

class MetricsEndpoint {
 public:
  // Listens on `address` (HOST:PORT, port 0: any free one) and answers GET /metrics with what
  // `render` returns, called on the endpoint's thread. kInvalidArgument for a malformed address,
  // kUnavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                                std::function<std::string()> render);
  ~MetricsEndpoint();  // stops listening; a client being answered is dropped

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint(int fd, int port, std::function<std::string()> render);
  void Loop();
  // Reads one request from `conn` and answers it, both by `deadline`.
  void Answer(int conn, std::chrono::steady_clock::time_point deadline);

  const int listen_fd_;
  const int port_;
  const std::function<std::string()> render_;
  int wake_[2] = {-1, -1};  // a pipe: written to stop the loop
  std::thread thread_;
};

}  // namespace vc

#endif  // VC_SERVICES_METRICS_H_
