#include "services/inference_client.h"

#include "absl/time/clock.h"

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
    if (resp.has_stats()) r.stats = resp.stats();
  }
  const grpc::Status s = reader->Finish();
  r.total_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.status = s.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return r;
}

std::unique_ptr<vericache::v1::Inference::Stub> InferenceStub(const std::string& target,
                                                              const std::string& tls_root_certs_pem) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls_root_certs_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls_root_certs_pem;
    creds = grpc::SslCredentials(ssl);
  }
  return vericache::v1::Inference::NewStub(grpc::CreateCustomChannel(target, creds, args));
}

}  // namespace vc
