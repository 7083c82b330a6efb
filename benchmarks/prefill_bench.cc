// Prefill throughput against the machine's FMA peak, measured in the same run.
//
// For each model and prompt length: a prompt of random token ids is prefilled into an empty KV
// cache in chunks of --chunk tokens (as the engines do), best of --reps after a warm-up. It reports
// tokens/s and the multiply-adds per second of the linear layers (every weight once per token, the
// tied or untied output head once per chunk: the engines take logits of a chunk's last token only)
// and of attention (QK and PV over the positions before each token), and that rate as a fraction of
// the FMA peak: every kernel thread running independent 256-bit FMA chains for --peak-ms, and
// 512-bit chains where the CPU has AVX-512. With --backends, each backend's model prefills in turn
// within every repetition, so their ratio is measured side by side.
//
//   prefill_bench --models models/vc-code-4m,/tmp/qwen2-0.5b-random [--prompts 512,2048,8192]
//                 [--backends avx2,avx512vl] [--chunk 512] [--reps 3] [--json FILE]
// (/usr/bin/python3 models/random_checkpoint.py --out /tmp/qwen2-0.5b-random writes the second.)
#include <immintrin.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "benchmarks/flags.h"
#include "kernels/backends.h"
#include "kernels/thread_pool.h"
#include "nlohmann/json.hpp"
#include "worker/runtime/kv_cache.h"
#include "worker/runtime/model.h"

namespace {

using vc::bench::Int;
using vc::bench::Ints;

// Independent FMA chains per thread: more than FMA latency times FMA ports, so that throughput,
// not latency, bounds them.
constexpr int kChains = 12;

// One thread's FMA chains of 256-bit (or 512-bit) vectors until `stop`; returns the iterations
// (each is kChains vector FMAs).
__attribute__((target("avx2,fma"))) int64_t Chains256(const std::atomic<bool>& stop) {
  __m256 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  int64_t iters = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int k = 0; k < 1000; ++k) {
#pragma GCC unroll 16
      for (int i = 0; i < kChains; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
    }
    iters += 1000;
  }
  for (int i = 1; i < kChains; ++i) a[0] = _mm256_add_ps(a[0], a[i]);  // every chain counts
  float sink[8];
  _mm256_storeu_ps(sink, a[0]);
  return iters + (sink[0] == 12345.0f);
}

__attribute__((target("avx512f"))) int64_t Chains512(const std::atomic<bool>& stop) {
  __m512 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  int64_t iters = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int k = 0; k < 1000; ++k) {
#pragma GCC unroll 16
      for (int i = 0; i < kChains; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
    }
    iters += 1000;
  }
  for (int i = 1; i < kChains; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
  float sink[16];
  _mm512_storeu_ps(sink, a[0]);
  return iters + (sink[0] == 12345.0f);
}

// Multiply-adds per second of `threads` threads running `chains` (kChains FMAs of `lanes` lanes an
// iteration) for `ms` milliseconds: the FMA peak at that width.
double FmaPeak(int64_t (*chains)(const std::atomic<bool>&), int lanes, int threads, int ms) {
  std::atomic<int64_t> total{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> pool;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&] { total += chains(stop); });
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  stop = true;
  for (auto& th : pool) th.join();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(total.load()) * kChains * lanes / dt;
}

// Multiply-adds of prefilling `n` tokens in chunks of `chunk`.
double PrefillMacs(const vc::ModelConfig& c, int64_t n, int64_t chunk) {
  const double d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  const double q = c.num_heads * hd, kv = c.num_kv_heads * hd;
  const double linear_per_token = c.num_layers * (d * q + 2 * d * kv + q * d + 3 * d * f);
  const double head_per_chunk = static_cast<double>(c.vocab_size) * d;
  // Token p attends to p + 1 positions: QK and PV, head_dim each, for every query head.
  const double attention = c.num_layers * c.num_heads * 2 * hd * (static_cast<double>(n) * (n + 1) / 2);
  const double chunks = static_cast<double>((n + chunk - 1) / chunk);
  return linear_per_token * n + head_per_chunk * chunks + attention;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"models", "models/vc-code-4m"}, {"prompts", "512,2048,8192"},
                                              {"chunk", "512"},                {"reps", "3"},
                                              {"backends", ""},
                                              {"peak-ms", "1000"},             {"json", ""}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  const std::vector<int64_t> prompts = Ints(flags, "prompts", 1, 1 << 20);
  const int64_t chunk = Int(flags, "chunk", 1, 1 << 20);
  const int reps = static_cast<int>(Int(flags, "reps", 1, 1000));
  const int peak_ms = static_cast<int>(Int(flags, "peak-ms", 100, 60000));
  const int threads = vc::kernels::KernelThreadPool().num_threads();
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::cerr << "the FMA peak needs AVX2 and FMA\n";
    return 1;
  }
  const double peak256 = FmaPeak(Chains256, 8, threads, peak_ms);
  const double peak512 = __builtin_cpu_supports("avx512f") ? FmaPeak(Chains512, 16, threads, peak_ms) : 0;
  std::cout << absl::StrFormat("FMA peak, %d threads: %.1f G multiply-adds/s at 256 bits, %.1f at 512 bits\n",
                               threads, peak256 / 1e9, peak512 / 1e9);
  std::cout << "| model | kernels | prompt | tokens/s | G multiply-adds/s | of the 256-bit peak | of the 512-bit peak "
               "|\n|---|---|---:|---:|---:|---:|---:|\n";
  nlohmann::json results = nlohmann::json::array();
  std::vector<const vc::kernels::Backend*> backends;
  for (absl::string_view name : absl::StrSplit(flags["backends"], ',', absl::SkipEmpty())) {
    const vc::kernels::Backend* b = vc::kernels::BackendByName(name);
    if (b == nullptr) {
      std::cerr << "no backend '" << name << "' on this machine\n";
      return 2;
    }
    backends.push_back(b);
  }
  if (backends.empty()) backends.push_back(&vc::kernels::DefaultBackend());
  for (absl::string_view dir : absl::StrSplit(flags["models"], ',')) {
    // One model per backend, measured in turn within each repetition.
    std::vector<std::unique_ptr<vc::Model>> models;
    for (const vc::kernels::Backend* b : backends) {
      vc::ModelOptions mo;
      mo.backend = b;
      auto model = vc::Model::Load(std::string(dir), mo);
      if (!model.ok()) {
        std::cerr << model.status() << "\n";
        return 1;
      }
      models.push_back(*std::move(model));
    }
    const vc::ModelConfig& c = models[0]->config();
    for (int64_t want : prompts) {
      const int64_t n = std::min<int64_t>(want, c.max_position_embeddings);
      std::mt19937 rng(static_cast<uint32_t>(n));
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
      std::vector<double> best(models.size(), 1e30);
      for (int r = 0; r < reps + 1; ++r) {  // the first warms up
        for (size_t m = 0; m < models.size(); ++m) {
          vc::PagedKvCache cache(models[m]->kv_layout(16), n / 16 + 2);
          const vc::SeqId seq = cache.NewSequence();
          std::vector<float> logits;
          const auto t0 = std::chrono::steady_clock::now();
          if (absl::Status st = models[m]->Prefill(tokens, seq, static_cast<int>(chunk), cache, &logits); !st.ok()) {
            std::cerr << st << "\n";
            return 1;
          }
          const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r > 0) best[m] = std::min(best[m], dt);
        }
      }
      for (size_t m = 0; m < models.size(); ++m) {
        const double macs = PrefillMacs(c, n, chunk) / best[m];
        const std::string name(backends[m]->name());
        std::cout << absl::StrFormat("| %s | %s | %d | %.0f | %.1f | %.0f%% | %s |\n", std::string(dir), name, n,
                                     n / best[m], macs / 1e9, 100 * macs / peak256,
                                     peak512 > 0 ? absl::StrFormat("%.0f%%", 100 * macs / peak512) : "-");
        std::cout.flush();
        results.push_back({{"model", std::string(dir)}, {"backend", name}, {"prompt", n},
                           {"tokens_per_s", n / best[m]}, {"macs_per_s", macs}, {"fma_peak_256", peak256},
                           {"fma_peak_512", peak512}, {"threads", threads}});
      }
    }
  }
  if (!flags["json"].empty()) std::ofstream(flags["json"]) << results.dump(1) << "\n";
  return 0;
}
