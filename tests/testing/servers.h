// A tiny model with a store and a worker for it, as the service tests start them in process.
#ifndef VC_TESTS_TESTING_SERVERS_H_
#define VC_TESTS_TESTING_SERVERS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "services/servers.h"
#include "vericache/v1/inference.pb.h"

namespace vc::testing {

struct TinyStack {
  std::string dir;             // a fresh directory: the model in dir/model, the store's data in dir/db
  StoreServerOptions store;    // 64 MiB of RAM, 256 MiB of disk; token "tok" of tenant "workers"
  WorkerServerOptions worker;  // the model, 32-token blocks, 8 MiB staging, 4 MiB full KV; store token
                               // "tok" (its store_target is for the test to set)
};

// Writes a tiny model (room for 1024 positions) under a fresh directory named after `name`.
TinyStack MakeTinyStack(const std::string& name);

// A prompt of `prompt_tokens` token ids (i % 250 + 1) for `max_tokens`, EOS ignored.
vericache::v1::GenerateRequest IdsRequest(int prompt_tokens, int max_tokens);

// What sequential full-KV decoding of the model in `model_dir` gives for `r`, a token-id request
// (greedy or sampled) that ignores EOS and has no stop sequences or generated_ids; for any other
// request, or a model that cannot be loaded, the test fails and the result is empty.
std::vector<int32_t> FullOutput(const std::string& model_dir, const vericache::v1::GenerateRequest& r);

// Sends `bytes` as the request of `method` at `target` (one request message and at most one
// answer, so any method whose answer is an error or a single message), with `token` as bearer
// token when not empty, within `timeout`; the call's status, and the answer's bytes in *response
// when given.
grpc::Status CallRaw(const std::string& target, const std::string& method, const std::string& bytes,
                     const std::string& token = "", absl::Duration timeout = absl::Seconds(30),
                     std::string* response = nullptr);

// GetStats on `stub` with `token` as bearer token when not empty: the call's status, the stats in
// *stats.
grpc::Status GetWorkerStats(vericache::v1::Inference::Stub& stub, const std::string& token,
                            vericache::v1::WorkerStats* stats);

// Whether `done` comes true, asked every 100 ms for up to `limit`.
bool Eventually(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(30));

// The standard gRPC health service's status for `service` ("": the whole server) at `target`: 1
// serving, 2 not serving, -1 when the call fails.
int HealthStatus(const std::string& target, absl::string_view service = "");

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_SERVERS_H_
