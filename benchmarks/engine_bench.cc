// End-to-end decoding throughput of the long-context scene, four ways, in one run:
//   (a) full:      full KV resident in worker memory, one token per step (the usual decoder)
//   (b) offload:   full KV in the tier, fetched for every step, one token per step
//   (c) lossy:     compressed KV only (an upper bound on speed; its output is wrong)
//   (d) vericache: draft from compressed KV, fetch full KV while drafting, verify in one pass
//   (d) resident:  the same with every sequence's full KV kept staged in worker memory (fetched
//                  once, when the sequence starts), the comparison with (a)
// The tier is host memory; its fetches can be paced to stand for a link: --link-ratios gives
// local-memory : link bandwidth ratios (e.g. 60 for HBM:PCIe, 250 for HBM:100 Gb/s), 0 = unpaced.
// Prompts are real Python code the model never saw in training. Every (d) output is checked
// token for token against (a); (c)'s agreement with (a) is reported.
//
//   engine_bench [--model DIR] [--corpus DIR] [--contexts 1024,4096,16384] [--batches 1,4]
//                [--tokens 64] [--compressor SPEC] [--draft-window 0|auto|plain|k] [--link-ratios 0,60]
//                [--modes full,offload,lossy,vericache,resident] [--budget-mib 0] [--rounds 1]
//                [--kv-dtypes auto|bf16|f16|f32[,...]] [--json FILE]
// With several --kv-dtypes the whole run repeats for each, one after the other, in one process.
// With --rounds N > 1 the modes without a link (full, lossy, resident) run N times each, in rounds
// of one run of each mode; a row gives its mode's median run, and its speedup over (a) as the
// median of the rounds' ratios. Runs of one round are seconds apart, where on a shared machine the
// rate drifts over minutes: the ratio of runs side by side varies less than the rate.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmarks/bandwidth.h"
#include "benchmarks/flags.h"
#include "nlohmann/json.hpp"
#include "worker/compression/lossy_decoder.h"
#include "worker/compression/registry.h"
#include "worker/engines/vericache_engine.h"
#include "worker/prefixes/full_kv_tier.h"
#include "worker/runtime/model.h"

namespace vc {
namespace {

using bench::Int;
using bench::Ints;

// Deterministic held-out code: the corpus's .py files in sorted order, concatenated.
std::string LoadCorpus(const std::string& dir, size_t want) {
  std::vector<std::string> files;
  std::error_code walk;
  for (std::filesystem::recursive_directory_iterator it(dir, std::filesystem::directory_options::skip_permission_denied,
                                                         walk),
       end;
       !walk && it != end; it.increment(walk)) {
    std::error_code ec;  // an entry that cannot be looked at (a dangling link) is skipped
    if (it->is_regular_file(ec) && it->path().extension() == ".py") files.push_back(it->path().string());
  }
  if (walk) std::cerr << "--corpus " << dir << ": " << walk.message() << " (using the files found before)\n";
  std::sort(files.begin(), files.end());
  std::string out;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().size() < 2000) continue;
    out += ss.str();
    if (out.size() >= want) break;
  }
  return out;
}

struct ModeResult {
  std::string mode;
  std::vector<std::vector<int32_t>> outputs;
  double decode_seconds = 0;
  double bytes_read = 0;  // KV + weights bytes the decode read (modelled from the passes run)
  int64_t tokens = 0;
  nlohmann::json extra;
  // With --rounds: the median over rounds of this mode's rate over (a)'s in the same round.
  double rounds_vs_full = 0;
};

double Rate(const ModeResult& r) { return r.tokens / r.decode_seconds; }

// One result per mode from several rounds of the same modes in the same order: each mode's median
// run by rate (the lower one of an even count), with the rounds' rates over (a) in `extra`. False
// when a mode's outputs differ between rounds.
bool MedianRounds(const std::vector<std::vector<ModeResult>>& rounds, std::vector<ModeResult>* out) {
  const size_t n = rounds.size();
  const auto full =
      std::find_if(rounds[0].begin(), rounds[0].end(), [](const ModeResult& r) { return r.mode == "full"; });
  const bool has_full = full != rounds[0].end();
  const size_t full_at = static_cast<size_t>(full - rounds[0].begin());
  for (size_t i = 0; i < rounds[0].size(); ++i) {
    std::vector<const ModeResult*> runs;
    std::vector<double> ratios;
    for (const auto& round : rounds) {
      if (round[i].outputs != rounds[0][i].outputs) return false;
      runs.push_back(&round[i]);
      if (has_full) ratios.push_back(Rate(round[i]) / Rate(round[full_at]));
    }
    std::sort(runs.begin(), runs.end(), [](auto* a, auto* b) { return Rate(*a) < Rate(*b); });
    ModeResult r = *runs[(n - 1) / 2];
    if (n > 1 && has_full && i != full_at) {
      nlohmann::json each = nlohmann::json::array();
      for (double x : ratios) each.push_back(std::round(x * 1000) / 1000);
      std::sort(ratios.begin(), ratios.end());
      r.rounds_vs_full = ratios[(n - 1) / 2];
      r.extra["rounds_vs_full"] = each;
    }
    out->push_back(std::move(r));
  }
  return true;
}

int64_t WeightBytes(const ModelConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  return ((d * (c.num_heads * hd) * 2 + d * (c.num_kv_heads * hd) * 2 + 3 * d * f) * c.num_layers +
          int64_t{c.vocab_size} * d) * 2;
}

// Prefills `prompt` but its last token into `seq` of `cache` (the positions a request's prefilled
// KV holds) and returns the queries of its last `window` positions, for compressors that choose
// what to keep from them.
absl::StatusOr<PromptQueries> PrefillPrompt(const Model& m, const std::vector<int32_t>& prompt, SeqId seq,
                                           PagedKvCache& cache, int64_t window) {
  return PrefillRecordingQueries(m, absl::MakeConstSpan(prompt).first(prompt.size() - 1), 512, cache, seq, window);
}

// Greedy one-token steps for every sequence of `seqs` in `cache`, `tokens` times; each step reads
// the weights plus kv_bytes(i) for sequence i. Fills r's outputs, bytes, time and token count.
template <typename KvBytes>
void DecodeBatched(const Model& m, AttentionCache& cache, const std::vector<SeqId>& seqs,
                   const std::vector<std::vector<int32_t>>& prompts, int tokens, KvBytes kv_bytes, ModeResult* r) {
  std::vector<int32_t> feed(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) feed[i] = prompts[i].back();
  r->outputs.resize(prompts.size());
  std::vector<float> logits;
  const int vocab = m.config().vocab_size;
  const absl::Time t0 = absl::Now();
  for (int step = 0; step < tokens; ++step) {
    std::vector<SequenceChunk> chunks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      chunks.push_back({seqs[i], {&feed[i], 1}});
      r->bytes_read += kv_bytes(i);
    }
    r->bytes_read += static_cast<double>(WeightBytes(m.config()));
    if (!m.Forward(chunks, cache, LogitsFor::kLastRows, &logits).ok()) std::abort();
    for (size_t i = 0; i < prompts.size(); ++i) {
      feed[i] = SampleToken(absl::MakeConstSpan(logits).subspan(i * vocab, vocab), SamplingParams{},
                            cache.Length(seqs[i]));
      r->outputs[i].push_back(feed[i]);
    }
  }
  r->decode_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r->tokens = static_cast<int64_t>(prompts.size()) * tokens;
}

// (a): batched one-token steps over the full KV, resident.
ModeResult RunFull(const Model& m, const PagedKvCache& master, const std::vector<SeqId>& src,
                   const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  ModeResult r;
  r.mode = "full";
  const KvLayout layout = master.layout();
  int64_t blocks = 0;
  for (const auto& p : prompts) blocks += (static_cast<int64_t>(p.size()) + tokens) / layout.block_size + 2;
  PagedKvCache cache(layout, blocks);
  std::vector<SeqId> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const SeqId s = cache.NewSequence();
    const int64_t n = static_cast<int64_t>(prompts[i].size()) - 1;
    (void)cache.Reserve(s, n);
    master.CopyTo(src[i], 0, n, cache, s);
    cache.Commit(s, n);
    seqs.push_back(s);
  }
  DecodeBatched(m, cache, seqs, prompts, tokens,
                [&](size_t i) { return static_cast<double>(cache.Length(seqs[i]) + 1) * layout.bytes_per_token(); }, &r);
  return r;
}

// (b): every step fetches each sequence's full KV from the tier into staging, then decodes.
ModeResult RunOffload(const Model& m, const PagedKvCache& master, const std::vector<SeqId>& src,
                      const std::vector<std::vector<int32_t>>& prompts, int tokens, double link_bps) {
  ModeResult r;
  r.mode = "offload";
  const KvLayout layout = master.layout();
  HostKvTier tier(layout, link_bps);
  int64_t blocks = 0;
  for (const auto& p : prompts) blocks += (static_cast<int64_t>(p.size()) + tokens) / layout.block_size + 2;
  PagedKvCache staging(layout, blocks);
  std::vector<int32_t> feed(prompts.size());
  std::vector<int64_t> len(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    len[i] = static_cast<int64_t>(prompts[i].size()) - 1;
    if (!tier.Append(i + 1, master, src[i], 0, len[i]).ok()) std::abort();
    feed[i] = prompts[i].back();
  }
  r.outputs.resize(prompts.size());
  std::vector<float> logits;
  double wait = 0;
  const absl::Time t0 = absl::Now();
  for (int step = 0; step < tokens; ++step) {
    std::vector<SeqId> seqs;
    std::vector<std::shared_ptr<FetchHandle>> fetches;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const SeqId s = staging.NewSequence();
      (void)staging.Reserve(s, len[i] + 1);
      fetches.push_back(tier.Fetch(i + 1, 0, len[i], &staging, s));
      seqs.push_back(s);
    }
    const absl::Time w0 = absl::Now();
    for (auto& f : fetches) {
      if (!f->Wait().ok()) std::abort();
      r.bytes_read += static_cast<double>(f->bytes());
    }
    wait += absl::ToDoubleSeconds(absl::Now() - w0);
    std::vector<SequenceChunk> chunks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      staging.Commit(seqs[i], len[i]);
      chunks.push_back({seqs[i], {&feed[i], 1}});
      r.bytes_read += static_cast<double>(len[i] + 1) * layout.bytes_per_token();
    }
    r.bytes_read += static_cast<double>(WeightBytes(m.config()));
    if (!m.Forward(chunks, staging, LogitsFor::kLastRows, &logits).ok()) std::abort();
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (!tier.Append(i + 1, staging, seqs[i], len[i], len[i] + 1).ok()) std::abort();
      ++len[i];
      feed[i] = SampleToken(absl::MakeConstSpan(logits).subspan(i * m.config().vocab_size, m.config().vocab_size),
                            SamplingParams{}, len[i]);
      r.outputs[i].push_back(feed[i]);
      staging.FreeSequence(seqs[i]);
    }
  }
  r.decode_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.tokens = static_cast<int64_t>(prompts.size()) * tokens;
  r.extra["fetch_wait_s"] = wait;
  return r;
}

// (c): batched one-token steps over the compressed cache alone.
ModeResult RunLossy(const Model& m, const PagedKvCache& master, const std::vector<SeqId>& src,
                    const std::vector<PromptQueries>& queries, const std::vector<std::vector<int32_t>>& prompts,
                    int tokens, const std::string& spec) {
  ModeResult r;
  r.mode = "lossy";
  auto cache = MakeCompressedKvCache(spec, master.layout(), m.config().num_heads);
  if (!cache.ok()) std::abort();
  std::vector<SeqId> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back((*cache)->NewSequence());
    const absl::Status built = (*cache)->BuildFrom(seqs[i], master, src[i], static_cast<int64_t>(prompts[i].size()) - 1,
                                                   RecordedQueries(queries[i]));
    if (!built.ok()) {
      std::cerr << built << "\n";
      std::abort();
    }
  }
  DecodeBatched(m, **cache, seqs, prompts, tokens,
                [&](size_t i) { return static_cast<double>((*cache)->Bytes(seqs[i])); }, &r);
  int64_t bytes = 0;
  for (SeqId s : seqs) bytes += (*cache)->Bytes(s);
  r.extra["compressed_bytes_per_seq"] = bytes / static_cast<int64_t>(prompts.size());
  return r;
}

// (d): the engine.
ModeResult RunVeriCache(const Model& m, const PagedKvCache& master, const std::vector<SeqId>& src,
                        const std::vector<PromptQueries>& queries, const std::vector<std::vector<int32_t>>& prompts,
                        int tokens, const std::string& spec,
                        int draft_window, double link_bps, int64_t staging_blocks = 0, bool resident = false) {
  ModeResult r;
  r.mode = resident ? "vericache-resident" : "vericache";
  HostKvTier tier(master.layout(), link_bps);
  EngineOptions eo;
  eo.compressor = spec;
  eo.draft_window = std::max(draft_window, 0);
  if (draft_window < 0) eo.window_pattern = {0};  // plain decoding throughout
  eo.block_size = master.layout().block_size;
  eo.max_batch = static_cast<int>(prompts.size());
  eo.staging_blocks = staging_blocks;
  // (d) holds only compressed KV between verifies and fetches the full KV for each; (d) resident
  // keeps every sequence's full KV staged (fetched once, at the start) as (a) does.
  eo.keep_staged = resident;
  auto engine = VeriCacheEngine::Create(m, &tier, eo);
  if (!engine.ok()) {
    std::cerr << engine.status() << "\n";
    std::abort();
  }
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o;
    o.max_tokens = tokens;
    o.stop_at_eos = false;
    reqs.push_back(MakeRequest(prompts[i], o, PrefilledKv{&master, src[i], RecordedQueries(queries[i])}));
  }
  // Staging is allocated (and zeroed) before the clock starts, as (a) and (b) allocate theirs: a
  // worker holds its staging from startup.
  if (!(*engine)->SizeStaging(reqs).ok()) std::abort();
  const absl::Time t0 = absl::Now();
  auto res = (*engine)->Generate(reqs);
  const double total = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!res.ok()) {
    std::cerr << res.status() << "\n";
    std::abort();
  }
  double prefill = 0, draft = 0, verify = 0, wait = 0;
  int64_t drafted = 0, accepted = 0, verifies = 0, fetched = 0, cbytes = 0;
  double verify_reads = 0;
  for (size_t i = 0; i < res->size(); ++i) {
    const EngineResult& e = (*res)[i];
    // Each verify pass reads the sequence's full KV from staging once, taken at its mean length
    // over the run (a resident sequence's passes read it without fetching it first).
    verify_reads += static_cast<double>(e.stats.verifies) *
                    (static_cast<double>(prompts[i].size()) + tokens / 2.0) * master.layout().bytes_per_token();
    r.outputs.push_back(e.tokens);
    prefill += e.stats.prefill_seconds;
    draft += e.stats.draft_seconds;
    verify += e.stats.verify_seconds;
    wait += e.stats.fetch_wait_seconds;
    drafted += e.stats.drafted;
    accepted += e.stats.accepted_drafts;
    verifies += e.stats.verifies;
    fetched += e.stats.bytes_fetched;
    cbytes += e.stats.compressed_bytes;
  }
  r.decode_seconds = total - prefill;
  r.tokens = static_cast<int64_t>(prompts.size()) * tokens;
  // Reads: each draft step reads the compressed cache; the full KV is read by its fetch (the
  // tier's copy, as (b) counts it) and by each verify pass over it.
  const double per_seq_c = static_cast<double>(cbytes) / prompts.size();
  r.bytes_read = drafted * per_seq_c + static_cast<double>(fetched) + verify_reads +
                 static_cast<double>(WeightBytes(m.config())) * (drafted + verifies) / prompts.size();
  r.extra = {{"acceptance_rate", drafted ? double(accepted) / drafted : 0.0},
             {"tokens_per_verify", verifies ? double(r.tokens) / verifies : 0.0},
             {"draft_s", draft / prompts.size()},
             {"verify_s", verify / prompts.size()},
             {"fetch_wait_s", wait},
             {"bytes_fetched", fetched}};
  return r;
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  using namespace vc;
  std::map<std::string, std::string> flags = {
      {"model", "models/vc-code-4m"}, {"corpus", "/usr/lib/python3/dist-packages"},
      {"contexts", "1024,4096,16384"}, {"batches", "1,4"}, {"tokens", "64"},
      {"compressor", "kivi:bits=4,group=32,residual=32"}, {"draft-window", "0"},
      {"link-ratios", "0,60,250"}, {"modes", "full,offload,lossy,vericache,resident"}, {"json", ""},
      {"budget-mib", "0"}, {"budget-context", "16384"}, {"rounds", "1"}, {"kv-dtypes", "auto"}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  std::vector<std::optional<DType>> kv_dtypes;
  for (absl::string_view name : absl::StrSplit(flags["kv-dtypes"], ',')) {
    auto d = ParseKvDType(name);
    if (!d.ok()) {
      std::cerr << "--kv-dtypes: " << d.status().message() << "\n";
      return 2;
    }
    kv_dtypes.push_back(*d);
  }
  nlohmann::json all = nlohmann::json::array();
  auto run = [&](std::optional<DType> kv_dtype) -> int {
    ModelOptions mo;
    mo.kv_dtype = kv_dtype;
    auto model = Model::Load(flags["model"], mo);
    if (!model.ok()) {
      std::cerr << model.status() << "\n";
      return 1;
    }
    const Model& m = **model;
    std::cout << "KV dtype " << DTypeName(m.kv_dtype()) << "\n";
    if (absl::Status s = m.tokenizer().CheckHandlesText("engine_bench"); !s.ok()) {
      std::cerr << s.message() << "\n";
      return 1;
    }
    // Every number is checked before anything runs: a bad one exits naming it.
    const int tokens = static_cast<int>(Int(flags, "tokens", 1, m.config().max_position_embeddings - 2));
    // 0 or auto: the adaptive window; plain (-1): no drafts, decoding from the staged full KV.
    const int draft_window = flags["draft-window"] == "auto"    ? 0
                             : flags["draft-window"] == "plain" ? -1
                                                                : static_cast<int>(Int(flags, "draft-window", 0, 64));
    const int64_t round_count = Int(flags, "rounds", 1, 1000);
    const std::vector<int64_t> contexts = Ints(flags, "contexts", 2, m.config().max_position_embeddings - tokens);
    const std::vector<int64_t> batches = Ints(flags, "batches", 1, 1024);
    const std::vector<int64_t> link_ratios = Ints(flags, "link-ratios", 0, 1000000);
    const int64_t budget = Int(flags, "budget-mib", 0, bench::kMaxMiB) << 20;
    const int64_t budget_context =
        budget > 0 ? Int(flags, "budget-context", 2, m.config().max_position_embeddings - tokens) : 0;
    std::set<std::string> modes;
    for (absl::string_view s : absl::StrSplit(flags["modes"], ',')) {
      if (s != "full" && s != "offload" && s != "lossy" && s != "vericache" && s != "resident") {
        std::cerr << "--modes '" << flags["modes"] << "': expected some of full,offload,lossy,vericache,resident\n";
        return 2;
      }
      modes.insert(std::string(s));
    }
    const double bw = bench::MeasureMemcpyBandwidth();
    std::cout << absl::StrFormat("memcpy bandwidth %.2f GB/s; compressor %s; draft window %s; %d tokens per sequence\n",
                                 bw / 1e9, flags["compressor"], draft_window > 0 ? std::to_string(draft_window) : draft_window < 0 ? "plain" : "auto",
                                 tokens);
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    const int64_t max_context = std::max(*std::max_element(contexts.begin(), contexts.end()), budget > 0 ? budget_context : 0);
    const std::string corpus = LoadCorpus(flags["corpus"], static_cast<size_t>(max_context * (max_batch + 1)));
    if (static_cast<int64_t>(corpus.size()) < max_context) {
      std::cerr << "--corpus " << flags["corpus"] << ": " << corpus.size() << " bytes of .py files, less than a context of "
                << max_context << "\n";
      return 2;
    }
    auto probe = MakeCompressedKvCache(flags["compressor"], m.kv_layout(16), m.config().num_heads);
    if (!probe.ok()) {
      std::cerr << probe.status().message() << "\n";
      return 2;
    }
    // Compressors that choose what to keep from the prompt's last queries (SnapKV) get them recorded
    // at the shared prefill.
    const int64_t query_window = (*probe)->prompt_query_window();

    std::cout << "| context | batch | link | mode | tokens/s | ms/token/seq | bytes read/token | speedup vs full | "
                 "speedup vs offload | identical to full | notes |\n|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|\n";
    for (int64_t ctx : contexts) {
      // Distinct prompts (one per sequence of the largest batch), each prefilled once.
      std::vector<std::vector<int32_t>> prompts;
      for (int64_t b = 0; b < max_batch; ++b) {
        const size_t start = static_cast<size_t>(b * ctx) % std::max<size_t>(1, corpus.size() - ctx);
        prompts.push_back(m.tokenizer().Encode(corpus.substr(start, static_cast<size_t>(ctx - 1))));
      }
      const KvLayout layout = m.kv_layout(16);
      PagedKvCache master(layout, max_batch * (ctx / 16 + 2));
      std::vector<SeqId> src;
      std::vector<PromptQueries> queries;
      const absl::Time p0 = absl::Now();
      for (const auto& p : prompts) {
        const SeqId s = master.NewSequence();
        auto q = PrefillPrompt(m, p, s, master, query_window);
        if (!q.ok()) {
          std::cerr << q.status() << "\n";
          return 1;
        }
        src.push_back(s);
        queries.push_back(*std::move(q));
      }
      std::cerr << absl::StrFormat("context %d: prefilled %d prompts in %.1f s\n", ctx, prompts.size(),
                                   absl::ToDoubleSeconds(absl::Now() - p0));
      for (int64_t batch : batches) {
        std::vector<std::vector<int32_t>> bp(prompts.begin(), prompts.begin() + batch);
        std::vector<SeqId> bs(src.begin(), src.begin() + batch);
        std::vector<std::vector<ModeResult>> rounds(static_cast<size_t>(round_count));
        for (std::vector<ModeResult>& round : rounds) {
          if (modes.count("full")) round.push_back(RunFull(m, master, bs, bp, tokens));
          if (modes.count("lossy")) round.push_back(RunLossy(m, master, bs, queries, bp, tokens, flags["compressor"]));
          if (modes.count("resident")) {
            round.push_back(
                RunVeriCache(m, master, bs, queries, bp, tokens, flags["compressor"], draft_window, 0.0, 0, true));
          }
        }
        std::vector<ModeResult> local;
        if (!MedianRounds(rounds, &local)) {
          std::cerr << "EXACTNESS FAILURE: a mode's output differs between rounds\n";
          return 3;
        }
        for (int64_t ratio : link_ratios) {
          const double link = ratio > 0 ? bw / ratio : 0.0;
          std::vector<ModeResult> linked;
          if (modes.count("offload")) linked.push_back(RunOffload(m, master, bs, bp, tokens, link));
          if (modes.count("vericache")) {
            linked.push_back(RunVeriCache(m, master, bs, queries, bp, tokens, flags["compressor"], draft_window, link));
          }
          const std::string link_name = ratio > 0 ? absl::StrFormat("1/%d", ratio) : "unpaced";
          std::vector<ModeResult*> rows;
          for (auto& r : local) rows.push_back(&r);
          for (auto& r : linked) rows.push_back(&r);
          const ModeResult* full = nullptr;
          const ModeResult* offload = nullptr;
          for (auto* r : rows) {
            if (r->mode == "full") full = r;
            if (r->mode == "offload") offload = r;
          }
          for (auto* r : rows) {
            const bool linked_mode = r->mode == "offload" || r->mode == "vericache";
            if (!linked_mode && ratio != link_ratios.front()) continue;  // print once
            const double tps = Rate(*r);
            std::string identical = "-";
            if (full != nullptr && r != full) {
              int same = 0;
              for (size_t i = 0; i < r->outputs.size(); ++i) same += r->outputs[i] == full->outputs[i];
              identical = absl::StrFormat("%d/%d", same, r->outputs.size());
              if (absl::StartsWith(r->mode, "vericache") && same != static_cast<int>(r->outputs.size())) {
                std::cerr << "EXACTNESS FAILURE: vericache output differs from full-KV decoding\n";
                return 3;
              }
            }
            const double vs_full = r->rounds_vs_full > 0 ? r->rounds_vs_full : full ? tps / Rate(*full) : 0;
            const double vs_off = offload ? tps / Rate(*offload) : 0;
            std::cout << absl::StrFormat("| %d | %d | %s | %s | %.1f | %.2f | %.0f | %.2f | %s | %s | %s |\n", ctx, batch,
                                         linked_mode ? link_name : "-", r->mode, tps, 1e3 * r->decode_seconds / tokens,
                                         r->bytes_read / r->tokens, vs_full,
                                         linked_mode && offload ? absl::StrFormat("%.2f", vs_off) : "-", identical,
                                         r->extra.is_null() ? "" : r->extra.dump());
            std::cout.flush();
            nlohmann::json j = {{"context", ctx}, {"batch", batch}, {"link_ratio", linked_mode ? ratio : 0},
                                {"mode", r->mode}, {"tokens_per_s", tps}, {"bytes_per_token", r->bytes_read / r->tokens},
                                {"identical", identical}, {"extra", r->extra}, {"memcpy_gbps", bw / 1e9}};
            all.push_back(j);
          }
        }
      }
    }
    // A fixed worker memory budget for KV: the full-KV decoder fits as many sequences as their full
    // KV allows; VeriCache fits compressed copies plus staging for one sequence's full KV (the one
    // being verified), so its batch is larger. Both run at the same context with their own batch.
    if (budget > 0) {
      const int64_t ctx = budget_context;
      const KvLayout layout = m.kv_layout(16);
      const int64_t full_seq = (ctx + tokens + 16) * layout.bytes_per_token();
      // Compressed bytes per sequence, measured on one sequence built from real KV.
      std::vector<int32_t> prompt = m.tokenizer().Encode(corpus.substr(0, static_cast<size_t>(ctx - 1)));
      PagedKvCache one(layout, ctx / 16 + 2);
      const SeqId s0 = one.NewSequence();
      auto q0 = PrefillPrompt(m, prompt, s0, one, query_window);
      if (!q0.ok()) {
        std::cerr << q0.status() << "\n";
        return 1;
      }
      const SeqId c0 = (*probe)->NewSequence();
      if (absl::Status st = (*probe)->BuildFrom(c0, one, s0, static_cast<int64_t>(prompt.size()) - 1, RecordedQueries(*q0));
          !st.ok()) {
        std::cerr << st << "\n";
        return 1;
      }
      const int64_t comp_seq = (*probe)->Bytes(c0) * (ctx + tokens) / ctx + 1;
      const int64_t batch_full = budget / full_seq;
      const int64_t batch_vc = std::max<int64_t>(0, (budget - full_seq) / comp_seq);
      std::cout << absl::StrFormat("\nmemory budget %d MiB at context %d: full KV %.1f MiB/sequence -> batch %d; "
                                   "compressed %.2f MiB/sequence + one staging sequence -> batch %d\n",
                                   budget >> 20, ctx, full_seq / 1048576.0, batch_full, comp_seq / 1048576.0, batch_vc);
      if (batch_full >= 1 && batch_vc >= 1) {
        std::vector<std::vector<int32_t>> prompts;
        PagedKvCache master(layout, batch_vc * (ctx / 16 + 2));
        std::vector<SeqId> src;
        for (int64_t b = 0; b < batch_vc; ++b) {
          // One real prefill, copied: each sequence holds its own KV, identical content.
          const SeqId sq = master.NewSequence();
          if (!master.Reserve(sq, static_cast<int64_t>(prompt.size()) - 1).ok()) return 1;
          one.CopyTo(s0, 0, static_cast<int64_t>(prompt.size()) - 1, master, sq);
          master.Commit(sq, static_cast<int64_t>(prompt.size()) - 1);
          src.push_back(sq);
          prompts.push_back(prompt);
        }
        const std::vector<PromptQueries> queries(static_cast<size_t>(batch_vc), *q0);
        std::vector<std::vector<int32_t>> pf(prompts.begin(), prompts.begin() + batch_full);
        std::vector<SeqId> sf(src.begin(), src.begin() + batch_full);
        ModeResult full = RunFull(m, master, sf, pf, tokens);
        const int64_t staging = full_seq / (layout.bytes_per_token() * 16) + 1;
        for (int64_t ratio : link_ratios) {
          const double link = ratio > 0 ? bw / ratio : 0.0;
          ModeResult vcr =
              RunVeriCache(m, master, src, queries, prompts, tokens, flags["compressor"], draft_window, link, staging);
          for (size_t i = 0; i < vcr.outputs.size(); ++i) {
            if (vcr.outputs[i] != full.outputs[0]) {
              std::cerr << "EXACTNESS FAILURE under the memory budget\n";
              return 3;
            }
          }
          const double tf = Rate(full), tv = Rate(vcr);
          std::cout << absl::StrFormat("budget run, link %s: full batch %d %.1f tokens/s; vericache batch %d %.1f "
                                       "tokens/s (%.2fx), outputs identical\n",
                                       ratio > 0 ? absl::StrFormat("1/%d", ratio) : "unpaced", batch_full, tf, batch_vc,
                                       tv, tv / tf);
          all.push_back({{"budget_mib", budget >> 20}, {"context", ctx}, {"link_ratio", ratio},
                         {"full_batch", batch_full}, {"full_tokens_per_s", tf}, {"vericache_batch", batch_vc},
                         {"vericache_tokens_per_s", tv}});
        }
      }
    }
    return 0;
  };
  for (const std::optional<DType>& kv_dtype : kv_dtypes) {
    const size_t before = all.size();
    if (const int rc = run(kv_dtype); rc != 0) return rc;
    for (size_t i = before; i < all.size(); ++i) {
      all[i]["kv_dtype"] = kv_dtype ? std::string(DTypeName(*kv_dtype)) : std::string("auto");
    }
  }
  if (!flags["json"].empty()) std::ofstream(flags["json"]) << all.dump(1) << "\n";
  return 0;
}
