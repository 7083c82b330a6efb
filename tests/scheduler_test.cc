// The scheduler on its own, without gRPC: limits, draining, cancellation and stops, shutdown, the
// stall clock, which engine may wait, and the real engines under it giving sequential decoding's
// output.
#include "worker/engines/scheduler.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/tiny_model.h"
#include "worker/engines/full_engine.h"
#include "worker/engines/vericache_engine.h"
#include "worker/prefixes/full_kv_tier.h"
#include "worker/runtime/full_decoder.h"

namespace vc {
namespace {

// An engine that emits one token a Step to each request in flight (the request's first prompt
// token plus its count so far) until max_tokens, unless held. What it is asked is counted in
// atomics, since the scheduler's thread drives it while the test reads.
class ScriptedEngine final : public Engine {
 public:
  RequestId Submit(EngineRequest request, DoneCallback on_done) override {
    Live l;
    l.id = next_id_;
    l.request = std::move(request);
    l.on_done = std::move(on_done);
    live_.push_back(std::move(l));
    submitted_++;
    return next_id_++;
  }
  void Cancel(RequestId id) override {
    for (Live& l : live_) {
      if (l.id == id) l.cancelled = true;
    }
    cancels_++;
  }
  absl::Status Step(bool may_wait) override {
    (may_wait ? steps_may_wait_ : steps_no_wait_)++;
    std::vector<Live> still;
    for (Live& l : live_) {
      if (l.cancelled) {
        l.on_done(absl::CancelledError("cancelled"), std::move(l.result));
        continue;
      }
      if (!hold_) {
        const int32_t t = l.request.prompt[0] + static_cast<int32_t>(l.result.tokens.size());
        l.result.tokens.push_back(t);
        l.result.stats.emitted++;
        if (l.request.on_tokens) l.request.on_tokens({&t, 1});
      }
      if (static_cast<int>(l.result.tokens.size()) >= l.request.options.max_tokens) {
        l.on_done(absl::OkStatus(), std::move(l.result));
        continue;
      }
      still.push_back(std::move(l));
    }
    live_ = std::move(still);
    return absl::OkStatus();
  }
  bool Idle() const override { return live_.empty(); }
  size_t queued() const override { return 0; }
  size_t active() const override { return live_.size(); }
  absl::StatusOr<std::vector<EngineResult>> Generate(absl::Span<const EngineRequest>) override {
    return absl::UnimplementedError("not scripted");
  }

  std::atomic<bool> hold_{false};
  std::atomic<int> submitted_{0}, cancels_{0}, steps_may_wait_{0}, steps_no_wait_{0};

 private:
  struct Live {
    RequestId id = 0;
    EngineRequest request;
    DoneCallback on_done;
    EngineResult result;
    bool cancelled = false;
  };
  RequestId next_id_ = 1;
  std::vector<Live> live_;
};

EngineRequest Request(int32_t first, int max_tokens, std::string tenant = "") {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  EngineRequest r = MakeRequest({first}, o);
  r.tenant = std::move(tenant);
  return r;
}

// Queues `r` on engine `engine`, streaming into the stream it returns (null when refused, with
// the status in *refused).
std::shared_ptr<RequestStream> Queue(Scheduler& s, EngineRequest r, size_t engine = 0,
                                     absl::Status* refused = nullptr) {
  auto stream = std::make_shared<RequestStream>();
  r.on_tokens = [stream](absl::Span<const int32_t> t) { stream->Push(t); };
  absl::Status st = s.Enqueue(std::move(r), engine, stream);
  if (refused != nullptr) *refused = st;
  return st.ok() ? stream : nullptr;
}

// Takes a stream's tokens until it ends (or 10 s pass: a failure).
std::vector<int32_t> Drain(RequestStream& stream) {
  std::vector<int32_t> all, part;
  for (int i = 0; i < 500; ++i) {
    const bool done = stream.Take(absl::Milliseconds(20), &part);
    all.insert(all.end(), part.begin(), part.end());
    if (done) return all;
  }
  ADD_FAILURE() << "the request did not end";
  return all;
}

struct OneEngine {
  explicit OneEngine(SchedulerOptions o = {}) {
    auto e = std::make_unique<ScriptedEngine>();
    engine = e.get();
    std::vector<std::unique_ptr<Engine>> engines;
    engines.push_back(std::move(e));
    scheduler = std::make_unique<Scheduler>(std::move(engines), std::move(o));
  }
  ScriptedEngine* engine;
  std::unique_ptr<Scheduler> scheduler;
};

TEST(Scheduler, RequestsStreamTheirTokensAndAreCountedPerTenant) {
  OneEngine w;
  auto a = Queue(*w.scheduler, Request(10, 3, "a"));
  auto b = Queue(*w.scheduler, Request(20, 5, "b"));
  auto c = Queue(*w.scheduler, Request(30, 2, "a"));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(Drain(*a), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(Drain(*b), (std::vector<int32_t>{20, 21, 22, 23, 24}));
  EXPECT_EQ(Drain(*c), (std::vector<int32_t>{30, 31}));
  EXPECT_TRUE(a->status().ok() && b->status().ok() && c->status().ok());
  EXPECT_EQ(b->stats().emitted, 5);
  ASSERT_TRUE(w.scheduler->WaitIdle(absl::Seconds(5)));
  const Scheduler::Snapshot s = w.scheduler->totals();
  EXPECT_EQ(s.all.ended, 3);
  EXPECT_EQ(s.all.in_flight, 0);
  EXPECT_EQ(s.all.sum.emitted, 10);
  EXPECT_EQ(s.tenants.at("a").ended, 2);
  EXPECT_EQ(s.tenants.at("a").sum.emitted, 5);
  EXPECT_EQ(s.tenants.at("b").ended, 1);
}

TEST(Scheduler, LimitsRefuseWithResourceExhausted) {
  OneEngine w(SchedulerOptions{3, 2, nullptr});
  w.engine->hold_ = true;
  absl::Status st;
  auto a1 = Queue(*w.scheduler, Request(1, 1, "a"), 0, &st);
  auto a2 = Queue(*w.scheduler, Request(2, 1, "a"), 0, &st);
  ASSERT_TRUE(a1 && a2);
  EXPECT_EQ(Queue(*w.scheduler, Request(3, 1, "a"), 0, &st), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("tenant 'a'"), std::string::npos) << st;
  auto b1 = Queue(*w.scheduler, Request(4, 1, "b"), 0, &st);
  ASSERT_TRUE(b1);
  EXPECT_EQ(Queue(*w.scheduler, Request(5, 1, "c"), 0, &st), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(Queue(*w.scheduler, Request(6, 1), 7, &st), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  const Scheduler::Snapshot s = w.scheduler->totals();
  EXPECT_EQ(s.all.refused, 2);
  EXPECT_EQ(s.all.in_flight, 3);
  EXPECT_EQ(s.tenants.at("a").refused, 1);
  EXPECT_EQ(s.tenants.at("c").refused, 1);
  // Room again once they end.
  w.engine->hold_ = false;
  for (auto* x : {&a1, &a2, &b1}) Drain(**x);
  ASSERT_TRUE(w.scheduler->WaitIdle(absl::Seconds(5)));
  EXPECT_NE(Queue(*w.scheduler, Request(7, 1, "a")), nullptr);
}

TEST(Scheduler, DrainingRefusesNewRequestsAndFinishesAdmittedOnes) {
  OneEngine w;
  w.engine->hold_ = true;
  auto a = Queue(*w.scheduler, Request(1, 4));
  ASSERT_TRUE(a);
  w.scheduler->StopAdmitting();
  absl::Status st;
  EXPECT_EQ(Queue(*w.scheduler, Request(2, 1), 0, &st), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_FALSE(w.scheduler->WaitIdle(absl::Milliseconds(50)));
  w.engine->hold_ = false;
  EXPECT_EQ(Drain(*a).size(), 4u);
  EXPECT_TRUE(a->status().ok()) << a->status();
  EXPECT_TRUE(w.scheduler->WaitIdle(absl::Seconds(5)));
  EXPECT_EQ(w.scheduler->totals().all.refused, 1);
}

TEST(Scheduler, ACancelReachesTheEngineAndAStopEndsWell) {
  OneEngine w;
  w.engine->hold_ = true;
  auto cancelled = Queue(*w.scheduler, Request(1, 100));
  auto stopped = Queue(*w.scheduler, Request(2, 100));
  ASSERT_TRUE(cancelled && stopped);
  cancelled->RequestCancel();
  stopped->RequestStop();
  Drain(*cancelled);
  Drain(*stopped);
  EXPECT_TRUE(absl::IsCancelled(cancelled->status())) << cancelled->status();
  EXPECT_TRUE(stopped->status().ok()) << stopped->status();
  EXPECT_EQ(w.engine->cancels_.load(), 2);
  ASSERT_TRUE(w.scheduler->WaitIdle(absl::Seconds(5)));
  const Scheduler::Snapshot s = w.scheduler->totals();
  EXPECT_EQ(s.all.failed, 1);
  EXPECT_EQ(s.all.ended, 1);
}

TEST(Scheduler, ShutdownEndsWhatIsInFlightAsUnavailable) {
  OneEngine w;
  w.engine->hold_ = true;
  auto a = Queue(*w.scheduler, Request(1, 100));
  ASSERT_TRUE(a);
  for (int i = 0; i < 200 && w.engine->submitted_ == 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  w.scheduler.reset();
  std::vector<int32_t> tokens;
  EXPECT_TRUE(a->Take(absl::ZeroDuration(), &tokens));
  EXPECT_EQ(a->status().code(), absl::StatusCode::kUnavailable) << a->status();
}

TEST(Scheduler, StalledForCountsOnlyWhileRequestsWaitOnAHeldLoop) {
  absl::Notification release;
  std::atomic<bool> stall{false};
  OneEngine w(SchedulerOptions{16, 0, [&] {
                                 if (stall) release.WaitForNotification();
                               }});
  EXPECT_EQ(w.scheduler->StalledFor(), absl::ZeroDuration());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(w.scheduler->StalledFor(), absl::ZeroDuration()) << "idle is not stalled";
  stall = true;
  auto a = Queue(*w.scheduler, Request(1, 2));
  ASSERT_TRUE(a);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GE(w.scheduler->StalledFor(), absl::Milliseconds(200));
  stall = false;
  release.Notify();
  Drain(*a);
  ASSERT_TRUE(w.scheduler->WaitIdle(absl::Seconds(5)));
  EXPECT_EQ(w.scheduler->StalledFor(), absl::ZeroDuration());
}

// An engine may wait for its store only while the other has nothing to do: with both busy,
// neither waits; with one alone, it may.
TEST(Scheduler, AnEngineWaitsOnlyWhileTheOtherIsQuiet) {
  auto e0 = std::make_unique<ScriptedEngine>();
  auto e1 = std::make_unique<ScriptedEngine>();
  ScriptedEngine* first = e0.get();
  ScriptedEngine* second = e1.get();
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(std::move(e0));
  engines.push_back(std::move(e1));
  Scheduler s(std::move(engines), {});
  auto alone = Queue(s, Request(1, 5), 0);
  ASSERT_TRUE(alone);
  Drain(*alone);
  EXPECT_GT(first->steps_may_wait_.load(), 0);
  EXPECT_EQ(first->steps_no_wait_.load(), 0);
  ASSERT_TRUE(s.WaitIdle(absl::Seconds(5)));

  first->hold_ = true;
  second->hold_ = true;
  auto a = Queue(s, Request(1, 3), 0);
  auto b = Queue(s, Request(2, 3), 1);
  ASSERT_TRUE(a && b);
  for (int i = 0; i < 400 && (first->steps_no_wait_ < 3 || second->steps_no_wait_ < 3); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(first->steps_no_wait_.load(), 3);
  EXPECT_GE(second->steps_no_wait_.load(), 3);
  const int second_may_wait = second->steps_may_wait_.load();
  first->hold_ = false;
  second->hold_ = false;
  Drain(*a);
  Drain(*b);
  EXPECT_EQ(second_may_wait, 0) << "the second engine was let wait while the first had work";
}

// The real engines under the scheduler, concurrently and mixed: every output is what sequential
// full-KV decoding gives.
TEST(Scheduler, RealEnginesGiveSequentialDecodingsOutput) {
  const std::string dir = testing::TempDir("scheduler_tiny");
  testing::WriteTinyModel(dir, testing::SmallGqaSpec());
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions eo;
  eo.staging_blocks = 64;
  HostKvTier tier((*model)->kv_layout(eo.block_size), 0);
  auto vericache = VeriCacheEngine::Create(**model, &tier, eo);
  ASSERT_TRUE(vericache.ok()) << vericache.status();
  FullEngineOptions fo;
  fo.kv_blocks = 64;
  auto full = FullKvEngine::Create(**model, fo);
  ASSERT_TRUE(full.ok()) << full.status();
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(*std::move(vericache));
  engines.push_back(*std::move(full));
  Scheduler s(std::move(engines), {});

  std::vector<EngineRequest> requests;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    GenerateOptions o;
    o.max_tokens = 24;
    o.stop_at_eos = false;
    o.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    o.sampling.seed = static_cast<uint64_t>(i + 1);
    std::vector<int32_t> prompt = {256};
    for (int j = 0; j < 40 + 13 * i; ++j) prompt.push_back((j * 37 + i * 11) % 256);
    requests.push_back(MakeRequest(prompt, o));
    streams.push_back(Queue(s, requests.back(), static_cast<size_t>(i % 2)));
    ASSERT_TRUE(streams.back());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<int32_t> got = Drain(*streams[i]);
    ASSERT_TRUE(streams[i]->status().ok()) << streams[i]->status();
    auto want = GenerateFull(**model, requests[i].prompt, requests[i].options);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(got, want->tokens) << "request " << i << " on engine " << i % 2;
  }
}

}  // namespace
}  // namespace vc
