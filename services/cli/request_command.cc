#include "services/cli/request_command.h"


#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "services/cli/args.h"
#include "services/inference_client.h"
#include "worker/runtime/sampler.h"

namespace vc::cli {
namespace {

absl::Status Run(const Args& a, std::ostream& out) {
  VC_RETURN_IF_ERROR(CheckAddress("--target", a.Str("target"), false));
  VC_ASSIGN_OR_RETURN(const std::string token, ClientToken(a));
  if (a.Has("prompt") == a.Has("prompt-file")) return absl::InvalidArgumentError("give one of --prompt, --prompt-file");
  vericache::v1::GenerateRequest req;
  if (a.Has("prompt")) {
    req.set_text(a.Str("prompt"));
  } else {
    VC_ASSIGN_OR_RETURN(std::string text, ReadFileLimited(a.Str("prompt-file"), 64 << 20, "prompt file"));
    req.set_text(std::move(text));
  }
  if (!IsUtf8(req.text())) return absl::InvalidArgumentError("the prompt is not UTF-8 text, which the Generate API takes");
  const int64_t max_tokens = a.Int("max-tokens");
  const int64_t top_k = a.Int("top-k");
  const int64_t seed = a.Int("seed");
  const double temperature = a.Double("temperature");
  const double top_p = a.Double("top-p");
  const int64_t timeout_ms = a.Int("timeout-ms");
  // Checked as the floats the request carries (there top_p 0 means "no cut", so 0, or a value
  // that rounds to it, is refused rather than sent).
  VC_RETURN_IF_ERROR(ValidateSamplingParams({static_cast<float>(temperature), 0, static_cast<float>(top_p), 0}));
  req.set_max_tokens(static_cast<uint32_t>(max_tokens));
  if (a.Has("stop")) req.add_stop(a.Str("stop"));  // the worker checks it
  req.mutable_sampling()->set_temperature(static_cast<float>(temperature));
  req.mutable_sampling()->set_top_k(static_cast<uint32_t>(top_k));
  req.mutable_sampling()->set_top_p(static_cast<float>(top_p));
  req.mutable_sampling()->set_seed(static_cast<uint64_t>(seed));
  const std::string mode = a.Str("mode");
  if (mode == "vericache") {
    req.set_mode(vericache::v1::MODE_VERICACHE);
  } else if (mode == "full") {
    req.set_mode(vericache::v1::MODE_FULL);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be vericache or full, not ", mode));
  }
  std::string root_pem;
  if (a.Has("tls-ca")) {
    VC_ASSIGN_OR_RETURN(root_pem, ReadPemFile(a.Str("tls-ca"), "TLS root certificates", "CERTIFICATE"));
  }
  auto stub = InferenceStub(a.Str("target"), root_pem);
  GenerateReply r = CallGenerate(*stub, req, token, absl::Milliseconds(timeout_ms));
  if (absl::IsUnimplemented(r.status)) {
    return absl::FailedPreconditionError(absl::StrCat(a.Str("target"), " serves no Inference API (is it a store?)",
                                                      r.status.message().empty() ? "" : ": ", r.status.message()));
  }
  if (!r.status.ok() && r.status.message().empty()) {
    return absl::Status(r.status.code(), absl::StrCat(a.Str("target"), " answered ", absl::StatusCodeToString(r.status.code())));
  }
  VC_RETURN_IF_ERROR(r.status);
  const auto& s = r.stats;
  out << r.text << "\n"
      << absl::StrFormat(
             "[%d prompt tokens (%d of full KV from the store, %d of compressed KV reused, %d of compressed KV "
             "from the store, %d recomputed), %d generated; %d drafts, %d accepted, %d verify passes; first token "
             "%.1f ms, total %.1f ms]\n",
             s.prompt_tokens(), s.prefix_store_tokens(), s.prefix_compressed_tokens(),
             s.prefix_compressed_store_tokens(), s.recomputed_tokens(),
             s.generated_tokens(), s.drafted_tokens(), s.accepted_drafts(), s.verify_passes(),
             1e3 * r.first_token_seconds, 1e3 * r.total_seconds);
  return absl::OkStatus();
}

}  // namespace

const FlagSet& RequestFlags() {
  static const FlagSet* const flags = new FlagSet{
      "request",
      "(--prompt TEXT | --prompt-file FILE)",
      "Sends one Generate call to a worker, prints the generated text and the call's stats.",
      {
          Flag::Str("target", "", "the worker (or router)").Value("HOST:PORT").Required(),
          Flag::Str("prompt", "", "the prompt (or --prompt-file)"),
          Flag::Str("prompt-file", "", "a file that holds the prompt, UTF-8 text (or --prompt)").Value("FILE"),
          Flag::Int("max-tokens", 128, 1, 1 << 20, "tokens to generate at most"),
          Flag::Str("mode", "vericache", "vericache: draft from compressed KV, verify with the full KV; full: "
                                         "decode with the full KV")
              .Value("vericache|full"),
          Flag::Number("temperature", 0, "sampling temperature; 0: greedy").Value("T"),
          Flag::Int("top-k", 0, 0, 1 << 20, "sample among the K likeliest tokens; 0: all").Value("K"),
          Flag::Number("top-p", 1, "sample among the likeliest tokens whose probabilities add up to P").Value("P"),
          Flag::Int("seed", 0, 0, INT64_MAX, "the sampler's seed").Value("S"),
          TokenFlag("the bearer token the worker takes"),
          TokenFileFlag(),
          Flag::Int("timeout-ms", 600000, 1, INT64_MAX / 1000000, "the call's deadline"),
          TlsCaFlag(),
          Flag::Str("stop", "", "stop generating where the output holds this text"),
      }};
  return *flags;
}

int RunRequestCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(RequestFlags(), args, out, err, Run);
}

}  // namespace vc::cli
