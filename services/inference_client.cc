#include "services/inference_client.h"

#include <algorithm>
#include <cstdint>
#include <future>

#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"

namespace vc {

GenerateReply CallGenerate(vericache::v1::Inference::Stub& stub, const vericache::v1::GenerateRequest& req,
                           const std::string& token, absl::Duration timeout) {
  GenerateReply r;
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  if (timeout != absl::InfiniteDuration()) ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const absl::Time t0 = absl::Now();
  std::unique_ptr<grpc::ClientReader<vericache::v1::GenerateResponse>> reader = stub.Generate(&ctx, req);
  vericache::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (r.tokens.empty() && resp.token_ids_size() > 0) r.first_token_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    r.tokens.insert(r.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    r.text += resp.text();
    if (resp.token_ids_size() > 0) r.texts.push_back(resp.text());
    if (resp.has_stats()) r.stats = resp.stats();
  }
  const grpc::Status s = reader->Finish();
  r.total_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.status = s.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return r;
}

std::shared_ptr<grpc::Channel> InferenceChannel(const std::string& target, const std::string& tls_root_certs_pem,
                                                int64_t keepalive_ms) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  for (const auto& [name, value] : KeepaliveArgs(keepalive_ms)) args.SetInt(name, value);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls_root_certs_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls_root_certs_pem;
    creds = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

std::vector<std::pair<std::string, int>> KeepaliveArgs(int64_t keepalive_ms) {
  if (keepalive_ms <= 0) return {};
  const int ms = static_cast<int>(std::min<int64_t>(keepalive_ms, INT32_MAX));
  return {{GRPC_ARG_KEEPALIVE_TIME_MS, ms}, {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms}, {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0}};
}

std::unique_ptr<vericache::v1::Inference::Stub> InferenceStub(const std::string& target,
                                                              const std::string& tls_root_certs_pem) {
  return vericache::v1::Inference::NewStub(InferenceChannel(target, tls_root_certs_pem));
}

grpc::Status CallBytes(grpc::Channel& channel, const std::string& method, const std::string& request,
                       grpc::ClientContext* ctx, std::string* response) {
  grpc::GenericStub stub(channel.shared_from_this());
  const grpc::Slice slice(request);
  const grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  std::promise<grpc::Status> done;
  stub.UnaryCall(ctx, method, grpc::StubOptions(), &in, &out, [&](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  response->clear();
  std::vector<grpc::Slice> slices;
  if (status.ok() && out.Dump(&slices).ok()) {
    for (const grpc::Slice& sl : slices) response->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  return status;
}

absl::StatusOr<int> ServingStatus(grpc::Channel& channel, absl::Time deadline, absl::string_view service) {
  if (service.size() > 127) return absl::InvalidArgumentError("a health service name longer than 127 bytes");
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  // HealthCheckRequest{service} is field 1, a string (none for ""); the answer is field 1, a varint.
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));
    request.append(service.data(), service.size());
  }
  std::string bytes;
  const grpc::Status s = CallBytes(channel, "/grpc.health.v1.Health/Check", request, &ctx, &bytes);
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  if (bytes.empty()) return 0;  // UNKNOWN, the default
  if (bytes.size() != 2 || bytes[0] != 0x08) return absl::DataLossError("a health answer that is not one status");
  return bytes[1];
}

}  // namespace vc
