// A small client of the Inference service: runs one streaming Generate call to its end.
#ifndef VC_SERVICES_INFERENCE_CLIENT_H_
#define VC_SERVICES_INFERENCE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "vericache/v1/inference.grpc.pb.h"

namespace vc {

struct GenerateReply {
  absl::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<std::string> texts;  // each message's text, in order
  vericache::v1::GenerateStats stats;
  double first_token_seconds = 0;  // as the client saw it: call start to the first token
  double total_seconds = 0;
};

// Runs `req` on `stub` (with `token` as bearer token when non-empty, and `timeout` as the call's
// deadline when finite).
GenerateReply CallGenerate(vericache::v1::Inference::Stub& stub, const vericache::v1::GenerateRequest& req,
                           const std::string& token = "", absl::Duration timeout = absl::InfiniteDuration());

// A channel to the worker at `target`, taking answers of up to 64 MiB: over TLS, trusting these
// root certificates (PEM), when `tls_root_certs_pem` is not empty. With `keepalive_ms` > 0, a
// connection with calls in flight that has been silent that long is pinged, and closed, its calls
// ended with UNAVAILABLE, when no answer comes within as long again: a worker whose host vanished,
// or that stopped, does not hold its calls open for good (without it, a call waiting on such a
// worker's tokens waits for as long as its deadline, or forever). The servers here accept the
// pings (Listen in services/servers.cc) once every 500 ms; `keepalive_ms` should be at least 1000.
std::shared_ptr<grpc::Channel> InferenceChannel(const std::string& target, const std::string& tls_root_certs_pem = "",
                                                int64_t keepalive_ms = 0);

// The gRPC arguments of a keepalive of `keepalive_ms` (none for 0), for a channel and a server
// alike: a ping after that long without traffic while calls are open, the connection closed when
// it goes unanswered as long again, and pings whether or not this end sends data (gRPC documents
// that it otherwise sends at most two while it sends nothing, which is all of a streamed reply's
// life after the request; 1.51, here, was seen to go on pinging).
std::vector<std::pair<std::string, int>> KeepaliveArgs(int64_t keepalive_ms);

// A stub over InferenceChannel(target, tls_root_certs_pem).
std::unique_ptr<vericache::v1::Inference::Stub> InferenceStub(const std::string& target,
                                                              const std::string& tls_root_certs_pem = "");

// One unary call of `method` ("/package.Service/Method") on `channel` with `request` as the
// request message's bytes, under `ctx`: the call's status, and the answer's bytes in *response.
// For calls whose messages the caller encodes itself (no generated stub at hand, or bytes that are
// not a valid message on purpose).
grpc::Status CallBytes(grpc::Channel& channel, const std::string& method, const std::string& request,
                       grpc::ClientContext* ctx, std::string* response);

// What the standard gRPC health service at the other end of `channel` says of `service` ("": the
// whole server), asked with this deadline: 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING (grpc.health.v1's
// enum); the call's error (kNotFound for a service it does not know), or kDataLoss for an answer
// that is none of these.
absl::StatusOr<int> ServingStatus(grpc::Channel& channel, absl::Time deadline, absl::string_view service = "");

}  // namespace vc

#endif  // VC_SERVICES_INFERENCE_CLIENT_H_
