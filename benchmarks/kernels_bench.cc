// Micro-benchmarks of the CPU kernels: matrix products at the test model's shapes for 1-token
// decode, a 17-row verify pass and a 128-row prefill chunk; attention at 1K-32K positions. The first
// argument picks the backend: 0 reference, 1 avx2, 2 avx2-variable-split, 3 avx512vl, 4 avx512vl-novbmi.
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kernels/backends.h"

namespace vc::kernels {
namespace {

const Backend* ByIndex(int64_t i) {
  switch (i) {
    case 0: return &ReferenceBackend();
    case 1: return Avx2BackendIfSupported();
    case 2: return Avx2VariableSplitBackendIfSupported();
    case 3: return Avx512vlBackendIfSupported();
    default: return Avx512vlNoVbmiBackendIfSupported();
  }
}

void BM_MatMulBF16(benchmark::State& state) {
  const Backend* b = ByIndex(state.range(0));
  if (b == nullptr) return state.SkipWithError("backend not available");
  const int64_t n = state.range(1), rows = 688, cols = 256;
  std::vector<uint16_t> w(rows * cols, F32ToBF16(0.01f));
  std::vector<float> x(n * cols, 0.5f), y(n * rows);
  const WeightView view{w.data(), DType::kBF16, rows, cols};
  for (auto _ : state) {
    b->MatMul(x.data(), n, view, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(b->name()));
  state.SetBytesProcessed(state.iterations() * rows * cols * 2);
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * 2 * n * rows * cols / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatMulBF16)->ArgsProduct({{0, 1, 3}, {1, 17, 128}});

// The products of a one-token decode step over six layers of the test model's shape (bf16, each
// layer's weights its own, 8.3 MB in all, from L3), q, k, v and gate, up either as separate MatMul
// calls (second argument 0) or as one MatMuls job each (1): what sharing a job saves in wake-ups,
// waits and a small product run on one thread.
void BM_DecodeProducts(benchmark::State& state) {
  const Backend* b = ByIndex(state.range(0));
  if (b == nullptr) return state.SkipWithError("backend not available");
  const bool shared = state.range(1) != 0;
  constexpr int kLayers = 6;
  const int64_t d = 256, kv = 64, f = 688;
  struct Layer {
    std::vector<uint16_t> q, k, v, o, gate, up, down;
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  auto weights = [&](int64_t n) {
    std::vector<uint16_t> w(static_cast<size_t>(n));
    for (uint16_t& x : w) x = F32ToBF16(dist(rng));
    return w;
  };
  std::vector<Layer> layers(kLayers);
  for (Layer& l : layers) {
    l.q = weights(d * d), l.k = weights(kv * d), l.v = weights(kv * d), l.o = weights(d * d);
    l.gate = weights(f * d), l.up = weights(f * d), l.down = weights(d * f);
  }
  auto view = [](const std::vector<uint16_t>& w, int64_t rows, int64_t cols) {
    return WeightView{w.data(), DType::kBF16, rows, cols};
  };
  std::vector<float> x(d, 0.5f), q(d), k(kv), v(kv), o(d), g(f), u(f);
  for (auto _ : state) {
    for (const Layer& l : layers) {
      const WeightView qkv[] = {view(l.q, d, d), view(l.k, kv, d), view(l.v, kv, d)};
      const WeightView gu[] = {view(l.gate, f, d), view(l.up, f, d)};
      float* const qkv_out[] = {q.data(), k.data(), v.data()};
      float* const gu_out[] = {g.data(), u.data()};
      if (shared) {
        b->MatMuls(x.data(), 1, qkv, qkv_out, 3);
      } else {
        for (int i = 0; i < 3; ++i) b->MatMul(x.data(), 1, qkv[i], qkv_out[i]);
      }
      b->MatMul(q.data(), 1, view(l.o, d, d), o.data());
      if (shared) {
        b->MatMuls(o.data(), 1, gu, gu_out, 2);
      } else {
        for (int i = 0; i < 2; ++i) b->MatMul(o.data(), 1, gu[i], gu_out[i]);
      }
      b->MatMul(g.data(), 1, view(l.down, d, f), x.data());
      for (float& z : x) z = 0.5f;  // keep the input bounded
    }
    benchmark::DoNotOptimize(x.data());
  }
  state.SetLabel(absl::StrCat(b->name(), shared ? ", shared jobs" : ", one job a product"));
  state.SetBytesProcessed(state.iterations() * kLayers * (2 * d * d + 2 * kv * d + 3 * f * d) * 2);
}
BENCHMARK(BM_DecodeProducts)->ArgsProduct({{1, 3}, {0, 1}})->Unit(benchmark::kMicrosecond);

// `n` query rows of one sequence over `ctx` positions (row r attends to ctx - n + 1 + r of them):
// n = 1 is a decode step, n = k + 1 a verify pass. With `layers` > 1, one call per layer, each
// layer's KV its own (6 layers of 16K are 48 MiB, past this machine's 32 MiB L3, as in the engine);
// with 1, the same layer again (from cache). Blocks are scattered through the pool. The last
// argument is the KV dtype: 0 float32, 1 bf16. Bytes are the KV bytes of one pass.
void BM_PagedAttention(benchmark::State& state) {
  const Backend* b = ByIndex(state.range(0));
  if (b == nullptr) return state.SkipWithError("backend not available");
  const int32_t ctx = static_cast<int32_t>(state.range(1));
  const int n = static_cast<int>(state.range(2));
  const int layers = static_cast<int>(state.range(3));
  const DType dtype = state.range(4) == 1 ? DType::kBF16 : DType::kF32;
  const int heads = 8, kv_heads = 2, d = 32, block = 16;
  const int64_t blocks = (ctx + block - 1) / block, stride = int64_t{block} * kv_heads * d;
  const int64_t elems = layers * blocks * stride, elem = static_cast<int64_t>(DTypeSize(dtype));
  std::vector<float> kf(elems, 0.1f), vf(elems, 0.2f), q(n * heads * d, 0.3f), out(n * heads * d);
  std::vector<char> k(elems * elem), v(elems * elem);
  NarrowFromF32(kf.data(), elems, dtype, k.data());
  NarrowFromF32(vf.data(), elems, dtype, v.data());
  std::vector<int32_t> table(blocks);
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>((i * 7919) % blocks);
  std::vector<AttentionRow> rows(n);
  for (int r = 0; r < n; ++r) rows[r] = {table.data(), ctx - n + 1 + r};
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) {
      const PagedKvLayer layer{k.data() + l * blocks * stride * elem, v.data() + l * blocks * stride * elem,
                               stride, block, kv_heads, d, dtype};
      b->PagedAttention(q.data(), n, heads, rows.data(), layer, 0.17f, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetLabel(absl::StrCat(b->name(), " ", DTypeName(dtype)));
  state.SetBytesProcessed(state.iterations() * layers * int64_t{ctx} * kv_heads * d * 2 * elem);
}
BENCHMARK(BM_PagedAttention)
    ->ArgsProduct({{0, 1, 2, 3}, {1024, 8192, 32768}, {1}, {1}, {0}})
    ->ArgsProduct({{1, 3}, {16384}, {1, 5, 9}, {1}, {0}})
    ->ArgsProduct({{1, 3}, {16384}, {1, 2, 3, 5, 9}, {6}, {0}})
    ->ArgsProduct({{1, 3}, {32768}, {1, 5}, {6}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

// One decode row over a KIVI cache of `ctx` tokens (all but 32 quantized, group 32), 8 query heads
// on 2 KV heads of 32 dims: the draft step's attention. Bytes are the cache bytes read.
void BM_KiviAttention(benchmark::State& state) {
  const Backend* b = ByIndex(state.range(0));
  if (b == nullptr) return state.SkipWithError("backend not available");
  const int32_t ctx = static_cast<int32_t>(state.range(1));
  const int bits = static_cast<int>(state.range(2));
  const int heads = 8, kv_heads = 2, d = 32, group = 32;
  const int32_t qt = (ctx - 32) / group * group, dense = ctx - qt;
  const int64_t row_bytes = int64_t{d} * bits / 8;
  std::vector<uint8_t> kc(qt * row_bytes, 0x5a), vc(qt * row_bytes, 0xa5);
  std::vector<float> ks(qt / group * d, 0.01f), km(qt / group * d, -0.1f), vs(qt, 0.01f), vm(qt, -0.1f);
  std::vector<float> dk(dense * d, 0.1f), dv(dense * d, 0.2f), q(heads * d, 0.3f), out(heads * d);
  std::vector<int32_t> rows(dense);
  for (int i = 0; i < dense; ++i) rows[i] = i;
  std::vector<CompressedKvHead> kv(kv_heads);
  for (auto& h : kv) {
    h.quant = {bits, group, d, qt, kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data()};
    h.dense = {dk.data(), dv.data(), d, rows.data(), dense};
  }
  for (auto _ : state) {
    b->CompressedAttention(q.data(), 1, heads, kv_heads, d, kv.data(), 0.17f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(b->name()));
  state.SetBytesProcessed(state.iterations() * kv_heads * (2 * int64_t{qt} * row_bytes + int64_t{qt} * 8 +
                                                          int64_t{qt} / group * d * 8 + int64_t{dense} * d * 8));
}
BENCHMARK(BM_KiviAttention)->ArgsProduct({{1, 3, 4}, {1024, 16384}, {2, 4, 8}})->Unit(benchmark::kMicrosecond);

// 4-bit KIVI attention over `selected` of `stored` quantized positions (a query-aware view: every
// stored / selected-th key group, through a group table), beside a view that holds only the
// selected positions: what reading groups spread over the larger store costs.
void BM_KiviAttentionSelected(benchmark::State& state) {
  const Backend* b = ByIndex(state.range(0));
  if (b == nullptr) return state.SkipWithError("backend not available");
  const int32_t stored = static_cast<int32_t>(state.range(1)), selected = static_cast<int32_t>(state.range(2));
  const int heads = 8, kv_heads = 2, d = 32, group = 32, bits = 4, dense = 32;
  const int64_t row_bytes = int64_t{d} * bits / 8;
  std::vector<uint8_t> kc(stored * row_bytes), vc(stored * row_bytes);
  std::vector<float> ks(stored / group * d), km(stored / group * d), vs(stored), vm(stored);
  std::mt19937 rng(7);
  for (auto& x : kc) x = static_cast<uint8_t>(rng());
  for (auto& x : vc) x = static_cast<uint8_t>(rng());
  for (auto& x : ks) x = 0.01f + (rng() % 100) * 1e-4f;
  for (auto& x : km) x = -0.1f + (rng() % 100) * 1e-3f;
  for (auto& x : vs) x = 0.01f + (rng() % 100) * 1e-4f;
  for (auto& x : vm) x = -0.1f + (rng() % 100) * 1e-3f;
  std::vector<float> dk(dense * d, 0.1f), dv(dense * d, 0.2f), q(heads * d, 0.3f), out(heads * d);
  std::vector<int32_t> rows(dense), table(selected / group);
  for (int i = 0; i < dense; ++i) rows[i] = i;
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i * (stored / selected));
  std::vector<CompressedKvHead> kv(kv_heads);
  for (auto& h : kv) {
    h.quant = {bits, group, d, selected, kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data()};
    if (stored != selected) h.quant.group_table = table.data();
    h.dense = {dk.data(), dv.data(), d, rows.data(), dense};
  }
  for (auto _ : state) {
    b->CompressedAttention(q.data(), 1, heads, kv_heads, d, kv.data(), 0.17f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(b->name()));
}
BENCHMARK(BM_KiviAttentionSelected)
    ->Args({1, 4096, 4096})
    ->Args({1, 16384, 4096})
    ->Args({1, 16384, 2048})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vc::kernels

BENCHMARK_MAIN();
