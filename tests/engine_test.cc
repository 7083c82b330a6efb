// The exactness contract: every VeriCache generation equals sequential full-KV decoding token for
// token, for every compressor, draft window, batch size, greedy and sampled.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/held_store.h"
#include "tests/testing/kv_dtype.h"
#include "tests/testing/memory_prefix_store.h"
#include "tests/testing/next_turn.h"
#include "tests/testing/tiny_model.h"
#include "worker/compression/lossy_decoder.h"
#include "worker/compression/registry.h"
#include "worker/engines/vericache_engine.h"
#include "worker/runtime/full_decoder.h"

namespace vc {
namespace {

std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t = {256};
  for (int i = 1; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % 256));
  return t;
}

// `max_tokens` tokens, greedy (temp 0) or sampled with top-k 50 and top-p 0.95, past any end of
// sequence.
GenerateOptions GreedyOrSampled(float temp, int max_tokens, uint64_t seed) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.stop_at_eos = false;
  o.sampling = {temp, temp > 0 ? 50 : 0, temp > 0 ? 0.95f : 1.0f, seed};
  return o;
}

// Greedy, 16 tokens, 4-bit KIVI drafts, staging for three sequences of `prompt_len` tokens.
void TierTestOptions(int64_t prompt_len, GenerateOptions* o, EngineOptions* eo) {
  o->max_tokens = 16;
  o->stop_at_eos = false;
  eo->compressor = "kivi:bits=4";
  eo->staging_blocks = 3 * ((prompt_len + o->max_tokens) / 16 + 2);
}

class EngineExactness : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const std::string dir = testing::TempDir("engine_tiny");
    testing::TinyModelSpec spec = testing::SmallGqaSpec();
    spec.weight_scale = 0.15f;
    testing::WriteTinyModel(dir, spec);
    model_ = Model::Load(dir, testing::TestModelOptions())->release();
  }
  static void TearDownTestSuite() { delete model_; }

  // Runs the engine on `prompts` and checks each output against GenerateFull.
  static void ExpectExact(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                          const GenerateOptions& o, const EngineOptions& eo, EngineStats* total = nullptr) {
    HostKvTier tier(model.kv_layout(eo.block_size), 0);
    auto engine = VeriCacheEngine::Create(model, &tier, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<EngineRequest> reqs;
    for (const auto& p : prompts) reqs.push_back(MakeRequest(p, o));
    auto got = (*engine)->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameAsFull(model, prompts, o, eo, *got, total);
  }

  // Checks each result against GenerateFull, and adds its stats to *total (when given).
  static void ExpectSameAsFull(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                               const GenerateOptions& o, const EngineOptions& eo,
                               const std::vector<EngineResult>& got, EngineStats* total) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto want = GenerateFull(model, prompts[i], o);
      ASSERT_TRUE(want.ok());
      ASSERT_EQ(got[i].tokens, want->tokens)
          << eo.compressor << " k=" << eo.draft_window << " prompt " << i << " temp " << o.sampling.temperature;
      // What the sequence reserved of the compressed-KV memory bounds what it held, drafts and
      // rollbacks included, and not by far once it generated all it could.
      const EngineStats& st = got[i].stats;
      // (One that never drafted may never have built its compressed cache.)
      if (st.drafted > 0) {
        EXPECT_GT(st.compressed_peak_bytes, 0) << eo.compressor << " prompt " << i;
      }
      EXPECT_LE(st.compressed_peak_bytes, st.compressed_reserved_bytes) << eo.compressor << " prompt " << i;
      // (One that decoded plainly for most of its passes never grew its compressed cache over its
      // output: the cache catches up only when drafting resumes.)
      if (static_cast<int>(got[i].tokens.size()) == o.max_tokens && 2 * st.plain_verifies < st.verifies) {
        EXPECT_LE(st.compressed_reserved_bytes, 3 * st.compressed_peak_bytes) << eo.compressor << " prompt " << i;
      }
      if (total != nullptr) {
        total->drafted += got[i].stats.drafted;
        total->accepted_drafts += got[i].stats.accepted_drafts;
        total->verifies += got[i].stats.verifies;
        total->plain_verifies += got[i].stats.plain_verifies;
        total->catch_ups += got[i].stats.catch_ups;
        total->bytes_fetched += got[i].stats.bytes_fetched;
      }
    }
  }

  // What a stepwise run saw: the most sequences in flight at once, and whether a request waited
  // in the queue while others ran.
  struct Admission {
    size_t max_active = 0;
    bool waited = false;
  };

  // ExpectExact through Submit and Step, watching admission (eo.staging_blocks must be set).
  static Admission ExpectExactStepwise(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                       const GenerateOptions& o, const EngineOptions& eo, EngineStats* total) {
    Admission seen;
    HostKvTier tier(model.kv_layout(eo.block_size), 0);
    auto engine = VeriCacheEngine::Create(model, &tier, eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return seen;
    std::vector<EngineResult> results(prompts.size());
    std::vector<bool> done(prompts.size(), false);
    for (size_t i = 0; i < prompts.size(); ++i) {
      (*engine)->Submit(MakeRequest(prompts[i], o), [&, i](absl::Status st, EngineResult r) {
        EXPECT_TRUE(st.ok()) << st;
        results[i] = std::move(r);
        done[i] = true;
      });
    }
    while (!(*engine)->Idle()) {
      const absl::Status st = (*engine)->Step();
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return seen;
      seen.max_active = std::max(seen.max_active, (*engine)->active());
      if ((*engine)->queued() > 0 && (*engine)->active() > 0) seen.waited = true;
    }
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE(done[i]) << "request " << i << " never ended";
    EXPECT_EQ((*engine)->compressed_reserved_bytes(), 0);  // every reservation given back
    ExpectSameAsFull(model, prompts, o, eo, results, total);
    return seen;
  }

  static Model* model_;
};
Model* EngineExactness::model_ = nullptr;

TEST_F(EngineExactness, EveryCompressorWindowAndSampling) {
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(1, 1), RandomPrompt(37, 2), RandomPrompt(150, 3)};
  for (const char* spec : {"none", "kivi:bits=2", "kivi:bits=4,group=32,residual=16", "kivi:bits=8",
                           "streaming:sinks=4,window=64", "streaming:sinks=0,window=1",
                           "snapkv:capacity=48,window=16,kernel=3",
                           "snapkv:capacity=48,window=16+kivi:bits=4,group=8,residual=8",
                           "h2o:heavy=16,recent=8,rollback=8", "quest:page=8,budget=32",
                           "quest:budget=16+kivi:bits=4,group=8,residual=8"}) {
    for (int k : {0, 1, 2, 3, 5, 8, 16}) {
      EngineStats total;
      for (float temp : {0.0f, 0.9f}) {
        const GenerateOptions o = GreedyOrSampled(temp, 24, 77);
        EngineOptions eo;
        eo.compressor = spec;
        eo.draft_window = k;
        eo.keep_staged = k % 2 == 0;  // both: full KV fetched for every verify, or kept staged
        ExpectExact(*model_, prompts, o, eo, &total);
        if (HasFatalFailure()) return;
      }
      // Every fixed window drafts and gets some drafts accepted (even the one-position window's,
      // here); the adaptive one, whose full KV stays staged from admission, starts decoding
      // plainly. Every emitted token is an accepted draft or a verify pass's own token. A
      // compressor that keeps everything drafts what full KV would: all its drafts are accepted.
      SCOPED_TRACE(absl::StrCat(spec, " k=", k));
      if (k > 0) {
        EXPECT_GT(total.drafted, 0);
        EXPECT_GT(total.accepted_drafts, 0);
      } else {
        EXPECT_GT(total.plain_verifies, 0);
      }
      EXPECT_LE(total.accepted_drafts, total.drafted);
      EXPECT_EQ(total.accepted_drafts + total.verifies, int64_t{2} * 24 * static_cast<int64_t>(prompts.size()));
      if (std::string(spec) == "none") {
        EXPECT_EQ(total.accepted_drafts, total.drafted);
      }
    }
  }
}

// A fixed window past the adaptive one's cap (16) is the window that runs, exactly.
TEST_F(EngineExactness, AFixedWindowPastTheAdaptiveCapRuns) {
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(40, 21)};
  GenerateOptions o;
  o.max_tokens = 120;
  o.stop_at_eos = false;
  EngineOptions eo;
  eo.compressor = "none";  // every draft is accepted: each window is a whole one
  eo.draft_window = 24;
  EngineStats total;
  ExpectExact(*model_, prompts, o, eo, &total);
  // 120 tokens in windows of 24 drafts and the pass's own token: 24 drafts a pass but the last.
  EXPECT_EQ(total.verifies, 5) << total.drafted;
  EXPECT_EQ(total.drafted, 4 * 24 + 19);  // the last: 20 tokens left, 19 drafts and its own
}

// A long prompt with nothing stored is prefilled a chunk a step: the sequence in flight streams on
// meanwhile, rather than waiting for the whole prefill, and both outputs are exact. One cancelled
// mid-prefill gives its staging back: the next long prompt, which needs it, runs.
TEST_F(EngineExactness, ALongPromptIsPrefilledAChunkAStepWhileTheBatchStreams) {
  GenerateOptions o;
  o.max_tokens = 60;
  o.stop_at_eos = false;
  o.prefill_chunk = 32;
  EngineOptions eo;
  eo.compressor = "snapkv:capacity=48,window=16+kivi:bits=4,group=8,residual=8";  // records prompt queries
  eo.draft_window = 4;
  eo.staging_blocks = 100;  // one long sequence (81 blocks) at a time, and the short one
  HostKvTier tier(model_->kv_layout(eo.block_size), 0);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> a = RandomPrompt(20, 31), b = RandomPrompt(1200, 32), c = RandomPrompt(1100, 33);
  std::map<char, std::vector<int32_t>> got;
  std::map<char, absl::Status> ended;
  size_t a_when_b_began = 0;  // tokens A had streamed when B's first token came
  const auto submit = [&](char name, const std::vector<int32_t>& prompt) {
    EngineRequest r = MakeRequest(prompt, o);
    r.on_tokens = [&, name](absl::Span<const int32_t> t) {
      if (name == 'b' && got['b'].empty()) a_when_b_began = got['a'].size();
      got[name].insert(got[name].end(), t.begin(), t.end());
    };
    return (*engine)->Submit(std::move(r), [&, name](absl::Status st, EngineResult) { ended[name] = st; });
  };
  const auto step_until = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_TRUE(done());
  };
  submit('a', a);
  step_until([&] { return !got['a'].empty(); });
  const size_t a_before = got['a'].size();
  submit('b', b);
  step_until([&] { return ended.contains('a') && ended.contains('b'); });
  // B's 1199 prompt positions take 38 chunks; A drafts and verifies at every one of those steps.
  EXPECT_GE(a_when_b_began - a_before, 20u) << "A streamed " << a_when_b_began - a_before << " tokens";
  ASSERT_TRUE(ended['a'].ok() && ended['b'].ok()) << ended['a'] << " " << ended['b'];
  for (const auto& [name, prompt] : {std::pair{'a', a}, std::pair{'b', b}}) {
    auto want = GenerateFull(*model_, prompt, o);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(got[name], want->tokens) << name;
  }

  const int64_t d = submit('d', b);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*engine)->Step().ok());  // a few of its chunks
  (*engine)->Cancel(d);
  submit('c', c);
  step_until([&] { return (*engine)->Idle(); });
  EXPECT_TRUE(absl::IsCancelled(ended['d'])) << ended['d'];
  EXPECT_TRUE(got['d'].empty());
  ASSERT_TRUE(ended['c'].ok()) << ended['c'];
  auto want = GenerateFull(*model_, c, o);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(got['c'], want->tokens);
}

// One tenant's long requests come first and would fill the batch; with each tenant's share capped
// below it, another tenant's short request runs at once and ends before any of them. Exact.
TEST_F(EngineExactness, ATenantsShareOfTheBatchLeavesRoomForAnother) {
  GenerateOptions o;
  o.max_tokens = 100;
  o.stop_at_eos = false;
  EngineOptions eo;
  eo.max_batch = 4;
  eo.max_batch_per_tenant = 3;
  eo.staging_blocks = 64;
  HostKvTier tier(model_->kv_layout(eo.block_size), 0);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::map<int, EngineResult> ended;
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(MakeRequest(RandomPrompt(20, 60 + i), o));
    reqs.back().tenant = i < 4 ? "a" : "b";
    if (i == 4) reqs.back().options.max_tokens = 4;
    (*engine)->Submit(reqs.back(), [&, i](absl::Status st, EngineResult r) {
      EXPECT_TRUE(st.ok()) << st;
      ended[i] = std::move(r);
    });
  }
  for (int i = 0; i < 5000 && !ended.contains(4); ++i) {
    const absl::Status st = (*engine)->Step();
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE(ended.contains(4));
  EXPECT_EQ(ended.size(), 1u) << "the short request waited for a long one";
  while (!(*engine)->Idle()) ASSERT_TRUE((*engine)->Step().ok());
  for (const int i : {0, 4}) {
    auto want = GenerateFull(*model_, reqs[i].prompt, reqs[i].options);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(ended[i].tokens, want->tokens) << i;
  }
}

// Prompts that must be prefilled wait their turn behind the one being prefilled without holding
// up a request whose prefix the store holds: it is admitted, and streams, meanwhile.
TEST_F(EngineExactness, RequestsWaitingForTheirPrefillTurnHoldUpNoStoredPrefix) {
  const int prompt_len = 6 * 16 + 24;  // six stored blocks, then 24 more tokens
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(prompt_len, &o, &eo);
  o.prefill_chunk = 32;
  eo.staging_blocks = 400;
  HostKvTier tier(model_->kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> shared = RandomPrompt(prompt_len, 600);
  std::vector<int32_t> hit = shared;
  for (int j = 0; j < 24; ++j) hit[6 * 16 + j] = (j * 13) % 256;  // its own rest
  // Six prompts of 10 chunks or more, then the one whose prefix the store holds.
  std::vector<std::vector<int32_t>> prompts = {RandomPrompt(1200, 601)};
  for (uint32_t i = 0; i < 5; ++i) prompts.push_back(RandomPrompt(330, 602 + i));
  prompts.push_back(hit);
  std::vector<absl::Status> st(prompts.size(), absl::UnknownError("not done"));
  std::vector<EngineResult> out(prompts.size());
  std::vector<int> first_step(prompts.size(), -1);
  int step = 0;
  const auto submit = [&](const std::vector<int32_t>& prompt, size_t i) {
    EngineRequest r = MakeRequest(prompt, o);
    r.on_tokens = [&, i](absl::Span<const int32_t>) {
      if (i < first_step.size() && first_step[i] < 0) first_step[i] = step;
    };
    (*engine)->Submit(std::move(r), [&, i](absl::Status s, EngineResult res) {
      if (i >= st.size()) return;
      st[i] = s;
      out[i] = std::move(res);
    });
  };
  const auto run = [&] {
    for (int i = 0; i < 4000 && !(*engine)->Idle(); ++i, ++step) ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_TRUE((*engine)->Idle());
  };
  submit(shared, SIZE_MAX);  // computes the prefix and publishes it
  run();
  ASSERT_GT(store.size(), 0u);
  for (size_t i = 0; i < prompts.size(); ++i) submit(prompts[i], i);
  run();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(st[i].ok()) << i << ": " << st[i];
    EXPECT_EQ(out[i].tokens, GenerateFull(*model_, prompts[i], o)->tokens) << i;
  }
  EXPECT_EQ(out.back().stats.prefix_store_tokens, 6 * 16);
  const int first_prefilled = *std::min_element(first_step.begin(), first_step.end() - 1);
  EXPECT_LT(first_step.back(), first_prefilled) << "the stored prefix's request waited for a prefill";
}

// Every emitted token is an accepted draft or a verify pass's own token, also when the output
// ends at an end of sequence that was itself an accepted draft: the drafts after it are never sent
// and not counted as accepted (that pass's own token is not sent either).
TEST_F(EngineExactness, DraftsAcceptedPastAnEndOfSequenceAreNotCounted) {
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 8; ++i) prompts.push_back(RandomPrompt(5 + 3 * i, 40 + i));
  GenerateOptions o;
  o.max_tokens = 400;
  o.stop_at_eos = true;
  o.sampling = {3.0f, 0, 1.0f, 5};  // near uniform: an end of sequence comes, at a random place
  EngineOptions eo;
  eo.compressor = "none";  // every draft is accepted: an end of sequence lands inside a window
  eo.draft_window = 8;
  HostKvTier tier(model_->kv_layout(eo.block_size), 0);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<EngineRequest> reqs;
  for (const auto& p : prompts) reqs.push_back(MakeRequest(p, o));
  auto got = (*engine)->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameAsFull(*model_, prompts, o, eo, *got, nullptr);
  int ended_inside_a_window = 0;
  for (size_t i = 0; i < got->size(); ++i) {
    const EngineStats& st = (*got)[i].stats;
    SCOPED_TRACE(absl::StrCat("prompt ", i, ": ", st.emitted, " emitted, ", st.accepted_drafts, " accepted, ",
                              st.verifies, " verifies"));
    EXPECT_EQ(st.emitted, static_cast<int64_t>((*got)[i].tokens.size()));
    const int64_t unsent = st.accepted_drafts + st.verifies - st.emitted;  // own tokens not sent
    EXPECT_GE(unsent, 0);
    EXPECT_LE(unsent, 1);
    ended_inside_a_window += unsent == 1;
  }
  EXPECT_GT(ended_inside_a_window, 0) << "no output ended at an accepted draft: the test shows nothing";
}

// The lossy baseline decodes from the compressed cache alone: with a compressor that keeps every
// position exactly it is full-KV decoding, and with 2-bit KIVI it is not.
TEST_F(EngineExactness, LossyDecodingIsFullDecodingOnlyWhenNothingIsLost) {
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(2, 11), RandomPrompt(60, 12), RandomPrompt(150, 13)};
  for (float temp : {0.0f, 0.9f}) {
    GenerateOptions o;
    o.max_tokens = 24;
    o.stop_at_eos = false;
    o.sampling = {temp, temp > 0 ? 50 : 0, temp > 0 ? 0.95f : 1.0f, 78};
    int lossy_differs = 0;
    for (const auto& p : prompts) {
      auto want = GenerateFull(*model_, p, o);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_EQ(want->tokens.size(), 24u);
      for (const char* spec : {"none", "streaming:sinks=0,window=4096", "snapkv:capacity=4096"}) {
        auto got = GenerateLossy(*model_, p, o, spec);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->generation.tokens, want->tokens) << spec << " prompt " << p.size() << " temp " << temp;
      }
      auto lossy = GenerateLossy(*model_, p, o, "kivi:bits=2");
      ASSERT_TRUE(lossy.ok()) << lossy.status();
      ASSERT_EQ(lossy->generation.tokens.size(), 24u);
      lossy_differs += lossy->generation.tokens != want->tokens;
    }
    EXPECT_GT(lossy_differs, 0) << "temp " << temp;
  }
}

TEST_F(EngineExactness, BatchSizesOneToEight) {
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < 8; ++b) prompts.push_back(RandomPrompt(20 + 13 * b, 100 + b));
  for (int batch = 1; batch <= 8; ++batch) {
    GenerateOptions o;
    o.max_tokens = 20;
    o.stop_at_eos = false;
    o.sampling = {batch % 2 ? 0.0f : 0.8f, 0, 1.0f, 5};
    EngineOptions eo;
    eo.compressor = "kivi:bits=4";
    // Drafting and plain decoding side by side in the batch (adaptive, this model's resident
    // sequences would decode plainly throughout).
    eo.window_pattern = {3, 0, 2};
    eo.max_batch = batch;
    eo.staging_blocks = 8 * ((20 + 13 * 7 + 20 + 17) / 16 + 2);  // all eight at once
    EngineStats total;
    const Admission seen = ExpectExactStepwise(*model_, prompts, o, eo, &total);
    if (HasFatalFailure()) return;
    EXPECT_EQ(seen.max_active, static_cast<size_t>(batch)) << "the batch limit binds";
    if (batch < 8) {
      EXPECT_TRUE(seen.waited);  // (at 8 too: prompts are prefilled one at a time)
    }
    EXPECT_GT(total.accepted_drafts, 0) << "batch " << batch;
    EXPECT_EQ(total.accepted_drafts + total.verifies, int64_t{20} * static_cast<int64_t>(prompts.size()));
  }
}

TEST_F(EngineExactness, TightStagingMemoryOnlyDelays) {
  // Staging for roughly one sequence at a time: sequences queue for it, outputs do not change.
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < 4; ++b) prompts.push_back(RandomPrompt(60, 200 + b));
  GenerateOptions o;
  o.max_tokens = 16;
  o.stop_at_eos = false;
  for (bool keep : {false, true}) {
    EngineOptions eo;
    eo.compressor = "kivi:bits=4";
    eo.staging_blocks = (60 + 16 + 17) / 16 + 2;
    eo.keep_staged = keep;  // kept staging is given up whenever another sequence needs it
    EngineStats total;
    const Admission seen = ExpectExactStepwise(*model_, prompts, o, eo, &total);
    if (HasFatalFailure()) return;
    EXPECT_GT(total.accepted_drafts, 0) << "keep_staged " << keep;
    EXPECT_EQ(seen.max_active, prompts.size());  // all admitted: they wait for staging, not admission
    if (keep) {
      // The limit binds: kept sequences lose their staging to one another and fetch again, where
      // staging for all four keeps them resident.
      eo.staging_blocks = 4 * ((60 + 16 + 17) / 16 + 2);
      EngineStats ample;
      ExpectExactStepwise(*model_, prompts, o, eo, &ample);
      EXPECT_GT(total.bytes_fetched, 4 * ample.bytes_fetched);
    }
  }
}

TEST_F(EngineExactness, ACompressedKvBudgetOnlyDelays) {
  // Compressed-KV memory for two sequences at a time of every compressor kind: the others wait for
  // one to end, outputs do not change; a request that needs more than all of it is refused alone.
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < 4; ++b) prompts.push_back(RandomPrompt(70, 500 + b));
  GenerateOptions o;
  o.max_tokens = 20;
  o.stop_at_eos = false;
  for (const char* spec : {"kivi:bits=4,group=16,residual=16", "snapkv:capacity=32,window=8+kivi:bits=2",
                           "h2o:heavy=16,recent=8,rollback=8", "streaming:sinks=4,window=16",
                           "quest:budget=16+kivi:bits=4,group=8,residual=8"}) {
    SCOPED_TRACE(spec);
    auto sizing = MakeCompressedKvCache(spec, model_->kv_layout(16), model_->config().num_heads);
    ASSERT_TRUE(sizing.ok()) << sizing.status();
    const int64_t one = (*sizing)->BytesBound(69, 70 + o.max_tokens);
    EngineOptions eo;
    eo.compressor = spec;
    eo.staging_blocks = 4 * ((70 + 20 + 17) / 16 + 2);
    eo.compressed_bytes = 2 * one + one / 2;
    EngineStats total;
    const Admission seen = ExpectExactStepwise(*model_, prompts, o, eo, &total);
    if (HasFatalFailure()) return;
    EXPECT_EQ(seen.max_active, 2u);
    EXPECT_TRUE(seen.waited);

    eo.compressed_bytes = one - 1;
    HostKvTier tier(model_->kv_layout(16), 0);
    auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<absl::Status> got(2, absl::UnknownError("not ended"));
    std::vector<EngineResult> out(2);
    // Short enough to need less than a compressor that keeps a fixed number of positions can hold.
    const std::vector<int32_t> small = RandomPrompt(5, 9);
    GenerateOptions short_output = o;
    short_output.max_tokens = 8;
    (*engine)->Submit(MakeRequest(prompts[0], o), [&](absl::Status st, EngineResult) { got[0] = st; });
    (*engine)->Submit(MakeRequest(small, short_output), [&](absl::Status st, EngineResult r) {
      got[1] = st;
      out[1] = std::move(r);
    });
    for (int i = 0; i < 1000 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
    EXPECT_EQ(got[0].code(), absl::StatusCode::kResourceExhausted) << got[0];
    EXPECT_NE(got[0].message().find("bytes of compressed KV"), std::string::npos) << got[0];
    ASSERT_TRUE(got[1].ok()) << got[1];
    EXPECT_EQ(out[1].tokens, GenerateFull(*model_, small, short_output)->tokens);
    EXPECT_EQ((*engine)->compressed_reserved_bytes(), 0);
  }
}

TEST_F(EngineExactness, HostTierForOneSequenceAtATimeOnlyDelays) {
  // The host tier holds one sequence's prompt and output, which cross one of its chunks: the
  // others wait their turn to start, since the first one's later appends need the room its prompt
  // did not (admitting a second one on its prompt alone made those appends fail the batch).
  const HostKvTier sizing(model_->kv_layout(16), 0);
  const int64_t prompt_len = sizing.chunk_positions() - 5;
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(prompt_len, &o, &eo);
  HostKvTier tier(model_->kv_layout(16), 0, 1, sizing.BytesFor(prompt_len + o.max_tokens));
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<EngineResult> results(3);
  int done = 0;
  for (int b = 0; b < 3; ++b) {
    prompts.push_back(RandomPrompt(static_cast<int>(prompt_len), 300 + b));
    (*engine)->Submit(MakeRequest(prompts.back(), o), [&, b](absl::Status st, EngineResult r) {
      EXPECT_TRUE(st.ok()) << st;
      results[b] = std::move(r);
      ++done;
    });
  }
  for (int i = 0; i < 1000 && !(*engine)->Idle(); ++i) {
    const absl::Status st = (*engine)->Step();
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_LE((*engine)->active(), 1u);
  }
  ASSERT_EQ(done, 3);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(results[b].tokens, GenerateFull(*model_, prompts[b], o)->tokens) << b;
}

TEST_F(EngineExactness, SmallRequestsPassOneThatMustWaitAFewTimesAtMost) {
  // The host tier holds one long sequence and three short ones. A second long request has to wait
  // for the first; short ones behind it do not wait with it, but only 8 of them pass it, even
  // when several are admitted in one step: then it holds up the rest until it is admitted. Every
  // output is exact.
  const HostKvTier sizing(model_->kv_layout(16), 0);
  GenerateOptions long_o, short_o;
  // A long sequence takes more of the tier's chunks than three short ones (at least four chunks in
  // bf16, whose chunks hold twice the positions of float32's), so two long ones never fit at once.
  long_o.max_tokens = 1500;
  short_o.max_tokens = 2;
  long_o.stop_at_eos = short_o.stop_at_eos = false;
  const int64_t long_len = 100, short_len = 40;
  HostKvTier tier(model_->kv_layout(16), 0, 1,
                  sizing.BytesFor(long_len + long_o.max_tokens) + 3 * sizing.BytesFor(short_len + short_o.max_tokens));
  EngineOptions eo;
  eo.compressor = "kivi:bits=4";
  eo.staging_blocks = 2 * ((long_len + long_o.max_tokens) / 16 + 4);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerateOptions> opts;
  std::vector<EngineResult> results(14);
  std::vector<int> done_order;
  for (int b = 0; b < 14; ++b) {
    const bool is_long = b < 2;
    prompts.push_back(RandomPrompt(static_cast<int>(is_long ? long_len : short_len), 400 + b));
    opts.push_back(is_long ? long_o : short_o);
    (*engine)->Submit(MakeRequest(prompts.back(), opts.back()), [&, b](absl::Status st, EngineResult r) {
      EXPECT_TRUE(st.ok()) << st;
      results[b] = std::move(r);
      done_order.push_back(b);
    });
  }
  for (int i = 0; i < 5000 && !(*engine)->Idle(); ++i) {
    const absl::Status st = (*engine)->Step();
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_LE((*engine)->active(), 4u);
  }
  ASSERT_EQ(done_order.size(), 14u);
  // Before the first long request ends, exactly 8 short ones have passed the second.
  const auto first_long = std::find(done_order.begin(), done_order.end(), 0);
  EXPECT_EQ(first_long - done_order.begin(), 8) << "short requests done before the first long one";
  for (int b = 0; b < 14; ++b) EXPECT_EQ(results[b].tokens, GenerateFull(*model_, prompts[b], opts[b])->tokens) << b;
}

TEST_F(EngineExactness, PrefixRecomputedUnderATightHostTierHasItsRoom) {
  // The host tier holds three chunks; a prompt and its output need two, one once its prefix is
  // attached from the store. A sequence keeps its prefix's share, so when the store's reads fail
  // each can hold its whole prompt here: two such requests run one after the other, and both are
  // exact (giving the share back let both start, and the second then ended for want of room).
  const HostKvTier sizing(model_->kv_layout(16), 0);
  const int prompt_len = static_cast<int>(sizing.chunk_positions()) + 40;  // the store holds 32 more than a chunk
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(prompt_len, &o, &eo);
  HostKvTier tier(model_->kv_layout(16), 0, 1, 3 * sizing.BytesFor(1));
  testing::MemoryPrefixStore store(16);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto run = [&](const std::vector<std::vector<int32_t>>& prompts, std::vector<absl::Status>* st,
                 std::vector<EngineResult>* out) {
    st->assign(prompts.size(), absl::UnknownError("not done"));
    out->assign(prompts.size(), EngineResult{});
    for (size_t i = 0; i < prompts.size(); ++i) {
      (*engine)->Submit(MakeRequest(prompts[i], o), [st, out, i](absl::Status s, EngineResult r) {
        (*st)[i] = s;
        (*out)[i] = std::move(r);
      });
    }
    for (int i = 0; i < 2000 && !(*engine)->Idle(); ++i) {
      const absl::Status s = (*engine)->Step();
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_TRUE((*engine)->Idle());
  };
  std::vector<int32_t> shared = RandomPrompt(prompt_len, 400);
  std::vector<absl::Status> st;
  std::vector<EngineResult> out;
  run({shared}, &st, &out);  // computes the prefix and publishes it
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_GT(store.size(), 0u);
  store.fail_reads = true;
  std::vector<std::vector<int32_t>> prompts = {shared, shared};
  prompts[0].back() = 1;  // the same prefix, different last tokens
  prompts[1].back() = 2;
  run(prompts, &st, &out);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(st[i].ok()) << i << ": " << st[i];
    EXPECT_EQ(out[i].tokens, GenerateFull(*model_, prompts[i], o)->tokens) << i;
    EXPECT_GT(out[i].stats.recomputed_tokens, 0) << i;
  }
  EXPECT_EQ(tier.reserved_bytes(), 0);
}

// A store lookup (a call to another server, up to its timeout when that server hangs) runs off the
// engine's thread: a request whose lookup has not come back waits in the queue while the batch in
// flight goes on, and is admitted, exact, once it does.
TEST_F(EngineExactness, AHangingStoreLookupHoldsUpOnlyItsOwnRequest) {
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(40, &o, &eo);
  o.max_tokens = 40;
  HostKvTier tier(model_->kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> a = RandomPrompt(40, 500), b = RandomPrompt(40, 501);
  const testing::HeldStoreRun run = testing::RunWithStoreHeld(**engine, store.hold_lookups, MakeRequest(a, o), MakeRequest(b, o));
  testing::ExpectOnlyTheSecondWaited(run, GenerateFull(*model_, a, o)->tokens, GenerateFull(*model_, b, o)->tokens);
  EXPECT_EQ(store.lookups, 2);
}

TEST_F(EngineExactness, PromptPassesAfterAStoredPrefixRunOneAtATime) {
  // Requests whose prefix the store holds each need a verify pass that computes the rest of their
  // prompt. Those passes run one per step, so no step gives two of these requests their first
  // token (a batched pass would give every one of them its first token at the end of it).
  const int prompt_len = 6 * 16 + 24;  // six stored blocks, then 24 more tokens
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(prompt_len, &o, &eo);
  eo.staging_blocks *= 2;  // room for all four at once
  eo.prefix_cache_bytes = 0;  // no compressed copies here: each first pass waits for the full prefix
  HostKvTier tier(model_->kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> shared = RandomPrompt(prompt_len, 500);
  std::vector<std::vector<int32_t>> prompts = {shared};
  for (int i = 1; i <= 4; ++i) {
    prompts.push_back(shared);
    for (int j = 0; j < 24; ++j) prompts.back()[6 * 16 + j] = (i * 37 + j * 11) % 256;  // its own rest
  }
  std::vector<absl::Status> st(prompts.size(), absl::UnknownError("not done"));
  std::vector<EngineResult> out(prompts.size());
  std::vector<int> first_step(prompts.size(), -1);
  int step = 0;
  auto submit = [&](size_t i) {
    EngineRequest r = MakeRequest(prompts[i], o);
    r.on_tokens = [&, i](absl::Span<const int32_t>) {
      if (first_step[i] < 0) first_step[i] = step;
    };
    (*engine)->Submit(std::move(r), [&, i](absl::Status s, EngineResult res) {
      st[i] = s;
      out[i] = std::move(res);
    });
  };
  auto run = [&] {
    for (int i = 0; i < 4000 && !(*engine)->Idle(); ++i, ++step) ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_TRUE((*engine)->Idle());
  };
  submit(0);  // computes the prefix and publishes it
  run();
  ASSERT_GT(store.size(), 0u);
  for (size_t i = 1; i < prompts.size(); ++i) submit(i);
  run();
  std::map<int, int> firsts_at;
  for (size_t i = 1; i < prompts.size(); ++i) {
    ASSERT_TRUE(st[i].ok()) << i << ": " << st[i];
    EXPECT_EQ(out[i].tokens, GenerateFull(*model_, prompts[i], o)->tokens) << i;
    EXPECT_EQ(out[i].stats.prefix_store_tokens, 6 * 16) << i;
    ASSERT_GE(first_step[i], 0) << i;
    EXPECT_EQ(++firsts_at[first_step[i]], 1) << "two requests got their first token at step " << first_step[i];
  }
}

// The rest of a prompt after its stored prefix, or all of it when the store's read fails, is
// computed a prefill chunk a step, ahead of its verify pass: a request streaming meanwhile is not
// held up by one pass over hundreds of positions.
TEST_F(EngineExactness, ALongRestAfterAStoredPrefixIsComputedAChunkAStep) {
  GenerateOptions o;
  o.max_tokens = 40;
  o.stop_at_eos = false;
  o.prefill_chunk = 32;
  EngineOptions eo;
  eo.compressor = "kivi:bits=4,group=8,residual=8";
  eo.draft_window = 4;
  eo.staging_blocks = 200;
  eo.prefix_cache_bytes = 0;  // no compressed copy: the first pass waits for the whole prompt
  testing::MemoryPrefixStore store(16);
  HostKvTier tier(model_->kv_layout(eo.block_size), 0);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> a = RandomPrompt(20, 41), prefix = RandomPrompt(64, 42);
  std::map<char, std::vector<int32_t>> got;
  std::map<char, absl::Status> ended;
  std::map<char, EngineStats> stats;
  int step = 0, b_first = -1;
  const auto submit = [&](char name, const std::vector<int32_t>& prompt) {
    EngineRequest r = MakeRequest(prompt, o);
    r.on_tokens = [&, name](absl::Span<const int32_t> t) {
      if (name == 'b' && b_first < 0) b_first = step;
      got[name].insert(got[name].end(), t.begin(), t.end());
    };
    (*engine)->Submit(std::move(r), [&, name](absl::Status st, EngineResult res) {
      ended[name] = st;
      stats[name] = res.stats;
    });
  };
  const auto step_until = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 3000 && !done(); ++i, ++step) ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_TRUE(done());
  };
  submit('p', prefix);  // publishes the 64-token prefix
  step_until([&] { return (*engine)->Idle(); });
  ASSERT_GE(store.size(), 4u);
  int64_t b_fetched = 0;  // B's full KV fetched with staging for everything: its prefix, once
  for (bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "the store's read fails" : "the store delivers");
    store.fail_reads = fail;
    std::vector<int32_t> b = prefix;  // a rest of its own each time: the store holds the prefix alone
    for (int j = 0; j < 600; ++j) b.push_back((j * 29 + 3 + (fail ? 7 : 0)) % 256);
    got.clear();
    ended.clear();
    b_first = -1;
    submit('a', a);
    step_until([&] { return !got['a'].empty(); });
    const size_t a_before = got['a'].size();
    const int b_submitted = step;
    submit('b', b);
    step_until([&] { return b_first >= 0; });
    const size_t a_meanwhile = got['a'].size() - a_before;
    step_until([&] { return (*engine)->Idle(); });
    // 600 positions after the stored prefix (664 when its read fails) take 18 (20) chunks of 32
    // before a pass of at most 32 of them and the window: one step each, A drafting or verifying at
    // each (its tokens come with its passes; one pass over all of B's rest would give it none).
    EXPECT_GE(b_first - b_submitted, 18) << "B's first token came " << b_first - b_submitted << " steps after it";
    EXPECT_GE(a_meanwhile, 5u) << "A streamed " << a_meanwhile << " tokens meanwhile";
    for (const auto& [name, prompt] : {std::pair{'a', a}, std::pair{'b', b}}) {
      ASSERT_TRUE(ended[name].ok()) << name << ": " << ended[name];
      EXPECT_EQ(got[name], GenerateFull(*model_, prompt, o)->tokens) << name;
    }
    EXPECT_EQ(stats['b'].prefix_store_tokens, fail ? 0 : 64);
    EXPECT_EQ(stats['b'].recomputed_tokens, fail ? 64 : 0);
    if (!fail) b_fetched = stats['b'].bytes_fetched;
  }

  // Staging for B's verify pass (45 blocks) and one more: A and B contend for it, and staged KV
  // may be given up and fetched again (how often depends on the costs measured as it runs: from
  // once, its prefix, to over four times that); outputs stay exact.
  eo.staging_blocks = 46;
  engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  store.fail_reads = false;
  std::vector<int32_t> b = prefix;
  for (int j = 0; j < 600; ++j) b.push_back((j * 31 + 5) % 256);
  got.clear();
  ended.clear();
  b_first = -1;
  submit('a', a);
  step_until([&] { return !got['a'].empty(); });
  submit('b', b);
  step_until([&] { return (*engine)->Idle(); });
  EXPECT_GE(stats['b'].bytes_fetched, b_fetched);
  for (const auto& [name, prompt] : {std::pair{'a', a}, std::pair{'b', b}}) {
    ASSERT_TRUE(ended[name].ok()) << name << ": " << ended[name];
    EXPECT_EQ(got[name], GenerateFull(*model_, prompt, o)->tokens) << name;
  }
}

// A prompt that shares only the first blocks of a cached compressed prefix (an edit in the middle
// of a file) drafts from that prefix cut back to the shared blocks, where KIVI can cut (whole
// quantized groups), and from nothing where it cannot; the output is exact either way.
TEST_F(EngineExactness, APromptSharingPartOfACachedPrefixDraftsFromItCutBack) {
  const int prompt_len = 8 * 32 + 10;  // eight blocks of 32, then 10 more tokens
  // 4-bit KIVI quantizes a cached 256-position prefix up to 224 (residual 32) or 192 (residual 64).
  for (const char* spec : {"kivi:bits=4,group=32,residual=32", "kivi:bits=4,group=32,residual=64"}) {
    GenerateOptions o;
    EngineOptions eo;
    TierTestOptions(prompt_len, &o, &eo);
    eo.compressor = spec;
    eo.staging_blocks *= 2;  // room for four at once
    HostKvTier tier(model_->kv_layout(16), 0);
    testing::MemoryPrefixStore store(32);
    auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::vector<int32_t> first = RandomPrompt(prompt_len, 700);
    auto got = (*engine)->Generate({MakeRequest(first, o)});  // computes, publishes, caches its prefix
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ((*engine)->cached_prefixes(), 1u);
    // Prompts that leave the first one after 5, 7 and 8 of its blocks, submitted together so that
    // each is admitted before any fetch is timed (a fetch as fast as this store's makes drafting
    // first not pay).
    std::vector<EngineRequest> reqs;
    for (int blocks : {5, 7, 8}) {
      std::vector<int32_t> p = first;
      for (int j = blocks * 32; j < prompt_len; ++j) p[j] = (p[j] + 1 + j) % 256;
      reqs.push_back(MakeRequest(p, o));
    }
    got = (*engine)->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    const bool wide = std::string(spec).find("residual=64") != std::string::npos;
    const std::vector<int64_t> want_compressed = {5 * 32, wide ? 0 : 7 * 32, 8 * 32};
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ((*got)[i].tokens, GenerateFull(*model_, reqs[i].prompt, o)->tokens) << spec << " " << i;
      EXPECT_EQ((*got)[i].stats.prefix_store_tokens, std::vector<int64_t>({5 * 32, 7 * 32, 8 * 32})[i]) << i;
      EXPECT_EQ((*got)[i].stats.prefix_compressed_tokens, want_compressed[i]) << spec << " " << i;
    }
  }
}

// A request cancelled mid-generation (a stop sequence is a cancel) shares the blocks of its output
// that the tier holds exact: the next turn, whose prompt extends what it sent, reads them from the
// store, and its output is exact. With `keep_staged` its K/V are still in staging when it is
// cancelled; without, they are fetched back from the tier to be shared.
void ExpectCancelledTurnShared(const Model& model, bool keep_staged, uint32_t seed, std::vector<int> pattern = {}) {
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(100, &o, &eo);
  o.max_tokens = 200;
  eo.staging_blocks = 64;
  eo.keep_staged = keep_staged;
  eo.window_pattern = std::move(pattern);
  HostKvTier tier(model.kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  auto created = VeriCacheEngine::Create(model, &tier, eo, &store);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::vector<int32_t> prompt = RandomPrompt(100, seed);
  const testing::NextTurnRun run = testing::CancelThenNextTurn(**created, prompt, o, 60, 10, 8);
  ASSERT_GE(run.sent.size(), 60u);
  EXPECT_EQ(run.result.tokens, GenerateFull(model, run.next, run.options)->tokens);
  // Every token it sent but the last had exact K/V when it was cancelled.
  EXPECT_EQ(run.result.stats.prefix_store_tokens, static_cast<int64_t>((prompt.size() + run.sent.size() - 1) / 16 * 16));
}

TEST_F(EngineExactness, ACancelledRequestSharesItsOutputForTheNextTurn) {
  ExpectCancelledTurnShared(*model_, /*keep_staged=*/true, 900);
}

TEST_F(EngineExactness, ACancelledRequestOutOfStagingSharesItsOutputToo) {
  ExpectCancelledTurnShared(*model_, /*keep_staged=*/false, 901);
}

// Decoding plainly, the tier never got the positions it sent: they are shared from staging.
TEST_F(EngineExactness, ACancelledPlainlyDecodedRequestSharesItsOutput) {
  ExpectCancelledTurnShared(*model_, /*keep_staged=*/true, 902, {0});
}

// Plain decoding (windows of no drafts with the full KV staged) skips the upkeep of the tier and
// the compressed cache; it catches up in bulk when drafting resumes or staging is given up. Every
// transition keeps the output exact: plain to drafting and back, plain to evicted (its staging
// taken by another sequence) to fetched, for each kind of compressor, greedy and sampled.
TEST_F(EngineExactness, PlainDecodingCatchesUpAtEveryTransition) {
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < 3; ++b) prompts.push_back(RandomPrompt(40 + 30 * b, 300 + b));
  for (const char* spec : {"kivi:bits=4,group=8,residual=8", "none", "streaming:sinks=4,window=32",
                           "snapkv:capacity=48,window=16+kivi:bits=4,group=8,residual=8",
                           "h2o:heavy=16,recent=8,rollback=8", "quest:page=8,budget=32"}) {
    for (float temp : {0.0f, 0.9f}) {
      SCOPED_TRACE(absl::StrCat(spec, " temp ", temp));
      const GenerateOptions o = GreedyOrSampled(temp, 48, 78);
      EngineOptions eo;
      eo.compressor = spec;
      // Runs of plain steps between windows of drafts; a window of 3 that follows plain steps
      // drafts from the compressed cache brought up to date first.
      eo.window_pattern = {0, 0, 0, 0, 3, 0, 0, 2, 1, 0};
      eo.staging_blocks = 3 * ((110 + 48 + 17) / 16 + 2);  // all three stay staged
      EngineStats ample;
      ExpectExactStepwise(*model_, prompts, o, eo, &ample);
      if (HasFatalFailure()) return;
      EXPECT_GT(ample.plain_verifies, 0);
      EXPECT_GT(ample.catch_ups, 0);
      EXPECT_GT(ample.drafted, 0);
      // Staging for about one sequence: they take each other's, a plain one's catching up first.
      eo.staging_blocks = (110 + 48 + 17) / 16 + 2;
      EngineStats tight;
      ExpectExactStepwise(*model_, prompts, o, eo, &tight);
      if (HasFatalFailure()) return;
      EXPECT_GT(tight.plain_verifies, 0);
      EXPECT_GT(tight.catch_ups, ample.catch_ups);
      EXPECT_GT(tight.bytes_fetched, ample.bytes_fetched);
    }
  }
  // Plain throughout with staging for all: not one catch-up, and every pass is plain.
  GenerateOptions o;
  o.max_tokens = 40;
  o.stop_at_eos = false;
  EngineOptions eo;
  eo.compressor = "kivi:bits=4";
  eo.window_pattern = {0};
  EngineStats plain;
  ExpectExact(*model_, prompts, o, eo, &plain);
  EXPECT_EQ(plain.catch_ups, 0);
  EXPECT_EQ(plain.drafted, 0);
  EXPECT_EQ(plain.plain_verifies, plain.verifies);
  EXPECT_EQ(plain.verifies, 40 * 3);
}

// The same, for a request whose prompt came from the store, cancelled out of staging with no fetch
// in flight (at once after a verify pass, its window of 16 drafts fetching only at the last): its
// output blocks are shared from the tier's own positions, and its prefix is not read from the store
// again for that (before, the cancel waited for a read of the whole prefix).
TEST_F(EngineExactness, ACancelledRequestDoesNotReadItsStoredPrefixAgainToShareItsOutput) {
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(100, &o, &eo);
  eo.staging_blocks = 64;
  eo.keep_staged = false;
  eo.draft_window = 16;
  HostKvTier tier(model_->kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = RandomPrompt(100, 903);
  o.max_tokens = 4;
  ASSERT_TRUE((*engine)->Generate({MakeRequest(prompt, o)}).ok());  // publishes the prompt's 6 blocks
  ASSERT_EQ(store.size(), 6u);

  o.max_tokens = 200;
  std::vector<int32_t> sent;
  absl::Status ended = absl::UnknownError("not ended");
  EngineRequest r = MakeRequest(prompt, o);
  r.on_tokens = [&](absl::Span<const int32_t> t) { sent.insert(sent.end(), t.begin(), t.end()); };
  const RequestId id =
      (*engine)->Submit(std::move(r), [&](absl::Status st, EngineResult res) {
        ended = st;
        EXPECT_EQ(res.stats.prefix_store_tokens, 96);
      });
  for (int i = 0; i < 4000 && sent.size() < 60; ++i) ASSERT_TRUE((*engine)->Step().ok());
  ASSERT_GE(sent.size(), 60u);
  const int reads = store.reads;
  (*engine)->Cancel(id);
  for (int i = 0; i < 100 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
  ASSERT_TRUE((*engine)->Idle());
  EXPECT_TRUE(absl::IsCancelled(ended)) << ended;
  EXPECT_EQ(store.reads, reads) << "the cancel read the stored prefix again";
  // Its output's blocks are there for the next turn, which is exact.
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), sent.begin(), sent.end());
  o.max_tokens = 8;
  auto got = (*engine)->Generate({MakeRequest(next, o)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens, GenerateFull(*model_, next, o)->tokens);
  EXPECT_EQ((*got)[0].stats.prefix_store_tokens, static_cast<int64_t>((prompt.size() + sent.size() - 1) / 16 * 16));
}

// An engine with nothing to run but a fetch in flight waits for it a while at most, as for a store
// lookup: its caller (a worker's scheduler) comes back for new requests, cancels and the other
// engine's batch. Before, a step waited for the fetch, a store read here held for as long as the
// test liked. Output exact once the read goes through.
TEST_F(EngineExactness, AStepWaitsForAFetchAWhileAtMost) {
  GenerateOptions o;
  EngineOptions eo;
  TierTestOptions(100, &o, &eo);
  eo.prefix_cache_bytes = 0;  // no compressed copy: the first pass waits for the stored prefix
  HostKvTier tier(model_->kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = RandomPrompt(100, 904);
  ASSERT_TRUE((*engine)->Generate({MakeRequest(prompt, o)}).ok());  // publishes its blocks
  store.hold_reads = true;
  std::vector<int32_t> got;
  absl::Status ended = absl::UnknownError("not ended");
  EngineRequest r = MakeRequest(prompt, o);
  r.on_tokens = [&](absl::Span<const int32_t> t) { got.insert(got.end(), t.begin(), t.end()); };
  (*engine)->Submit(std::move(r), [&](absl::Status st, EngineResult) { ended = st; });
  for (int i = 0; i < 20; ++i) {
    auto step = std::async(std::launch::async, [&] { return (*engine)->Step(/*may_wait=*/true); });
    if (step.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      store.hold_reads = false;
      step.get().IgnoreError();
      FAIL() << "step " << i << " waited for the held read";
    }
    ASSERT_TRUE(step.get().ok());
  }
  EXPECT_TRUE(got.empty());
  store.hold_reads = false;
  for (int i = 0; i < 2000 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
  ASSERT_TRUE(ended.ok()) << ended;
  EXPECT_EQ(got, GenerateFull(*model_, prompt, o)->tokens);
}

TEST_F(EngineExactness, StagingThatCanNeverHoldASequenceEndsItAlone) {
  // Four blocks (64 positions) take a 60-token prompt's prefill, but not the prompt and its 16
  // output tokens that a verify pass may need: the request ends with kResourceExhausted before it
  // starts, once, and the engine goes on with the next one. The same for a host tier too small.
  HostKvTier tier(model_->kv_layout(16), 0);
  EngineOptions eo;
  eo.compressor = "kivi:bits=4";
  eo.draft_window = 8;
  eo.staging_blocks = 4;
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateOptions o;
  o.max_tokens = 16;
  o.stop_at_eos = false;
  int calls = 0;
  absl::Status got;
  (*engine)->Submit(MakeRequest(RandomPrompt(60, 5), o), [&](absl::Status st, EngineResult) {
    ++calls;
    got = st;
  });
  for (int i = 0; i < 100 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_TRUE((*engine)->Idle());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kResourceExhausted) << got;
  // A request that fits still runs, and exactly.
  std::vector<int32_t> prompt = RandomPrompt(30, 6);
  EngineResult out;
  (*engine)->Submit(MakeRequest(prompt, o), [&](absl::Status st, EngineResult r) {
    got = st;
    out = std::move(r);
  });
  for (int i = 0; i < 100 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
  ASSERT_TRUE(got.ok()) << got;
  EXPECT_EQ(out.tokens, GenerateFull(*model_, prompt, o)->tokens);

  HostKvTier small(model_->kv_layout(16), 0, 1, /*capacity_bytes=*/1024);
  eo.staging_blocks = 64;
  engine = VeriCacheEngine::Create(*model_, &small, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->Submit(MakeRequest(prompt, o), [&](absl::Status st, EngineResult) { got = st; });
  for (int i = 0; i < 100 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_EQ(got.code(), absl::StatusCode::kResourceExhausted) << got;
  EXPECT_NE(got.message().find("host KV tier"), absl::string_view::npos) << got;
}

// Logits that overflow float32 end only the sequence that samples from them, with the error full
// decoding gives it (its first draft step overflows too, which ends its window, not the step); a
// row no decoding samples from (here a prompt row after a stored prefix) ends nothing. The model
// overflows in every row whose input is kOverflowToken.
class EngineOverflow : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const std::string dir = testing::TempDir("engine_overflow");
    testing::WriteModelOverflowingOn(dir);
    model_ = Model::Load(dir, testing::TestModelOptions())->release();
  }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* EngineOverflow::model_ = nullptr;

TEST_F(EngineOverflow, OnlyTheSequenceThatSamplesAnOverflowEnds) {
  const Model& model = *model_;
  GenerateOptions o;
  o.max_tokens = 8;
  o.stop_at_eos = false;
  std::vector<int32_t> ends_on = RandomPrompt(40, 1);
  ends_on.back() = testing::kOverflowToken;
  const std::vector<int32_t> clean = testing::WithoutOverflowToken(RandomPrompt(40, 2));
  ASSERT_EQ(GenerateFull(model, ends_on, o).status().code(), absl::StatusCode::kDataLoss);
  auto want = GenerateFull(model, clean, o);
  ASSERT_TRUE(want.ok()) << want.status();

  HostKvTier tier(model.kv_layout(16), 0);
  testing::MemoryPrefixStore store(16);
  EngineOptions eo;
  eo.compressor = "kivi:bits=4";
  eo.draft_window = 4;
  eo.staging_blocks = 64;
  auto engine = VeriCacheEngine::Create(model, &tier, eo, &store);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<absl::Status> st(4, absl::UnknownError("not done"));
  std::vector<EngineResult> out(4);
  auto submit = [&](size_t i, const std::vector<int32_t>& prompt) {
    (*engine)->Submit(MakeRequest(prompt, o), [&, i](absl::Status s, EngineResult r) {
      st[i] = s;
      out[i] = std::move(r);
    });
  };
  auto run = [&] {
    for (int i = 0; i < 1000 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_TRUE((*engine)->Idle());
  };
  // In one batch: the one whose next token is sampled from an overflow fails, the other is exact.
  submit(0, ends_on);
  submit(1, clean);
  run();
  EXPECT_EQ(st[0].code(), absl::StatusCode::kDataLoss) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  EXPECT_EQ(out[1].tokens, want->tokens);
  // A prompt whose first 96 tokens the store holds, with the overflowing token after them: the
  // verify pass computes its row, which nothing samples from.
  const std::vector<int32_t> shared = testing::WithoutOverflowToken(RandomPrompt(6 * 16 + 24, 3));
  std::vector<int32_t> inside = shared;
  inside[6 * 16 + 5] = testing::kOverflowToken;
  auto want_inside = GenerateFull(model, inside, o);
  ASSERT_TRUE(want_inside.ok()) << want_inside.status();
  submit(2, shared);
  run();
  ASSERT_TRUE(st[2].ok()) << st[2];
  submit(3, inside);
  run();
  ASSERT_TRUE(st[3].ok()) << st[3];
  EXPECT_EQ(out[3].stats.prefix_store_tokens, 6 * 16);
  EXPECT_EQ(out[3].tokens, want_inside->tokens);
}

// A sequence that generates the overflowing token gets the tokens decoding gives up to it, that
// token included, and then the error, whatever its draft window (its drafts may accept the token
// and the overflow come at a row inside the pass).
TEST_F(EngineOverflow, TheTokensBeforeAnOverflowAreStreamedThenTheError) {
  const Model& model = *model_;
  GenerateOptions o;
  o.max_tokens = 24;
  o.stop_at_eos = false;
  // A prompt whose output has the token after a few others: decoding fails once it samples past it.
  std::vector<int32_t> prompt, want;
  for (uint32_t seed = 1; seed < 3000 && want.empty(); ++seed) {
    prompt = testing::WithoutOverflowToken(RandomPrompt(40, seed));
    if (GenerateFull(model, prompt, o).ok()) continue;
    for (int m = 2; m <= o.max_tokens; ++m) {
      GenerateOptions upto = o;
      upto.max_tokens = m;
      auto got = GenerateFull(model, prompt, upto);
      if (!got.ok()) break;
      want = got->tokens;
    }
    if (want.size() < 2 || want.back() != testing::kOverflowToken) want.clear();
  }
  ASSERT_FALSE(want.empty()) << "no prompt's output has the overflowing token after another";
  for (int window : {1, 4, 16}) {
    HostKvTier tier(model.kv_layout(16), 0);
    EngineOptions eo;
    eo.compressor = "kivi:bits=4";
    eo.draft_window = window;
    eo.staging_blocks = 16;
    auto engine = VeriCacheEngine::Create(model, &tier, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EngineRequest r = MakeRequest(prompt, o);
    std::vector<int32_t> streamed;
    r.on_tokens = [&](absl::Span<const int32_t> t) { streamed.insert(streamed.end(), t.begin(), t.end()); };
    absl::Status st = absl::UnknownError("not done");
    (*engine)->Submit(std::move(r), [&](absl::Status s, EngineResult) { st = s; });
    for (int i = 0; i < 1000 && !(*engine)->Idle(); ++i) ASSERT_TRUE((*engine)->Step().ok());
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << window << ": " << st;
    EXPECT_EQ(streamed, want) << window;
  }
}

// KV prefilled elsewhere (a benchmark's shared prefill) builds the draft cache; a compressor that
// chooses what to keep from the prompt's last queries takes them along with it.
TEST_F(EngineExactness, PrefilledKvBuildsTheDraftCache) {
  const std::vector<int32_t> prompt = RandomPrompt(90, 45);
  const int64_t n = static_cast<int64_t>(prompt.size()) - 1;
  PagedKvCache pre(model_->kv_layout(16), 8);
  const SeqId seq = pre.NewSequence();
  auto queries = PrefillRecordingQueries(*model_, absl::MakeConstSpan(prompt).first(n), 32, pre, seq, 16);
  ASSERT_TRUE(queries.ok()) << queries.status();
  GenerateOptions o;
  o.max_tokens = 20;
  o.stop_at_eos = false;
  o.sampling = {0.8f, 0, 1.0f, 3};
  auto want = GenerateFull(*model_, prompt, o);
  ASSERT_TRUE(want.ok());
  for (const char* spec : {"kivi:bits=4", "snapkv:capacity=48,window=16,kernel=3"}) {
    SCOPED_TRACE(spec);
    HostKvTier tier(model_->kv_layout(16), 0);
    EngineOptions eo;
    eo.compressor = spec;
    eo.draft_window = 4;
    auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EngineRequest r = MakeRequest(prompt, o, PrefilledKv{&pre, seq, &*queries});
    auto got = (*engine)->Generate({&r, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].tokens, want->tokens);
    EXPECT_GT((*got)[0].stats.drafted, 0);
  }
  // Without the queries SnapKV cannot choose: the request is refused, not built from nothing.
  HostKvTier tier(model_->kv_layout(16), 0);
  EngineOptions eo;
  eo.compressor = "snapkv:capacity=48,window=16,kernel=3";
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EngineRequest r = MakeRequest(prompt, o, PrefilledKv{&pre, seq});
  EXPECT_EQ((*engine)->Generate({&r, 1}).status().code(), absl::StatusCode::kFailedPrecondition);
  // And the prefilled KV is what the engine reads: too short a one is the request's error.
  ASSERT_TRUE(pre.Truncate(seq, 10).ok());
  r.prefilled.queries = &*queries;
  EXPECT_EQ((*engine)->Generate({&r, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineExactness, RejectsBadOptions) {
  HostKvTier tier(model_->kv_layout(16), 0);
  EngineOptions eo;
  eo.compressor = "kivi:bits=3";
  EXPECT_EQ(VeriCacheEngine::Create(*model_, &tier, eo).status().code(), absl::StatusCode::kInvalidArgument);
  eo.compressor = "kivi:bits=4";
  auto engine = VeriCacheEngine::Create(*model_, &tier, eo);
  ASSERT_TRUE(engine.ok());
  GenerateOptions o;
  o.max_tokens = 0;
  std::vector<EngineRequest> reqs = {MakeRequest(RandomPrompt(5, 1), o)};
  EXPECT_EQ((*engine)->Generate(reqs).status().code(), absl::StatusCode::kInvalidArgument);
}

// The shipped test model on real held-out code with a context beyond 4K tokens.
TEST(EngineOnTestModel, LongCodeContextsGreedyAndSampled) {
  const std::string dir = std::string(VC_SOURCE_DIR) + "/models/vc-code-4m";
  auto model = Model::Load(dir, testing::TestModelOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  std::string code;
  {
    // Real Python, the test model's own domain, in a file that does not change with the code.
    std::ifstream in(std::string(VC_SOURCE_DIR) + "/models/train.py");
    std::stringstream ss;
    ss << in.rdbuf();
    code = ss.str();
  }
  ASSERT_GT(code.size(), 9000u);
  std::vector<std::vector<int32_t>> prompts = {
      (*model)->tokenizer().Encode(code.substr(0, 4400)),
      (*model)->tokenizer().Encode(code.substr(2000, 1500)),
  };
  for (const auto& [spec, temp] : std::vector<std::pair<std::string, float>>{
           {"kivi:bits=4", 0.0f}, {"kivi:bits=4", 0.7f}, {"quest:budget=1024+kivi:bits=4", 0.0f},
           {"quest:budget=1024+kivi:bits=4", 0.7f}}) {
    GenerateOptions o;
    o.max_tokens = 40;
    o.stop_at_eos = false;
    o.sampling = {temp, 0, 1.0f, 11};
    EngineOptions eo;
    eo.compressor = spec;
    // The full KV is fetched for every verify, so drafts can hide it and the adaptive window
    // drafts (how much depends on the costs it times; with the KV kept staged, drafting does not
    // pay on a CPU and the window stays near 0).
    eo.keep_staged = false;
    EngineStats total;
    EngineExactness::ExpectExact(**model, prompts, o, eo, &total);
    std::cout << spec << ", temperature " << temp << ": " << total.accepted_drafts << "/" << total.drafted
              << " drafts accepted over " << total.verifies << " verifies\n";
    EXPECT_GT(total.drafted, 0);
  }
}

}  // namespace
}  // namespace vc
