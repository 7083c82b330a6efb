// A small client of the Inference service: runs one streaming Generate call to its end.
#ifndef VC_SERVICES_INFERENCE_CLIENT_H_
#define VC_SERVICES_INFERENCE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "vericache/v1/inference.grpc.pb.h"

namespace vc {

struct GenerateReply {
  absl::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  vericache::v1::GenerateStats stats;
  double first_token_seconds = 0;  // as the client saw it: call start to the first token
  double total_seconds = 0;
};

// Runs `req` on `stub` (with `token` as bearer token when non-empty, and `timeout` as the call's
// deadline when finite).
GenerateReply CallGenerate(vericache::v1::Inference::Stub& stub, const vericache::v1::GenerateRequest& req,
                           const std::string& token = "", absl::Duration timeout = absl::InfiniteDuration());

// A stub for the worker at `target`: over TLS, trusting these root certificates (PEM), when
// `tls_root_certs_pem` is not empty.
std::unique_ptr<vericache::v1::Inference::Stub> InferenceStub(const std::string& target,
                                                              const std::string& tls_root_certs_pem = "");

}  // namespace vc

#endif  // VC_SERVICES_INFERENCE_CLIENT_H_
