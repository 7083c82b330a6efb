#include "services/cli/demo_command.h"

#include <stdlib.h>

#include <filesystem>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "services/cli/args.h"
#include "services/inference_client.h"
#include "services/servers.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model_config.h"
#include "worker/runtime/tokenizer.h"

namespace vc::cli {
namespace {

// Why a request drafted or did not, from its stats: the engine drafts while the full KV streams
// in (and to probe), and decodes plainly wherever drafting was measured not to pay.
std::string WhyDrafted(const vericache::v1::GenerateStats& s) {
  const uint32_t plain = s.plain_verify_passes(), passes = s.verify_passes();
  if (s.drafted_tokens() == 0) {
    return absl::StrCat("no drafts: it decoded plainly in all ", passes, " verify passes");
  }
  const std::string drafts = absl::StrFormat("%d drafts, %d accepted (%.0f%%)", s.drafted_tokens(), s.accepted_drafts(),
                                             100.0 * s.accepted_drafts() / s.drafted_tokens());
  if (2 * plain >= passes) {
    return absl::StrCat(drafts, " while the prefix streamed in and in probes; then plain decoding in ", plain, " of ",
                        passes, " verify passes, where drafting was measured slower");
  }
  return absl::StrCat(drafts, "; it drafted in ", passes - plain, " of ", passes,
                      " verify passes, where drafting was measured faster than one token a pass");
}

// What each request asks for after the shared file.
constexpr const char* kSuffixes[] = {
    "\n\ndef count_parameters(model):\n",
    "\n\ndef save_checkpoint(model, path):\n",
    "\n\nclass Tokenizer:\n    \"\"\"Bytes in, ids out.\"\"\"\n\n    def __init__(self):\n",
    "\n\ndef evaluate(model, docs, ctx):\n",
};

absl::StatusOr<std::string> SharedPrefix(const std::string& path, int64_t bytes) {
  VC_ASSIGN_OR_RETURN(std::string text, ReadFileLimited(path, 64 << 20, "prefix file"));
  text.resize(std::min(text.size(), static_cast<size_t>(bytes)));
  const size_t nl = text.rfind('\n');
  if (nl != std::string::npos && nl > 0) text.resize(nl);
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("the prefix file ", path, " is empty"));
  return text;
}

// The worker's two client tenants: one for each mode's pass.
constexpr char kFullToken[] = "demo-full";
constexpr char kVeriCacheToken[] = "demo-vericache";

struct Row {
  std::string name;
  double ttft = 0, total = 0;
  int64_t tokens = 0;
  int identical = 0, requests = 0;
};

absl::Status Run(const Args& a, std::ostream& out) {
  const int64_t max_tokens = a.Int("max-tokens");
  const std::string model_dir = a.Str("model");
  VC_ASSIGN_OR_RETURN(std::string prefix, SharedPrefix(a.Str("prefix-file"), a.Int("prefix-bytes")));

  {  // The demo sends text: checked before anything starts.
    VC_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
    VC_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, MakeTokenizer(config, model_dir));
    VC_RETURN_IF_ERROR(tokenizer->CheckHandlesText("the demo"));
  }
  char tmpl[] = "/tmp/vericache-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
  const std::string tmp = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmp};

  StoreServerOptions so;
  so.store.ram.capacity_bytes = uint64_t{256} << 20;
  so.store.disk.path = tmp + "/store";
  so.store.disk.capacity_bytes = uint64_t{1} << 30;
  so.service.tokens = {{"demo-token", "demo"}};
  so.ucx = a.Str("ucx");
  VC_ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> store, StoreServer::Start(so));

  WorkerServerOptions wo;
  wo.model_dir = model_dir;
  VC_ASSIGN_OR_RETURN(wo.kv_dtype, KvDType(a));
  wo.store_target = store->target();
  wo.store_token = "demo-token";
  wo.ucx = so.ucx;
  wo.service.engine.compressor = a.Str("compressor");
  wo.service.client_tokens = {{kFullToken, "full"}, {kVeriCacheToken, "vericache"}};
  VC_ASSIGN_OR_RETURN(std::unique_ptr<WorkerServer> worker, WorkerServer::Start(wo));
  const Model& model = worker->model();
  auto stub = InferenceStub(worker->target());

  std::vector<std::vector<int32_t>> prompts;
  for (const char* s : kSuffixes) prompts.push_back(model.tokenizer().Encode(prefix + s));
  out << "VeriCache demo: a cache store (port " << store->port() << ", RocksDB in " << tmp << ", UCX " << so.ucx
      << ") and a worker (port " << worker->port() << ", kernels " << model.backend().name() << ", compressor "
      << wo.service.engine.compressor << ") in this process.\n"
      << prompts.size() << " requests share the first " << prefix.size() << " bytes of "
      << a.Str("prefix-file") << "; " << max_tokens
      << " tokens each, greedy; sent once per mode, each mode a tenant of its own.\n\n";

  // The reference: sequential full-KV decoding, prefix recomputed for each request.
  GenerateOptions o;
  o.max_tokens = static_cast<int>(max_tokens);
  std::vector<GenerateResult> want;
  Row recompute{"recompute the prefix, full-KV decode (reference)"};
  for (const auto& p : prompts) {
    VC_ASSIGN_OR_RETURN(GenerateResult g, GenerateFull(model, p, o));
    recompute.ttft += g.prefill_seconds + g.decode_seconds / std::max<size_t>(1, g.tokens.size());
    recompute.total += g.prefill_seconds + g.decode_seconds;
    recompute.tokens += static_cast<int64_t>(g.tokens.size());
    recompute.identical++;
    recompute.requests++;
    want.push_back(std::move(g));
  }

  auto request = [&](const std::string& token, size_t i, vericache::v1::Mode mode) {
    vericache::v1::GenerateRequest req;
    req.mutable_token_ids()->mutable_ids()->Add(prompts[i].begin(), prompts[i].end());
    req.set_max_tokens(static_cast<uint32_t>(max_tokens));
    req.set_mode(mode);
    return CallGenerate(*stub, req, token);
  };
  // Request 1 finds nothing in the store: the worker computes the prefix and publishes its blocks.
  auto cold = [&](const std::string& token) -> absl::StatusOr<GenerateReply> {
    GenerateReply r = request(token, 0, vericache::v1::MODE_VERICACHE);
    VC_RETURN_IF_ERROR(r.status);
    worker->prefixes()->Flush();
    return r;
  };

  // The others arrive together, in both modes: MODE_FULL reads the prefix from the store into
  // worker memory before decoding; VeriCache drafts from the compressed prefix while it streams.
  // Each mode runs as a tenant of its own, after its own request 1, so that both start from the
  // same store and worker state: neither finds blocks the other's requests published.
  auto run_all = [&](const std::string& token, vericache::v1::Mode mode, Row* row,
                     std::vector<GenerateReply>* replies) {
    std::vector<std::future<GenerateReply>> calls;
    const absl::Time t0 = absl::Now();
    for (size_t i = 1; i < prompts.size(); ++i) {
      calls.push_back(std::async(std::launch::async, request, token, i, mode));
    }
    for (auto& c : calls) replies->push_back(c.get());
    row->total = absl::ToDoubleSeconds(absl::Now() - t0);
    for (size_t i = 0; i < replies->size(); ++i) {
      const GenerateReply& r = (*replies)[i];
      row->ttft += r.first_token_seconds;
      row->tokens += static_cast<int64_t>(r.tokens.size());
      row->identical += r.status.ok() && r.tokens == want[i + 1].tokens;
      row->requests++;
    }
  };
  Row full{"fetch the full prefix from the store, then decode"};
  Row vc{"VeriCache: draft from the compressed prefix, verify"};
  std::vector<GenerateReply> full_replies, vc_replies;
  VC_ASSIGN_OR_RETURN(const GenerateReply full_first, cold(kFullToken));
  run_all(kFullToken, vericache::v1::MODE_FULL, &full, &full_replies);
  VC_ASSIGN_OR_RETURN(const GenerateReply first, cold(kVeriCacheToken));
  out << "--- request 1 (cold: prefix computed, " << first.stats.prompt_tokens() / wo.block_tokens
      << " blocks published to the store)\n..." << kSuffixes[0] + 2 << first.text << "\n["
      << (first.tokens == want[0].tokens ? "IDENTICAL to" : "DIFFERS from") << " full-KV decoding]\n\n";
  run_all(kVeriCacheToken, vericache::v1::MODE_VERICACHE, &vc, &vc_replies);
  for (size_t i = 0; i < vc_replies.size(); ++i) {
    const GenerateReply& r = vc_replies[i];
    VC_RETURN_IF_ERROR(r.status);
    out << "--- request " << i + 2 << " (" << r.stats.prefix_store_tokens() << " prefix tokens of full KV read from the store; "
        << (r.stats.prefix_compressed_tokens() > 0
                ? absl::StrCat("drafting began from the worker's compressed copy of ", r.stats.prefix_compressed_tokens(),
                               " of them before they arrived")
            : r.stats.prefix_compressed_store_tokens() > 0
                ? absl::StrCat("drafting began from the store's compressed copy of ",
                               r.stats.prefix_compressed_store_tokens(), " of them before they arrived")
                : std::string("they arrived before drafting could start, so the rest of the prompt was verified at once"))
        << ")\n..." << kSuffixes[i + 1] + 2
        << r.text << "\n["
        << (r.tokens == want[i + 1].tokens ? "IDENTICAL to" : "DIFFERS from")
        << absl::StrFormat(" full-KV decoding; ms: prefill %.0f, draft %.0f, verify %.0f, fetch wait %.0f]\n",
                           r.stats.prefill_micros() / 1e3, r.stats.draft_micros() / 1e3, r.stats.verify_micros() / 1e3,
                           r.stats.fetch_wait_micros() / 1e3)
        << "[" << WhyDrafted(r.stats) << "]\n\n";
  }
  // Recompute is sequential here; per-request time to first token compares like with like.
  out << absl::StrFormat("%-52s %10s %12s %10s\n", "requests 2-" + std::to_string(prompts.size()), "TTFT (ms)",
                         "tokens/s", "identical");
  Row rc = recompute;  // the same requests as the others: drop request 1
  rc.ttft = recompute.ttft - (want[0].prefill_seconds + want[0].decode_seconds / std::max<size_t>(1, want[0].tokens.size()));
  rc.total = recompute.total - want[0].prefill_seconds - want[0].decode_seconds;
  rc.tokens = recompute.tokens - static_cast<int64_t>(want[0].tokens.size());
  rc.requests = recompute.requests - 1;
  rc.identical = rc.requests;
  for (const Row* r : {&rc, &full, &vc}) {
    out << absl::StrFormat("%-52s %10.1f %12.0f %7d/%d\n", r->name, 1e3 * r->ttft / r->requests, r->tokens / r->total,
                           r->identical, r->requests);
  }
  // The regime: where the full KV was, and what that made drafting worth.
  uint64_t drafted = 0, plain = 0, passes = 0;
  double fetch_wait = 0;
  for (const GenerateReply& r : vc_replies) {
    drafted += r.stats.drafted_tokens();
    plain += r.stats.plain_verify_passes();
    passes += r.stats.verify_passes();
    fetch_wait += r.stats.fetch_wait_micros() / 1e3;
  }
  out << "\nregime: remote prefix on one host. Each prefix's full KV came from the store "
      << (so.ucx == "off" ? "inline over gRPC" : absl::StrCat("over UCX (error mode ", so.ucx, ")"))
      << absl::StrFormat(" with %.0f ms of waiting in all, and then stayed in worker memory. ", fetch_wait)
      << absl::StrFormat("VeriCache drafted %d tokens and decoded plainly in %d of %d verify passes: ", drafted, plain,
                         passes)
      << (2 * plain >= passes
              ? "with the full KV in memory on a CPU, a verify row costs about a decode step's arithmetic, so drafts "
                "do not pay there, and the engine decodes as a full-KV decoder does. Drafting pays where the full KV "
                "must cross a slow link or stays offloaded (docs/benchmarks.md, regimes).\n"
              : "drafting was measured to pay here.\n");
  const bool all_same = first.tokens == want[0].tokens && full_first.tokens == want[0].tokens && vc.identical == vc.requests && full.identical == full.requests;
  out << (all_same ? "\nevery output is identical to full-KV decoding\n" : "\nOUTPUTS DIFFER from full-KV decoding\n");
  if (!all_same) return absl::InternalError("an output differs from full-KV decoding");
  return absl::OkStatus();
}

}  // namespace

const FlagSet& DemoFlags() {
  static const FlagSet* const flags = new FlagSet{
      "demo",
      "",
      "Starts a cache store (RocksDB in a temporary directory) and a worker in this process, then sends requests "
      "that share a code prefix (the first --prefix-bytes of --prefix-file, as an IDE sends a file it edits): the "
      "first computes the prefix and publishes its KV; the others draft from the worker's compressed copy while the "
      "full KV streams in from the store over UCX. The set runs twice, the others in MODE_FULL (fetch the full "
      "prefix, then decode) the first time and in VeriCache mode the second, each time as a tenant of its own, so "
      "that neither finds what the other published. Every output is checked token for token against sequential "
      "full-KV decoding.",
      {
          Flag::Str("model", "models/vc-code-4m", "the checkpoint's directory; its tokenizer must take text")
              .Value("DIR"),
          Flag::Int("max-tokens", 128, 1, 4096, "tokens each request generates at most"),
          Flag::Str("prefix-file", "models/train.py", "the file whose beginning the requests share").Value("FILE"),
          Flag::Int("prefix-bytes", 1800, 256, 1 << 20,
                    "bytes of --prefix-file the requests share, cut at the last line's end. The default stays "
                    "within the 2048-token context the test model was trained at; it runs at longer ones, but "
                    "writes worse code there"),
          KvDTypeFlag(),
          Flag::Str("compressor", WorkerServerOptions{}.service.engine.compressor,
                    "the compressed KV that sequences draft from (see vericache generate --help)")
              .Value("SPEC"),
          Flag::Str("ucx", "none", "the UCX error-handling mode of the worker's one-sided reads from the store, or "
                                   "off: blocks inline over gRPC (see vericache worker --help)")
              .Value("none|peer|off"),
      }};
  return *flags;
}

int RunDemoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(DemoFlags(), args, out, err, Run);
}

}  // namespace vc::cli
