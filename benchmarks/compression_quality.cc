// How much each KV compression method changes greedy decoding, on code the model never saw.
//
// For each prompt (the first 2K..8K bytes of a Python file from --corpus, the contexts spread
// evenly over that range) the prompt minus its last token is prefilled once on the full paged
// cache, through a QueryRecorder so that the methods which select by prompt queries (SnapKV, and
// H2O's initial scores) get them. Full-KV greedy decoding then continues for --tokens steps. Each
// method builds its compressed cache from that prefill and is fed, one token per step, the same
// tokens the full-KV run was fed (teacher forcing); at each step its argmax is compared with the
// full-KV argmax, i.e. with the full-KV greedy token.
//
// Greedy decoding from the compressed cache alone feeds exactly those tokens until its argmax first
// differs from the full-KV one (every cache here is deterministic and pass-size invariant), so
// the same run also gives the lossy greedy output's first divergence and whether it is identical;
// it is not decoded a second time.
//
// Reported per method: bytes per token held after the build (Bytes / prompt positions) and its
// ratio to the full KV (KvLayout::bytes_per_token), the fraction of runs whose greedy output equals
// the full-KV output, the mean position of the first divergence (--tokens when a run does not
// diverge), the next-token agreement (teacher-forced argmax equality over all steps) and the
// decode time per step.
//
//   compression_quality [--model models/vc-code-4m] [--corpus /usr/lib/python3/dist-packages]
//                       [--prompts 8] [--tokens 64] [--min_context 2048] [--max_context 8192]
//                       [--methods "none;kivi:bits=4;..."] [--json FILE]
//
// --methods is a list of specs separated by ';', or by ',' where a piece that starts with
// "key=value" continues the spec before it ("kivi:bits=4,group=32,h2o" is two specs).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "benchmarks/flags.h"
#include "nlohmann/json.hpp"
#include "worker/compression/lossy_decoder.h"
#include "worker/compression/registry.h"
#include "worker/runtime/model.h"

namespace {

constexpr char kDefaultMethods[] =
    "none;kivi:bits=2;kivi:bits=4;kivi:bits=8;streaming:sinks=4,window=256;streaming:sinks=4,window=1024;"
    "h2o:heavy=128,recent=128;h2o:heavy=512,recent=512;snapkv:capacity=256;snapkv:capacity=1024;"
    "snapkv:capacity=1024+kivi:bits=4;quest:page=16,budget=256;quest:page=16,budget=1024";

std::vector<std::string> SplitMethods(const std::string& s) {
  std::vector<std::string> out;
  if (s.find(';') != std::string::npos) {
    for (absl::string_view p : absl::StrSplit(s, ';', absl::SkipWhitespace())) out.emplace_back(p);
    return out;
  }
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    const size_t eq = p.find('='), colon = p.find(':');
    const bool continues = eq != absl::string_view::npos && (colon == absl::string_view::npos || eq < colon);
    if (continues && !out.empty()) {
      absl::StrAppend(&out.back(), ",", p);
    } else {
      out.emplace_back(p);
    }
  }
  return out;
}

struct Prompt {
  std::string path;
  std::vector<int32_t> tokens;  // the context, BOS first
  std::string continuation;     // the file's next bytes
};

// N prompts from the Python files under `dir`, chosen deterministically: files sorted by path,
// prompt i starts looking at the i/N-th file and takes the first unused one long enough.
std::vector<Prompt> LoadPrompts(const vc::Model& model, const std::string& dir, int n, int64_t min_ctx,
                                int64_t max_ctx, int tokens) {
  std::vector<std::pair<std::string, int64_t>> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(
           dir, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().extension() == ".py") {
      files.emplace_back(it->path().string(), static_cast<int64_t>(it->file_size(ec)));
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<Prompt> out;
  std::vector<bool> used(files.size(), false);
  for (int i = 0; i < n && !files.empty(); ++i) {
    const int64_t ctx = n == 1 ? min_ctx : min_ctx + (max_ctx - min_ctx) * i / (n - 1);
    const size_t start = files.size() * static_cast<size_t>(i) / static_cast<size_t>(n);
    for (size_t j = 0; j < files.size(); ++j) {
      const size_t f = (start + j) % files.size();
      if (used[f] || files[f].second < ctx + tokens) continue;
      std::ifstream in(files[f].first, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      if (static_cast<int64_t>(text.size()) < ctx + tokens) continue;
      used[f] = true;
      Prompt p;
      p.path = files[f].first;
      p.tokens = model.tokenizer().Encode(absl::string_view(text).substr(0, static_cast<size_t>(ctx)));
      p.continuation = text.substr(static_cast<size_t>(ctx), static_cast<size_t>(tokens));
      out.push_back(std::move(p));
      break;
    }
  }
  return out;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct MethodStats {
  std::string spec;
  int runs = 0;
  int identical = 0;
  double first_divergence_sum = 0;
  int64_t agree = 0, steps = 0;
  double bytes_per_token_sum = 0;
  double decode_seconds = 0;
  nlohmann::json per_run = nlohmann::json::array();
};

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"model", "models/vc-code-4m"},
                                              {"corpus", "/usr/lib/python3/dist-packages"},
                                              {"prompts", "8"},
                                              {"tokens", "64"},
                                              {"min_context", "2048"},
                                              {"max_context", "8192"},
                                              {"methods", kDefaultMethods},
                                              {"json", ""}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  const int num_prompts = static_cast<int>(vc::bench::Int(flags, "prompts", 1, 1 << 20));
  const int tokens = static_cast<int>(vc::bench::Int(flags, "tokens", 1, 1 << 20));
  const int64_t min_ctx = vc::bench::Int(flags, "min_context", 2, 1 << 30);
  const int64_t max_ctx = vc::bench::Int(flags, "max_context", min_ctx, 1 << 30);
  auto model_or = vc::Model::Load(flags["model"]);
  if (!model_or.ok()) {
    std::cerr << model_or.status() << "\n";
    return 1;
  }
  const vc::Model& model = **model_or;
  if (absl::Status s = model.tokenizer().CheckHandlesText("compression_quality"); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 1;
  }
  const vc::ModelConfig& config = model.config();
  const vc::KvLayout layout = model.kv_layout(16);

  // Every spec is checked before any work; the recorder keeps enough prompt queries for them all.
  const std::vector<std::string> specs = SplitMethods(flags["methods"]);
  int64_t window = 32;
  std::vector<MethodStats> stats;
  for (const std::string& spec : specs) {
    auto c = vc::MakeCompressedKvCache(spec, layout, config.num_heads);
    if (!c.ok()) {
      std::cerr << c.status() << "\n";
      return 2;
    }
    auto parsed = vc::ParseCompressorSpec((*c)->spec());
    for (const vc::MethodSpec& m : *parsed) {
      auto w = m.params.find("window");
      int64_t v;
      if (m.name == "snapkv" && w != m.params.end() && absl::SimpleAtoi(w->second, &v)) window = std::max(window, v);
    }
    stats.push_back(MethodStats{(*c)->spec()});
  }

  const std::vector<Prompt> prompts = LoadPrompts(model, flags["corpus"], num_prompts, min_ctx, max_ctx, tokens);
  if (prompts.empty()) {
    std::cerr << "no Python file of at least " << min_ctx + tokens << " bytes under " << flags["corpus"] << "\n";
    return 1;
  }
  if (static_cast<int>(prompts.size()) < num_prompts) {
    std::cerr << "only " << prompts.size() << " files are long enough; running those\n";
  }
  const auto t_start = std::chrono::steady_clock::now();
  int64_t full_matches_file = 0;
  double full_decode_seconds = 0;
  for (const Prompt& prompt : prompts) {
    const int64_t n = static_cast<int64_t>(prompt.tokens.size()) - 1;  // the last token is fed by step 0
    if (n + tokens > config.max_position_embeddings) {
      std::cerr << prompt.path << ": " << n + tokens << " positions exceed the model's context\n";
      return 1;
    }
    vc::PagedKvCache full(layout, (n + tokens) / layout.block_size + 2);
    const vc::SeqId seq = full.NewSequence();
    std::vector<float> logits;
    auto recorded = vc::PrefillRecordingQueries(model, absl::MakeConstSpan(prompt.tokens).first(n), 512, full, seq,
                                                window);
    if (!recorded.ok()) {
      std::cerr << recorded.status() << "\n";
      return 1;
    }
    const vc::PromptQueries queries = std::move(*recorded);
    // Full-KV greedy decoding; fed[i] is the token fed at step i, greedy[i] the argmax after it.
    std::vector<int32_t> fed = {prompt.tokens.back()}, greedy;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < tokens; ++i) {
      vc::SequenceChunk ch{seq, {&fed[i], 1}};
      if (absl::Status st = model.Forward({&ch, 1}, full, vc::LogitsFor::kLastRows, &logits); !st.ok()) {
        std::cerr << st << "\n";
        return 1;
      }
      greedy.push_back(Argmax(logits));
      fed.push_back(greedy.back());
    }
    full_decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int i = 0; i < tokens; ++i) full_matches_file += greedy[i] == static_cast<uint8_t>(prompt.continuation[i]);

    for (MethodStats& ms : stats) {
      auto cache = vc::MakeCompressedKvCache(ms.spec, layout, config.num_heads);
      const vc::SeqId cseq = (*cache)->NewSequence();
      if (absl::Status st = (*cache)->BuildFrom(cseq, full, seq, n, &queries); !st.ok()) {
        std::cerr << ms.spec << ": " << st << "\n";
        return 1;
      }
      const double bytes_per_token = static_cast<double>((*cache)->Bytes(cseq)) / static_cast<double>(n);
      int agree = 0, first_divergence = tokens;
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < tokens; ++i) {
        vc::SequenceChunk ch{cseq, {&fed[i], 1}};
        if (absl::Status st = model.Forward({&ch, 1}, **cache, vc::LogitsFor::kLastRows, &logits); !st.ok()) {
          std::cerr << ms.spec << ": " << st << "\n";
          return 1;
        }
        const bool same = Argmax(logits) == greedy[i];
        agree += same;
        if (!same && first_divergence == tokens) first_divergence = i;
      }
      ms.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      ms.runs++;
      ms.identical += first_divergence == tokens;
      ms.first_divergence_sum += first_divergence;
      ms.agree += agree;
      ms.steps += tokens;
      ms.bytes_per_token_sum += bytes_per_token;
      ms.per_run.push_back({{"file", prompt.path}, {"context_tokens", n + 1}, {"bytes_per_token", bytes_per_token},
                            {"first_divergence", first_divergence}, {"agreement", double(agree) / tokens}});
    }
    std::cerr << absl::StrFormat("%s: %d tokens done (%.0f s)\n", prompt.path, n + 1,
                                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  }

  const double full_bpt = static_cast<double>(layout.bytes_per_token());
  const int64_t total_steps = static_cast<int64_t>(prompts.size()) * tokens;
  std::cout << absl::StrFormat(
      "model %s, %d prompts of %d..%d context tokens from %s, %d greedy tokens each; full KV %.0f bytes/token, "
      "%.2f ms/step; full-KV greedy matches the file's continuation at %.1f%% of positions\n\n",
      flags["model"], prompts.size(), prompts.front().tokens.size(), prompts.back().tokens.size(), flags["corpus"],
      tokens, full_bpt, 1e3 * full_decode_seconds / total_steps, 100.0 * full_matches_file / total_steps);
  std::cout << "| method | bytes/token | vs full KV | identical greedy | mean first divergence | next-token agreement "
               "| ms/step |\n|---|---:|---:|---:|---:|---:|---:|\n";
  nlohmann::json results = nlohmann::json::array();
  for (const MethodStats& ms : stats) {
    const double bpt = ms.bytes_per_token_sum / ms.runs;
    const double identical = double(ms.identical) / ms.runs;
    const double divergence = ms.first_divergence_sum / ms.runs;
    const double agreement = double(ms.agree) / ms.steps;
    const double ms_per_step = 1e3 * ms.decode_seconds / ms.steps;
    std::cout << absl::StrFormat("| %s | %.0f | %.3f | %d/%d (%.0f%%) | %.1f | %.1f%% | %.2f |\n", ms.spec, bpt,
                                 bpt / full_bpt, ms.identical, ms.runs, 100 * identical, divergence, 100 * agreement,
                                 ms_per_step);
    results.push_back({{"method", ms.spec}, {"bytes_per_token", bpt}, {"fraction_of_full_kv", bpt / full_bpt},
                       {"identical_fraction", identical}, {"mean_first_divergence", divergence},
                       {"next_token_agreement", agreement}, {"decode_ms_per_step", ms_per_step},
                       {"runs", ms.per_run}});
  }
  std::cout << absl::StrFormat("\nmean first divergence counts %d for a run that never diverges.\n", tokens);
  if (!flags["json"].empty()) {
    nlohmann::json doc = {{"model", flags["model"]}, {"corpus", flags["corpus"]}, {"tokens", tokens},
                          {"full_kv_bytes_per_token", full_bpt},
                          {"full_matches_file_fraction", double(full_matches_file) / total_steps},
                          {"methods", results}};
    std::ofstream(flags["json"]) << doc.dump(1) << "\n";
  }
  return 0;
}
