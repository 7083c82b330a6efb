// The OpenAI-compatible HTTP API on a real worker and a real router on loopback: the official
// openai npm client (tests/http) gets, plain and streamed, the output that gRPC Generate and
// sequential full-KV decoding give; errors come with OpenAI's shape and the right status; a client
// that goes away cancels its request; a draining worker answers 503; with a certificate, HTTPS.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "services/http/openai_api.h"
#include "services/servers.h"
#include "tests/testing/servers.h"
#include "tests/testing/tls.h"
#include "worker/chat/chat_format.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;
using json = nlohmann::json;

constexpr char kToken[] = "secret";
constexpr char kOtherTenantToken[] = "tenant-b";

// Runs `command`; its exit status, its stdout in *out.
int RunCommand(const std::string& command, std::string* out) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stack_ = testing::MakeTinyStack("http_api");
    auto store = StoreServer::Start(stack_.store);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    WorkerServerOptions o = stack_.worker;
    o.store_target = store_->target();
    o.http_listen = "127.0.0.1:0";
    o.chat_template_file = std::string(VC_SOURCE_DIR) + "/models/vc-code-4m/chat_template.jinja";
    o.served_model_name = "tiny";
    o.service.client_tokens = {{kToken, ""}, {kOtherTenantToken, "b"}, {"ops", ""}};
    o.service.max_requests_per_tenant = 2;
    o.service.before_steps = [this] {
      if (const int ms = step_delay_ms_.load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
    auto worker = WorkerServer::Start(o);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
    RouterServerOptions r;
    r.service.workers = worker_->target();
    r.service.worker_token = "ops";
    r.http_listen = "127.0.0.1:0";
    auto router = RouterServer::Start(r);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    ASSERT_TRUE(router_->service().WaitServing(1, absl::Seconds(20)));
    auto chat = LoadChatFormat(stack_.worker.model_dir, o.chat_template_file);
    ASSERT_TRUE(chat.ok() && chat->has_value()) << chat.status();
    chat_ = std::make_unique<ChatFormat>(**chat);
    channel_ = grpc::CreateChannel(worker_->target(), grpc::InsecureChannelCredentials());
  }

  std::string WorkerUrl() const { return absl::StrCat("http://127.0.0.1:", worker_->http_port()); }
  std::string RouterUrl() const { return absl::StrCat("http://127.0.0.1:", router_->http_port()); }

  // gRPC Generate on the worker: the text, the tokens and the stats.
  void Generate(const v1::GenerateRequest& req, std::string* text, std::vector<int32_t>* tokens,
                v1::GenerateStats* stats) {
    auto stub = v1::Inference::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      *text += r.text();
      tokens->insert(tokens->end(), r.token_ids().begin(), r.token_ids().end());
      if (r.has_stats()) *stats = r.stats();
    }
    const grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // A case for the node script: `body` through gRPC Generate, its tokens checked against
  // sequential full-KV decoding of the prompt's ids.
  json Case(const std::string& name, const std::string& kind, json body) {
    auto parsed = http::ParseRequest(kind == "chat" ? http::Endpoint::kChatCompletions : http::Endpoint::kCompletions,
                                     body.dump(), 0);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (!parsed.ok()) return json();
    v1::GenerateRequest req = parsed->generate;
    std::string text;
    std::vector<int32_t> tokens;
    v1::GenerateStats stats;
    Generate(req, &text, &tokens, &stats);
    // The same prompt as token ids, decoded sequentially with the full KV.
    std::vector<int32_t> ids;
    if (req.has_chat()) {
      auto rendered = chat_->Render(req.chat().messages_json(), req.chat().tools_json(), true);
      EXPECT_TRUE(rendered.ok()) << rendered.status();
      ids = worker_->model().tokenizer().EncodeTemplated(*rendered);
    } else if (req.has_token_ids()) {
      ids.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
    } else {
      ids = worker_->model().tokenizer().Encode(req.text());
    }
    v1::GenerateRequest as_ids = req;
    as_ids.mutable_token_ids()->Clear();
    for (int32_t id : ids) as_ids.mutable_token_ids()->add_ids(id);
    if (as_ids.max_tokens() == 0) as_ids.set_max_tokens(worker_->model().config().max_position_embeddings - ids.size());
    // A request that may end early (at a stop sequence or the end of sequence) gives the first
    // tokens of what decoding without either gives.
    as_ids.clear_stop();
    as_ids.set_ignore_eos(true);
    std::vector<int32_t> full = testing::FullOutput(stack_.worker.model_dir, as_ids);
    if (req.stop_size() > 0 || !req.ignore_eos()) {
      EXPECT_LE(tokens.size(), full.size()) << name;
      full.resize(std::min(full.size(), tokens.size()));
      for (const std::string& stop : req.stop()) EXPECT_EQ(text.find(stop), std::string::npos) << name;
    }
    EXPECT_EQ(tokens, full) << name;
    EXPECT_EQ(stats.prompt_tokens(), ids.size()) << name;
    return json{{"name", name},
                {"kind", kind},
                {"body", body},
                {"text", text},
                {"prompt_tokens", stats.prompt_tokens()},
                {"completion_tokens", stats.generated_tokens()},
                {"finish_reason", http::FinishReason(stats.finish_reason())}};
  }

  v1::WorkerStats Stats() {
    v1::WorkerStats s;
    auto stub = v1::Inference::NewStub(channel_);
    EXPECT_TRUE(testing::GetWorkerStats(*stub, kToken, &s).ok());
    return s;
  }

  testing::TinyStack stack_;
  std::unique_ptr<StoreServer> store_;
  std::unique_ptr<WorkerServer> worker_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<ChatFormat> chat_;
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<int> step_delay_ms_{0};  // the scheduler sleeps this long before each round of steps
};

TEST_F(HttpApiTest, OpenAiClientGetsTheOutputOfGrpcAndOfFullKvDecoding) {
  const std::string prefix = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
  json cases = json::array();
  cases.push_back(Case("greedy completion", "completion",
                       {{"prompt", prefix}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}}));
  cases.push_back(Case("sampled completion", "completion",
                       {{"prompt", prefix + "    if n < 2:"}, {"max_tokens", 48}, {"temperature", 0.8},
                        {"top_p", 0.9}, {"top_k", 40}, {"seed", 7}, {"ignore_eos", true}}));
  cases.push_back(Case("token-id prompt", "completion",
                       {{"prompt", json::array({100, 101, 102, 103, 104})}, {"max_tokens", 24}, {"temperature", 0},
                        {"ignore_eos", true}}));
  cases.push_back(Case("stop sequence", "completion",
                       {{"prompt", prefix}, {"max_tokens", 64}, {"temperature", 0.7}, {"seed", 3}, {"stop", "e"}}));
  json messages = json::array({{{"role", "system"}, {"content", "You write Python."}},
                               {{"role", "user"}, {"content", "Sum a list."}}});
  cases.push_back(Case("greedy chat", "chat",
                       {{"messages", messages}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}}));
  messages.push_back({{"role", "assistant"}, {"content", "def total(xs):\n    return sum(xs)"}});
  messages.push_back({{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Now the mean."}}})}});
  cases.push_back(Case("sampled chat, text parts", "chat",
                       {{"messages", messages}, {"max_completion_tokens", 40}, {"temperature", 1.0}, {"seed", 11},
                        {"ignore_eos", true}}));
  // Without max_tokens a chat goes on to the end of the context.
  cases.push_back(Case("chat to the end of the context", "chat",
                       {{"messages", json::array({{{"role", "user"}, {"content", "Go on."}}})},
                        {"temperature", 0},
                        {"ignore_eos", true}}));
  EXPECT_EQ(cases.back()["prompt_tokens"].get<int>() + cases.back()["completion_tokens"].get<int>(),
            worker_->model().config().max_position_embeddings);
  ASSERT_FALSE(HasFailure());
  const std::string cases_path = stack_.dir + "/cases.json";
  std::ofstream(cases_path) << cases.dump();

  const uint64_t failed_before = Stats().requests_failed();
  step_delay_ms_ = 2;  // the streams the client aborts (900 tokens) take seconds
  const std::string command =
      absl::StrCat("cd ", VC_SOURCE_DIR, "/tests/http && VC_TARGETS='", json::array({WorkerUrl(), RouterUrl()}).dump(),
                   "' VC_TOKEN=", kToken, " VC_MODEL=tiny VC_CASES=", cases_path, " ", VC_NODE,
                   " openai_client_test.mjs 2>&1");
  std::string out;
  const int status = RunCommand(command, &out);
  EXPECT_EQ(status, 0) << out;
  const size_t brace = out.rfind('{');
  ASSERT_NE(brace, std::string::npos) << out;
  const json summary = json::parse(out.substr(brace), nullptr, false);
  ASSERT_TRUE(summary.is_object()) << out;
  std::cout << "openai client: " << summary.dump() << std::endl;
  EXPECT_EQ(summary["failures"], 0) << out;
  EXPECT_GE(summary["checks"].get<int>(), 100) << out;
  EXPECT_EQ(summary["cancelled"], 2) << out;
  // Each aborted stream ended its request on the worker, early, as failed (cancelled).
  EXPECT_TRUE(testing::Eventually([&] {
    const v1::WorkerStats s = Stats();
    return s.requests_in_flight() == 0 && s.requests_failed() >= failed_before + 2;
  })) << Stats().DebugString();
}

// A prompt sent again finds its blocks in the store or the worker's compressed prefixes: the usage
// says so.
TEST_F(HttpApiTest, UsageCountsThePromptTokensReadInsteadOfComputed) {
  httplib::Client c("127.0.0.1", worker_->http_port());
  const httplib::Headers auth = {{"Authorization", absl::StrCat("Bearer ", kToken)}};
  const std::string body =
      json{{"prompt", std::string(200, 'a') + "def f(x):"}, {"max_tokens", 8}, {"temperature", 0}}.dump();
  json usage;
  const auto send = [&] {
    auto r = c.Post("/v1/completions", auth, body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
    usage = r && r->status == 200 ? json::parse(r->body)["usage"] : json();
  };
  send();
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 0) << usage;
  EXPECT_EQ(usage["prompt_tokens"], 210) << usage;
  // 210 prompt tokens: six whole 32-token blocks, published as the first request ends (the store
  // may take a moment to hold them all).
  EXPECT_TRUE(testing::Eventually([&] {
    send();
    return usage["prompt_tokens_details"]["cached_tokens"] == 192;
  })) << usage;
  // What was read instead of computed: the store's full KV, or the compressed prefix drafting began
  // from, whichever reached further.
  const json& vc = usage["vericache"];
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"].get<int>(),
            std::max(vc["prefix_store_tokens"].get<int>(),
                     vc["prefix_compressed_tokens"].get<int>() + vc["prefix_compressed_store_tokens"].get<int>()))
      << usage;
}

// Junk: mutated request bodies, odd paths and methods. Every answer is a success or a client error
// in OpenAI's shape (never a 5xx, a hang or a dropped connection), and the server serves after.
TEST_F(HttpApiTest, JunkGetsClientErrorsAndLeavesTheServerServing) {
  httplib::Client c("127.0.0.1", worker_->http_port());
  c.set_read_timeout(30, 0);
  const httplib::Headers auth = {{"Authorization", absl::StrCat("Bearer ", kToken)}};
  const std::vector<std::string> seeds = {
      R"({"prompt": "def f(x):", "max_tokens": 4, "temperature": 0.5, "seed": 3, "stop": ["
"]})",
      R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true})",
      R"({"prompt": [1, 2, 3], "max_tokens": 2, "top_p": 0.5, "top_k": 3, "stream_options": {"include_usage": true}})",
  };
  const std::string alphabet = "{}[]\":,0123456789-.eE \\nulltruefalse\x80\xff";
  std::mt19937 rng(12345);
  int answered = 0;
  for (int i = 0; i < 300; ++i) {
    std::string body = seeds[i % seeds.size()];
    for (int edits = 1 + static_cast<int>(rng() % 4); edits > 0; --edits) {
      const size_t at = rng() % (body.size() + 1);
      switch (rng() % 3) {
        case 0:
          body.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 1:
          if (at < body.size()) body.erase(at, 1 + rng() % 8);
          break;
        default:
          if (at < body.size()) body[at] = alphabet[rng() % alphabet.size()];
      }
    }
    const char* path = i % 2 == 0 ? "/v1/completions" : "/v1/chat/completions";
    auto r = c.Post(path, auth, body, "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error()) << " for " << body;
    EXPECT_TRUE(r->status == 200 || (r->status >= 400 && r->status < 500)) << r->status << " for " << body;
    if (r->status != 200) {
      const json e = json::parse(r->body, nullptr, false);
      EXPECT_TRUE(e.is_object() && e["error"]["message"].is_string()) << r->body;
    }
    answered++;
  }
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/completions"}, {"DELETE", "/v1/models"}, {"PUT", "/health"}, {"GET", "/../../etc/passwd"}}) {
    httplib::Request req;
    req.method = method;
    req.path = path;
    auto r = c.send(req);
    ASSERT_TRUE(r) << method << " " << path;
    EXPECT_GE(r->status, 400) << method << " " << path;
    EXPECT_LT(r->status, 500) << method << " " << path;
  }
  EXPECT_EQ(answered, 300);
  auto ok = c.Post("/v1/completions", auth, R"({"prompt": "def", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_TRUE(testing::Eventually([&] { return Stats().requests_in_flight() == 0; }));
}

// The status and the OpenAI error object of a response.
void ExpectError(const httplib::Result& r, int status, const std::string& type) {
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, status) << r->body;
  const json body = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << r->body;
  EXPECT_EQ(body["error"]["type"], type) << r->body;
  EXPECT_FALSE(body["error"]["message"].get<std::string>().empty()) << r->body;
}

TEST_F(HttpApiTest, BadRequestsGetOpenAiErrorsWithTheirStatus) {
  httplib::Client c("127.0.0.1", worker_->http_port());
  const httplib::Headers auth = {{"Authorization", absl::StrCat("Bearer ", kToken)}};
  ExpectError(c.Post("/v1/completions", auth, "{not json", "application/json"), 400, "invalid_request_error");
  ExpectError(c.Post("/v1/completions", auth, "[1]", "application/json"), 400, "invalid_request_error");
  ExpectError(c.Post("/v1/completions", auth, R"({"prompt": ""})", "application/json"), 400, "invalid_request_error");
  ExpectError(c.Post("/v1/completions", auth, R"({"prompt": ["a", "b"]})", "application/json"), 400,
              "invalid_request_error");
  ExpectError(c.Post("/v1/completions", auth, R"({"prompt": "a", "logprobs": 2})", "application/json"), 400,
              "invalid_request_error");
  ExpectError(c.Post("/v1/completions", auth, R"({"prompt": "a", "stop": [1]})", "application/json"), 400,
              "invalid_request_error");
  ExpectError(c.Post("/v1/chat/completions", auth, R"({"messages": [{"content": "no role"}]})", "application/json"),
              400, "invalid_request_error");
  ExpectError(c.Post("/v1/chat/completions", auth,
                     R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "application/json"),
              400, "invalid_request_error");
  ExpectError(c.Post("/v1/completions", auth, "{\"prompt\": \"\xff\"}", "application/json"), 400,
              "invalid_request_error");
  ExpectError(c.Post("/v1/completions", R"({"prompt": "a"})", "application/json"), 401, "authentication_error");
  ExpectError(c.Post("/v1/completions", auth, R"({"model": "gpt-4", "prompt": "a"})", "application/json"), 404,
              "not_found_error");
  ExpectError(c.Get("/v1/models/gpt-4", auth), 404, "not_found_error");
  ExpectError(c.Get("/v1/nothing", auth), 404, "not_found_error");
  ExpectError(c.Post("/v1/completions", auth, std::string(33 << 20, ' '), "application/json"), 413,
              "invalid_request_error");
  // At its tenant's request limit (2): 429, and the tenant's requests in flight go on.
  auto stub = v1::Inference::NewStub(channel_);
  std::vector<std::unique_ptr<grpc::ClientContext>> held;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers;
  for (int i = 0; i < 2; ++i) {
    held.push_back(std::make_unique<grpc::ClientContext>());
    held.back()->AddMetadata("authorization", absl::StrCat("Bearer ", kOtherTenantToken));
    v1::GenerateRequest r = testing::IdsRequest(16, 900);
    readers.push_back(stub->Generate(held.back().get(), r));
    v1::GenerateResponse first;
    ASSERT_TRUE(readers.back()->Read(&first));
  }
  const httplib::Headers b = {{"Authorization", absl::StrCat("Bearer ", kOtherTenantToken)}};
  ExpectError(c.Post("/v1/completions", b, R"({"prompt": "a"})", "application/json"), 429, "rate_limit_error");
  for (auto& ctx : held) ctx->TryCancel();
  for (auto& r : readers) r->Finish();
  // Draining: 503, and the health endpoint says so.
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  worker_->StopAdmitting();
  ExpectError(c.Post("/v1/completions", auth, R"({"prompt": "a"})", "application/json"), 503, "server_error");
  health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
}

TEST_F(HttpApiTest, AClientThatLeavesAPlainRequestCancelsIt) {
  const uint64_t failed_before = Stats().requests_failed();
  step_delay_ms_ = 10;  // 1000 tokens take seconds
  {
    httplib::Client c("127.0.0.1", worker_->http_port());
    c.set_read_timeout(0, 300'000);  // gives up on the answer before the server's first space
    auto r = c.Post("/v1/completions", {{"Authorization", absl::StrCat("Bearer ", kToken)}},
                    R"({"prompt": "x", "max_tokens": 1000, "ignore_eos": true, "temperature": 0})", "application/json");
    EXPECT_FALSE(r && r->status == 200 && !r->body.empty() && r->body.back() == '}');
  }
  EXPECT_TRUE(testing::Eventually([&] {
    const v1::WorkerStats s = Stats();
    return s.requests_in_flight() == 0 && s.requests_failed() == failed_before + 1;
  })) << Stats().DebugString();
}

// With the worker's --tls-cert and --tls-key, the HTTP API is HTTPS: a client that trusts the
// certificate gets answers, one that speaks plain HTTP to it gets none.
TEST(HttpApiTls, ServesHttpsWithTheWorkersCertificate) {
  testing::TinyStack t = testing::MakeTinyStack("http_api_tls");
  const testing::CertAndKey id = testing::SelfSignedCert("vericache-worker");
  ASSERT_FALSE(id.cert_pem.empty()) << "OpenSSL could not make a certificate";
  const std::string cert = t.dir + "/cert.pem", key = t.dir + "/key.pem";
  std::ofstream(cert) << id.cert_pem;
  std::ofstream(key) << id.key_pem;
  WorkerServerOptions o = t.worker;
  o.http_listen = "127.0.0.1:0";
  o.http_tls_cert_file = cert;
  o.http_tls_key_file = key;
  auto worker = WorkerServer::Start(o);
  ASSERT_TRUE(worker.ok()) << worker.status();
  httplib::SSLClient https("127.0.0.1", (*worker)->http_port());
  https.set_ca_cert_path(cert.c_str());
  https.enable_server_certificate_verification(true);
  auto r = https.Post("/v1/completions", R"({"prompt": "def", "max_tokens": 4, "temperature": 0})", "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 4) << r->body;
  httplib::Client plain("127.0.0.1", (*worker)->http_port());
  plain.set_read_timeout(2, 0);
  auto refused = plain.Get("/health");
  EXPECT_FALSE(refused && refused->status == 200);
  // A key that is not the certificate's: the worker does not start.
  o.http_tls_key_file = cert;
  EXPECT_EQ(WorkerServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vc
