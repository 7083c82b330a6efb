// The full-KV baseline engine: every request's output equals sequential full-KV decoding
// (GenerateFull) token for token, whatever else is in the batch, however long it queued for KV
// memory and whether its prefix came from a prefix store or was computed. Requests end alone:
// cancelled, expired, invalid or too big for the pool, while the others go on.
#include "worker/engines/full_engine.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/held_store.h"
#include "tests/testing/kv_dtype.h"
#include "tests/testing/memory_prefix_store.h"
#include "tests/testing/next_turn.h"
#include "tests/testing/tiny_model.h"
#include "worker/runtime/full_decoder.h"

namespace vc {
namespace {

using testing::MemoryPrefixStore;

std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t = {256};
  for (int i = 1; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % 256));
  return t;
}

GenerateOptions Options(int max_tokens, float temperature, uint64_t seed, int prefill_chunk = 512) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.stop_at_eos = false;
  o.sampling = {temperature, temperature > 0 ? 40 : 0, temperature > 0 ? 0.95f : 1.0f, seed};
  o.prefill_chunk = prefill_chunk;
  return o;
}

std::vector<int32_t> Reference(const Model& model, const EngineRequest& r) {
  auto want = GenerateFull(model, r.prompt, r.options);
  EXPECT_TRUE(want.ok()) << want.status();
  return want.ok() ? want->tokens : std::vector<int32_t>{};
}

// What a request ended with, and the tokens it streamed.
struct Outcome {
  bool done = false;
  absl::Status status;
  EngineResult result;
  std::vector<int32_t> streamed;
};

// Drives the engine with Submit/Step the way a scheduler would.
class Driver {
 public:
  explicit Driver(Engine& engine) : engine_(engine) {}

  // Submits `r` (streaming into its outcome); returns the outcome's index.
  size_t Submit(EngineRequest r) {
    const size_t i = outcomes_.size();
    outcomes_.push_back(std::make_unique<Outcome>());
    Outcome* out = outcomes_.back().get();
    r.on_tokens = [out](absl::Span<const int32_t> t) { out->streamed.insert(out->streamed.end(), t.begin(), t.end()); };
    ids_.push_back(engine_.Submit(std::move(r), [out](absl::Status st, EngineResult res) {
      EXPECT_FALSE(out->done) << "a request ended twice";
      out->done = true;
      out->status = std::move(st);
      out->result = std::move(res);
    }));
    return i;
  }
  // One Step; records whether admission had to wait while others ran.
  void Step() {
    ASSERT_TRUE(engine_.Step().ok());
    max_active_ = std::max(max_active_, engine_.active());
    if (engine_.queued() > 0 && engine_.active() > 0) waited_ = true;
  }
  void RunUntilIdle() {
    while (!engine_.Idle()) {
      Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  Outcome& operator[](size_t i) { return *outcomes_[i]; }
  RequestId id(size_t i) const { return ids_[i]; }
  size_t max_active() const { return max_active_; }
  bool waited() const { return waited_; }

 private:
  Engine& engine_;
  std::vector<std::unique_ptr<Outcome>> outcomes_;
  std::vector<RequestId> ids_;
  size_t max_active_ = 0;
  bool waited_ = false;
};

class FullEngineTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const std::string dir = testing::TempDir("full_engine_tiny");
    testing::TinyModelSpec spec = testing::SmallGqaSpec();
    spec.weight_scale = 0.15f;
    testing::WriteTinyModel(dir, spec);
    model_ = Model::Load(dir, testing::TestModelOptions())->release();
  }
  static void TearDownTestSuite() { delete model_; }

  static std::unique_ptr<FullKvEngine> Engine(int64_t kv_blocks, int max_batch, PrefixStore* store = nullptr,
                                              bool fetch_prefix = true) {
    FullEngineOptions eo;
    eo.kv_blocks = kv_blocks;
    eo.max_batch = max_batch;
    eo.fetch_prefix = fetch_prefix;
    auto e = FullKvEngine::Create(*model_, eo, store);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static Model* model_;
};
Model* FullEngineTest::model_ = nullptr;

TEST_F(FullEngineTest, ManyRequestsInATightPoolMatchGenerateFull) {
  // Prompts from 1 to 150 tokens, chunked prefill of several sizes, greedy and sampled, with a
  // pool of 16 blocks (256 positions): the longest requests run nearly alone, the rest queue.
  std::vector<EngineRequest> reqs;
  const int lengths[] = {1, 150, 5, 17, 40, 63, 100, 2, 33, 120, 9, 77};
  for (int i = 0; i < 12; ++i) {
    const float temp = i % 3 == 0 ? 0.0f : 0.8f;
    reqs.push_back(MakeRequest(RandomPrompt(lengths[i], 10 + i), Options(8 + 5 * (i % 4), temp, 100 + i, 7 + 9 * i)));
  }
  reqs[4].options.max_tokens = 1;
  auto engine = Engine(16, 5);
  ASSERT_NE(engine, nullptr);
  Driver d(*engine);
  // Half arrive at once, the rest while the first ones run.
  for (int i = 0; i < 6; ++i) d.Submit(reqs[i]);
  for (int step = 0; step < 5; ++step) d.Step();
  for (int i = 6; i < 12; ++i) d.Submit(reqs[i]);
  d.RunUntilIdle();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(d.waited()) << "the pool was meant to make admission wait";
  EXPECT_LE(d.max_active(), 5u);
  EXPECT_EQ(engine->free_blocks(), 16);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(d[i].done) << i;
    ASSERT_TRUE(d[i].status.ok()) << i << ": " << d[i].status;
    EXPECT_EQ(d[i].result.tokens, Reference(*model_, reqs[i])) << "request " << i;
    EXPECT_EQ(d[i].streamed, d[i].result.tokens) << "request " << i;
    const EngineStats& st = d[i].result.stats;
    EXPECT_EQ(st.prompt_tokens, lengths[i]);
    EXPECT_EQ(st.emitted, static_cast<int64_t>(d[i].result.tokens.size()));
    EXPECT_GE(st.total_seconds, st.first_token_seconds);
    EXPECT_GE(st.first_token_seconds, st.queue_seconds);
  }
}

// One tenant's long requests fill the batch; another tenant's short request comes after them. With
// a cap on each tenant's share of the batch it runs at once and ends before any of the long ones;
// without, it waits for one of them to end. Every output is exact either way.
TEST_F(FullEngineTest, ATenantsShareOfTheBatchLeavesRoomForAnother) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    const bool is_long = i < 4;
    reqs.push_back(MakeRequest(RandomPrompt(20, 700 + i), Options(is_long ? 120 : 4, 0.0f, 1)));
    reqs.back().tenant = is_long ? "a" : "b";
  }
  for (const int cap : {3, 0}) {
    FullEngineOptions eo;
    eo.kv_blocks = 64;
    eo.max_batch = 4;
    eo.max_batch_per_tenant = cap;
    auto engine = FullKvEngine::Create(*model_, eo, nullptr);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Driver d(**engine);
    for (const EngineRequest& r : reqs) d.Submit(r);
    int long_done_before_short = -1;
    while (!(*engine)->Idle()) {
      d.Step();
      ASSERT_FALSE(HasFatalFailure());
      if (d[4].done && long_done_before_short < 0) {
        long_done_before_short = 0;
        for (int i = 0; i < 4; ++i) long_done_before_short += d[i].done;
      }
    }
    if (cap > 0) {
      EXPECT_EQ(long_done_before_short, 0) << "the short request waited for a long one";
    } else {
      EXPECT_GT(long_done_before_short, 0);
    }
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(d[i].status.ok()) << i << ": " << d[i].status;
      EXPECT_EQ(d[i].result.tokens, Reference(*model_, reqs[i])) << "request " << i << ", cap " << cap;
    }
  }
  FullEngineOptions bad;
  bad.kv_blocks = 8;
  bad.max_batch_per_tenant = -1;
  EXPECT_EQ(FullKvEngine::Create(*model_, bad, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FullEngineTest, SmallRequestsPassOneThatMustWaitAFewTimesAtMost) {
  // The pool holds one long request and three short ones. A second long one waits for the first;
  // short ones behind it pass it, 8 of them (several in one step), and then wait behind it.
  // Every output is exact.
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 14; ++i) {
    const bool is_long = i < 2;
    reqs.push_back(MakeRequest(RandomPrompt(is_long ? 100 : 20, 500 + i), Options(is_long ? 400 : 2, 0.0f, 1)));
  }
  auto engine = Engine((100 + 400) / 16 + 1 + 3 * 2, 4);
  ASSERT_NE(engine, nullptr);
  std::vector<int> done_order;
  std::vector<EngineResult> results(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    engine->Submit(reqs[i], [&, i](absl::Status st, EngineResult r) {
      EXPECT_TRUE(st.ok()) << st;
      results[i] = std::move(r);
      done_order.push_back(static_cast<int>(i));
    });
  }
  for (int step = 0; step < 5000 && !engine->Idle(); ++step) ASSERT_TRUE(engine->Step().ok());
  ASSERT_EQ(done_order.size(), reqs.size());
  EXPECT_EQ(std::find(done_order.begin(), done_order.end(), 0) - done_order.begin(), 8)
      << "short requests done before the first long one";
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(results[i].tokens, Reference(*model_, reqs[i])) << i;
}

TEST_F(FullEngineTest, EveryBatchSizeGivesTheSameTokens) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(MakeRequest(RandomPrompt(20 + 11 * i, 300 + i), Options(12, i % 2 ? 0.9f : 0.0f, 9, 16)));
  }
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(Reference(*model_, r));
  for (int batch : {1, 2, 3, 6}) {
    auto engine = Engine(64, batch);
    ASSERT_NE(engine, nullptr);
    auto got = engine->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ((*got)[i].tokens, want[i]) << "batch " << batch << " request " << i;
  }
}

TEST_F(FullEngineTest, GenerateRejectsBadRequestsUpFront) {
  auto engine = Engine(8, 4);
  ASSERT_NE(engine, nullptr);
  std::vector<EngineRequest> reqs = {MakeRequest(RandomPrompt(10, 1), Options(4, 0, 0)),
                                     MakeRequest(RandomPrompt(10, 2), Options(0, 0, 0))};
  EXPECT_EQ(engine->Generate(reqs).status().code(), absl::StatusCode::kInvalidArgument);
  reqs[1] = MakeRequest(RandomPrompt(120, 2), Options(16, 0, 0));  // 136 positions > 8 blocks of 16
  EXPECT_EQ(engine->Generate(reqs).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(engine->Idle());
  reqs.pop_back();
  auto got = engine->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens, Reference(*model_, reqs[0]));

  FullEngineOptions eo;  // kv_blocks unset
  EXPECT_EQ(FullKvEngine::Create(*model_, eo).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FullEngineTest, BadAndOversizedRequestsFailAlone) {
  auto engine = Engine(10, 4);
  ASSERT_NE(engine, nullptr);
  Driver d(*engine);
  std::vector<EngineRequest> reqs = {
      MakeRequest(RandomPrompt(30, 1), Options(10, 0.0f, 0)),
      MakeRequest(RandomPrompt(30, 2), Options(0, 0.0f, 0)),      // max_tokens < 1
      MakeRequest({256, 5, 9000}, Options(5, 0.0f, 0)),           // a token outside the vocabulary
      MakeRequest(RandomPrompt(150, 3), Options(20, 0.0f, 0)),    // 170 positions > 10 blocks of 16
      MakeRequest(RandomPrompt(30, 4), Options(10, 0.7f, 3)),
      MakeRequest({}, Options(3, 0.0f, 0)),                       // empty prompt
      MakeRequest(RandomPrompt(140, 5), Options(20, 0.7f, 4)),    // 160 positions: fits an empty pool
  };
  for (const auto& r : reqs) d.Submit(r);
  d.RunUntilIdle();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(d[1].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d[2].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d[3].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d[5].status.code(), absl::StatusCode::kInvalidArgument);
  for (size_t i : {1, 2, 3, 5}) EXPECT_TRUE(d[i].result.tokens.empty()) << i;
  for (size_t i : {0, 4, 6}) {
    ASSERT_TRUE(d[i].status.ok()) << i << ": " << d[i].status;
    EXPECT_EQ(d[i].result.tokens, Reference(*model_, reqs[i])) << i;
  }
}

TEST_F(FullEngineTest, CancelMidGenerationAndWhileQueued) {
  auto engine = Engine(12, 2);
  ASSERT_NE(engine, nullptr);
  Driver d(*engine);
  std::vector<EngineRequest> reqs = {MakeRequest(RandomPrompt(25, 1), Options(40, 0.8f, 5)),
                                     MakeRequest(RandomPrompt(25, 2), Options(40, 0.0f, 0)),
                                     MakeRequest(RandomPrompt(25, 3), Options(40, 0.0f, 0)),
                                     MakeRequest(RandomPrompt(25, 4), Options(20, 0.8f, 6))};
  for (const auto& r : reqs) d.Submit(r);
  // Requests 0 and 1 run (max_batch 2), 2 and 3 queue.
  while (d[0].streamed.size() < 6) {
    d.Step();
    ASSERT_FALSE(HasFatalFailure());
  }
  engine->Cancel(d.id(0));
  engine->Cancel(d.id(2));
  engine->Cancel(12345);  // unknown: nothing happens
  d.RunUntilIdle();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(d[0].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(d[2].status.code(), absl::StatusCode::kCancelled);
  const std::vector<int32_t> want0 = Reference(*model_, reqs[0]);
  ASSERT_EQ(d[0].result.tokens.size(), 6u);
  EXPECT_TRUE(std::equal(d[0].result.tokens.begin(), d[0].result.tokens.end(), want0.begin()));
  EXPECT_EQ(d[0].streamed, d[0].result.tokens);
  EXPECT_TRUE(d[2].result.tokens.empty());
  for (size_t i : {1, 3}) {
    ASSERT_TRUE(d[i].status.ok()) << i << ": " << d[i].status;
    EXPECT_EQ(d[i].result.tokens, Reference(*model_, reqs[i])) << i;
  }
  EXPECT_EQ(engine->free_blocks(), 12);
}

TEST_F(FullEngineTest, DeadlinesEndRequestsQueuedOrRunning) {
  auto engine = Engine(32, 4);
  ASSERT_NE(engine, nullptr);
  Driver d(*engine);
  EngineRequest late = MakeRequest(RandomPrompt(20, 1), Options(10, 0.0f, 0));
  late.deadline = absl::Now() - absl::Seconds(1);
  EngineRequest running = MakeRequest(RandomPrompt(20, 2), Options(50, 0.7f, 8));
  running.deadline = absl::Now() + absl::Milliseconds(500);
  const absl::Time deadline = running.deadline;
  // Passes the deadline once three tokens are out, so the outcome does not hang on timing.
  int seen = 0;
  running.on_tokens = [&seen, deadline](absl::Span<const int32_t> t) {
    seen += static_cast<int>(t.size());
    if (seen == 3) absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(5));
  };
  EngineRequest ok = MakeRequest(RandomPrompt(20, 3), Options(10, 0.0f, 0));
  d.Submit(late);
  Outcome r;
  engine->Submit(running, [&r](absl::Status st, EngineResult res) {
    r.done = true;
    r.status = std::move(st);
    r.result = std::move(res);
  });
  d.Submit(ok);
  d.RunUntilIdle();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(d[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(r.result.tokens.size(), 3u);
  const std::vector<int32_t> want = Reference(*model_, running);
  EXPECT_TRUE(std::equal(r.result.tokens.begin(), r.result.tokens.end(), want.begin()));
  ASSERT_TRUE(d[1].status.ok()) << d[1].status;
  EXPECT_EQ(d[1].result.tokens, Reference(*model_, ok));
}

TEST_F(FullEngineTest, RequestPrefilledKvSkipsThePrompt) {
  const std::vector<int32_t> prompt = RandomPrompt(70, 44);
  PagedKvCache pre(model_->kv_layout(16), 8);
  const SeqId seq = pre.NewSequence();
  std::vector<float> logits;
  const SequenceChunk c{seq, absl::MakeConstSpan(prompt).first(prompt.size() - 1)};
  ASSERT_TRUE(model_->Forward({&c, 1}, pre, LogitsFor::kLastRows, &logits).ok());
  EngineRequest r = MakeRequest(prompt, Options(15, 0.8f, 2), PrefilledKv{&pre, seq});
  auto engine = Engine(16, 2);
  ASSERT_NE(engine, nullptr);
  auto got = engine->Generate({&r, 1});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens, Reference(*model_, r));
  // Too short a prefilled KV is the request's error.
  ASSERT_TRUE(pre.Truncate(seq, 10).ok());
  EXPECT_EQ(engine->Generate({&r, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Requests that share prefixes of various lengths, through the store: stored prefixes are read,
// missing blocks published, and the output never depends on it.
TEST_F(FullEngineTest, PrefixStoreReadsPublishesAndRecomputes) {
  const std::vector<int32_t> shared = RandomPrompt(130, 77);
  auto with_tail = [&](int keep, int tail, uint32_t seed) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + keep);
    std::vector<int32_t> t = RandomPrompt(tail + 1, seed);
    p.insert(p.end(), t.begin() + 1, t.end());
    return p;
  };
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(MakeRequest(with_tail(130 - 17 * i, 3 + 4 * i, 900 + i), Options(10, i % 2 ? 0.8f : 0.0f, i, 32)));
  }
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(Reference(*model_, r));

  // block_tokens 24 straddles the engine's 16-token blocks.
  for (int bt : {16, 24}) {
    MemoryPrefixStore store(bt);
    auto engine = Engine(64, 4, &store);
    ASSERT_NE(engine, nullptr);
    // Full blocks of request i's prompt and output, whose K/V it computed (all but the last
    // token's): it publishes them all, its prompt's first and then its output's.
    const auto computed_blocks = [&](size_t i) {
      return static_cast<int>((reqs[i].prompt.size() + want[i].size() - 1) / bt);
    };
    // The first request alone: the store is cold, it publishes its full blocks.
    auto first = engine->Generate({&reqs[0], 1});
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ((*first)[0].tokens, want[0]);
    const int blocks0 = computed_blocks(0);
    EXPECT_EQ((*first)[0].stats.published_blocks, blocks0);
    EXPECT_EQ((*first)[0].stats.prefix_store_tokens, 0);
    EXPECT_EQ(static_cast<int>(store.size()), blocks0);

    // The rest together: each reads the shared blocks it has in common.
    auto got = engine->Generate(absl::MakeConstSpan(reqs).subspan(1));
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 1; i < reqs.size(); ++i) {
      const EngineStats& st = (*got)[i - 1].stats;
      EXPECT_EQ((*got)[i - 1].tokens, want[i]) << "bt " << bt << " request " << i;
      const int64_t shared_blocks = std::min<int64_t>((130 - 17 * i) / bt, (reqs[i].prompt.size() - 1) / bt);
      EXPECT_GE(st.prefix_store_tokens, shared_blocks * bt) << i;
      EXPECT_GT(st.prefix_store_tokens, 0) << i;
      EXPECT_EQ(st.bytes_fetched, st.prefix_store_tokens * model_->kv_layout(16).bytes_per_token());
      EXPECT_EQ(st.recomputed_tokens, 0);
    }

    // The store fails every read: each prompt is recomputed and republished with its output, same
    // tokens.
    store.fail_reads = true;
    const int published = store.published;
    got = engine->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    int64_t republished = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const EngineStats& st = (*got)[i].stats;
      EXPECT_EQ((*got)[i].tokens, want[i]) << "bt " << bt << " request " << i << " after a failed read";
      EXPECT_GT(st.recomputed_tokens, 0) << i;
      EXPECT_EQ(st.prefix_store_tokens, 0) << i;
      EXPECT_EQ(st.published_blocks, computed_blocks(i)) << i;
      republished += st.published_blocks;
    }
    EXPECT_EQ(store.published - published, republished);
    EXPECT_EQ(engine->free_blocks(), 64);
  }
}

// Store lookups and reads (calls to another server, up to its timeout when that server hangs) run
// off the engine's thread: a request whose lookup has not come back waits in the queue, and one
// whose stored prefix is still being read joins the batch once it has arrived, while the batch in
// flight goes on.
TEST_F(FullEngineTest, AHangingStoreLookupOrReadHoldsUpOnlyItsOwnRequest) {
  for (const bool reads : {false, true}) {
    SCOPED_TRACE(reads ? "reads held" : "lookups held");
    MemoryPrefixStore store(16);
    auto engine = Engine(64, 4, &store);
    ASSERT_NE(engine, nullptr);
    const EngineRequest a = MakeRequest(RandomPrompt(40, 500), Options(40, 0.0f, 0));
    const EngineRequest b = MakeRequest(RandomPrompt(40, 501), Options(40, 0.0f, 0));
    if (reads) {
      ASSERT_TRUE(engine->Generate({b}).ok());  // publishes b's blocks, for it to read
    }
    const int lookups = store.lookups;
    const testing::HeldStoreRun run =
        testing::RunWithStoreHeld(*engine, reads ? store.hold_reads : store.hold_lookups, a, b);
    testing::ExpectOnlyTheSecondWaited(run, Reference(*model_, a), Reference(*model_, b));
    EXPECT_EQ(store.lookups - lookups, 2);
    EXPECT_EQ(store.reads, reads ? 1 : 0);
  }
}

// A request cancelled mid-generation (a stop sequence is a cancel) shares the blocks its output
// completed: the next turn, whose prompt extends what it sent, reads them from the store.
TEST_F(FullEngineTest, ACancelledRequestSharesItsOutputForTheNextTurn) {
  GenerateOptions o = Options(200, 0.0f, 0);
  MemoryPrefixStore store(16);
  auto owned = Engine(64, 4, &store);
  ASSERT_NE(owned, nullptr);
  FullKvEngine* engine = owned.get();
  const std::vector<int32_t> prompt = RandomPrompt(100, 900);
  const testing::NextTurnRun run = testing::CancelThenNextTurn(*engine, prompt, o, 60, 10, 8);
  ASSERT_GE(run.sent.size(), 60u);
  EXPECT_EQ(run.result.tokens, Reference(*model_, MakeRequest(run.next, run.options)));
  // Every token it sent but the last had exact K/V when it was cancelled.
  EXPECT_EQ(run.result.stats.prefix_store_tokens, static_cast<int64_t>((prompt.size() + run.sent.size() - 1) / 16 * 16));
}

// Logits that overflow float32 end only the sequence that samples from them (the batch goes on),
// and a prefill chunk's last row, which nothing samples from, ends nothing. The model overflows in
// every row whose input is kOverflowToken.
TEST(FullEngineOverflow, OnlyTheSequenceThatSamplesAnOverflowEnds) {
  const std::string dir = testing::TempDir("full_engine_overflow");
  testing::WriteModelOverflowingOn(dir);
  auto model = Model::Load(dir, testing::TestModelOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  FullEngineOptions eo;
  eo.kv_blocks = 64;
  eo.max_batch = 4;
  auto engine = FullKvEngine::Create(**model, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<int32_t> ends_on = testing::WithoutOverflowToken(RandomPrompt(40, 1));
  ends_on.back() = testing::kOverflowToken;
  std::vector<int32_t> chunk_ends_on = testing::WithoutOverflowToken(RandomPrompt(40, 2));
  chunk_ends_on[15] = testing::kOverflowToken;  // the last row of the first 16-token chunk
  Driver d(**engine);
  d.Submit(MakeRequest(ends_on, Options(8, 0.0f, 1)));
  const EngineRequest clean = MakeRequest(chunk_ends_on, Options(8, 0.0f, 1, /*prefill_chunk=*/16));
  d.Submit(clean);
  d.RunUntilIdle();
  EXPECT_EQ(d[0].status.code(), absl::StatusCode::kDataLoss) << d[0].status;
  ASSERT_TRUE(d[1].status.ok()) << d[1].status;
  EXPECT_EQ(d[1].result.tokens, Reference(**model, clean));
}

TEST_F(FullEngineTest, StoredPrefixIsWhatTheSequenceAttendsTo) {
  // Corrupt blocks served as if they were good change the output: the engine really decodes over
  // what it read instead of computing the prefix anyway.
  MemoryPrefixStore store(16);
  auto engine = Engine(32, 2, &store);
  ASSERT_NE(engine, nullptr);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(MakeRequest(RandomPrompt(100, 50 + i), Options(12, 0.0f, 0)));
  ASSERT_TRUE(engine->Generate(reqs).ok());
  store.corrupt_reads = true;
  auto got = engine->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  int differ = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].stats.prefix_store_tokens, 96);
    differ += (*got)[i].tokens != Reference(*model_, reqs[i]);
  }
  EXPECT_GT(differ, 0);
}

TEST_F(FullEngineTest, RecomputeBaselineLeavesTheStoreAlone) {
  MemoryPrefixStore store(16);
  auto warm = Engine(32, 2, &store);
  ASSERT_NE(warm, nullptr);
  std::vector<EngineRequest> reqs = {MakeRequest(RandomPrompt(90, 5), Options(10, 0.0f, 0)),
                                     MakeRequest(RandomPrompt(60, 6), Options(10, 0.8f, 1))};
  ASSERT_TRUE(warm->Generate(reqs).ok());
  const int lookups = store.lookups, reads = store.reads, published = store.published;
  store.corrupt_reads = true;  // would show in the output if anything were read
  auto engine = Engine(32, 2, &store, /*fetch_prefix=*/false);
  ASSERT_NE(engine, nullptr);
  auto got = engine->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, Reference(*model_, reqs[i])) << i;
    EXPECT_EQ((*got)[i].stats.prefix_store_tokens, 0);
    EXPECT_EQ((*got)[i].stats.published_blocks, 0);
  }
  EXPECT_EQ(store.lookups, lookups);
  EXPECT_EQ(store.reads, reads);
  EXPECT_EQ(store.published, published);
}

// The shipped test model on real code: long prompts sharing a prefix, a pool that holds about two
// of them, greedy and sampled, with and without the prefix store.
TEST(FullEngineOnTestModel, LongCodePromptsThroughATightPool) {
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
  ASSERT_GT(code.size(), 6000u);
  const Tokenizer& tok = (*model)->tokenizer();
  std::vector<EngineRequest> reqs;
  reqs.push_back(MakeRequest(tok.Encode(code.substr(0, 1600)), Options(24, 0.0f, 0, 256)));
  reqs.push_back(MakeRequest(tok.Encode(code.substr(0, 1200) + code.substr(3000, 300)), Options(24, 0.7f, 11, 256)));
  reqs.push_back(MakeRequest(tok.Encode(code.substr(4000, 900)), Options(24, 0.0f, 0, 128)));
  reqs.push_back(MakeRequest(tok.Encode(code.substr(0, 1600)), Options(24, 0.7f, 12, 512)));
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(Reference(**model, r));

  MemoryPrefixStore store(64);
  for (PrefixStore* prefixes : {static_cast<PrefixStore*>(nullptr), static_cast<PrefixStore*>(&store)}) {
    FullEngineOptions eo;
    eo.kv_blocks = 2 * (1700 + 24) / 16;
    eo.max_batch = 4;
    auto engine = FullKvEngine::Create(**model, eo, prefixes);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Driver d(**engine);
    for (const auto& r : reqs) d.Submit(r);
    d.RunUntilIdle();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_TRUE(d.waited());
    int64_t from_store = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(d[i].status.ok()) << d[i].status;
      EXPECT_EQ(d[i].result.tokens, want[i]) << "request " << i << (prefixes ? " with the store" : "");
      EXPECT_EQ(d[i].streamed, d[i].result.tokens);
      from_store += d[i].result.stats.prefix_store_tokens;
    }
    if (prefixes != nullptr) {
      // Requests 0 and 1 are admitted together into an empty store; request 3, admitted after
      // request 0's prompt was published, reads all of its identical prompt's full blocks.
      EXPECT_EQ(d[3].result.stats.prefix_store_tokens, static_cast<int64_t>(reqs[3].prompt.size() - 1) / 64 * 64);
      EXPECT_EQ(from_store, d[3].result.stats.prefix_store_tokens);
    }
  }
}

}  // namespace
}  // namespace vc
