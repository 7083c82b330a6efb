// Decode throughput of a model at long contexts, next to the memory-bandwidth floor.
//
// For each (context, batch): `batch` sequences hold `context` positions of KV (filled with
// synthetic values: decode speed does not depend on them, and prefilling 16 x 32K positions would
// dominate the run), then every step decodes one token for each sequence in one batched pass and
// rolls the cache back, so each step sees the same context. The floor is the time to read the
// weights once plus every sequence's KV once at the memcpy bandwidth measured in this run. Each KV
// dtype runs in the same process, one after the other per (backend, context, batch), so their
// ratio is measured side by side.
//
//   decode_bench --model models/vc-code-4m [--contexts 1024,8192,32768] [--batches 1,16]
//                [--backends avx512vl,avx2,avx2-variable-split] [--kv-dtypes f32,bf16] [--steps 8]
//                [--json FILE]
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "benchmarks/bandwidth.h"
#include "benchmarks/flags.h"
#include "kernels/backends.h"
#include "kernels/thread_pool.h"
#include "nlohmann/json.hpp"
#include "worker/runtime/model.h"

namespace {

using vc::bench::Int;
using vc::bench::Ints;

int64_t WeightBytes(const vc::ModelConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  const int64_t per_layer = d * (c.num_heads * hd) * 2 + d * (c.num_kv_heads * hd) * 2 + 3 * d * f;
  return (per_layer * c.num_layers + int64_t{c.vocab_size} * d) * 2;  // bf16 weights
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"model", "models/vc-code-4m"},
                                              {"contexts", "1024,8192,32768"},
                                              {"batches", "1,16"},
                                              {"backends", "avx512vl,avx2,avx2-variable-split"},
                                              {"kv-dtypes", "f32,bf16"},
                                              {"steps", "8"},
                                              {"json", ""}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  const int steps = static_cast<int>(Int(flags, "steps", 1, 1 << 20));
  const std::vector<int64_t> contexts = Ints(flags, "contexts", 1, 1 << 30);
  const std::vector<int64_t> batches = Ints(flags, "batches", 1, 4096);
  const double bw = vc::bench::MeasureMemcpyBandwidth();
  std::cout << absl::StrFormat("memcpy bandwidth: %.2f GB/s, kernel threads: %d\n", bw / 1e9,
                               vc::kernels::KernelThreadPool().num_threads());
  nlohmann::json results = nlohmann::json::array();
  std::vector<vc::DType> dtypes;
  for (absl::string_view name : absl::StrSplit(flags["kv-dtypes"], ',')) {
    auto d = vc::ParseKvDType(name);
    if (!d.ok() || !d->has_value()) {
      std::cerr << "--kv-dtypes: each of f32, bf16, f16; got '" << name << "'\n";
      return 2;
    }
    dtypes.push_back(**d);
  }
  std::cout << "| backend | KV | context | batch | tokens/s | ms/step | floor ms/step | fraction of floor | vs first KV dtype |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (absl::string_view name : absl::StrSplit(flags["backends"], ',')) {
    const vc::kernels::Backend* backend = vc::kernels::BackendByName(name);
    if (backend == nullptr) {
      std::cout << "backend " << name << " not available here\n";
      continue;
    }
    std::vector<std::unique_ptr<vc::Model>> models;
    for (vc::DType dtype : dtypes) {
      vc::ModelOptions mo;
      mo.backend = backend;
      mo.kv_dtype = dtype;
      auto model = vc::Model::Load(flags["model"], mo);
      if (!model.ok()) {
        std::cerr << model.status() << "\n";
        return 1;
      }
      models.push_back(*std::move(model));
    }
    const vc::ModelConfig& c = models[0]->config();
    for (int64_t want_ctx : contexts) {
      // The decoded token needs a position of its own inside the model's context.
      const int64_t ctx = std::min(want_ctx, c.max_position_embeddings - 1);
      for (int64_t batch : batches) {
        double first_tps = 0;
        for (const auto& model : models) {
          const vc::KvLayout layout = model->kv_layout(16);
          vc::PagedKvCache cache(layout, batch * ((ctx + 1) / 16 + 2));
          std::mt19937 rng(1);
          std::normal_distribution<float> nd(0.0f, 1.0f);
          std::vector<vc::SeqId> seqs;
          for (int64_t b = 0; b < batch; ++b) {
            const vc::SeqId s = cache.NewSequence();
            if (absl::Status st = cache.Reserve(s, ctx + 1); !st.ok()) {
              std::cerr << st << "\n";
              return 1;
            }
            std::vector<float> k(static_cast<size_t>(layout.row_elems())), v(k.size());
            for (int l = 0; l < c.num_layers; ++l) {
              for (int64_t p = 0; p < ctx; ++p) {
                for (size_t i = 0; i < k.size(); ++i) k[i] = nd(rng), v[i] = nd(rng);
                cache.Write(l, s, p, k.data(), v.data());
              }
            }
            cache.SetLength(s, ctx);
            seqs.push_back(s);
          }
          std::vector<int32_t> tokens(batch, 'x');
          std::vector<vc::SequenceChunk> chunks;
          for (int64_t b = 0; b < batch; ++b) chunks.push_back({seqs[b], {&tokens[b], 1}});
          std::vector<float> logits;
          double best = 1e30;
          for (int s = 0; s < steps + 1; ++s) {  // the first step warms up
            const auto t0 = std::chrono::steady_clock::now();
            if (absl::Status st = model->Forward(chunks, cache, vc::LogitsFor::kLastRows, &logits); !st.ok()) {
              std::cerr << st << "\n";
              return 1;
            }
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (s > 0) best = std::min(best, dt);
            for (vc::SeqId q : seqs) (void)cache.Truncate(q, ctx);
          }
          const double bytes = static_cast<double>(WeightBytes(c)) +
                               static_cast<double>(batch) * (ctx + 1) * layout.bytes_per_token();
          const double floor_s = bytes / bw;
          const double tps = batch / best;
          if (first_tps == 0) first_tps = tps;
          const std::string kv(vc::DTypeName(layout.dtype));
          std::cout << absl::StrFormat("| %s | %s | %d | %d | %.1f | %.3f | %.3f | %.2f | %.2fx |\n", std::string(name),
                                       kv, ctx, batch, tps, best * 1e3, floor_s * 1e3, floor_s / best, tps / first_tps);
          std::cout.flush();
          results.push_back({{"backend", std::string(name)}, {"kv_dtype", kv}, {"context", ctx}, {"batch", batch},
                             {"tokens_per_s", tps}, {"step_ms", best * 1e3},
                             {"floor_step_ms", floor_s * 1e3}, {"fraction_of_floor", floor_s / best},
                             {"bytes_per_step", bytes}, {"memcpy_gbps", bw / 1e9},
                             {"vs_first_kv_dtype", tps / first_tps}});
        }
      }
    }
  }
  if (!flags["json"].empty()) std::ofstream(flags["json"]) << results.dump(1) << "\n";
  return 0;
}
