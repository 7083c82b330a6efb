// The remote-prefix scene end to end: a `vericache store` process, a `vericache worker` process
// and many concurrent gRPC clients on loopback, sending prompts that share code prefixes. Every
// output must equal sequential full-KV decoding, through a store killed and restarted mid-run and
// a worker killed and restarted mid-run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachestore/store_client.h"
#include "gtest/gtest.h"
#include "services/inference_client.h"
#include "tests/testing/servers.h"
#include "tests/testing/tiny_model.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;

const char* kModel = VC_SOURCE_DIR "/models/vc-code-4m";

class Process {
 public:
  explicit Process(std::vector<std::string> args) {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string bin = std::string(VC_BINARY_DIR) + "/services/vericache";
      std::vector<char*> argv = {const_cast<char*>(bin.c_str())};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
  }
  ~Process() { Kill(SIGKILL); }
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Whether the process exits within `limit` (it is reaped then).
  bool WaitExit(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (pid_ > 0 && std::chrono::steady_clock::now() < until) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pid_ <= 0;
  }
  bool Running() { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  void Kill(int sig) {
    if (pid_ > 0) {
      kill(pid_, sig);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
};

int FreePort(int salt) { return 20000 + static_cast<int>((getpid() * 7 + salt * 131) % 40000); }

// Waits until `probe` succeeds or the process dies; false after 60 s.
bool WaitFor(Process& p, const std::function<bool()>& probe) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    if (!p.Running()) return false;
    if (probe()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The test model's training script (models/train.py), the text of the tests' prompts.
const std::string& TrainScript() {
  static const std::string* text = [] {
    std::ifstream in(kModel + std::string("/../train.py"));
    std::stringstream ss;
    ss << in.rdbuf();
    return new std::string(ss.str());
  }();
  return *text;
}

// Whether the server at `port` answers GetModelInfo (a router: once it has learned the model).
bool AnswersModelInfo(int port) {
  auto stub = InferenceStub(absl::StrCat("127.0.0.1:", port));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  v1::ModelInfo info;
  return stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok();
}

// A worker of the test model with these flags besides its model and port, once it answers.
std::unique_ptr<Process> StartWorkerWith(int port, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"worker", "--model", kModel, "--listen", absl::StrCat("127.0.0.1:", port)};
  args.insert(args.end(), flags.begin(), flags.end());
  auto p = std::make_unique<Process>(args);
  EXPECT_TRUE(WaitFor(*p, [&] { return AnswersModelInfo(port); })) << "worker did not start";
  return p;
}

// A router in front of the workers at `worker_ports`, once it routes.
std::unique_ptr<Process> StartRouter(int port, const std::vector<int>& worker_ports,
                                     const std::vector<std::string>& flags) {
  std::vector<std::string> targets;
  for (int w : worker_ports) targets.push_back(absl::StrCat("127.0.0.1:", w));
  std::vector<std::string> args = {"router", "--listen", absl::StrCat("127.0.0.1:", port), "--workers",
                                   absl::StrJoin(targets, ","), "--health-interval-ms", "100"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto p = std::make_unique<Process>(args);
  EXPECT_TRUE(WaitFor(*p, [&] { return AnswersModelInfo(port); })) << "router did not start";
  return p;
}

class EndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("e2e");
    std::ofstream(dir_ + "/tokens") << "worker-token tenant-a\n";
    std::ofstream(dir_ + "/worker-token") << "worker-token\n";
    store_port_ = FreePort(1);
    auto model = Model::Load(kModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    // Two code prefixes of ~700 and ~1000 tokens (several 64-token store blocks each), and
    // requests that continue them differently.
    const std::string& text = TrainScript();
    ASSERT_GT(text.size(), 4000u);
    const std::string prefixes[2] = {text.substr(0, 700), text.substr(2000, 1000)};
    const char* suffixes[] = {"\ndef f(x):\n", "\nclass A:\n", "\n# utilities\n", "\nimport os\n", "\nif x:\n",
                              "\nfor i in range(3):\n"};
    for (int i = 0; i < 12; ++i) {
      GenerateOptions o;
      o.max_tokens = 24;
      if (i % 3 == 2) {
        o.sampling.temperature = 0.8f;
        o.sampling.top_k = 40;
        o.sampling.seed = 1000 + i;
      }
      prompts_.push_back(model_->tokenizer().Encode(prefixes[i % 2] + suffixes[i % 6]));
      options_.push_back(o);
      auto want = GenerateFull(*model_, prompts_.back(), o);
      ASSERT_TRUE(want.ok());
      want_.push_back(want->tokens);
    }
  }

  std::unique_ptr<Process> StartStore() {
    auto p = std::make_unique<Process>(std::vector<std::string>{
        "store", "--listen", absl::StrCat("127.0.0.1:", store_port_), "--data-dir", dir_ + "/db", "--tokens",
        dir_ + "/tokens", "--ram-bytes", "67108864", "--disk-bytes", "1073741824"});
    auto client = *cachestore::StoreClient::Create({absl::StrCat("127.0.0.1:", store_port_), "worker-token", 300, ""});
    EXPECT_TRUE(WaitFor(*p, [&] { return client->Lookup({}).ok(); })) << "store did not start";
    return p;
  }

  std::unique_ptr<Process> StartWorker(int port) {
    return StartWorkerWith(port, {"--store", absl::StrCat("127.0.0.1:", store_port_), "--store-token-file",
                                  dir_ + "/worker-token", "--block-tokens", "64", "--staging-mib", "64",
                                  "--full-kv-mib", "32", "--max-batch", "8", "--store-timeout-ms", "1000"});
  }

  v1::GenerateRequest Request(size_t i, v1::Mode mode) const {
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Add(prompts_[i].begin(), prompts_[i].end());
    r.set_max_tokens(static_cast<uint32_t>(options_[i].max_tokens));
    r.mutable_sampling()->set_temperature(options_[i].sampling.temperature);
    r.mutable_sampling()->set_top_k(static_cast<uint32_t>(options_[i].sampling.top_k));
    r.mutable_sampling()->set_seed(options_[i].sampling.seed);
    r.set_mode(mode);
    return r;
  }

  // Every request from its own client thread, all at once.
  std::vector<GenerateReply> RunAll(int port, v1::Mode mode) {
    std::vector<std::future<GenerateReply>> calls;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      calls.push_back(std::async(std::launch::async, [this, i, port, mode] {
        auto stub = InferenceStub(absl::StrCat("127.0.0.1:", port));
        return CallGenerate(*stub, Request(i, mode), "", absl::Seconds(120));
      }));
    }
    std::vector<GenerateReply> out;
    for (auto& c : calls) out.push_back(c.get());
    return out;
  }

  // Waits (up to 10 s) until the worker at `port` has a request in flight.
  static bool WaitInFlight(int port) {
    auto stub = InferenceStub(absl::StrCat("127.0.0.1:", port));
    for (int i = 0; i < 2000; ++i) {
      v1::WorkerStats stats;
      if (testing::GetWorkerStats(*stub, "", &stats).ok() && stats.requests_in_flight() > 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  void ExpectIdentical(const std::vector<GenerateReply>& got, const std::string& what) {
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << what << " request " << i << ": " << got[i].status;
      EXPECT_EQ(got[i].tokens, want_[i]) << what << " request " << i;
    }
  }

  int64_t Sum(const std::vector<GenerateReply>& got, uint32_t (v1::GenerateStats::*field)() const) {
    int64_t s = 0;
    for (const auto& r : got) s += (r.stats.*field)();
    return s;
  }

  std::string dir_;
  int store_port_ = 0;
  std::unique_ptr<Model> model_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<GenerateOptions> options_;
  std::vector<std::vector<int32_t>> want_;
};

TEST_F(EndToEnd, ConcurrentClientsThroughStoreAndWorkerRestarts) {
  auto store = StartStore();
  const int worker_port = FreePort(2);
  auto worker = StartWorker(worker_port);

  // Cold, then warm: the second round finds the prefixes the first one published.
  std::vector<GenerateReply> cold = RunAll(worker_port, v1::MODE_VERICACHE);
  ExpectIdentical(cold, "cold");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // background puts land
  std::vector<GenerateReply> warm = RunAll(worker_port, v1::MODE_VERICACHE);
  ExpectIdentical(warm, "warm");
  EXPECT_GT(Sum(warm, &v1::GenerateStats::prefix_store_tokens), 0) << "no prefix came from the store";
  ExpectIdentical(RunAll(worker_port, v1::MODE_FULL), "mode full");

  // The store dies mid-run: requests in flight and after still give identical output
  // (recomputed); then it comes back with its disk tier and serves the prefixes again.
  auto inflight = std::async(std::launch::async, [&] { return RunAll(worker_port, v1::MODE_VERICACHE); });
  EXPECT_TRUE(WaitInFlight(worker_port));
  store->Kill(SIGKILL);
  ExpectIdentical(inflight.get(), "store killed mid-run");
  ExpectIdentical(RunAll(worker_port, v1::MODE_VERICACHE), "store down");
  store = StartStore();
  std::vector<GenerateReply> back = RunAll(worker_port, v1::MODE_VERICACHE);
  ExpectIdentical(back, "store restarted");
  EXPECT_GT(Sum(back, &v1::GenerateStats::prefix_store_tokens), 0) << "the restarted store served no prefix";

  // The store stops answering mid-run (SIGSTOP: its TCP still accepts, as a hung process's does):
  // reads time out (--store-timeout-ms) and prefixes are computed, with identical output; once it
  // runs again it serves them again.
  auto paused = std::async(std::launch::async, [&] { return RunAll(worker_port, v1::MODE_VERICACHE); });
  EXPECT_TRUE(WaitInFlight(worker_port));
  store->Signal(SIGSTOP);
  ExpectIdentical(paused.get(), "store paused mid-run");
  store->Signal(SIGCONT);
  auto client = *cachestore::StoreClient::Create({absl::StrCat("127.0.0.1:", store_port_), "worker-token", 300, ""});
  EXPECT_TRUE(testing::Eventually([&] { return client->Lookup({}).ok(); }, absl::Seconds(10)));
  ExpectIdentical(RunAll(worker_port, v1::MODE_VERICACHE), "store resumed");
  std::printf("store killed, restarted, paused and resumed under load: %zu requests, every output identical\n",
              5 * prompts_.size());

  // The worker dies mid-run: its calls end with a clear status, never with wrong tokens; a new
  // worker (without compressed prefixes) reads the store's blocks and gives identical output.
  auto dying = std::async(std::launch::async, [&] { return RunAll(worker_port, v1::MODE_VERICACHE); });
  EXPECT_TRUE(WaitInFlight(worker_port));
  worker->Kill(SIGKILL);
  const std::vector<GenerateReply> cut = dying.get();
  for (size_t i = 0; i < cut.size(); ++i) {
    if (cut[i].status.ok()) {
      EXPECT_EQ(cut[i].tokens, want_[i]) << "finished before the kill, request " << i;
    } else {
      EXPECT_EQ(cut[i].status.code(), absl::StatusCode::kUnavailable) << cut[i].status;
    }
  }
  const int new_port = FreePort(3);
  worker = StartWorker(new_port);
  std::vector<GenerateReply> again = RunAll(new_port, v1::MODE_VERICACHE);
  ExpectIdentical(again, "worker restarted");
  EXPECT_GT(Sum(again, &v1::GenerateStats::prefix_store_tokens), 0);
  int finished = 0;
  for (const auto& r : cut) finished += r.status.ok();
  std::printf("worker killed under load: %d of %zu calls had finished identical, the rest ended UNAVAILABLE; "
              "a new worker's %zu outputs identical\n", finished, cut.size(), again.size());
}

TEST_F(EndToEnd, BadRequestsGetClearStatuses) {
  const int worker_port = FreePort(4);
  auto store = StartStore();
  auto worker = StartWorker(worker_port);
  auto stub = InferenceStub(absl::StrCat("127.0.0.1:", worker_port));
  v1::GenerateRequest empty;
  empty.set_max_tokens(4);
  EXPECT_EQ(CallGenerate(*stub, empty).status.code(), absl::StatusCode::kInvalidArgument);
  v1::GenerateRequest r = Request(0, v1::MODE_VERICACHE);
  r.mutable_token_ids()->add_ids(100000);  // outside the vocabulary
  EXPECT_EQ(CallGenerate(*stub, r).status.code(), absl::StatusCode::kInvalidArgument);
  r = Request(0, v1::MODE_VERICACHE);
  r.set_max_tokens(1u << 30);  // beyond the context (0 would be: up to its end)
  EXPECT_EQ(CallGenerate(*stub, r).status.code(), absl::StatusCode::kInvalidArgument);
  r = Request(0, static_cast<v1::Mode>(7));
  EXPECT_EQ(CallGenerate(*stub, r).status.code(), absl::StatusCode::kInvalidArgument);
  r = Request(0, v1::MODE_VERICACHE);
  r.set_compressor("kivi:bits=3");
  EXPECT_EQ(CallGenerate(*stub, r).status.code(), absl::StatusCode::kInvalidArgument);
  r.set_compressor("kivi:bits=8");  // a compressor, not this worker's: another worker may serve it
  v1::WorkerStats was, is;
  ASSERT_TRUE(testing::GetWorkerStats(*stub, "", &was).ok());
  EXPECT_EQ(CallGenerate(*stub, r).status.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(testing::GetWorkerStats(*stub, "", &is).ok());
  EXPECT_EQ(is.requests_refused(), was.requests_refused() + 1);  // refused, not invalid
  EXPECT_EQ(is.requests_invalid(), was.requests_invalid());
  // MODE_FULL drafts nothing: another compressor is served, an invalid one still refused.
  r = Request(0, v1::MODE_FULL);
  r.set_compressor("kivi:bits=8");
  const GenerateReply full = CallGenerate(*stub, r);
  EXPECT_TRUE(full.status.ok()) << full.status;
  EXPECT_FALSE(full.tokens.empty());
  r.set_compressor("kivi:bits=3");
  EXPECT_EQ(CallGenerate(*stub, r).status.code(), absl::StatusCode::kInvalidArgument);
  r = Request(0, v1::MODE_VERICACHE);
  r.set_max_tokens(500);
  v1::WorkerStats before;
  ASSERT_TRUE(testing::GetWorkerStats(*stub, "", &before).ok());
  GenerateReply late = CallGenerate(*stub, r, "", absl::Milliseconds(50));
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded) << late.status;
  // The worker ends the call too, as failed, rather than decoding its 500 tokens for nobody.
  bool ended = false;
  for (int i = 0; i < 2000 && !ended; ++i) {
    v1::WorkerStats stats;
    ended = testing::GetWorkerStats(*stub, "", &stats).ok() && stats.requests_in_flight() == 0 &&
            stats.requests_failed() == before.requests_failed() + 1;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(ended) << "the worker kept the expired call";
  // Prompts past the context are refused before they are encoded or copied, and a message past
  // the Inference servers' 32 MiB before it is parsed.
  v1::GenerateRequest big;
  big.set_max_tokens(4);
  big.set_text(std::string(1 << 20, 'x'));
  GenerateReply refused = CallGenerate(*stub, big);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_NE(refused.status.message().find("prompt of at least 1048577 tokens"), std::string::npos) << refused.status;
  big.clear_text();
  for (int i = 0; i < (1 << 20); ++i) big.mutable_token_ids()->add_ids(i % 200 + 1);
  refused = CallGenerate(*stub, big);
  EXPECT_NE(refused.status.message().find("prompt of 1048576 tokens"), std::string::npos) << refused.status;
  big.set_text(std::string(40 << 20, 'x'));
  refused = CallGenerate(*stub, big);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted) << refused.status;
  // Bytes that are no protocol buffer (a length-delimited field 1 whose length runs past the end),
  // to a streaming and a unary worker method and to the store (a callback service): each names the
  // method and changes nothing.
  const std::string garbage("\x0a\x64" "ab", 4);
  for (const auto& [port, method] : std::vector<std::pair<int, std::string>>{
           {worker_port, "/vericache.v1.Inference/Generate"},
           {worker_port, "/vericache.v1.Inference/GetModelInfo"},
           {store_port_, "/vericache.v1.CacheStore/Lookup"},
           {store_port_, "/vericache.v1.CacheStore/Put"}}) {
    const grpc::Status s = testing::CallRaw(absl::StrCat("127.0.0.1:", port), method, garbage, "worker-token");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(method), std::string::npos) << s.error_message();
  }
  // A well-formed request through the same path still reaches the service.
  v1::GetModelInfoRequest info;
  EXPECT_TRUE(testing::CallRaw(absl::StrCat("127.0.0.1:", worker_port), "/vericache.v1.Inference/GetModelInfo",
                               info.SerializeAsString(), "worker-token")
                  .ok());
  // The worker still serves correctly afterwards.
  GenerateReply ok = CallGenerate(*stub, Request(1, v1::MODE_VERICACHE));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.tokens, want_[1]);
}

// SIGTERM drains the worker process: the request in flight, longer than a plain shutdown's grace,
// finishes, exact, a new one is refused with UNAVAILABLE, and the process then exits on its own.
TEST_F(EndToEnd, SigtermDrainsTheWorker) {
  const int port = FreePort(5);
  auto store = StartStore();
  auto worker = StartWorker(port);
  auto stub = InferenceStub(absl::StrCat("127.0.0.1:", port));
  v1::GenerateRequest r = Request(0, v1::MODE_VERICACHE);
  // Long enough to outlast the 2 s a plain shutdown would give it.
  r.set_max_tokens(4000);
  r.set_ignore_eos(true);
  GenerateOptions o = options_[0];
  o.max_tokens = 4000;
  o.stop_at_eos = false;
  const auto want = GenerateFull(*model_, prompts_[0], o);
  ASSERT_TRUE(want.ok());
  auto long_call = std::async(std::launch::async, [&] { return CallGenerate(*stub, r, "", absl::Seconds(120)); });
  bool admitted = false;
  for (int i = 0; i < 2000 && !admitted; ++i) {  // until it is admitted
    v1::WorkerStats stats;
    admitted = testing::GetWorkerStats(*stub, "", &stats).ok() && stats.requests_in_flight() > 0;
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(admitted) << "the long request was not admitted";
  worker->Signal(SIGTERM);
  // Requests sent before the worker took the signal run; once it drains, they are refused.
  GenerateReply refused;
  for (int i = 0; i < 100; ++i) {
    refused = CallGenerate(*stub, Request(1, v1::MODE_VERICACHE), "", absl::Seconds(30));
    if (refused.status.code() == absl::StatusCode::kUnavailable) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(long_call.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the long request ended before a new one was refused";
  const GenerateReply done = long_call.get();
  ASSERT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.tokens, want->tokens);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable) << refused.status;
  EXPECT_TRUE(worker->WaitExit(std::chrono::seconds(30))) << "the worker did not exit after draining";
}

// The first `bytes` of the test model's training script as a text prompt, for `max_tokens`
// tokens, end of sequence ignored.
v1::GenerateRequest TextRequest(size_t bytes, uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.set_text(TrainScript().substr(0, bytes));
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.set_mode(v1::MODE_VERICACHE);
  return r;
}

// A worker and a router in front of it, both with --keepalive-ms 1000, and a 30000-token call
// through the router; `started`: its first token has come.
struct LongCallThroughRouter {
  LongCallThroughRouter(int salt, size_t prompt_bytes)
      : worker_port(FreePort(salt)), router_port(FreePort(salt + 1)),
        worker(StartWorkerWith(worker_port, {"--keepalive-ms", "1000"})),
        router(StartRouter(router_port, {worker_port}, {"--keepalive-ms", "1000"})),
        stub(InferenceStub(absl::StrCat("127.0.0.1:", router_port))) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    reader = stub->Generate(&ctx, TextRequest(prompt_bytes, 30000));
    v1::GenerateResponse r;
    started = reader->Read(&r);
  }
  const int worker_port, router_port;
  std::unique_ptr<Process> worker, router;
  std::unique_ptr<v1::Inference::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  bool started = false;
};

// A worker that stops answering (SIGSTOP: its host's TCP still acknowledges, as a hung process's
// does; a vanished host's answers nothing, which keepalive sees the same way) with a call in
// flight through a router: the router's keepalive ends the call with UNAVAILABLE within a few
// seconds. Without it, the call would wait for its deadline.
TEST(Keepalive, ARoutersCallsToAWorkerThatStopsAnsweringEnd) {
  LongCallThroughRouter call(6, 500);
  ASSERT_TRUE(call.started) << call.reader->Finish().error_message();
  call.worker->Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  v1::GenerateResponse r;
  while (call.reader->Read(&r)) {
  }
  const grpc::Status s = call.reader->Finish();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  call.worker->Signal(SIGCONT);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_LT(waited, 15.0) << "keepalive 1 s should end the call within about 2 s";
  std::cout << "the call ended " << waited << " s after the worker stopped" << std::endl;
  // Resumed, the worker finds the router's connection closed and ends the call too, thousands of
  // tokens short of its end.
  EXPECT_TRUE(WaitFor(*call.worker, [&] {
    v1::WorkerStats stats;
    auto direct = InferenceStub(absl::StrCat("127.0.0.1:", call.worker_port));
    return testing::GetWorkerStats(*direct, "", &stats).ok() && stats.requests_in_flight() == 0;
  })) << "the worker still runs the call";
}

// The other way: a router (the worker's client) that stops answering has its calls cancelled by
// the worker's keepalive, which frees their batch slots. Without it, the worker would generate
// all 30000 tokens for no one (the engine does not wait for the writes).
TEST(Keepalive, AWorkerCancelsTheCallsOfAClientThatStopsAnswering) {
  LongCallThroughRouter call(8, 600);
  ASSERT_TRUE(call.started) << call.reader->Finish().error_message();
  call.router->Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  auto direct = InferenceStub(absl::StrCat("127.0.0.1:", call.worker_port));
  bool idle = false;
  v1::WorkerStats stats;
  while (!idle && std::chrono::steady_clock::now() - stopped < std::chrono::seconds(20)) {
    idle = testing::GetWorkerStats(*direct, "", &stats).ok() && stats.requests_in_flight() == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  call.router->Signal(SIGCONT);
  call.ctx.TryCancel();
  call.reader->Finish();
  EXPECT_TRUE(idle) << "the worker still runs the call of a client that stopped answering";
  EXPECT_EQ(stats.requests_failed(), 1u) << "the call was not cut short";
  EXPECT_LT(stats.generated_tokens(), 30000u);
  EXPECT_LT(waited, 15.0);
  std::cout << "the worker ended the call " << waited << " s after its client stopped" << std::endl;
}

// Keepalive pings on a call whose worker is busy and silent (a 10000-token prefill, several
// seconds here, both cores computing) keep the call: the worker answers the router's pings in
// time, and takes them however long it has sent nothing.
TEST(Keepalive, PingsDuringALongSilentPrefillKeepTheCall) {
  const int worker_port = FreePort(10), router_port = FreePort(11);
  auto worker = StartWorkerWith(worker_port, {"--keepalive-ms", "1000"});
  auto router = StartRouter(router_port, {worker_port}, {"--keepalive-ms", "1000"});
  auto stub = InferenceStub(absl::StrCat("127.0.0.1:", router_port));
  const GenerateReply got = CallGenerate(*stub, TextRequest(10000, 8), "", absl::Seconds(120));
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.tokens.size(), 8u);
  std::cout << "first token after " << got.first_token_seconds << " s"
            << (got.first_token_seconds < 3.0 ? " (under three keepalive intervals: this run shows little)" : "")
            << std::endl;
}

// Three workers behind a router; a call's worker goes mid-stream, and the router hands the call to
// another with the tokens already sent as generated_ids. The client's stream goes on to the end,
// and its output is sequential full-KV decoding's. First a greedy call's worker is killed (its
// connection breaks: UNAVAILABLE), then a sampled call's is told to stop (SIGTERM) with no time
// to drain (--drain-seconds 0: it ends its calls with UNAVAILABLE, not gRPC's CANCELLED).
TEST(Failover, AWorkerThatGoesMidStreamHandsItsCallOnExactly) {
  auto model = Model::Load(kModel);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> prompt = (*model)->tokenizer().Encode(TrainScript().substr(4000, 600));
  const std::vector<int> ports = {FreePort(14), FreePort(15), FreePort(16)};
  std::vector<std::unique_ptr<Process>> workers;
  for (int port : ports) workers.push_back(StartWorkerWith(port, {"--drain-seconds", "0"}));
  const int router_port = FreePort(17);
  auto router = StartRouter(router_port, ports, {});
  auto router_stub = InferenceStub(absl::StrCat("127.0.0.1:", router_port));
  auto stats_stub = v1::Router::NewStub(InferenceChannel(absl::StrCat("127.0.0.1:", router_port)));
  const auto router_stats = [&](v1::RouterStats* s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stats_stub->GetRouterStats(&ctx, v1::GetRouterStatsRequest(), s).ok();
  };
  ASSERT_TRUE(WaitFor(*router, [&] {
    v1::RouterStats s;
    if (!router_stats(&s)) return false;
    int serving = 0;
    for (const auto& w : s.workers()) serving += w.serving();
    return serving == 3;
  })) << "the router does not see three serving workers";
  uint64_t failovers = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{5}}) {
    v1::GenerateRequest req;
    req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    req.set_max_tokens(1500);
    req.set_ignore_eos(true);
    if (seed != 0) {
      req.mutable_sampling()->set_temperature(0.8f);
      req.mutable_sampling()->set_top_k(40);
      req.mutable_sampling()->set_seed(seed);
    }
    const std::vector<int32_t> want = testing::FullOutput(kModel, req);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = router_stub->Generate(&ctx, req);
    std::vector<int32_t> got;
    v1::GenerateResponse r;
    v1::GenerateStats stats;
    ASSERT_TRUE(reader->Read(&r)) << reader->Finish().error_message();
    got.insert(got.end(), r.token_ids().begin(), r.token_ids().end());
    int killed = -1;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i] == nullptr) continue;
      v1::WorkerStats w;
      if (testing::GetWorkerStats(*InferenceStub(absl::StrCat("127.0.0.1:", ports[i])), "", &w).ok() &&
          w.requests_in_flight() > 0) {
        killed = static_cast<int>(i);
      }
    }
    ASSERT_NE(killed, -1) << "no worker has the call";
    if (seed == 0) {
      workers[killed]->Kill(SIGKILL);
    } else {
      workers[killed]->Signal(SIGTERM);
      EXPECT_TRUE(workers[killed]->WaitExit(std::chrono::seconds(30)));
    }
    workers[killed].reset();
    while (reader->Read(&r)) {
      got.insert(got.end(), r.token_ids().begin(), r.token_ids().end());
      if (r.has_stats()) stats = r.stats();
    }
    const grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(got, want) << "seed " << seed;
    EXPECT_EQ(stats.generated_tokens(), 1500u);
    EXPECT_EQ(stats.prompt_tokens(), prompt.size());
    v1::RouterStats rs;
    EXPECT_TRUE(router_stats(&rs));
    EXPECT_EQ(rs.failovers(), ++failovers);
  }
}

}  // namespace
// SIGTERM to a router with --unready-seconds: it reports NOT_SERVING at once, for load balancers
// to stop sending, but serves new calls until those seconds are over; then it closes and exits.
TEST(RouterDrain, AnUnreadyRouterServesOnUntilItsPortCloses) {
  const int worker_port = FreePort(20), router_port = FreePort(21);
  auto worker = StartWorkerWith(worker_port, {});
  auto router = StartRouter(router_port, {worker_port}, {"--unready-seconds", "6", "--drain-seconds", "15"});
  const std::string target = absl::StrCat("127.0.0.1:", router_port);
  EXPECT_EQ(testing::HealthStatus(target), 1);
  const auto signalled = std::chrono::steady_clock::now();
  router->Signal(SIGTERM);
  EXPECT_TRUE(testing::Eventually([&] { return testing::HealthStatus(target) == 2; }, absl::Seconds(2)));
  const GenerateReply r = CallGenerate(*InferenceStub(target), testing::IdsRequest(20, 4), "", absl::Seconds(10));
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(6)) << "the call came after the window";
  EXPECT_TRUE(router->WaitExit(std::chrono::seconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(6));
  EXPECT_EQ(testing::HealthStatus(target), -1);
}

}  // namespace vc
