#include "services/http/http_server.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "httplib.h"
#include "services/call_metadata.h"
#include "services/http/openai_api.h"
#include "vericache/v1/inference.grpc.pb.h"

namespace vc::http {

namespace v1 = vericache::v1;
using json = nlohmann::ordered_json;

namespace {

// How often a waiting answer checks that its client is still there.
constexpr auto kAlivePeriod = std::chrono::seconds(1);
// How long the model's name, as a request checks it, is taken as known.
constexpr absl::Duration kModelInfoAge = absl::Seconds(5);

// One Generate call, read on a thread of its own so that the HTTP side can wait with a timeout.
class GenerateCall {
 public:
  GenerateCall(v1::Inference::Stub* stub, const v1::GenerateRequest& req, const std::string& authorization) {
    if (!authorization.empty()) ctx_.AddMetadata("authorization", authorization);
    reader_ = stub->Generate(&ctx_, req);
    thread_ = std::thread([this] { Read(); });
  }
  ~GenerateCall() {
    ctx_.TryCancel();
    thread_.join();
  }

  void Cancel() { ctx_.TryCancel(); }

  // Waits until the call is queued, has a token, or ended. False when it ended with no response:
  // refused or failed (status()).
  bool WaitTaken() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return admitted_ || !pending_.empty() || ended_; });
    return !(ended_ && pending_.empty() && !status_.ok() && !admitted_);
  }

  // Moves the responses that came to `out`, waiting up to `timeout` for one; whether the call has
  // ended (with every response taken).
  bool Next(std::chrono::milliseconds timeout, std::vector<v1::GenerateResponse>* out) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return !pending_.empty() || ended_; });
    out->assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
    pending_.clear();
    return ended_;
  }

  grpc::Status status() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }

 private:
  void Read() {
    reader_->WaitForInitialMetadata();
    if (ctx_.GetServerInitialMetadata().count(kAdmittedKey) > 0) {
      std::lock_guard<std::mutex> l(mu_);
      admitted_ = true;
      cv_.notify_all();
    }
    v1::GenerateResponse r;
    while (reader_->Read(&r)) {
      std::lock_guard<std::mutex> l(mu_);
      pending_.push_back(std::move(r));
      cv_.notify_all();
      r = v1::GenerateResponse();
    }
    grpc::Status s = reader_->Finish();
    std::lock_guard<std::mutex> l(mu_);
    status_ = std::move(s);
    ended_ = true;
    cv_.notify_all();
  }

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::GenerateResponse> pending_;  // guarded by mu_
  bool admitted_ = false, ended_ = false;     // guarded by mu_
  grpc::Status status_;                       // guarded by mu_, set when ended_
  std::thread thread_;                        // last: starts once the rest is built
};

void SendError(httplib::Response& res, int status, absl::string_view message) {
  res.status = status;
  res.set_content(JsonText(ErrorBody(status, message)), "application/json");
}

bool Write(httplib::DataSink& sink, const std::string& s) { return sink.write(s.data(), s.size()); }

// The client is gone: its call is cancelled, and the answer ends (false: httplib closes the
// connection).
bool CancelCall(GenerateCall& c) {
  c.Cancel();
  return false;
}

std::string Event(const json& j) { return absl::StrCat("data: ", JsonText(j), "\n\n"); }

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  std::unique_ptr<v1::Inference::Stub> stub;
  std::unique_ptr<httplib::Server> server;  // an httplib::SSLServer for HTTPS
  int port = 0;
  std::thread thread;
  std::mutex mu;
  std::mt19937_64 random{std::random_device{}()};  // guarded by mu
  std::set<GenerateCall*> calls;                     // guarded by mu: cancelled by the destructor
  bool stopping = false;                             // guarded by mu
  v1::ModelInfo recent_info;                         // guarded by mu: RecentModelInfo's
  absl::Time info_at = absl::InfinitePast();         // guarded by mu: when recent_info was asked

  uint64_t RandomU64() {
    std::lock_guard<std::mutex> l(mu);
    return random();
  }

  // The model as the service reports it, asked with the client's credentials.
  grpc::Status ModelInfo(const std::string& authorization, v1::ModelInfo* info) {
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), info);
  }

  // ModelInfo as a request needs it (the model's name): asked at most every few seconds, since a
  // router asks a worker each time. The request's own call authenticates it.
  grpc::Status RecentModelInfo(const std::string& authorization, v1::ModelInfo* info) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (info_at != absl::InfinitePast() && absl::Now() - info_at < kModelInfoAge) {
        *info = recent_info;
        return grpc::Status::OK;
      }
    }
    grpc::Status s = ModelInfo(authorization, info);
    if (s.ok()) {
      std::lock_guard<std::mutex> l(mu);
      recent_info = *info;
      info_at = absl::Now();
    }
    return s;
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    v1::ModelInfo info;
    if (grpc::Status s = ModelInfo(req.get_header_value("Authorization"), &info); !s.ok()) {
      return SendError(res, HttpStatusOf(s.error_code()), s.error_message());
    }
    json model = {{"id", info.model_name()},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "vericache"},
                  {"max_model_len", info.max_context_tokens()}};
    if (req.matches.size() > 1) {
      if (req.matches[1] != info.model_name()) {
        return SendError(res, 404, absl::StrCat("The model '", std::string(req.matches[1]), "' does not exist"));
      }
      return res.set_content(JsonText(model), "application/json");
    }
    res.set_content(JsonText(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  }

  void Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
};

void HttpServer::Impl::Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<ApiRequest> parsed = ParseRequest(endpoint, req.body, RandomU64());
  if (!parsed.ok()) return SendError(res, 400, parsed.status().message());
  const std::string authorization = req.get_header_value("Authorization");
  v1::ModelInfo info;
  if (grpc::Status s = RecentModelInfo(authorization, &info); !s.ok()) {
    return SendError(res, HttpStatusOf(s.error_code()), s.error_message());
  }
  if (!parsed->model.empty() && parsed->model != info.model_name()) {
    return SendError(res, 404, absl::StrCat("The model '", parsed->model, "' does not exist; this server serves '",
                                            info.model_name(), "'"));
  }
  auto call = std::make_shared<GenerateCall>(stub.get(), parsed->generate, authorization);
  {
    std::lock_guard<std::mutex> l(mu);
    if (stopping) return SendError(res, 503, "the server is stopping");
    calls.insert(call.get());
  }
  // Deregisters the call when the answer is done with it (or never began).
  struct Registered {
    Impl* impl;
    std::shared_ptr<GenerateCall> call;
    ~Registered() {
      std::lock_guard<std::mutex> l(impl->mu);
      impl->calls.erase(call.get());
    }
  };
  auto registered = std::make_shared<Registered>(Registered{this, call});
  if (!call->WaitTaken()) {
    const grpc::Status s = call->status();
    return SendError(res, HttpStatusOf(s.error_code()), s.error_message());
  }
  AnswerHeader header;
  header.id = absl::StrCat(endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-", absl::Hex(RandomU64()),
                           absl::Hex(RandomU64()));
  header.created = absl::ToUnixSeconds(absl::Now());
  header.model = info.model_name();
  const bool include_usage = parsed->include_usage;
  if (parsed->stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [=](size_t, httplib::DataSink& sink) {
      GenerateCall& c = *registered->call;
      bool first = true;
      if (endpoint == Endpoint::kChatCompletions) {
        if (!Write(sink, Event(Chunk(endpoint, header, "", true, "")))) return CancelCall(c);
        first = false;
      }
      v1::GenerateStats stats;
      std::vector<v1::GenerateResponse> got;
      bool ended = false;
      while (!ended) {
        ended = c.Next(std::chrono::duration_cast<std::chrono::milliseconds>(kAlivePeriod), &got);
        std::string out;
        for (v1::GenerateResponse& r : got) {
          if (!r.text().empty()) absl::StrAppend(&out, Event(Chunk(endpoint, header, r.text(), first, "")));
          if (r.has_stats()) stats = r.stats();
        }
        if (out.empty() && !ended) out = ": waiting\n\n";  // an SSE comment: is the client still there?
        if (!out.empty() && !Write(sink, out)) return CancelCall(c);
      }
      const grpc::Status s = c.status();
      std::string out;
      if (!s.ok()) {
        out = Event(ErrorBody(HttpStatusOf(s.error_code()), s.error_message()));
      } else {
        out = Event(Chunk(endpoint, header, "", false, FinishReason(stats.finish_reason())));
        if (include_usage) absl::StrAppend(&out, Event(UsageChunk(endpoint, header, stats)));
      }
      out += "data: [DONE]\n\n";
      if (!Write(sink, out)) return false;
      sink.done();
      return true;
    });
    return;
  }
  res.set_chunked_content_provider("application/json", [=](size_t, httplib::DataSink& sink) {
    GenerateCall& c = *registered->call;
    std::string text;
    v1::GenerateStats stats;
    std::vector<v1::GenerateResponse> got;
    bool ended = false;
    auto checked = std::chrono::steady_clock::now();
    while (!ended) {
      ended = c.Next(std::chrono::duration_cast<std::chrono::milliseconds>(kAlivePeriod), &got);
      for (v1::GenerateResponse& r : got) {
        text += r.text();
        if (r.has_stats()) stats = r.stats();
      }
      // JSON may begin with spaces: one a second tells whether the client is still there.
      if (!ended && std::chrono::steady_clock::now() - checked >= kAlivePeriod) {
        if (!Write(sink, " ")) return CancelCall(c);
        checked = std::chrono::steady_clock::now();
      }
    }
    if (!c.status().ok()) return false;  // the answer began as a 200: cut it short
    if (!Write(sink, JsonText(Answer(endpoint, header, text, stats)))) return false;
    sink.done();
    return true;
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stopping = true;
    for (GenerateCall* c : impl_->calls) c->Cancel();
  }
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int HttpServer::port() const { return impl_->port; }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                             std::shared_ptr<grpc::Channel> inference) {
  VC_RETURN_IF_ERROR(CheckAddress("HTTP listen address", options.listen, /*listen=*/true));
  if (absl::StartsWith(options.listen, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP listen address ", options.listen, ": give HOST:PORT"));
  }
  const std::string host = HostOf(options.listen);
  const int port = static_cast<int>(PortOf(options.listen));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->stub = v1::Inference::NewStub(std::move(inference));
  Impl* m = impl.get();
  if (m->options.tls_cert_file.empty() != m->options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("HTTPS needs both a certificate and its key");
  }
  if (m->options.tls_cert_file.empty()) {
    m->server = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(m->options.tls_cert_file.c_str(), m->options.tls_key_file.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot serve HTTPS with the certificate ", m->options.tls_cert_file,
                                                     " and the key ", m->options.tls_key_file));
    }
    m->server = std::move(tls);
  }
  httplib::Server& s = *m->server;
  const size_t threads = static_cast<size_t>(std::max(1, m->options.max_connections));
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(m->options.max_body_bytes);
  s.set_keep_alive_max_count(1000);
  // Small writes (a header, a chunk of a few tokens) go out at once, not after the client's
  // delayed acknowledgement (about 40 ms on Linux).
  s.set_tcp_nodelay(true);
  s.Post("/v1/completions", [m](const httplib::Request& req, httplib::Response& res) {
    m->Generate(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [m](const httplib::Request& req, httplib::Response& res) {
    m->Generate(Endpoint::kChatCompletions, req, res);
  });
  s.Get("/v1/models", [m](const httplib::Request& req, httplib::Response& res) { m->Models(req, res); });
  s.Get(R"(/v1/models/(.+))", [m](const httplib::Request& req, httplib::Response& res) { m->Models(req, res); });
  s.Get("/health", [m](const httplib::Request&, httplib::Response& res) {
    const bool ok = !m->options.healthy || m->options.healthy();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? R"({"status":"ok"})" : R"({"status":"unavailable"})", "application/json");
  });
  // Anything else (an unknown path, a body over the limit, a method a path does not take) in
  // OpenAI's error shape.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message = res.status == 404   ? absl::StrCat("no route for ", req.method, " ", req.path)
                                : res.status == 413 ? "the request body is too large"
                                                    : absl::StrCat("HTTP ", res.status);
    res.set_content(JsonText(ErrorBody(res.status, message)), "application/json");
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    SendError(res, 500, "internal error");
  });
  m->port = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (m->port <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", m->options.listen));
  }
  m->thread = std::thread([m] { m->server->listen_after_bind(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace vc::http
