// Replays request arrivals that share prefixes (a window of Mooncake's conversation trace) through
// the real services in one process on loopback: a cache store (RocksDB + UCX) and a worker (engines
// + gRPC Inference service). Three modes see the same arrivals, each with a fresh store and worker:
//
//   recompute  a worker without a store, MODE_FULL: every prompt is prefilled in full
//   fetch      MODE_FULL with a warm store: the prefix's full KV is read into worker memory first
//   vericache  MODE_VERICACHE with a warm store: drafts from the worker's compressed prefix while
//              the full KV streams in for verification
//
// "Warm" means each distinct prefix was sent once, untimed, through the same worker before the
// replay, as earlier turns of the conversations would have left it in a real cluster. With
// --fresh-worker 1 another worker serves the replay: it holds no compressed prefixes of its own
// and reads the store's compressed variants instead. With --workers N > 1, N workers serve behind a
// router (services/router_service.h) with --router-policy; its counts of the replay (the warm-up's
// left out) follow the table. With --edit-at F (0 < F < 1) each replayed prompt differs from the
// prefix the warm-up sent from F of that prefix's length on (one byte changed there, as an edit
// inside a file would): the store and the worker's compressed prefixes hold only its first blocks.
//
//   prefix_bench --model models/vc-code-4m --requests 12 --block-tokens 512 --max-prompt-tokens 8192 --max-tokens 32
//                --time-scale 4 [--link-mb-per-s 0] [--keep-staged 1] [--fresh-worker 0] [--stored-compressed 0]
//                [--workers 1] [--router-policy prefix|least-loaded|round-robin] [--edit-at 0]
//                [--modes recompute,fetch,vericache] [--check all|N] --json benchmarks/results/prefix.json --md benchmarks/results/prefix.md
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/flags.h"
#include "cachestore/tier_replay.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/inference_client.h"
#include "services/servers.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc {
namespace {

using bench::Double;
using bench::Int;

// A trace request and its arrival after the window's first request, time-scaled.
struct TraceRequest : cachestore::TraceRequest {
  double arrival_s = 0;
};

struct Request {
  TraceRequest trace;
  std::vector<int32_t> prompt;
  std::vector<int32_t> prefix;  // every hash block but the last: what earlier turns left in the store
  int max_tokens = 0;
};

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, int first, int count, double time_scale) {
  VC_ASSIGN_OR_RETURN(const std::vector<cachestore::TraceRequest> read, cachestore::ReadMooncakeTrace(path, first, count));
  std::vector<TraceRequest> out;
  for (const cachestore::TraceRequest& t : read) {
    TraceRequest r;
    static_cast<cachestore::TraceRequest&>(r) = t;
    r.arrival_s = (t.timestamp_ms - read.front().timestamp_ms) / 1e3 / time_scale;
    out.push_back(std::move(r));
  }
  return out;
}

// The test model's training corpus: the standard library's Python files, concatenated.
absl::StatusOr<std::string> LoadCorpus(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
  }
  if (ec || files.empty()) return absl::NotFoundError(absl::StrCat("no .py files in ", dir));
  std::sort(files.begin(), files.end());
  std::string corpus;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus += ss.str();
  }
  return corpus;
}

// Hash id h -> the corpus's h-th block of `block_bytes` (wrapping): equal ids give equal text.
std::string BlockText(const std::string& corpus, int64_t id, int64_t block_bytes) {
  const int64_t blocks = static_cast<int64_t>(corpus.size()) / block_bytes;
  return corpus.substr(static_cast<size_t>((id % blocks) * block_bytes), static_cast<size_t>(block_bytes));
}

struct Outcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  double ttft_s = 0, total_s = 0, end_s = 0;  // end_s: from the replay's start
  vericache::v1::GenerateStats stats;
};

struct ModeRun {
  std::string name;
  std::vector<Outcome> outcomes;
  double makespan_s = 0;
  double warmup_s = 0;
  std::optional<vericache::v1::RouterStats> router;  // with --workers > 1: the replay's counts
};

struct Mode {
  std::string name;
  bool with_store;
  vericache::v1::Mode mode;
};

vericache::v1::GenerateRequest MakeRequest(const std::vector<int32_t>& prompt, int max_tokens, vericache::v1::Mode mode) {
  vericache::v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  req.set_max_tokens(static_cast<uint32_t>(max_tokens));
  req.set_ignore_eos(true);
  req.set_mode(mode);
  return req;
}

// The stores of a run: `shards` of them, blocks on `replicas` each; `down` of them are stopped
// once the store is warm, before the replay.
struct StoreSetup {
  int shards = 1, replicas = 1, down = 0;
  // > 1: that many workers behind a router with this policy, which every request goes through
  // (the warm-up's included).
  int workers = 1;
  std::string policy = "prefix";
};

absl::StatusOr<ModeRun> RunMode(const Mode& mode, const std::vector<Request>& requests, WorkerServerOptions wo,
                                const std::string& tmp_root, bool fresh_worker, const StoreSetup& setup) {
  const std::string tmp = absl::StrCat(tmp_root, "/", mode.name);
  std::filesystem::create_directories(tmp);
  std::vector<std::unique_ptr<StoreServer>> stores;
  if (mode.with_store) {
    std::vector<std::string> targets;
    for (int i = 0; i < setup.shards; ++i) {
      StoreServerOptions so;
      so.store.ram.capacity_bytes = uint64_t{1} << 30;
      so.store.disk.path = absl::StrCat(tmp, "/store", i);
      so.store.disk.capacity_bytes = uint64_t{4} << 30;
      so.service.tokens = {{"bench-token", "bench"}};
      so.ucx = wo.ucx;
      VC_ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> store, StoreServer::Start(so));
      targets.push_back(store->target());
      stores.push_back(std::move(store));
    }
    wo.store_target = absl::StrJoin(targets, ",");
    wo.store_replicas = setup.replicas;
    wo.store_token = "bench-token";
  }
  std::vector<std::unique_ptr<WorkerServer>> workers;
  for (int i = 0; i < setup.workers; ++i) {
    VC_ASSIGN_OR_RETURN(std::unique_ptr<WorkerServer> w, WorkerServer::Start(wo));
    workers.push_back(std::move(w));
  }
  std::unique_ptr<RouterServer> router;
  std::string target = workers[0]->target();
  if (setup.workers > 1) {
    RouterServerOptions ro;
    for (const auto& w : workers) ro.service.workers += (ro.service.workers.empty() ? "" : ",") + w->target();
    ro.service.policy = setup.policy;
    VC_ASSIGN_OR_RETURN(router, RouterServer::Start(ro));
    if (!router->service().WaitServing(setup.workers, absl::Seconds(30))) {
      return absl::UnavailableError("the router's workers did not all serve within 30 s");
    }
    target = router->target();
  }
  ModeRun run;
  run.name = mode.name;

  if (mode.with_store) {
    // Warm the store (and the workers' compressed prefixes) with each distinct prefix, untimed.
    const absl::Time w0 = absl::Now();
    std::set<std::vector<int32_t>> seen;
    for (const Request& r : requests) {
      if (r.prefix.size() < static_cast<size_t>(wo.block_tokens) || !seen.insert(r.prefix).second) continue;
      GenerateReply g = CallGenerate(*InferenceStub(target), MakeRequest(r.prefix, 1, vericache::v1::MODE_VERICACHE));
      VC_RETURN_IF_ERROR(g.status);
    }
    for (const auto& w : workers) w->prefixes()->Flush();
    run.warmup_s = absl::ToDoubleSeconds(absl::Now() - w0);
    for (int i = 0; i < setup.down; ++i) stores[i].reset();
    if (fresh_worker) {
      // Another worker serves the replay: the prefixes are in the store only, full and compressed.
      workers[0].reset();
      VC_ASSIGN_OR_RETURN(workers[0], WorkerServer::Start(wo));
      target = workers[0]->target();
    }
  }

  vericache::v1::RouterStats before;  // the warm-up's counts, taken off the replay's
  if (router != nullptr) router->service().CurrentStats(&before);
  run.outcomes.resize(requests.size());
  const absl::Time start = absl::Now();
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      absl::SleepFor(start + absl::Seconds(requests[i].trace.arrival_s) - absl::Now());
      auto own_stub = InferenceStub(target);
      GenerateReply g = CallGenerate(*own_stub, MakeRequest(requests[i].prompt, requests[i].max_tokens, mode.mode));
      Outcome& o = run.outcomes[i];
      o.end_s = absl::ToDoubleSeconds(absl::Now() - start);
      o.status = g.status;
      o.tokens = std::move(g.tokens);
      o.ttft_s = g.first_token_seconds;
      o.total_s = g.total_seconds;
      o.stats = g.stats;
    });
  }
  for (auto& t : clients) t.join();
  for (const Outcome& o : run.outcomes) run.makespan_s = std::max(run.makespan_s, o.end_s);
  for (const Outcome& o : run.outcomes) VC_RETURN_IF_ERROR(o.status);
  if (router != nullptr) {
    vericache::v1::RouterStats rs;
    router->service().CurrentStats(&rs);
    rs.set_requests_routed(rs.requests_routed() - before.requests_routed());
    rs.set_prefix_routed(rs.prefix_routed() - before.prefix_routed());
    rs.set_prefix_blocks_matched(rs.prefix_blocks_matched() - before.prefix_blocks_matched());
    rs.set_load_spills(rs.load_spills() - before.load_spills());
    for (int i = 0; i < rs.workers_size(); ++i) {
      rs.mutable_workers(i)->set_requests_routed(rs.workers(i).requests_routed() - before.workers(i).requests_routed());
    }
    run.router = rs;
  }
  return run;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

absl::Status Main(std::map<std::string, std::string> flags) {
  // Every number is checked before anything starts: a bad one exits naming it.
  const int64_t n = Int(flags, "requests", 1, 1 << 20);
  const int64_t block_tokens = Int(flags, "block-tokens", 1, 1 << 20);  // tokens per 512-token trace block
  const int64_t max_tokens_cap = Int(flags, "max-tokens", 1, 1 << 20);
  const int64_t max_prompt_tokens = Int(flags, "max-prompt-tokens", 1, 1 << 30);
  // Requests checked against sequential full-KV decoding (all of them unless given).
  const int64_t check = flags["check"] == "all" ? n : Int(flags, "check", 0, 1 << 20);
  const double time_scale = Double(flags, "time-scale", 1e-6, 1e6);  // 0 would put arrivals at infinity
  const double edit_at = Double(flags, "edit-at", 0, 1);
  if (edit_at >= 1) return absl::InvalidArgumentError("--edit-at must be in [0, 1)");
  const int64_t first = Int(flags, "first", 0, INT32_MAX - (1 << 20));
  const int64_t link_mb_per_s = Int(flags, "link-mb-per-s", 0, int64_t{1} << 40);
  const bool keep_staged = Int(flags, "keep-staged", 0, 1) != 0;
  const bool fresh_worker = Int(flags, "fresh-worker", 0, 1) != 0;
  const bool stored_compressed = Int(flags, "stored-compressed", 0, 1) != 0;
  StoreSetup setup;
  setup.shards = static_cast<int>(Int(flags, "shards", 1, 1024));
  setup.replicas = static_cast<int>(Int(flags, "replicas", 1, setup.shards));
  setup.down = static_cast<int>(Int(flags, "down-shards", 0, setup.shards - 1));
  setup.workers = static_cast<int>(Int(flags, "workers", 1, kMaxRouterWorkers));
  setup.policy = flags["router-policy"];
  if (setup.workers > 1 && fresh_worker) {
    return absl::InvalidArgumentError("--fresh-worker 1 needs --workers 1");
  }
  for (absl::string_view m : absl::StrSplit(flags["modes"], ',')) {
    if (m != "recompute" && m != "fetch" && m != "vericache") {
      return absl::InvalidArgumentError(
          absl::StrCat("--modes '", flags["modes"], "': expected some of recompute,fetch,vericache"));
    }
  }
  VC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(flags["model"]));
  VC_RETURN_IF_ERROR(model->tokenizer().CheckHandlesText("prefix_bench"));
  const int64_t context = model->config().max_position_embeddings;
  VC_ASSIGN_OR_RETURN(std::vector<TraceRequest> trace,
                      ReadTrace(flags["trace"], static_cast<int>(first), static_cast<int>(n), time_scale));
  VC_ASSIGN_OR_RETURN(std::string corpus, LoadCorpus(flags["corpus"]));
  if (static_cast<int64_t>(corpus.size()) < block_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-tokens ", block_tokens, " is more than the corpus holds (", corpus.size(), " bytes)"));
  }

  // Prompts: the request's hash blocks as corpus text, cut at its (scaled) input length.
  std::vector<Request> requests;
  int64_t prompt_tokens = 0, prefix_tokens = 0, max_prompt = 0, capped = 0;
  std::map<int64_t, int> id_uses;
  for (const TraceRequest& t : trace) {
    Request r;
    r.trace = t;
    // Longer conversations keep their first blocks and their last (the new turn) within the cap.
    const size_t keep = static_cast<size_t>(std::max<int64_t>(2, max_prompt_tokens / block_tokens));
    int64_t input_tokens = t.input_length * block_tokens / 512;
    if (r.trace.hash_ids.size() > keep) {
      const int64_t last = r.trace.hash_ids.back();
      input_tokens -= static_cast<int64_t>(r.trace.hash_ids.size() - keep) * block_tokens;
      r.trace.hash_ids.resize(keep - 1);
      r.trace.hash_ids.push_back(last);
      ++capped;
    }
    std::string text;
    for (int64_t id : r.trace.hash_ids) text += BlockText(corpus, id, block_tokens);
    text.resize(std::min<size_t>(text.size(), static_cast<size_t>(input_tokens)));
    std::string prefix_text = text.substr(0, (r.trace.hash_ids.size() - 1) * static_cast<size_t>(block_tokens));
    r.max_tokens = static_cast<int>(std::min(t.output_length, max_tokens_cap));
    r.max_tokens = std::max(r.max_tokens, 1);
    r.prompt = model->tokenizer().Encode(text);
    if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > context) {
      return absl::InvalidArgumentError(absl::StrCat("a prompt of ", r.prompt.size(), " tokens exceeds the context ", context,
                                                     ": lower --block-tokens"));
    }
    r.prefix = model->tokenizer().Encode(prefix_text);
    if (edit_at > 0) {
      // Token 0 is BOS; the edit changes one byte of the text after it.
      const size_t at = std::max<size_t>(1, static_cast<size_t>(edit_at * static_cast<double>(r.prefix.size())));
      if (at < r.prompt.size()) r.prompt[at] = (r.prompt[at] + 1) % 256;
    }
    for (int64_t id : r.trace.hash_ids) id_uses[id]++;
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    prefix_tokens += static_cast<int64_t>(r.prefix.size());
    max_prompt = std::max<int64_t>(max_prompt, static_cast<int64_t>(r.prompt.size()) + r.max_tokens);
    requests.push_back(std::move(r));
  }
  int64_t shared_ids = 0;
  for (const auto& [id, uses] : id_uses) shared_ids += uses > 1;

  // Worker memory: full KV for about a quarter of the requests' prompts (at least the largest),
  // the same for VeriCache's staging, and room for every compressed prefix.
  const int64_t kv_bytes_per_token = model->kv_layout(16).bytes_per_token();
  const int64_t budget = std::max(kv_bytes_per_token * (prompt_tokens / 4), kv_bytes_per_token * (max_prompt + 64));
  WorkerServerOptions wo;
  wo.model_dir = flags["model"];
  wo.ucx = flags["ucx"];
  // A paced link for every full-KV read (store prefix and the worker's host copy); 0: loopback.
  wo.fetch_bytes_per_second = 1e6 * static_cast<double>(link_mb_per_s);
  wo.service.engine.keep_staged = keep_staged;
  wo.service.engine.stored_compressed_prefixes = stored_compressed;
  wo.full_kv_bytes = budget;
  wo.staging_bytes = budget;
  wo.prefix_cache_bytes = kv_bytes_per_token * prompt_tokens;  // the compressed copies take ~1/5 of it
  wo.service.max_requests = static_cast<int>(4 * n);

  std::cout << absl::StrFormat(
      "trace %s, requests %d-%d; one 512-token trace block -> %d tokens (context %d); %d prompts capped at %d "
      "tokens (their first blocks and their last)\n"
      "prompts: %d tokens in all (mean %.0f, max %d incl. output); prefixes (all blocks but the last): %d tokens; "
      "%d distinct hash ids, %d of them used by more than one request\n"
      "arrivals over %.2f s (trace time / %.1f); outputs min(output_length, %d) tokens, ignore_eos\n"
      "KV %d bytes/token; worker budget: full KV %.1f MiB, staging %.1f MiB, prefix cache %.1f MiB; UCX %s\n",
      flags["trace"], first, first + n - 1, block_tokens, context, capped, max_prompt_tokens, prompt_tokens,
      static_cast<double>(prompt_tokens) / static_cast<double>(requests.size()), max_prompt, prefix_tokens,
      id_uses.size(), shared_ids, requests.back().trace.arrival_s, time_scale, max_tokens_cap, kv_bytes_per_token,
      budget / 1048576.0, budget / 1048576.0, wo.prefix_cache_bytes / 1048576.0, wo.ucx);
  if (edit_at > 0) {
    std::cout << absl::StrFormat("replayed prompts differ from their warm-up prefix from %.2f of its length on\n",
                                 edit_at);
  }

  // References: sequential full-KV decoding for the first `check` requests.
  std::vector<std::vector<int32_t>> want;
  // (The trace may hold fewer requests than --requests asked for.)
  for (int64_t i = 0; i < std::min<int64_t>(check, static_cast<int64_t>(requests.size())); ++i) {
    GenerateOptions go;
    go.max_tokens = requests[i].max_tokens;
    go.stop_at_eos = false;
    VC_ASSIGN_OR_RETURN(GenerateResult g, GenerateFull(*model, requests[i].prompt, go));
    want.push_back(std::move(g.tokens));
  }

  char tmpl[] = "/tmp/prefix-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpl};

  const std::vector<Mode> modes = {{"recompute", false, vericache::v1::MODE_FULL},
                                   {"fetch", true, vericache::v1::MODE_FULL},
                                   {"vericache", true, vericache::v1::MODE_VERICACHE}};
  std::set<std::string> wanted;
  for (absl::string_view m : absl::StrSplit(flags.at("modes"), ',')) wanted.insert(std::string(m));
  std::vector<ModeRun> runs;
  for (const Mode& m : modes) {
    if (!wanted.count(m.name)) continue;
    std::cout << "running " << m.name << "..." << std::endl;
    VC_ASSIGN_OR_RETURN(ModeRun r, RunMode(m, requests, wo, tmpl, fresh_worker, setup));
    runs.push_back(std::move(r));
  }

  // Correctness: recompute against GenerateFull for the first `check`; every mode against recompute.
  nlohmann::json rows = nlohmann::json::array();
  std::ostringstream md;
  if (setup.shards > 1) {
    md << absl::StrFormat("store: %d shards, %d replicas of each block, %d stopped after the warm-up\n\n", setup.shards,
                          setup.replicas, setup.down);
  }
  if (setup.workers > 1) {
    md << absl::StrFormat("%d workers behind a router, policy %s\n\n", setup.workers, setup.policy);
  }
  md << absl::StrFormat("| mode | TTFT mean (ms) | TTFT p50 (ms) | TTFT p90 (ms) | complete mean (ms) | tokens/s | "
                        "makespan (s) | warm-up (s) | queue mean (ms) | prefix from store (tokens) | compressed prefix reused (tokens) | "
                        "compressed prefix from store (tokens) | drafted | accepted | identical |\n"
                        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  std::map<std::string, double> ttft_mean, tput;
  bool all_identical = true;
  std::ostringstream router_md;  // after the table
  for (const ModeRun& r : runs) {
    std::vector<double> ttft;
    double total = 0;
    int64_t tokens = 0, store_tokens = 0, compressed_tokens = 0, cstore_tokens = 0, drafted = 0, accepted = 0;
    double queue = 0;
    // Outputs past --check are compared with the first mode's; the first mode's own are not checked.
    int identical = 0, checked = 0;
    for (size_t i = 0; i < r.outcomes.size(); ++i) {
      const Outcome& o = r.outcomes[i];
      ttft.push_back(o.ttft_s);
      total += o.total_s;
      tokens += static_cast<int64_t>(o.tokens.size());
      store_tokens += o.stats.prefix_store_tokens();
      compressed_tokens += o.stats.prefix_compressed_tokens();
      cstore_tokens += o.stats.prefix_compressed_store_tokens();
      queue += o.stats.queue_micros() / 1e6;
      drafted += o.stats.drafted_tokens();
      accepted += o.stats.accepted_drafts();
      if (i >= want.size() && &r == &runs[0]) continue;
      ++checked;
      identical += i < want.size() ? o.tokens == want[i] : o.tokens == runs[0].outcomes[i].tokens;
    }
    all_identical &= identical == checked;
    double mean = 0;
    for (double t : ttft) mean += t;
    mean /= static_cast<double>(ttft.size());
    ttft_mean[r.name] = mean;
    tput[r.name] = static_cast<double>(tokens) / r.makespan_s;
    const int unchecked = static_cast<int>(r.outcomes.size()) - checked;
    const std::string id =
        absl::StrCat(identical, "/", checked, unchecked > 0 ? absl::StrCat(" (", unchecked, " not checked)") : "");
    const double count = static_cast<double>(r.outcomes.size());
    md << absl::StrFormat("| %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.2f | %.1f | %.0f | %d | %d | %d | %d | %d | %s |\n", r.name,
                          1e3 * mean,
                          1e3 * Percentile(ttft, 0.5), 1e3 * Percentile(ttft, 0.9),
                          1e3 * total / count, tput[r.name], r.makespan_s, r.warmup_s, 1e3 * queue / count, store_tokens,
                          compressed_tokens, cstore_tokens, drafted, accepted, id);
    nlohmann::json per = nlohmann::json::array();
    for (size_t i = 0; i < r.outcomes.size(); ++i) {
      const Outcome& o = r.outcomes[i];
      per.push_back({{"arrival_s", requests[i].trace.arrival_s}, {"prompt_tokens", requests[i].prompt.size()},
                     {"prefix_tokens", requests[i].prefix.size()}, {"ttft_s", o.ttft_s}, {"total_s", o.total_s},
                     {"tokens", o.tokens.size()}, {"prefix_store_tokens", o.stats.prefix_store_tokens()},
                     {"prefix_compressed_tokens", o.stats.prefix_compressed_tokens()},
                     {"prefix_compressed_store_tokens", o.stats.prefix_compressed_store_tokens()},
                     {"queue_ms", o.stats.queue_micros() / 1e3}, {"prefill_ms", o.stats.prefill_micros() / 1e3},
                     {"draft_ms", o.stats.draft_micros() / 1e3}, {"verify_ms", o.stats.verify_micros() / 1e3},
                     {"fetch_wait_ms", o.stats.fetch_wait_micros() / 1e3}});
    }
    rows.push_back({{"mode", r.name}, {"ttft_mean_s", mean}, {"ttft_p50_s", Percentile(ttft, 0.5)},
                    {"ttft_p90_s", Percentile(ttft, 0.9)}, {"complete_mean_s", total / static_cast<double>(r.outcomes.size())},
                    {"tokens_per_s", tput[r.name]}, {"makespan_s", r.makespan_s}, {"warmup_s", r.warmup_s},
                    {"generated_tokens", tokens}, {"queue_mean_s", queue / count}, {"prefix_store_tokens", store_tokens},
                    {"prefix_compressed_tokens", compressed_tokens},
                    {"prefix_compressed_store_tokens", cstore_tokens}, {"drafted", drafted},
                    {"accepted", accepted}, {"identical", identical}, {"checked", checked}, {"requests", per}});
    if (r.router.has_value()) {
      const vericache::v1::RouterStats& rs = *r.router;
      std::vector<uint64_t> spread;
      for (const auto& w : rs.workers()) spread.push_back(w.requests_routed());
      if (router_md.tellp() == 0) router_md << "\n";
      router_md << absl::StrFormat(
          "router (%s): %d routed, %d to a worker that served their leading blocks (%d blocks), %d passed to a "
          "less busy one; requests per worker: %s\n",
          r.name, rs.requests_routed(), rs.prefix_routed(), rs.prefix_blocks_matched(), rs.load_spills(),
          absl::StrJoin(spread, ", "));
      rows.back()["router"] = {{"routed", rs.requests_routed()}, {"prefix_routed", rs.prefix_routed()},
                               {"prefix_blocks_matched", rs.prefix_blocks_matched()}, {"load_spills", rs.load_spills()},
                               {"per_worker", spread}};
    }
  }
  md << router_md.str() << "\n";
  // Ratios of modes that ran (0 otherwise).
  auto ratio = [](std::map<std::string, double>& m, const char* a, const char* b) {
    return m.count(a) && m.count(b) ? m[a] / m[b] : 0.0;
  };
  const double r_cb = ratio(ttft_mean, "vericache", "fetch"), r_ca = ratio(ttft_mean, "vericache", "recompute");
  const double t_cb = ratio(tput, "vericache", "fetch");
  if (r_cb > 0) {
    md << absl::StrFormat("TTFT(vericache)/TTFT(fetch) = %.2f (target <= 1.1: %s); throughput(vericache)/"
                          "throughput(fetch) = %.2f (target >= 1.5: %s)\n",
                          r_cb, r_cb <= 1.1 ? "met" : "missed", t_cb, t_cb >= 1.5 ? "met" : "missed");
  }
  if (r_ca > 0) {
    md << absl::StrFormat("TTFT(vericache)/TTFT(recompute) = %.2f (target < 0.33: %s)\n", r_ca,
                          r_ca < 1.0 / 3 ? "met" : "missed");
  }
  if (want.size() == requests.size()) {
    md << absl::StrFormat("identical: every output checked against sequential GenerateFull; %s\n",
                          all_identical ? "all identical" : "OUTPUTS DIFFER");
  } else {
    md << absl::StrFormat("identical: outputs checked against sequential GenerateFull for the first %d requests, every "
                          "other output against the first mode's (%s, whose own are then not checked); %s\n",
                          want.size(), runs.front().name, all_identical ? "all checked identical" : "OUTPUTS DIFFER");
  }
  std::cout << "\n" << md.str();

  nlohmann::json all = {{"trace", flags["trace"]},
                        {"first", first},
                        {"requests", n},
                        {"block_tokens", block_tokens},
                        {"max_prompt_tokens", max_prompt_tokens},
                        {"capped_prompts", capped},
                        {"max_tokens", max_tokens_cap},
                        {"time_scale", time_scale},
                        {"ucx", wo.ucx},
                        {"link_bytes_per_second", wo.fetch_bytes_per_second},
                        {"keep_staged", wo.service.engine.keep_staged},
                        {"fresh_worker", fresh_worker},
                        {"store_shards", setup.shards},
                        {"store_replicas", setup.replicas},
                        {"store_shards_down", setup.down},
                        {"stored_compressed_prefixes", wo.service.engine.stored_compressed_prefixes},
                        {"prompt_tokens", prompt_tokens},
                        {"prefix_tokens", prefix_tokens},
                        {"distinct_hash_ids", id_uses.size()},
                        {"shared_hash_ids", shared_ids},
                        {"kv_bytes_per_token", kv_bytes_per_token},
                        {"full_kv_bytes", wo.full_kv_bytes},
                        {"staging_bytes", wo.staging_bytes},
                        {"prefix_cache_bytes", wo.prefix_cache_bytes},
                        {"ttft_vericache_over_fetch", r_cb},
                        {"ttft_vericache_over_recompute", r_ca},
                        {"throughput_vericache_over_fetch", t_cb},
                        {"all_identical", all_identical},
                        {"modes", rows}};
  if (!flags["json"].empty()) std::ofstream(flags["json"]) << all.dump(1) << "\n";
  if (!flags["md"].empty()) std::ofstream(flags["md"]) << md.str();
  if (!all_identical) return absl::InternalError("an output differs from full-KV decoding");
  return absl::OkStatus();
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"model", "models/vc-code-4m"},
      {"trace", "benchmarks/data/mooncake_conversation_head.jsonl"},
      {"corpus", "/usr/lib/python3.11"},
      {"first", "0"},
      {"requests", "12"},
      {"block-tokens", "512"},
      {"max-prompt-tokens", "8192"},
      {"max-tokens", "32"},
      {"time-scale", "4"},
      {"check", "all"},
      {"ucx", "none"},
      {"link-mb-per-s", "0"},
      {"keep-staged", "1"},
      {"fresh-worker", "0"},
      {"shards", "1"},
      {"replicas", "1"},
      {"down-shards", "0"},
      {"workers", "1"},
      {"router-policy", "prefix"},
      {"stored-compressed", "0"},
      {"modes", "recompute,fetch,vericache"},
      {"edit-at", "0"},
      {"json", ""},
      {"md", ""},
  };
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  const absl::Status s = vc::Main(flags);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return absl::IsInvalidArgument(s) ? 2 : 1;
  }
  return 0;
}
