// The router in front of real workers on loopback: prompts sharing a prefix meet the worker that
// served it, outputs are exact whichever worker serves, calls move past a worker that is down or
// draining, and errors, tokens, cancellation and stats pass through.
#include "services/router_service.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/memory.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "services/inference_client.h"
#include "services/servers.h"
#include "tests/testing/raw_http2.h"
#include "tests/testing/servers.h"
#include "tests/testing/tiny_model.h"
#include "worker/prefixes/store_prefixes.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;

TEST(AffinityTable, RemembersForgetsAndStaysBounded) {
  AffinityTable t(8);  // generations of 4
  t.Add(1, 0b01);
  t.Add(1, 0b10);
  EXPECT_EQ(t.Get(1), 0b11u);
  EXPECT_EQ(t.Get(2), 0u);
  t.Forget(0b01);
  EXPECT_EQ(t.Get(1), 0b10u);
  t.Forget(0b10);
  EXPECT_EQ(t.Get(1), 0u);
  EXPECT_EQ(t.size(), 0);
  for (uint64_t b = 10; b < 110; ++b) t.Add(b, 1);
  EXPECT_LE(t.size(), 8);
  EXPECT_EQ(t.Get(109), 1u);  // the most recent are kept
  EXPECT_EQ(t.Get(10), 0u);
  // A block looked up moves to the current generation and outlives those that were not.
  AffinityTable u(8);
  u.Add(1, 1);
  for (uint64_t b = 2; b < 5; ++b) u.Add(b, 1);  // the fourth add rolls the generation
  EXPECT_EQ(u.Get(1), 1u);
  for (uint64_t b = 5; b < 8; ++b) u.Add(b, 1);
  EXPECT_EQ(u.Get(1), 1u);
  EXPECT_EQ(u.Get(2), 0u);
}

// Looking up a prompt's blocks finds them all, and keeps them all: moving the first into a current
// generation that it fills does not drop the previous one, which holds the rest.
TEST(AffinityTable, LookingUpAPromptKeepsItsOtherBlocks) {
  AffinityTable t(8);  // generations of 4
  const std::vector<uint64_t> prompt = {1, 2, 3, 4};
  for (uint64_t b : prompt) t.Add(b, 1);  // the fourth add rolls
  for (uint64_t b = 10; b < 13; ++b) t.Add(b, 2);
  uint64_t mask = 0b11;
  EXPECT_EQ(t.LongestRun(prompt, &mask), 4);
  EXPECT_EQ(mask, 1u);
  for (uint64_t b : prompt) EXPECT_EQ(t.Get(b), 1u) << b;
  EXPECT_LE(t.size(), 8);
  // A run stops at the first block no worker of the mask served.
  mask = 0b10;
  EXPECT_EQ(t.LongestRun(prompt, &mask), 0);
  EXPECT_EQ(mask, 0b10u);
}

// The fake workers below: of checkpoint "f" (or another, set_fingerprint), kernels of `numerics`,
// taking generated_ids.
class FakeWorkerService : public v1::Inference::Service {
 public:
  explicit FakeWorkerService(std::string numerics = "avx2") : numerics_(std::move(numerics)) {}
  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*, v1::ModelInfo* info) override {
    {
      absl::MutexLock l(&mu_);
      info->set_fingerprint_hex(fingerprint_);
    }
    info->set_numerics(numerics_);
    info->set_takes_generated_ids(true);
    return grpc::Status::OK;
  }
  void set_fingerprint(const std::string& f) {
    absl::MutexLock l(&mu_);
    fingerprint_ = f;
  }

 private:
  const std::string numerics_;
  absl::Mutex mu_;
  std::string fingerprint_ ABSL_GUARDED_BY(mu_) = "f";
};

// A worker that sends the whole output, stats last, and then fails the call (its connection broke
// after the last message).
class EndsThenFails final : public FakeWorkerService {
 public:
  using FakeWorkerService::FakeWorkerService;
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    v1::GenerateResponse r;
    r.add_token_ids(5);
    r.add_token_ids(6);
    r.mutable_stats()->set_generated_tokens(2);
    writer->Write(r);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the connection broke");
  }
};

// Serves `service` on a port of loopback until destroyed.
struct FakeWorker {
  explicit FakeWorker(grpc::Service* service) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service);
    server = b.BuildAndStart();
  }
  ~FakeWorker() { server->Shutdown(); }
  std::string target() const { return absl::StrCat("127.0.0.1:", port); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// A router of `workers` (health checked every 50 ms) once `serving` of them serve; null (the test
// failed) when it does not start or they do not.
std::unique_ptr<RouterServer> RouterOf(const std::string& workers, int serving, const std::string& policy = "prefix") {
  RouterServerOptions o;
  o.service.workers = workers;
  o.service.policy = policy;
  o.service.health_interval_ms = 50;
  auto router = RouterServer::Start(o);
  EXPECT_TRUE(router.ok()) << router.status();
  if (!router.ok()) return nullptr;
  EXPECT_TRUE((*router)->service().WaitServing(serving, absl::Seconds(20)));
  return std::move(*router);
}

// The client of such a worker has its whole output: the call is OK, where an UNAVAILABLE would
// have a client that retries get the output twice.
TEST(RouterOfFakeWorkers, AnOutputThatEndedIsOkWhateverFollows) {
  EndsThenFails service;
  FakeWorker worker(&service);
  ASSERT_NE(worker.port, 0);
  auto router = RouterOf(worker.target(), 1);
  ASSERT_NE(router, nullptr);
  const GenerateReply r = CallGenerate(*InferenceStub(router->target()), testing::IdsRequest(10, 8), "");
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 6}));
}

// A worker that refuses every call, by default as full, as one at its request limit does.
class AlwaysFull final : public FakeWorkerService {
 public:
  explicit AlwaysFull(grpc::StatusCode code = grpc::StatusCode::RESOURCE_EXHAUSTED) : code_(code) {}
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateResponse>*) override {
    return grpc::Status(code_, code_ == grpc::StatusCode::RESOURCE_EXHAUSTED
                                   ? "the worker holds 4 requests, its limit"
                                   : "this worker drafts with kivi:bits=8,group=32,residual=32, not ...");
  }

 private:
  const grpc::StatusCode code_;
};

// Four calls through a round-robin router in front of a worker that refuses every call with
// `code` and one that serves them: each is served, and the router's stats after them.
v1::RouterStats FourCallsPastARefusingWorker(grpc::StatusCode code) {
  AlwaysFull refusing_service(code);
  EndsThenFails serving_service;
  FakeWorker refusing(&refusing_service), serving(&serving_service);
  v1::RouterStats s;
  auto router = RouterOf(refusing.target() + "," + serving.target(), 2, "round-robin");
  if (router == nullptr) return s;
  auto stub = InferenceStub(router->target());
  for (int i = 0; i < 4; ++i) {
    const GenerateReply r = CallGenerate(*stub, testing::IdsRequest(10, 8), "");
    EXPECT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 6}));
  }
  router->service().CurrentStats(&s);
  return s;
}

// A full worker is busy, not failing: each call it refuses goes to the next worker, is counted as
// refused as full, and leaves it serving.
TEST(RouterOfFakeWorkers, AFullWorkerIsBusyNotFailing) {
  const v1::RouterStats s = FourCallsPastARefusingWorker(grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_EQ(s.workers_size(), 2);
  EXPECT_GE(s.workers(0).busy(), 1u) << s.DebugString();
  EXPECT_EQ(s.workers(0).failures(), 0u) << s.DebugString();
  EXPECT_EQ(s.workers(0).serving(), 1u);
  EXPECT_EQ(s.retries(), s.workers(0).busy());
  EXPECT_EQ(s.workers(1).requests_routed(), 4u);
  EXPECT_EQ(s.workers(1).busy(), 0u);
}

// A worker that does not serve what a call asks for (another compressor, MODE_FULL without full-KV
// memory: FAILED_PRECONDITION) passes it to the next, and is neither failing nor busy.
TEST(RouterOfFakeWorkers, ACallAWorkerDoesNotServeGoesToAnother) {
  const v1::RouterStats s = FourCallsPastARefusingWorker(grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_EQ(s.workers_size(), 2);
  EXPECT_GE(s.retries(), 1u);
  EXPECT_EQ(s.workers(0).failures() + s.workers(0).busy(), 0u) << s.DebugString();
  EXPECT_EQ(s.workers(0).serving(), 1u);
  EXPECT_EQ(s.workers(1).requests_routed(), 4u);
}

// The router is ready (health SERVING) only while some worker serves: after its workers are gone,
// and once it drains, it is not.
TEST(RouterOfFakeWorkers, TheRouterIsReadyOnlyWhileAWorkerServes) {
  EndsThenFails service;
  auto worker = std::make_unique<FakeWorker>(&service);
  RouterServerOptions o;
  o.service.workers = worker->target();
  o.service.health_interval_ms = 50;
  auto router = RouterServer::Start(o);
  ASSERT_TRUE(router.ok()) << router.status();
  const std::string target = (*router)->target();
  EXPECT_TRUE(testing::Eventually([&] { return testing::HealthStatus(target) == 1; })) << testing::HealthStatus(target);
  worker.reset();
  EXPECT_TRUE(testing::Eventually([&] { return testing::HealthStatus(target) == 2; })) << testing::HealthStatus(target);
  worker = std::make_unique<FakeWorker>(&service);  // another port: a router of it
  o.service.workers = worker->target();
  auto second = RouterServer::Start(o);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(testing::Eventually([&] { return testing::HealthStatus((*second)->target()) == 1; }));
  (*second)->StopAdmitting();
  EXPECT_EQ(testing::HealthStatus((*second)->target()), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // health rounds do not undo a drain
  EXPECT_EQ(testing::HealthStatus((*second)->target()), 2);
}

// A worker that sends `tokens`, no stats, and then fails the call.
class SendsThenFails final : public FakeWorkerService {
 public:
  explicit SendsThenFails(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    v1::GenerateResponse r;
    for (int32_t t : tokens_) r.add_token_ids(t);
    writer->Write(r);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the connection broke");
  }

 private:
  const std::vector<int32_t> tokens_;
};

// A worker that stops serving and comes back serving another checkpoint (restarted at the same
// address between two health checks) has its model asked again, and is kept out.
TEST(RouterOfFakeWorkers, AWorkerBackFromNotServingHasItsModelCheckedAgain) {
  EndsThenFails a_service, b_service;
  FakeWorker a(&a_service), b(&b_service);
  auto router = RouterOf(a.target() + "," + b.target(), 2);
  ASSERT_NE(router, nullptr);
  const auto a_serving = [&] {
    v1::RouterStats s;
    router->service().CurrentStats(&s);
    return s.workers(0).serving() == 1;
  };
  a.server->GetHealthCheckService()->SetServingStatus(false);
  ASSERT_TRUE(testing::Eventually([&] { return !a_serving(); }));
  a_service.set_fingerprint("g");
  a.server->GetHealthCheckService()->SetServingStatus(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // ten rounds of checks
  EXPECT_FALSE(a_serving());
  v1::RouterStats s;
  router->service().CurrentStats(&s);
  EXPECT_NE(s.workers(0).state().find("serves another model"), std::string::npos) << s.workers(0).state();
  EXPECT_EQ(s.workers(1).serving(), 1u);
}

// A worker that fails after sending all of max_tokens has sent the whole output: the call is OK.
// One that fails sooner, with no other worker able to take the rest, fails the call as it failed
// (UNAVAILABLE), whatever the other worker answered.
TEST(RouterOfFakeWorkers, AFailureAfterTheLastTokenIsNoFailureAndOneBeforeItIsUnavailable) {
  SendsThenFails two({5, 6});
  FakeWorker worker(&two);
  auto router = RouterOf(worker.target(), 1);
  ASSERT_NE(router, nullptr);
  GenerateReply r = CallGenerate(*InferenceStub(router->target()), testing::IdsRequest(10, 2), "");
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 6}));

  AlwaysFull full_service;
  FakeWorker full(&full_service);
  auto both = RouterOf(worker.target() + "," + full.target(), 2, "round-robin");
  ASSERT_NE(both, nullptr);
  for (int i = 0; i < 2; ++i) {  // each worker first once
    // (A call that found the first one failing keeps it out until its next health check.)
    ASSERT_TRUE(both->service().WaitServing(2, absl::Seconds(20)));
    r = CallGenerate(*InferenceStub(both->target()), testing::IdsRequest(10, 8), "");
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 6}));
  }
}

// During an upgrade, workers that report no numerics (older than the field) serve beside those that
// do, whichever the router pinned. A worker of other numerics than those pinned is kept out; with
// none pinned (an older worker's model was), every worker of the checkpoint serves.
TEST(RouterOfFakeWorkers, WorkersThatReportNoNumericsServeBesideThoseThatDo) {
  EndsThenFails old_service(""), new_service("avx2"), other_service("reference");
  FakeWorker old_worker(&old_service), new_worker(&new_service), other(&other_service);
  for (bool old_first : {true, false}) {
    RouterServerOptions o;
    o.service.workers = old_first ? old_worker.target() + "," + new_worker.target() + "," + other.target()
                                  : new_worker.target() + "," + old_worker.target() + "," + other.target();
    o.service.health_interval_ms = 50;
    auto router = RouterServer::Start(o);
    ASSERT_TRUE(router.ok()) << router.status();
    ASSERT_TRUE((*router)->service().WaitServing(2, absl::Seconds(20)));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    v1::RouterStats s;
    (*router)->service().CurrentStats(&s);
    ASSERT_EQ(s.workers_size(), 3);
    EXPECT_EQ(s.workers(0).serving() + s.workers(1).serving(), 2u) << old_first;
    // Whichever is listed first, the pin takes the numerics a worker reports, and the worker of
    // other kernels stays out.
    EXPECT_EQ(s.workers(2).serving(), 0u) << old_first << ": " << s.workers(2).state();
  }
}

TEST(PromptBlockHashes, ChainFullBlocksOnly) {
  v1::GenerateRequest a = testing::IdsRequest(100, 1), b = a, c = a;
  b.mutable_token_ids()->set_ids(40, 7);  // in the second block of 32
  const auto ha = PromptBlockHashes(a, 1, 32, 64), hb = PromptBlockHashes(b, 1, 32, 64);
  ASSERT_EQ(ha.size(), 3u);  // 100 tokens: three full blocks
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);  // a block's hash covers the blocks before it
  EXPECT_NE(PromptBlockHashes(a, 2, 32, 64)[0], ha[0]);  // another caller's token
  c.mutable_token_ids()->mutable_ids()->Truncate(31);
  EXPECT_TRUE(PromptBlockHashes(c, 1, 32, 64).empty());
  v1::GenerateRequest text;
  text.set_text(std::string(200, 'x'));
  EXPECT_EQ(PromptBlockHashes(text, 1, 32, 64).size(), 3u);
}

// A store, two workers and a router over them.
class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stack_ = testing::MakeTinyStack("router");
    auto store = StoreServer::Start(stack_.store);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    stack_.worker.store_target = store_->target();
    stack_.worker.service.client_tokens = {{"ops", ""}, {"a", "team-a"}};
    for (int i = 0; i < 2; ++i) {
      auto w = WorkerServer::Start(stack_.worker);
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(std::move(*w));
    }
  }

  std::unique_ptr<RouterServer> StartRouter(int64_t health_interval_ms, const std::string& policy = "prefix",
                                            int64_t client_write_timeout_ms = 60'000) {
    RouterServerOptions o;
    o.service.client_write_timeout_ms = client_write_timeout_ms;
    o.service.workers = workers_[0]->target() + "," + workers_[1]->target();
    o.service.policy = policy;
    o.service.worker_token = "ops";
    o.service.health_interval_ms = health_interval_ms;
    auto r = RouterServer::Start(o);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    EXPECT_TRUE((*r)->service().WaitServing(2, absl::Seconds(20))) << Stats(**r).DebugString();
    return std::move(*r);
  }

  // A worker like the others serving another checkpoint (a tiny model of `seed`), written to
  // stack_.dir/`name`.
  std::unique_ptr<WorkerServer> StartWorkerOfAnotherModel(const std::string& name, int seed) {
    testing::TinyModelSpec spec;
    spec.max_positions = 1024;
    spec.seed = seed;
    testing::WriteTinyModel(stack_.dir + "/" + name, spec);
    WorkerServerOptions o = stack_.worker;
    o.model_dir = stack_.dir + "/" + name;
    auto w = WorkerServer::Start(o);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  static v1::RouterStats Stats(RouterServer& r) {
    v1::RouterStats s;
    r.service().CurrentStats(&s);
    return s;
  }

  // A prompt of `prefix` shared tokens (from `seed`) and 20 of its own (from `own`).
  static v1::GenerateRequest Prompt(int seed, int own, int prefix = 96) {
    v1::GenerateRequest r;
    for (int i = 0; i < prefix; ++i) r.mutable_token_ids()->add_ids((i * 7 + seed * 31) % 250 + 1);
    for (int i = 0; i < 20; ++i) r.mutable_token_ids()->add_ids((i * 3 + own * 17) % 250 + 1);
    r.set_max_tokens(8);
    r.set_ignore_eos(true);
    return r;
  }

  testing::TinyStack stack_;
  std::unique_ptr<StoreServer> store_;
  std::vector<std::unique_ptr<WorkerServer>> workers_;
};

TEST_F(RouterTest, PrefixesMeetTheirWorkerAndOutputsAreExact) {
  auto router = StartRouter(100);
  ASSERT_NE(router, nullptr);
  auto stub = InferenceStub(router->target());
  // Three prefixes, four requests each, interleaved: every request after a prefix's first goes to
  // the worker that served it.
  for (int round = 0; round < 4; ++round) {
    for (int prefix = 0; prefix < 3; ++prefix) {
      const v1::GenerateRequest req = Prompt(prefix, round);
      const GenerateReply reply = CallGenerate(*stub, req, "ops");
      ASSERT_TRUE(reply.status.ok()) << reply.status;
      EXPECT_EQ(reply.tokens, testing::FullOutput(stack_.worker.model_dir, req)) << round << " " << prefix;
    }
  }
  const v1::RouterStats s = Stats(*router);
  EXPECT_EQ(s.requests_routed(), 12u);
  EXPECT_EQ(s.prefix_routed(), 9u);
  EXPECT_EQ(s.prefix_blocks_matched(), 27u);  // three 32-token blocks of the shared 96
  EXPECT_EQ(s.load_spills(), 0u);
  EXPECT_EQ(s.retries(), 0u);
  EXPECT_GT(s.affinity_blocks(), 0u);
  ASSERT_EQ(s.workers_size(), 2);
  EXPECT_EQ(s.workers(0).requests_routed() + s.workers(1).requests_routed(), 12u);
  EXPECT_EQ(s.workers(0).state(), "serving");
  // Each worker served whole prefixes (four requests each), and GetStats through the router sums
  // what the two say.
  v1::WorkerStats sum;
  uint64_t ended = 0;
  for (const auto& w : workers_) {
    v1::WorkerStats one;
    ASSERT_TRUE(testing::GetWorkerStats(*InferenceStub(w->target()), "ops", &one).ok());
    EXPECT_EQ(one.requests_ended() % 4, 0u) << one.requests_ended();
    ended += one.requests_ended();
  }
  EXPECT_EQ(ended, 12u);
  ASSERT_TRUE(testing::GetWorkerStats(*stub, "ops", &sum).ok());
  EXPECT_EQ(sum.requests_ended(), 12u);
  EXPECT_EQ(sum.generated_tokens(), 12u * 8);
  EXPECT_EQ(sum.prefix_store_tokens(), 9u * 96);  // the later requests' prefixes, from the store
  ASSERT_EQ(sum.tenants_size(), 1);
  EXPECT_EQ(sum.tenants(0).requests_ended(), 12u);
  ASSERT_EQ(sum.store().shards_size(), 1);  // both workers' one shard, matched by its target
  EXPECT_EQ(sum.store().shards(0).lookups(), sum.store().lookups());
  // A prompt that shares only its first block of three with those (a system prompt, say) is not
  // sent after it.
  v1::GenerateRequest shallow = Prompt(0, 0);
  shallow.mutable_token_ids()->mutable_ids()->Truncate(32);
  for (int i = 0; i < 64; ++i) shallow.mutable_token_ids()->add_ids((i * 11 + 5) % 250 + 1);
  ASSERT_TRUE(CallGenerate(*stub, shallow, "ops").status.ok());
  EXPECT_EQ(Stats(*router).prefix_routed(), 9u);
  EXPECT_EQ(Stats(*router).requests_routed(), 13u);
  // The model, for the workers' clients only, as a worker answers it.
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    const grpc::Status anonymous = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED) << anonymous.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer a");
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(info.prefix_block_tokens(), 32u);
}

TEST_F(RouterTest, RoundRobinSpreadsAndReusesLess) {
  auto router = StartRouter(100, "round-robin");
  ASSERT_NE(router, nullptr);
  auto stub = InferenceStub(router->target());
  for (int round = 0; round < 4; ++round) {
    const v1::GenerateRequest req = Prompt(0, round);
    const GenerateReply reply = CallGenerate(*stub, req, "ops");
    ASSERT_TRUE(reply.status.ok()) << reply.status;
    EXPECT_EQ(reply.tokens, testing::FullOutput(stack_.worker.model_dir, req));
  }
  const v1::RouterStats s = Stats(*router);
  EXPECT_EQ(s.workers(0).requests_routed(), 2u);
  EXPECT_EQ(s.workers(1).requests_routed(), 2u);
  EXPECT_EQ(s.prefix_routed(), 0u);
}

TEST_F(RouterTest, ACallMovesPastADownWorkerAndADrainingOneGetsNone) {
  auto router = StartRouter(60000);  // one health check, at start: the router finds out by calling
  ASSERT_NE(router, nullptr);
  auto stub = InferenceStub(router->target());
  const v1::GenerateRequest req = Prompt(5, 0);
  ASSERT_TRUE(CallGenerate(*stub, req, "ops").status.ok());
  v1::RouterStats s = Stats(*router);
  const int first = s.workers(0).requests_routed() == 1 ? 0 : 1;
  // The worker that holds the prefix goes away; the same prefix is asked for again.
  workers_[first].reset();
  const GenerateReply moved = CallGenerate(*stub, Prompt(5, 1), "ops");
  ASSERT_TRUE(moved.status.ok()) << moved.status;
  EXPECT_EQ(moved.tokens, testing::FullOutput(stack_.worker.model_dir, Prompt(5, 1)));
  s = Stats(*router);
  EXPECT_EQ(s.retries(), 1u);
  EXPECT_EQ(s.workers(first).failures(), 1u);
  EXPECT_EQ(s.workers(first).serving(), 0u);
  EXPECT_EQ(s.workers(1 - first).requests_routed(), 1u);
  // The other one drains: with none serving, calls are refused at once, with the reason.
  workers_[1 - first]->StopAdmitting();
  const GenerateReply refused = CallGenerate(*stub, Prompt(6, 0), "ops");
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status.message().find("no worker could take the call"), std::string::npos) << refused.status;
  const GenerateReply none = CallGenerate(*stub, Prompt(6, 0), "ops");
  EXPECT_EQ(none.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status.message().find("no serving worker"), std::string::npos) << none.status;
  EXPECT_EQ(Stats(*router).requests_unrouted(), 2u);
}

// A worker of the same checkpoint whose kernels compute other bits is kept out like one of another
// model: a request's output would depend on the worker it landed on.
TEST_F(RouterTest, AWorkerOfOtherKernelsIsKeptOut) {
  if (kernels::DefaultBackend().numerics() == "reference") GTEST_SKIP() << "the default kernels are the reference";
  WorkerServerOptions wo = stack_.worker;
  wo.kernels = "reference";
  auto slow = WorkerServer::Start(wo);
  ASSERT_TRUE(slow.ok()) << slow.status();
  RouterServerOptions o;
  o.service.workers = (*slow)->target() + "," + workers_[0]->target() + "," + workers_[1]->target();
  o.service.health_interval_ms = 50;
  o.service.worker_token = "a";
  auto router = RouterServer::Start(o);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_TRUE((*router)->service().WaitServing(2, absl::Seconds(20)));
  const v1::RouterStats s = Stats(**router);
  ASSERT_EQ(s.workers_size(), 3);
  EXPECT_EQ(s.workers(0).serving(), 0u);
  EXPECT_NE(s.workers(0).state().find("computes with other kernels: numerics \"reference+kv-bf16\""), std::string::npos)
      << s.workers(0).state();
  EXPECT_EQ(s.workers(1).serving() + s.workers(2).serving(), 2u);
}

TEST_F(RouterTest, HealthChecksFollowDrainingAndAnotherModelIsRefused) {
  // A third worker serving another checkpoint: the router pins the first model it sees.
  auto other = StartWorkerOfAnotherModel("other", 99);
  ASSERT_NE(other, nullptr);
  const std::string other_model = stack_.dir + "/other";
  RouterServerOptions o;
  // And a store listed as a worker by mistake.
  o.service.workers = other->target() + "," + workers_[0]->target() + "," + workers_[1]->target() + "," +
                      store_->target();
  o.service.health_interval_ms = 50;
  o.service.worker_token = "a";
  auto router = RouterServer::Start(o);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_TRUE((*router)->service().WaitServing(2, absl::Seconds(20)));
  v1::RouterStats s = Stats(**router);
  ASSERT_EQ(s.workers_size(), 4);
  EXPECT_EQ(s.workers(0).serving(), 0u);
  EXPECT_NE(s.workers(0).state().find("serves another model"), std::string::npos) << s.workers(0).state();
  EXPECT_EQ(s.workers(3).serving(), 0u);
  EXPECT_NE(s.workers(3).state().find("serves no workers' Inference API"), std::string::npos) << s.workers(3).state();
  // Named in the options, the other checkpoint is the one served.
  RouterServerOptions pinned = o;
  pinned.service.model_fingerprint_hex = HexString(*ModelFingerprint(other_model));
  auto router_other = RouterServer::Start(pinned);
  ASSERT_TRUE(router_other.ok()) << router_other.status();
  ASSERT_TRUE((*router_other)->service().WaitServing(1, absl::Seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  s = Stats(**router_other);
  EXPECT_EQ(s.workers(0).serving(), 1u);
  EXPECT_EQ(s.workers(1).serving() + s.workers(2).serving(), 0u);
  const GenerateReply from_other = CallGenerate(*InferenceStub((*router_other)->target()), Prompt(3, 0), "ops");
  ASSERT_TRUE(from_other.status.ok()) << from_other.status;
  EXPECT_EQ(from_other.tokens, testing::FullOutput(other_model, Prompt(3, 0)));

  auto stub = InferenceStub((*router)->target());
  workers_[0]->StopAdmitting();
  for (int i = 0; i < 200 && Stats(**router).workers(1).serving() == 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(Stats(**router).workers(1).serving(), 0u);
  for (int i = 0; i < 3; ++i) {
    const GenerateReply r = CallGenerate(*stub, Prompt(i, 0), "ops");
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  s = Stats(**router);
  EXPECT_EQ(s.workers(2).requests_routed(), 3u);
  EXPECT_EQ(s.retries(), 0u);
}

TEST_F(RouterTest, ErrorsTokensAndCancellationPassThrough) {
  auto router = StartRouter(100);
  ASSERT_NE(router, nullptr);
  auto stub = InferenceStub(router->target());
  // The worker's answer to a bad request, not retried elsewhere.
  v1::GenerateRequest empty;
  empty.set_max_tokens(4);
  const GenerateReply bad = CallGenerate(*stub, empty, "ops");
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kInvalidArgument) << bad.status;
  const GenerateReply anonymous = CallGenerate(*stub, Prompt(1, 1));
  EXPECT_EQ(anonymous.status.code(), absl::StatusCode::kUnauthenticated) << anonymous.status;
  const GenerateReply tenant = CallGenerate(*stub, Prompt(1, 1), "a");
  ASSERT_TRUE(tenant.status.ok()) << tenant.status;
  EXPECT_EQ(tenant.tokens, testing::FullOutput(stack_.worker.model_dir, Prompt(1, 1)));
  EXPECT_EQ(Stats(*router).retries(), 0u);

  // A client that cancels after its first tokens: the worker's call is cancelled too (it fails
  // there, rather than running to its end).
  v1::GenerateRequest longer = Prompt(2, 0);
  longer.set_max_tokens(800);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer ops");
    auto reader = stub->Generate(&ctx, longer);
    v1::GenerateResponse r;
    ASSERT_TRUE(reader->Read(&r));
    ctx.TryCancel();
    while (reader->Read(&r)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  v1::WorkerStats sum;
  for (int i = 0; i < 300; ++i) {
    sum.Clear();
    ASSERT_TRUE(testing::GetWorkerStats(*stub, "ops", &sum).ok());
    if (sum.requests_in_flight() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(sum.requests_in_flight(), 0u);
  EXPECT_EQ(sum.requests_failed(), 1u);  // the cancelled one
  EXPECT_EQ(sum.requests_ended(), 1u);   // tenant a's
  EXPECT_LT(sum.generated_tokens(), 8u + 800u);

  // Bad options.
  RouterServiceOptions o;
  o.workers = workers_[0]->target();
  o.policy = "random";
  EXPECT_EQ(RouterService::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.policy = "prefix";
  o.workers = "127.0.0.1:99999";
  EXPECT_EQ(RouterService::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.workers = "";
  EXPECT_EQ(RouterService::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  // An affinity table that could outgrow the machine's memory is refused before it grows.
  o.workers = workers_[0]->target();
  o.affinity_blocks = int64_t{1} << 32;  // about 160 GiB
  if (UsableMemoryBytes() < (uint64_t{160} << 30)) {
    const absl::Status big = RouterService::Create(o).status();
    EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
    EXPECT_NE(big.message().find("--affinity-blocks"), absl::string_view::npos) << big;
  }
  o.affinity_blocks = int64_t{1} << 20;
  // More workers than a router routes to are refused, not some of them left out.
  std::vector<std::string> many;
  for (int i = 0; i <= kMaxRouterWorkers; ++i) many.push_back(absl::StrCat("127.0.0.1:", 1000 + i));
  o.workers = absl::StrJoin(many, ",");
  const absl::Status too_many = RouterService::Create(o).status();
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_NE(too_many.message().find("65 workers; a router routes to at most 64"), absl::string_view::npos) << too_many;
  many.pop_back();
  o.workers = absl::StrJoin(many, ",");
  EXPECT_TRUE(RouterService::Create(o).ok());
  // One listed twice is a mistake in the list: refused, as a worker's --store refuses it.
  many.push_back(many.front());
  o.workers = absl::StrJoin(many, ",");
  const absl::Status twice = RouterService::Create(o).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << twice;
  EXPECT_NE(twice.message().find("the worker 127.0.0.1:1000 is listed twice"), absl::string_view::npos) << twice;
  // Workers named by DNS that has no answer yet: the router starts, with nothing to route to.
  RouterServerOptions later;
  later.service.workers = "srv:_grpc._tcp.vericache-worker";
  later.service.dns_server = "127.0.0.1:1";
  later.service.worker_timeout_ms = 200;
  auto waiting = RouterServer::Start(later);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  const GenerateReply none = CallGenerate(*InferenceStub((*waiting)->target()), Prompt(1, 1), "ops");
  EXPECT_EQ(none.status.code(), absl::StatusCode::kUnavailable) << none.status;
}

// A router that learned its checkpoint from the workers takes the new one after a rollout: once
// no worker has served the old one for repin_after_ms, the workers serving another are served.
TEST_F(RouterTest, AfterARolloutTheNewCheckpointIsServed) {
  auto rolled = StartWorkerOfAnotherModel("rolled", 98);
  ASSERT_NE(rolled, nullptr);
  RouterServerOptions o;
  o.service.workers = workers_[0]->target() + "," + rolled->target();  // a tie: the first listed
  o.service.health_interval_ms = 50;
  o.service.worker_token = "a";
  o.service.repin_after_ms = 300;
  auto router = RouterServer::Start(o);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_TRUE((*router)->service().WaitServing(1, absl::Seconds(20)));
  v1::RouterStats s = Stats(**router);
  EXPECT_EQ(s.workers(0).serving(), 1u);
  EXPECT_EQ(s.workers(1).serving(), 0u) << s.workers(1).state();
  workers_[0]->StopAdmitting();  // the old checkpoint's last worker drains
  for (int i = 0; i < 500 && Stats(**router).workers(1).serving() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  s = Stats(**router);
  ASSERT_EQ(s.workers(1).serving(), 1u) << s.workers(1).state();
  EXPECT_EQ(s.workers(0).serving(), 0u);
  const GenerateReply r = CallGenerate(*InferenceStub((*router)->target()), Prompt(2, 0), "ops");
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, testing::FullOutput(stack_.dir + "/rolled", Prompt(2, 0)));
}

// A client's authorization header goes on to the workers, and gRPC aborts the process that sends a
// header value holding bytes other than printable ASCII; gRPC's server takes such a value from a
// raw HTTP/2 peer. The router refuses it instead, and still serves.
TEST_F(RouterTest, AnAuthorizationValueGrpcCannotSendOnIsRefused) {
  auto router = StartRouter(100);
  ASSERT_NE(router, nullptr);
  v1::GenerateRequest req = Prompt(3, 1);
  req.set_max_tokens(2);
  for (const std::string& value : {std::string("Bearer \x01ops"), std::string("Bearer op\ts"),
                                   std::string("Bearer caf\xc3\xa9")}) {
    testing::RawGrpcCall generate(router->port(), "/vericache.v1.Inference/Generate", {{"authorization", value}},
                                  req.SerializeAsString());
    EXPECT_TRUE(generate.Pump(std::chrono::seconds(10), true));
    testing::RawGrpcCall stats(router->port(), "/vericache.v1.Inference/GetStats", {{"authorization", value}},
                               v1::GetStatsRequest().SerializeAsString());
    EXPECT_TRUE(stats.Pump(std::chrono::seconds(10), true));
  }
  // Answered without reaching a worker.
  EXPECT_EQ(Stats(*router).requests_routed(), 0u);
  EXPECT_EQ(Stats(*router).requests_unrouted(), 0u);
  auto stub = InferenceStub(router->target());
  const GenerateReply ok = CallGenerate(*stub, Prompt(3, 1), "ops");
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.tokens, testing::FullOutput(stack_.worker.model_dir, Prompt(3, 1)));
  EXPECT_EQ(Stats(*router).requests_routed(), 1u);
}

// A client that keeps its call open and takes nothing (here: it grants the stream no window) blocks
// the router's writes; past --client-write-timeout-ms the router cancels the call, which frees its
// handler and its count of calls in flight, and cancels the worker's call.
TEST_F(RouterTest, AClientThatStopsReadingIsCutOff) {
  // A worker of the 4M-parameter model, still generating when the router gives up on the client,
  // behind a router of its own.
  WorkerServerOptions wo = stack_.worker;
  wo.model_dir = VC_SOURCE_DIR "/models/vc-code-4m";
  wo.store_target = "";
  wo.staging_bytes = wo.full_kv_bytes = int64_t{96} << 20;
  auto slow = WorkerServer::Start(wo);
  ASSERT_TRUE(slow.ok()) << slow.status();
  RouterServerOptions o;
  o.service.workers = (*slow)->target();
  o.service.worker_token = "ops";
  o.service.health_interval_ms = 100;
  o.service.client_write_timeout_ms = 300;
  auto started_router = RouterServer::Start(o);
  ASSERT_TRUE(started_router.ok()) << started_router.status();
  RouterServer* router = started_router->get();
  ASSERT_TRUE(router->service().WaitServing(1, absl::Seconds(20)));
  v1::GenerateRequest req = Prompt(4, 1);
  req.set_max_tokens(2000);
  req.set_ignore_eos(true);
  auto worker_stub = InferenceStub((*slow)->target());
  const auto worker_stats = [&] {
    v1::WorkerStats s;
    EXPECT_TRUE(testing::GetWorkerStats(*worker_stub, "ops", &s).ok());
    return s;
  };
  testing::RawGrpcCall stalled(router->port(), "/vericache.v1.Inference/Generate",
                               {{"authorization", "Bearer ops"}}, req.SerializeAsString(), /*zero_window=*/true);
  bool started = false;
  for (int i = 0; i < 500 && !started; ++i) {
    stalled.Pump(std::chrono::milliseconds(20), false);
    started = Stats(*router).requests_in_flight() == 1;
  }
  ASSERT_TRUE(started) << Stats(*router).DebugString();
  uint32_t in_flight = 1;
  for (int i = 0; i < 500 && in_flight != 0; ++i) {
    stalled.Pump(std::chrono::milliseconds(20), false);  // the connection stays open meanwhile
    in_flight = Stats(*router).requests_in_flight();
  }
  EXPECT_EQ(in_flight, 0u) << Stats(*router).DebugString();
  // The worker's call is cancelled too (it ends as failed), not left to run its 2000 tokens.
  v1::WorkerStats w = worker_stats();
  for (int i = 0; i < 500 && w.requests_in_flight() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    w = worker_stats();
  }
  EXPECT_EQ(w.requests_in_flight(), 0u);
  EXPECT_EQ(w.requests_failed(), 1u);
  EXPECT_EQ(w.requests_ended(), 0u);
  EXPECT_LT(w.generated_tokens(), 2000u);
  auto stub = InferenceStub(router->target());
  v1::GenerateRequest small = Prompt(4, 1);
  small.set_max_tokens(8);
  small.set_ignore_eos(true);
  const GenerateReply ok = CallGenerate(*stub, small, "ops");
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.tokens, testing::FullOutput(wo.model_dir, small));
}

}  // namespace
}  // namespace vc
