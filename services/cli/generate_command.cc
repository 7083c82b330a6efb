#include "services/cli/generate_command.h"


#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/cli/args.h"
#include "worker/compression/lossy_decoder.h"
#include "worker/compression/registry.h"
#include "worker/engines/vericache_engine.h"
#include "worker/prefixes/full_kv_tier.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc::cli {
namespace {

absl::StatusOr<std::string> ReadPrompt(const Args& a) {
  if (a.Has("prompt") == a.Has("prompt-file")) {
    return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-file");
  }
  if (a.Has("prompt")) return a.Str("prompt");
  return ReadFileLimited(a.Str("prompt-file"), 64 << 20, "prompt file");
}

absl::Status Run(const Args& a, std::ostream& out) {
  VC_ASSIGN_OR_RETURN(std::string prompt, ReadPrompt(a));
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  GenerateOptions o;
  o.max_tokens = static_cast<int>(a.Int("max-tokens"));
  o.block_size = static_cast<int>(a.Int("block-size"));
  o.sampling.temperature = static_cast<float>(a.Double("temperature"));
  o.sampling.top_k = static_cast<int>(a.Int("top-k"));
  o.sampling.top_p = static_cast<float>(a.Double("top-p"));
  o.sampling.seed = static_cast<uint64_t>(a.Int("seed"));
  VC_RETURN_IF_ERROR(ValidateSamplingParams(o.sampling));

  const std::string mode = a.Str("mode");
  if (mode != "full" && mode != "lossy" && mode != "vericache") {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be full, lossy or vericache, got '", mode, "'"));
  }
  const std::string compressor = a.Str("compressor");
  VC_ASSIGN_OR_RETURN(const int draft_window, DraftWindow(a));

  ModelOptions mo;
  VC_ASSIGN_OR_RETURN(mo.kv_dtype, KvDType(a));
  VC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(a.Str("model"), mo));
  // A compressor given is checked in full mode too, which does not use it; a draft window is
  // checked against what the compressor rolls back, and refused where nothing drafts.
  if (a.Has("draft-window") && mode != "vericache") {
    return absl::InvalidArgumentError("--draft-window is for --mode vericache");
  }
  if (a.Has("compressor") || mode == "vericache") {
    VC_ASSIGN_OR_RETURN(const std::unique_ptr<CompressedKvCache> drafts,
                        MakeCompressedKvCache(compressor, model->kv_layout(o.block_size), model->config().num_heads));
    VC_RETURN_IF_ERROR(CheckDraftWindow(*drafts, draft_window));
  }
  if (!model->tokenizer().handles_text()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has no tokenizer (its config names ",
        model->config().tokenizer.empty() ? "none" : model->config().tokenizer,
        ", its folder no tokenizer.json), and generate takes text: serve it with vericache worker and send "
        "token ids"));
  }
  const std::vector<int32_t> ids = model->tokenizer().Encode(prompt);
  GenerateResult r;
  nlohmann::json stats;
  if (mode == "full") {
    VC_ASSIGN_OR_RETURN(r, GenerateFull(*model, ids, o));
  } else if (mode == "lossy") {
    VC_ASSIGN_OR_RETURN(LossyResult lr, GenerateLossy(*model, ids, o, compressor));
    r = std::move(lr.generation);
    stats["compressor"] = lr.compressor;
    stats["compressed_bytes"] = lr.compressed_bytes;
  } else {
    VC_RETURN_IF_ERROR(ValidateGenerate(*model, ids, o));
    HostKvTier tier(model->kv_layout(o.block_size), 0);
    EngineOptions eo;
    eo.compressor = compressor;
    eo.draft_window = draft_window;
    eo.block_size = o.block_size;
    VC_ASSIGN_OR_RETURN(auto engine, VeriCacheEngine::Create(*model, &tier, eo));
    std::vector<EngineRequest> reqs = {MakeRequest(ids, o)};
    const absl::Time t0 = absl::Now();
    VC_ASSIGN_OR_RETURN(std::vector<EngineResult> er, engine->Generate(reqs));
    const double total = absl::ToDoubleSeconds(absl::Now() - t0);
    const EngineStats& st = er[0].stats;
    r.tokens = std::move(er[0].tokens);
    r.prefill_seconds = st.prefill_seconds;
    r.decode_seconds = total - st.prefill_seconds;
    stats = {{"compressor", engine->compressor_spec()},
             {"draft_window", draft_window == 0 ? nlohmann::json("auto") : nlohmann::json(draft_window)},
             {"acceptance_rate", st.acceptance_rate()},
             {"tokens_per_verify", st.tokens_per_verify()},
             {"verifies", st.verifies},
             {"plain_verifies", st.plain_verifies},
             {"catch_ups", st.catch_ups},
             {"drafted", st.drafted},
             {"accepted_drafts", st.accepted_drafts},
             {"bytes_fetched", st.bytes_fetched},
             {"compressed_bytes", st.compressed_bytes},
             {"compressed_peak_bytes", st.compressed_peak_bytes},
             {"compressed_reserved_bytes", st.compressed_reserved_bytes},
             {"draft_ms", st.draft_seconds * 1e3},
             {"verify_ms", st.verify_seconds * 1e3},
             {"fetch_wait_ms", st.fetch_wait_seconds * 1e3}};
  }
  const std::string text = model->tokenizer().Decode(r.tokens);
  if (a.Has("json")) {
    nlohmann::json j;
    if (!stats.is_null()) j["stats"] = stats;
    j["prompt"] = prompt;
    j["prompt_ids"] = ids;
    j["token_ids"] = r.tokens;
    j["text"] = text;
    j["mode"] = mode;
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

const FlagSet& GenerateFlags() {
  static const FlagSet* const flags = new FlagSet{
      "generate",
      "(--prompt TEXT | --prompt-file FILE)",
      "Generates text from a checkpoint on this machine and prints it (or one JSON object with --json).",
      {
          Flag::Str("model", "", "the checkpoint's directory").Value("DIR").Required(),
          Flag::Str("prompt", "", "the prompt (or --prompt-file)"),
          Flag::Str("prompt-file", "", "a file that holds the prompt (or --prompt)").Value("FILE"),
          Flag::Int("max-tokens", 128, 1, int64_t{1} << 30, "tokens to generate at most"),
          Flag::Number("temperature", 0.0, "sampling temperature; 0: greedy").Value("T"),
          Flag::Int("top-k", 0, 0, int64_t{1} << 30, "sample among the K likeliest tokens; 0: all").Value("K"),
          Flag::Number("top-p", 1.0, "sample among the likeliest tokens whose probabilities add up to P").Value("P"),
          Flag::Int("seed", 0, 0, INT64_MAX, "the sampler's seed: sampled runs with one are reproducible").Value("S"),
          Flag::Int("block-size", 16, 1, 4096, "tokens per KV-cache block"),
          KvDTypeFlag(),
          Flag::Str("mode", "full",
                    "full: sequential decoding with the full KV cache (the reference)\n"
                    "lossy: decoding from the compressed cache alone (may diverge from full)\n"
                    "vericache: draft from the compressed cache, verify with the full KV: identical to full")
              .Value("full|lossy|vericache"),
          Flag::Str("compressor", "kivi:bits=4,group=32,residual=32",
                    "the compressed cache that lossy decodes from and vericache drafts from, e.g. "
                    "kivi:bits=4,group=32,residual=32 | streaming:sinks=4,window=2000 | none")
              .Value("SPEC"),
          DraftWindowFlag(),
          Flag::Switch("json", "print one JSON object: the text, the prompt's and the output's token ids, timings, "
                               "and (lossy and vericache) the compressed cache's stats"),
      }};
  return *flags;
}

int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(GenerateFlags(), args, out, err, Run);
}

}  // namespace vc::cli
