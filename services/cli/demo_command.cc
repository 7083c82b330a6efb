#include "services/cli/demo_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "services/cli/args.h"
#include "worker/engine.h"
#include "worker/full_decoder.h"
#include "worker/full_kv_tier.h"
#include "worker/lossy_decoder.h"

namespace vc::cli {
namespace {

constexpr char kUsage[] =
    "usage: vericache demo [--model DIR] [--max-tokens N] [--compressor SPEC]\n"
    "  requests sharing a code prefix through the VeriCache engine, each checked token for token\n"
    "  against full-KV decoding, next to the lossy compressed-only baseline\n";

// Three requests that share a long code prefix, as an agent or IDE sends them.
constexpr char kSharedPrefix[] = R"(import os
import sys
import json
import hashlib


class FileIndex:
    """An index of the files under a directory, keyed by content hash."""

    def __init__(self, root):
        self.root = root
        self.entries = {}

    def scan(self):
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                self.entries[path] = digest
        return self.entries

)";

constexpr const char* kSuffixes[] = {
    "    def save(self, path):\n",
    "    def find_duplicates(self):\n",
    "    def load(self, path):\n        \"\"\"Read the index from a JSON file.\"\"\"\n",
};

absl::Status Run(const std::vector<std::string>& argv, std::ostream& out) {
  VC_ASSIGN_OR_RETURN(Args a, Args::Parse(argv, {"model", "max-tokens", "compressor"}, {}));
  VC_ASSIGN_OR_RETURN(int64_t max_tokens, a.Int("max-tokens", 160, 1, 4096));
  const std::string compressor = a.Str("compressor", "kivi:bits=4,group=32,residual=32");
  VC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(a.Str("model", "models/vc-code-4m")));

  GenerateOptions o;
  o.max_tokens = static_cast<int>(max_tokens);
  std::vector<EngineRequest> reqs;
  for (const char* suffix : kSuffixes) {
    reqs.push_back({model->tokenizer().Encode(std::string(kSharedPrefix) + suffix), o, {}});
  }
  out << "VeriCache demo: " << reqs.size() << " requests sharing a " << sizeof(kSharedPrefix) - 1
      << "-byte code prefix; model " << a.Str("model", "models/vc-code-4m") << ", kernels "
      << model->backend().name() << ", compressor " << compressor << "\n\n";

  // The reference: sequential decoding with the full KV, one request after another.
  std::vector<GenerateResult> full;
  double full_decode = 0;
  for (const EngineRequest& r : reqs) {
    VC_ASSIGN_OR_RETURN(GenerateResult g, GenerateFull(*model, r.prompt, o));
    full_decode += g.decode_seconds;
    full.push_back(std::move(g));
  }
  // The lossy baseline: the compressed cache alone.
  std::vector<LossyResult> lossy;
  for (const EngineRequest& r : reqs) {
    VC_ASSIGN_OR_RETURN(LossyResult l, GenerateLossy(*model, r.prompt, o, compressor));
    lossy.push_back(std::move(l));
  }
  // VeriCache: all requests together, drafting from compressed KV, verifying against full KV held
  // in a host-memory tier.
  HostKvTier tier(model->kv_layout(16), 0);
  EngineOptions eo;
  eo.compressor = compressor;
  VC_ASSIGN_OR_RETURN(auto engine, VeriCacheEngine::Create(*model, &tier, eo));
  const absl::Time t0 = absl::Now();
  VC_ASSIGN_OR_RETURN(std::vector<EngineResult> vc, engine->Generate(reqs));
  const double vc_total = absl::ToDoubleSeconds(absl::Now() - t0);

  int identical = 0, lossy_identical = 0;
  int64_t tokens = 0;
  double prefill = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const bool same = vc[i].tokens == full[i].tokens;
    identical += same;
    lossy_identical += lossy[i].generation.tokens == full[i].tokens;
    tokens += static_cast<int64_t>(vc[i].tokens.size());
    prefill += vc[i].stats.prefill_seconds;
    out << "--- request " << i + 1 << ": ..." << kSuffixes[i] << model->tokenizer().Decode(vc[i].tokens) << "\n";
    out << absl::StrFormat("[vericache %s full-KV decoding; %d tokens, %.0f%% of drafts accepted, %.1f tokens per "
                           "verify; lossy %s]\n\n",
                           same ? "IDENTICAL to" : "DIFFERS from", vc[i].tokens.size(),
                           100 * vc[i].stats.acceptance_rate(), vc[i].stats.tokens_per_verify(),
                           lossy[i].generation.tokens == full[i].tokens ? "also identical" : "diverged");
  }
  const double vc_decode = vc_total - prefill;
  out << absl::StrFormat(
      "outputs identical to full-KV decoding: %d/%d (lossy compressed-only decoding: %d/%d)\n"
      "decode throughput: vericache %.0f tokens/s (batched), full-KV %.0f tokens/s (one request at a time)\n",
      identical, reqs.size(), lossy_identical, reqs.size(), tokens / vc_decode, tokens / full_decode);
  if (identical != static_cast<int>(reqs.size())) return absl::InternalError("vericache output differs from full-KV");
  return absl::OkStatus();
}

}  // namespace

int RunDemoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand("demo", kUsage, args, out, err, Run);
}

}  // namespace vc::cli
