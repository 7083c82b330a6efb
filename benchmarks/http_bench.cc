// What the OpenAI-compatible HTTP API adds to a request's latency against gRPC: one worker with
// the test model (no store), the same greedy request (the demo's shared code prefix and one of its
// suffixes, --max-tokens tokens, EOS ignored) sent in alternating rounds through gRPC Generate
// (a TCP client on loopback), HTTP /v1/completions plain and HTTP streamed (server-sent events).
// Every answer's text is compared with gRPC's. Reports the median, min and max latency of each
// path and the medians' ratios.
//
//   http_bench [--model models/vc-code-4m] [--prefix-file models/train.py] [--prefix-bytes 6000]
//              [--max-tokens 128] [--rounds 15] [--md benchmarks/results/http.md]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/flags.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "services/servers.h"

namespace {

namespace v1 = vericache::v1;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"model", "models/vc-code-4m"}, {"prefix-file", "models/train.py"},
                                              {"prefix-bytes", "6000"},       {"max-tokens", "128"},
                                              {"rounds", "15"},               {"md", ""}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  const int64_t max_tokens = vc::bench::Int(flags, "max-tokens", 1, 4096);
  const int64_t rounds = vc::bench::Int(flags, "rounds", 1, 10000);
  std::ifstream in(flags["prefix-file"]);
  std::stringstream text;
  text << in.rdbuf();
  std::string prompt = text.str().substr(0, static_cast<size_t>(vc::bench::Int(flags, "prefix-bytes", 1, 1 << 26)));
  if (prompt.empty()) {
    std::cerr << "http_bench: " << flags["prefix-file"] << " is empty or missing\n";
    return 2;
  }
  prompt.resize(prompt.rfind('\n') + 1);
  prompt += "\ndef evaluate(model, docs, ctx):\n";

  vc::WorkerServerOptions o;
  o.model_dir = flags["model"];
  o.http_listen = "127.0.0.1:0";
  auto worker = vc::WorkerServer::Start(o);
  if (!worker.ok()) {
    std::cerr << "http_bench: " << worker.status() << "\n";
    return 1;
  }
  auto stub = v1::Inference::NewStub(grpc::CreateChannel((*worker)->target(), grpc::InsecureChannelCredentials()));
  httplib::Client http("127.0.0.1", (*worker)->http_port());
  http.set_read_timeout(600, 0);
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);  // as HTTP clients of APIs set it (Node's undici, Python's httpx)

  v1::GenerateRequest req;
  req.set_text(prompt);
  req.set_max_tokens(static_cast<uint32_t>(max_tokens));
  req.set_ignore_eos(true);
  const json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  json streamed = body;
  streamed["stream"] = true;

  // Each path's answer text and its latency.
  const auto grpc_call = [&](std::string* out) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) *out += r.text();
    return reader->Finish().ok();
  };
  const auto http_plain = [&](std::string* out) {
    auto r = http.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) return false;
    *out = json::parse(r->body)["choices"][0]["text"].get<std::string>();
    return true;
  };
  const auto http_stream = [&](std::string* out) {
    std::string sse;
    auto r = http.Post("/v1/completions", streamed.dump(), "application/json");
    if (!r || r->status != 200) return false;
    std::istringstream lines(r->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const json chunk = json::parse(line.substr(6));
      if (!chunk["choices"].empty()) *out += chunk["choices"][0]["text"].get<std::string>();
    }
    return true;
  };
  struct Path {
    const char* name;
    std::function<bool(std::string*)> call;
    std::vector<double> seconds;
  };
  std::vector<Path> paths = {{"gRPC Generate", grpc_call, {}},
                             {"HTTP /v1/completions", http_plain, {}},
                             {"HTTP /v1/completions, streamed", http_stream, {}}};
  std::string expected;
  if (!grpc_call(&expected)) {  // warm-up: the prefix is in the worker's caches for every round
    std::cerr << "http_bench: the warm-up request failed\n";
    return 1;
  }
  for (int64_t round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < paths.size(); ++k) {
      Path& p = paths[(k + static_cast<size_t>(round)) % paths.size()];  // the order rotates
      std::string out;
      const Clock::time_point start = Clock::now();
      const bool ok = p.call(&out);
      p.seconds.push_back(Seconds(start));
      if (!ok || out != expected) {
        std::cerr << "http_bench: " << p.name << (ok ? " gave other text than gRPC" : " failed") << "\n";
        return 1;
      }
    }
  }
  const double base = Median(paths[0].seconds);
  std::ostringstream md;
  md << absl::StrFormat("%d rounds, one request of each path per round (order rotating), %d tokens each, prompt "
                        "%d bytes, model %s; every answer identical to gRPC's.\n\n",
                        rounds, max_tokens, prompt.size(), flags["model"]);
  md << "| path | median ms | min ms | max ms | median / gRPC's |\n|---|---|---|---|---|\n";
  for (const Path& p : paths) {
    md << absl::StrFormat("| %s | %.1f | %.1f | %.1f | %.3f |\n", p.name, Median(p.seconds) * 1e3,
                          *std::min_element(p.seconds.begin(), p.seconds.end()) * 1e3,
                          *std::max_element(p.seconds.begin(), p.seconds.end()) * 1e3, Median(p.seconds) / base);
  }
  std::cout << md.str();
  if (!flags["md"].empty()) std::ofstream(flags["md"]) << md.str();
  return 0;
}
