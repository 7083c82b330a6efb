#include "tests/testing/servers.h"

#include <future>

#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "tests/testing/tiny_model.h"
#include "worker/full_decoder.h"
#include "worker/model.h"

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
  auto model = Model::Load(model_dir);
  if (!model.ok()) return {};
  GenerateOptions o;
  o.max_tokens = static_cast<int>(r.max_tokens());
  o.stop_at_eos = false;
  const std::vector<int32_t> prompt(r.token_ids().ids().begin(), r.token_ids().ids().end());
  auto out = GenerateFull(**model, prompt, o);
  return out.ok() ? out->tokens : std::vector<int32_t>();
}

grpc::Status CallRaw(const std::string& target, const std::string& method, const std::string& bytes,
                     const std::string& token, absl::Duration timeout, std::string* response) {
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer answer;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &answer, [&](grpc::Status s) { done.set_value(s); });
  const grpc::Status status = done.get_future().get();
  if (response != nullptr) {
    response->clear();
    std::vector<grpc::Slice> slices;
    if (status.ok() && answer.Dump(&slices).ok()) {
      for (const grpc::Slice& sl : slices) response->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
  }
  return status;
}

int HealthStatus(const std::string& target) {
  std::string answer;  // HealthCheckResponse: field 1, a varint
  if (!CallRaw(target, "/grpc.health.v1.Health/Check", "", "", absl::Seconds(10), &answer).ok()) return -1;
  return answer.size() == 2 && answer[0] == 0x08 ? answer[1] : -1;
}

}  // namespace vc::testing
