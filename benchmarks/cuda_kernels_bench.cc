// Times the CUDA launchers on device-resident data, without the host staging of the "cuda" Backend:
// the memory-bound shapes of decode (n = 1) and of a verify pass or small batch.
//
// Each iteration enqueues kLaunchesPerIteration launches between two CUDA events; the reported
// time is the event time per iteration. GB/s counts the bytes one launch must move at least once
// (weights or KV read, activations read and written) over the event time. The MatMul weights are
// rotated over enough copies to exceed twice the L2 cache, so each launch reads them from HBM.
//
// Prints "no CUDA device" and exits 0 where there is no device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/dtype.h"
#include "kernels/cuda/cuda_kernels.h"

namespace vc::kernels::cuda {
namespace {

constexpr int kLaunchesPerIteration = 10;

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct EventDestroy {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using StreamPtr = std::unique_ptr<CUstream_st, StreamDestroy>;
using EventPtr = std::unique_ptr<CUevent_st, EventDestroy>;

// Marks the benchmark failed on error; returns whether it may go on.
bool Ok(benchmark::State& state, const absl::Status& status) {
  if (status.ok()) return true;
  state.SkipWithError(std::string(status.ToString()).c_str());
  return false;
}
bool Ok(benchmark::State& state, cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  state.SkipWithError(absl::StrCat(what, ": ", cudaGetErrorString(err)).c_str());
  return false;
}

template <typename T = void>
T* Get(const DevicePtr& p) {
  return static_cast<T*>(p.get());
}

// The stream, events and timing of one benchmark run.
class Timer {
 public:
  bool Init(benchmark::State& state) {
    cudaStream_t s = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    if (!Ok(state, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate")) return false;
    stream_.reset(s);
    if (!Ok(state, cudaEventCreate(&a), "cudaEventCreate")) return false;
    start_.reset(a);
    if (!Ok(state, cudaEventCreate(&b), "cudaEventCreate")) return false;
    stop_.reset(b);
    return true;
  }

  cudaStream_t stream() const { return stream_.get(); }

  // Runs the benchmark loop: `launch(i)` enqueues launch i. Reports time per iteration and GB/s for
  // `bytes_per_launch`.
  template <typename Launch>
  void Loop(benchmark::State& state, double bytes_per_launch, Launch launch) {
    if (!Ok(state, launch(0)) || !Ok(state, cudaStreamSynchronize(stream()), "warm-up")) return;
    double seconds = 0.0;
    int64_t i = 0;
    for (auto _ : state) {
      if (!Ok(state, cudaEventRecord(start_.get(), stream()), "cudaEventRecord")) break;
      bool ok = true;
      for (int l = 0; l < kLaunchesPerIteration && ok; ++l) ok = Ok(state, launch(i++));
      if (!ok || !Ok(state, cudaEventRecord(stop_.get(), stream()), "cudaEventRecord") ||
          !Ok(state, cudaEventSynchronize(stop_.get()), "cudaEventSynchronize")) {
        break;
      }
      float ms = 0.0f;
      if (!Ok(state, cudaEventElapsedTime(&ms, start_.get(), stop_.get()), "cudaEventElapsedTime")) break;
      state.SetIterationTime(ms / 1e3);
      seconds += ms / 1e3;
    }
    if (seconds > 0.0) {
      const double launches = static_cast<double>(state.iterations()) * kLaunchesPerIteration;
      state.counters["GB/s"] = bytes_per_launch * launches / seconds / 1e9;
      state.counters["us/launch"] = seconds / launches * 1e6;
    }
  }

 private:
  StreamPtr stream_;
  EventPtr start_, stop_;
};

bool Alloc(benchmark::State& state, size_t bytes, DevicePtr* out) {
  void* p = nullptr;
  if (!Ok(state, cudaMalloc(&p, bytes), "cudaMalloc")) return false;
  out->reset(p);
  return true;
}

template <typename T>
bool Upload(benchmark::State& state, const std::vector<T>& host, DevicePtr* out) {
  const size_t bytes = host.size() * sizeof(T);
  return Alloc(state, bytes, out) &&
         Ok(state, cudaMemcpy(out->get(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

std::vector<float> RandomFloats(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(count);
  for (float& v : out) v = dist(rng);
  return out;
}

// y [n, 4096] = x [n, 4096] * W^T with W [4096, 4096] bf16.
void BM_MatMulBf16(benchmark::State& state) {
  constexpr int64_t kRows = 4096, kCols = 4096;
  const int64_t n = state.range(0);
  Timer timer;
  if (!timer.Init(state)) return;
  std::mt19937 rng(1);
  const size_t weight_bytes = static_cast<size_t>(kRows * kCols) * sizeof(uint16_t);
  int device = 0, l2_bytes = 0;
  if (!Ok(state, cudaGetDevice(&device), "cudaGetDevice") ||
      !Ok(state, cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute")) {
    return;
  }
  const size_t copies = std::max<size_t>(2, (2 * static_cast<size_t>(l2_bytes) + weight_bytes - 1) / weight_bytes + 1);

  std::vector<uint16_t> host_w(static_cast<size_t>(kRows * kCols));
  {
    const std::vector<float> values = RandomFloats(host_w.size(), rng);
    for (size_t i = 0; i < values.size(); ++i) host_w[i] = F32ToBF16(values[i]);
  }
  DevicePtr weights;
  if (!Alloc(state, copies * weight_bytes, &weights)) return;
  for (size_t c = 0; c < copies; ++c) {
    if (!Ok(state, cudaMemcpy(Get<char>(weights) + c * weight_bytes, host_w.data(), weight_bytes,
                              cudaMemcpyHostToDevice),
            "cudaMemcpy")) {
      return;
    }
  }
  DevicePtr x, y;
  if (!Upload(state, RandomFloats(static_cast<size_t>(n * kCols), rng), &x) ||
      !Alloc(state, static_cast<size_t>(n * kRows) * sizeof(float), &y)) {
    return;
  }
  const double bytes = static_cast<double>(weight_bytes) + static_cast<double>(n) * (kCols + kRows) * sizeof(float);
  timer.Loop(state, bytes, [&](int64_t i) {
    const WeightView w{Get<char>(weights) + static_cast<size_t>(i) % copies * weight_bytes, DType::kBF16, kRows, kCols};
    return LaunchMatMul(Get<float>(x), n, w, Get<float>(y), timer.stream());
  });
  state.counters["weight_copies"] = static_cast<double>(copies);
}

// The attention shape of both benchmarks below: a Llama-style 32-head, 8-KV-head layer at 32K,
// float32 KV in blocks of 16 positions.
constexpr int kAttnHeads = 32, kAttnKvHeads = 8, kAttnHeadDim = 128, kAttnBlock = 16;
constexpr int32_t kAttnKvLen = 32768;
constexpr int64_t kAttnBlocksPerRow = kAttnKvLen / kAttnBlock;

// Times one LaunchPagedAttention over a pool of `blocks` KV blocks, row r reading the kAttnBlocksPerRow
// entries of `tables` from r * kAttnBlocksPerRow and attending to lens[r] positions. GB/s counts the
// pool once (each block must be read at least once) plus the queries and outputs.
void RunPagedAttention(benchmark::State& state, Timer& timer, int64_t blocks, const std::vector<int32_t>& tables,
                       const std::vector<int32_t>& lens, std::mt19937& rng) {
  const int64_t n = static_cast<int64_t>(lens.size());
  const int64_t block_floats = static_cast<int64_t>(kAttnBlock) * kAttnKvHeads * kAttnHeadDim;
  const size_t side_bytes = static_cast<size_t>(blocks * block_floats) * sizeof(float);
  DevicePtr k, v;
  // Timing does not depend on the values; any finite pattern will do.
  if (!Alloc(state, side_bytes, &k) || !Alloc(state, side_bytes, &v) ||
      !Ok(state, cudaMemset(k.get(), 0x3c, side_bytes), "cudaMemset") ||
      !Ok(state, cudaMemset(v.get(), 0x3c, side_bytes), "cudaMemset")) {
    return;
  }
  DevicePtr dtables, dlens, q, out, workspace;
  const size_t ws_bytes = AttentionWorkspaceBytes(n, kAttnHeads, kAttnHeadDim, kAttnKvLen);
  const size_t q_floats = static_cast<size_t>(n * kAttnHeads * kAttnHeadDim);
  if (!Upload(state, tables, &dtables) || !Upload(state, lens, &dlens) ||
      !Upload(state, RandomFloats(q_floats, rng), &q) || !Alloc(state, q_floats * sizeof(float), &out) ||
      !Alloc(state, ws_bytes, &workspace)) {
    return;
  }
  const PagedKvLayer kv{Get<float>(k), Get<float>(v), block_floats, kAttnBlock, kAttnKvHeads, kAttnHeadDim};
  const DeviceAttentionRows rows{Get<int32_t>(dtables), Get<int32_t>(dlens), kAttnBlocksPerRow, kAttnKvLen};
  const float scale = 1.0f / std::sqrt(static_cast<float>(kAttnHeadDim));
  const double bytes = 2.0 * static_cast<double>(side_bytes) + 2.0 * q_floats * sizeof(float);
  timer.Loop(state, bytes, [&](int64_t) {
    return LaunchPagedAttention(Get<float>(q), n, kAttnHeads, rows, kv, scale, workspace.get(), ws_bytes,
                                Get<float>(out), timer.stream());
  });
}

// n independent sequences of 32K positions, each in its own shuffled blocks.
void BM_PagedAttention32K(benchmark::State& state) {
  const int64_t n = state.range(0);
  Timer timer;
  if (!timer.Init(state)) return;
  std::mt19937 rng(2);
  const int64_t blocks = n * kAttnBlocksPerRow;
  std::vector<int32_t> tables(static_cast<size_t>(blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  RunPagedAttention(state, timer, blocks, tables, std::vector<int32_t>(static_cast<size_t>(n), kAttnKvLen), rng);
}

// A verify pass: n rows of one sequence, row r attending to the first kAttnKvLen - n + 1 + r positions
// of one shared block table. GB/s counts the KV once, as a pass needs it read once; us/launch against
// n = 1 is what verifying n - 1 drafts costs over one decode step.
void BM_VerifyAttention32K(benchmark::State& state) {
  const int64_t n = state.range(0);
  Timer timer;
  if (!timer.Init(state)) return;
  std::mt19937 rng(3);
  std::vector<int32_t> table(static_cast<size_t>(kAttnBlocksPerRow));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> tables, lens;
  for (int64_t r = 0; r < n; ++r) {
    tables.insert(tables.end(), table.begin(), table.end());
    lens.push_back(static_cast<int32_t>(kAttnKvLen - n + 1 + r));
  }
  RunPagedAttention(state, timer, kAttnBlocksPerRow, tables, lens, rng);
}

BENCHMARK(BM_MatMulBf16)->Arg(1)->Arg(5)->Arg(16)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PagedAttention32K)->Arg(1)->Arg(4)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_VerifyAttention32K)->Arg(1)->Arg(5)->Arg(9)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vc::kernels::cuda

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
