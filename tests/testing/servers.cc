#include "tests/testing/servers.h"

#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/inference_client.h"
#include "tests/testing/tiny_model.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc::testing {

TinyStack MakeTinyStack(const std::string& name) {
  TinyStack t;
  t.dir = TempDir(name);
  TinyModelSpec spec;
  spec.max_positions = 1024;
  WriteTinyModel(t.dir + "/model", spec);
  t.store.store.ram.capacity_bytes = uint64_t{64} << 20;
  t.store.store.disk.path = t.dir + "/db";
  t.store.store.disk.capacity_bytes = uint64_t{256} << 20;
  t.store.service.tokens = {{"tok", "workers"}};
  t.worker.model_dir = t.dir + "/model";
  t.worker.store_token = "tok";
  t.worker.block_tokens = 32;
  t.worker.staging_bytes = 8 << 20;
  t.worker.full_kv_bytes = 4 << 20;
  return t;
}

vericache::v1::GenerateRequest IdsRequest(int prompt_tokens, int max_tokens) {
  vericache::v1::GenerateRequest r;
  for (int i = 0; i < prompt_tokens; ++i) r.mutable_token_ids()->add_ids(i % 250 + 1);
  r.set_max_tokens(static_cast<uint32_t>(max_tokens));
  r.set_ignore_eos(true);
  return r;
}

std::vector<int32_t> FullOutput(const std::string& model_dir, const vericache::v1::GenerateRequest& r) {
  // What it computes: greedy or sampled decoding of a token-id prompt, EOS ignored.
  if (!r.ignore_eos() || !r.has_token_ids() || r.stop_size() > 0 || r.generated_ids_size() > 0) {
    ADD_FAILURE() << "FullOutput takes token-id requests that ignore EOS, without stops or generated_ids";
    return {};
  }
  auto model = Model::Load(model_dir);
  if (!model.ok()) {
    ADD_FAILURE() << model.status();
    return {};
  }
  GenerateOptions o;
  o.max_tokens = static_cast<int>(r.max_tokens());
  o.stop_at_eos = false;
  o.sampling.temperature = r.sampling().temperature();
  o.sampling.top_k = static_cast<int>(r.sampling().top_k());
  o.sampling.top_p = r.sampling().top_p() == 0.0f ? 1.0f : r.sampling().top_p();
  o.sampling.seed = r.sampling().seed();
  const std::vector<int32_t> prompt(r.token_ids().ids().begin(), r.token_ids().ids().end());
  auto out = GenerateFull(**model, prompt, o);
  if (!out.ok()) {
    ADD_FAILURE() << out.status();
    return {};
  }
  return out->tokens;
}

grpc::Status CallRaw(const std::string& target, const std::string& method, const std::string& bytes,
                     const std::string& token, absl::Duration timeout, std::string* response) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::string answer;
  return CallBytes(*grpc::CreateChannel(target, grpc::InsecureChannelCredentials()), method, bytes, &ctx,
                   response != nullptr ? response : &answer);
}

grpc::Status GetWorkerStats(vericache::v1::Inference::Stub& stub, const std::string& token,
                            vericache::v1::WorkerStats* stats) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  return stub.GetStats(&ctx, vericache::v1::GetStatsRequest(), stats);
}

bool Eventually(const std::function<bool()>& done, absl::Duration limit) {
  for (const absl::Time end = absl::Now() + limit;; std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    if (done()) return true;
    if (absl::Now() >= end) return false;
  }
}

int HealthStatus(const std::string& target, absl::string_view service) {
  const absl::StatusOr<int> s = ServingStatus(*grpc::CreateChannel(target, grpc::InsecureChannelCredentials()),
                                              absl::Now() + absl::Seconds(10), service);
  return s.ok() ? *s : -1;
}

}  // namespace vc::testing
