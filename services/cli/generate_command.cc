#include "services/cli/generate_command.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/cli/args.h"
#include "worker/full_decoder.h"
#include "worker/model.h"

namespace vc::cli {
namespace {

constexpr char kUsage[] =
    "usage: vericache generate --model DIR (--prompt TEXT | --prompt-file F) [--max-tokens N]\n"
    "                          [--temperature T --top-k K --top-p P --seed S] [--json]\n";

int ExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

absl::StatusOr<std::string> ReadPrompt(const Args& a) {
  if (a.Has("prompt") == a.Has("prompt-file")) {
    return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-file");
  }
  if (a.Has("prompt")) return a.Str("prompt");
  std::ifstream in(a.Str("prompt-file"), std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read prompt file '", a.Str("prompt-file"), "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status Run(const std::vector<std::string>& argv, std::ostream& out) {
  VC_ASSIGN_OR_RETURN(Args a, Args::Parse(argv,
                                          {"model", "prompt", "prompt-file", "max-tokens", "temperature",
                                           "top-k", "top-p", "seed", "block-size"},
                                          {"json"}));
  if (!a.Has("model")) return absl::InvalidArgumentError("--model DIR is required");
  VC_ASSIGN_OR_RETURN(std::string prompt, ReadPrompt(a));
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  GenerateOptions o;
  VC_ASSIGN_OR_RETURN(int64_t max_tokens, a.Int("max-tokens", 128, 1, int64_t{1} << 30));
  VC_ASSIGN_OR_RETURN(int64_t top_k, a.Int("top-k", 0, 0, int64_t{1} << 30));
  VC_ASSIGN_OR_RETURN(int64_t seed, a.Int("seed", 0, 0, INT64_MAX));
  VC_ASSIGN_OR_RETURN(int64_t block, a.Int("block-size", 16, 1, 4096));
  VC_ASSIGN_OR_RETURN(double temperature, a.Double("temperature", 0.0));
  VC_ASSIGN_OR_RETURN(double top_p, a.Double("top-p", 1.0));
  o.max_tokens = static_cast<int>(max_tokens);
  o.block_size = static_cast<int>(block);
  o.sampling.temperature = static_cast<float>(temperature);
  o.sampling.top_k = static_cast<int>(top_k);
  o.sampling.top_p = static_cast<float>(top_p);
  o.sampling.seed = static_cast<uint64_t>(seed);
  VC_RETURN_IF_ERROR(ValidateSamplingParams(o.sampling));

  VC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(a.Str("model")));
  const std::vector<int32_t> ids = model->tokenizer().Encode(prompt);
  VC_ASSIGN_OR_RETURN(GenerateResult r, GenerateFull(*model, ids, o));
  const std::string text = model->tokenizer().Decode(r.tokens);
  if (a.Has("json")) {
    nlohmann::json j;
    j["prompt"] = prompt;
    j["prompt_ids"] = ids;
    j["token_ids"] = r.tokens;
    j["text"] = text;
    j["mode"] = "full";
    j["kernels"] = std::string(model->backend().name());
    j["prefill_ms"] = r.prefill_seconds * 1e3;
    j["decode_ms"] = r.decode_seconds * 1e3;
    j["decode_tokens_per_s"] = r.decode_seconds > 0 ? r.tokens.size() / r.decode_seconds : 0.0;
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    out << text << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::Status s = Run(args, out);
  if (s.ok()) return 0;
  err << "vericache generate: " << s.message() << "\n";
  if (s.code() == absl::StatusCode::kInvalidArgument && s.message().find("--") != absl::string_view::npos) {
    err << kUsage;
  }
  return ExitCodeFor(s);
}

}  // namespace vc::cli
