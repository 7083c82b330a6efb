// CUDA kernels of the token path. The reduction order of every output is spelled out with explicit
// rounding intrinsics (fmaf, __fadd_rn, __fmul_rn) wherever it matters, so it does not rest on the
// compiler's contraction choices, and it depends only on the shapes named in cuda_kernels.h.
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace vc::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

constexpr int kMatMulWarps = 8;      // warps (= output elements) per MatMul block
constexpr int kNormThreads = 256;    // threads per RmsNorm row
constexpr int kAttnThreads = 256;    // threads per attention chunk block
constexpr int kAttnWarps = kAttnThreads / kWarp;
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxGridX = 2147483647;
constexpr int kMaxGridY = 65535;

static_assert(kAttnThreads == kAttentionChunk, "the softmax phase gives each thread one position");
static_assert(kMaxHeadDim <= kAttnThreads, "the V phase gives each thread one output dimension");

// Sum over the warp in a fixed xor-butterfly tree. Float addition is commutative, so every lane ends
// with the same bits.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// ---------------------------------------------------------------------------------------------------
// MatMul

// The two 16-bit elements packed in a 32-bit word (element 0 in the low half), as float. Exact.
template <DType T>
__device__ __forceinline__ float2 Unpack16(uint32_t word) {
  if constexpr (T == DType::kBF16) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  } else {
    return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(word & 0xffffu))),
                       __half2float(__ushort_as_half(static_cast<unsigned short>(word >> 16))));
  }
}

template <DType T>
__device__ __forceinline__ float LoadWeight(const void* w, int64_t i) {
  if constexpr (T == DType::kF32) {
    return __ldg(static_cast<const float*>(w) + i);
  } else {
    const unsigned short u = __ldg(static_cast<const unsigned short*>(w) + i);
    return T == DType::kBF16 ? __uint_as_float(static_cast<uint32_t>(u) << 16) : __half2float(__ushort_as_half(u));
  }
}

// Elements in one 16-byte weight load.
template <DType T>
__host__ __device__ constexpr int VecWidth() {
  return T == DType::kF32 ? 4 : 8;
}

// Loads the 16 bytes of weights at element i as VecWidth<T>() floats.
template <DType T>
__device__ __forceinline__ void LoadWeightVec(const void* w, int64_t i, float* out) {
  if constexpr (T == DType::kF32) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(w) + i));
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(w) + i));
    const float2 a = Unpack16<T>(v.x), b = Unpack16<T>(v.y), c = Unpack16<T>(v.z), d = Unpack16<T>(v.w);
    out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
    out[4] = c.x, out[5] = c.y, out[6] = d.x, out[7] = d.y;
  }
}

// One warp per kOut consecutive output elements and tile of up to kTile rows. For each output o,
// lane l owns, in order, the columns [s + l*V, s + l*V + V) for s = 0, 32V, 64V, ... (kVec: cols % V
// == 0, 16-byte loads) or the columns l, l + 32, ... (otherwise), folding them into one fma chain per
// row; the lanes then meet in WarpSum. Each (row, output) chain is the same whatever kTile, kOut, the
// tile the row is in, n or the grid: kTile and kOut (chosen from n) only set how many rows share the
// weight loads and how many outputs share the loads of x.
template <DType T, bool kVec, int kTile, int kOut>
__global__ void __launch_bounds__(kMatMulWarps* kWarp)
    MatMulKernel(const float* __restrict__ x, int64_t n, const void* __restrict__ w, int64_t rows, int64_t cols,
                 float* __restrict__ y) {
  constexpr int V = VecWidth<T>();
  const int lane = threadIdx.x % kWarp;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kMatMulWarps + threadIdx.x / kWarp) * kOut;
  if (o0 >= rows) return;  // whole warps only
  const int outs = static_cast<int>(min(static_cast<int64_t>(kOut), rows - o0));  // uniform across the warp
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < n;
       r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    const int tile = static_cast<int>(min(static_cast<int64_t>(kTile), n - r0));
    const float* xt = x + r0 * cols;
    float acc[kOut][kTile];
#pragma unroll
    for (int u = 0; u < kOut; ++u) {
#pragma unroll
      for (int r = 0; r < kTile; ++r) acc[u][r] = 0.0f;
    }
    if constexpr (kVec) {
#pragma unroll 2
      for (int64_t c = static_cast<int64_t>(lane) * V; c < cols; c += kWarp * V) {
        float wv[kOut][V];
#pragma unroll
        for (int u = 0; u < kOut; ++u) {
          if (u < outs) LoadWeightVec<T>(w, (o0 + u) * cols + c, wv[u]);
        }
#pragma unroll
        for (int r = 0; r < kTile; ++r) {
          if (r < tile) {
            const float4* xr = reinterpret_cast<const float4*>(xt + r * cols + c);
#pragma unroll
            for (int q = 0; q < V / 4; ++q) {
              const float4 xv = __ldg(xr + q);
#pragma unroll
              for (int u = 0; u < kOut; ++u) {
                acc[u][r] = fmaf(xv.x, wv[u][4 * q + 0], acc[u][r]);
                acc[u][r] = fmaf(xv.y, wv[u][4 * q + 1], acc[u][r]);
                acc[u][r] = fmaf(xv.z, wv[u][4 * q + 2], acc[u][r]);
                acc[u][r] = fmaf(xv.w, wv[u][4 * q + 3], acc[u][r]);
              }
            }
          }
        }
      }
    } else {
      for (int64_t c = lane; c < cols; c += kWarp) {
        float wv[kOut];
#pragma unroll
        for (int u = 0; u < kOut; ++u) wv[u] = u < outs ? LoadWeight<T>(w, (o0 + u) * cols + c) : 0.0f;
#pragma unroll
        for (int r = 0; r < kTile; ++r) {
          if (r < tile) {
            const float xv = __ldg(xt + r * cols + c);
#pragma unroll
            for (int u = 0; u < kOut; ++u) acc[u][r] = fmaf(xv, wv[u], acc[u][r]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kOut; ++u) {
#pragma unroll
      for (int r = 0; r < kTile; ++r) {
        if (u < outs && r < tile) {  // uniform across the warp
          const float sum = WarpSum(acc[u][r]);
          if (lane == 0) y[(r0 + r) * rows + o0 + u] = sum;
        }
      }
    }
  }
}

template <DType T>
absl::Status LaunchMatMulTyped(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t stream) {
  constexpr int V = VecWidth<T>();
  const bool vec = w.cols % V == 0;
  if (vec) {
    const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
    if (misaligned(x) || misaligned(w.data)) {
      return absl::InvalidArgumentError("MatMul: x and w.data must be 16-byte aligned");
    }
  }
  const auto launch = [&](auto tile, auto outs) -> absl::Status {
    constexpr int kTile = decltype(tile)::value, kOut = decltype(outs)::value;
    const int64_t per_block = int64_t{kMatMulWarps} * kOut;
    const int64_t bx = (w.rows + per_block - 1) / per_block;
    if (bx > kMaxGridX) return absl::InvalidArgumentError(absl::StrCat("MatMul: too many rows: ", w.rows));
    const int64_t tiles = (n + kTile - 1) / kTile;
    const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(std::min<int64_t>(tiles, kMaxGridY)));
    if (vec) {
      MatMulKernel<T, true, kTile, kOut><<<grid, kMatMulWarps * kWarp, 0, stream>>>(x, n, w.data, w.rows, w.cols, y);
    } else {
      MatMulKernel<T, false, kTile, kOut><<<grid, kMatMulWarps * kWarp, 0, stream>>>(x, n, w.data, w.rows, w.cols, y);
    }
    return LastLaunchStatus("MatMul launch");
  };
  // Small n gets a small tile, so a decode step does not pay for registers it does not use; with
  // several rows, the loads of x outnumber the weight loads, and four outputs per warp share them.
  using std::integral_constant;
  if (n == 1) return launch(integral_constant<int, 1>(), integral_constant<int, 1>());
  if (n == 2) return launch(integral_constant<int, 2>(), integral_constant<int, 2>());
  if (n <= 4) return launch(integral_constant<int, 4>(), integral_constant<int, 4>());
  return launch(integral_constant<int, kMatMulRowTile>(), integral_constant<int, 4>());
}

// ---------------------------------------------------------------------------------------------------
// RmsNorm

// Sum over a block of kNormThreads: WarpSum, then the warp sums added in warp order. `warp_sums`
// holds kNormThreads / kWarp floats. Every thread returns the same bits.
__device__ __forceinline__ float BlockSum(float v, float* warp_sums) {
  v = WarpSum(v);
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = v;
  __syncthreads();
  float total = warp_sums[0];
#pragma unroll
  for (int i = 1; i < kNormThreads / kWarp; ++i) total = __fadd_rn(total, warp_sums[i]);
  return total;
}

__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const float* x, int64_t n, int64_t dim, const float* __restrict__ weight, float eps, float* y) {
  __shared__ float warp_sums[kNormThreads / kWarp];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) ss = fmaf(xr[i], xr[i], ss);
    const float total = BlockSum(ss, warp_sums);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(dim)), eps)));
    // Each thread rewrites only the elements it read, so y may alias x.
    for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) {
      y[r * dim + i] = __fmul_rn(__fmul_rn(xr[i], inv), __ldg(weight + i));
    }
    __syncthreads();  // warp_sums is reused by the next row
  }
}

// ---------------------------------------------------------------------------------------------------
// Rope and SwiGlu

__global__ void RopeKernel(float* x, int64_t n, int heads, int head_dim, const float* __restrict__ cos,
                           const float* __restrict__ sin) {
  const int half = head_dim / 2;
  const int64_t total = n * heads * half;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int64_t rh = t / half;  // row * heads + head
    const int64_t r = rh / heads;
    float* v = x + rh * head_dim;
    const float c = __ldg(cos + r * half + i), s = __ldg(sin + r * half + i);
    const float a = v[i], b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

unsigned ElementwiseBlocks(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kElementwiseThreads - 1) / kElementwiseThreads, 1 << 20));
}

// ---------------------------------------------------------------------------------------------------
// Attention

// Where the partials of (row, head, chunk) live in the workspace: (max, sum) pairs first, then the
// weighted V sums, both indexed by (row * num_heads + head) * max_chunks + chunk.
struct Partials {
  float2* ml;
  float* acc;
};

int64_t MaxChunks(int32_t max_len) { return std::max<int64_t>(1, (max_len + kAttentionChunk - 1) / kAttentionChunk); }

int64_t PartialCount(int64_t n, int num_heads, int32_t max_len) { return n * num_heads * MaxChunks(max_len); }

size_t AccOffsetBytes(int64_t count) { return (static_cast<size_t>(count) * sizeof(float2) + 15) / 16 * 16; }

// Position sources: how many positions (row r, KV head g) attends to, and where the K/V row of its
// position j starts (in floats from the K and V base pointers). The kernels' arithmetic is the same
// for every source, so equal K/V rows in equal order give equal bits whichever source lists them.
struct PagedPositions {
  DeviceAttentionRows rows;
  int64_t block_stride;
  int block_size, num_kv_heads, head_dim;

  __device__ int32_t Len(int64_t r, int) const { return rows.kv_lens[r]; }
  __device__ int64_t Offset(int64_t r, int g, int64_t j) const {
    const int32_t block = rows.block_tables[r * rows.table_stride + j / block_size];
    return block * block_stride + ((j % block_size) * num_kv_heads + g) * static_cast<int64_t>(head_dim);
  }
};

struct ListPositions {
  DeviceKvLists lists;
  int num_kv_heads;

  __device__ int32_t Len(int64_t r, int g) const { return lists.lens[r * num_kv_heads + g]; }
  __device__ int64_t Offset(int64_t r, int g, int64_t j) const {
    return lists.offsets[lists.starts[r * num_kv_heads + g] + j];
  }
};

// Dynamic shared memory of the chunk kernel, in this order: the K/V offsets of the chunk's
// positions, the scores, and the group's queries (later reused for the V phase's per-slice sums).
struct ChunkSmem {
  static constexpr size_t kOffsetBytes = kAttentionChunk * sizeof(int64_t);
  static __host__ __device__ int Slices(int d) { return kAttnThreads / d; }
  static __host__ __device__ size_t ScoreBytes(int group) {
    return static_cast<size_t>(group) * kAttentionChunk * sizeof(float);
  }
  static __host__ __device__ size_t QBytes(int group, int d) {
    return static_cast<size_t>(Slices(d)) * group * d * sizeof(float);
  }
  static size_t Bytes(int group, int d) { return kOffsetBytes + ScoreBytes(group) + QBytes(group, d); }
};

// One block per (row r, KV head g, chunk), flattened into blockIdx.x with the row fastest: the rows of
// a verify pass read the same KV chunk, and adjacent blocks run together, so the chunk comes from HBM
// once and from L2 for the other rows. The order decides only where a block runs. Computes, for the `group`
// query heads sharing KV head g, over positions [j0, j0 + clen) of (r, g):
//   scores: one warp per position; lane l owns dimensions l, l + 32, ... (fma chain), then WarpSum.
//   softmax: one warp per head; lane l owns positions l, l + 32, ... (max, then a sum chain of the
//            exponentials), then WarpMax / WarpSum.
//   weighted V: the block is cut into S = kAttnThreads / d slices of d threads; slice p sums, per
//            dimension, positions p, p + S, ... in order; the S slice sums are then added in slice
//            order.
// Every order above is a function of (head_dim, group, clen) only, and clen of (length, chunk).
template <typename Positions>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionChunkKernel(const float* __restrict__ q, int num_heads, int num_kv_heads, int d, Positions pos,
                         const float* __restrict__ kbase, const float* __restrict__ vbase, float scale,
                         int64_t n, int64_t max_chunks, Partials part) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int group = num_heads / num_kv_heads;
  int64_t* offs = reinterpret_cast<int64_t*>(smem);                     // [kAttentionChunk]
  float* s = reinterpret_cast<float*>(smem + ChunkSmem::kOffsetBytes);  // [group, kAttentionChunk]
  float* qs = reinterpret_cast<float*>(smem + ChunkSmem::kOffsetBytes + ChunkSmem::ScoreBytes(group));
  // qs: [group, d], later [slices, group, d]

  const int64_t r = blockIdx.x % n;
  const int64_t rest = blockIdx.x / n;
  const int g = static_cast<int>(rest % num_kv_heads);
  const int64_t chunk = rest / num_kv_heads;
  const int32_t len = pos.Len(r, g);
  const int64_t j0 = chunk * kAttentionChunk;
  if (j0 >= len) return;  // whole block; the merge reads only chunks that exist
  const int clen = static_cast<int>(min(static_cast<int64_t>(kAttentionChunk), len - j0));
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int h0 = g * group;  // first query head of the group

  const float* qg = q + (r * num_heads + h0) * d;
  for (int i = tid; i < group * d; i += kAttnThreads) qs[i] = qg[i];
  if (tid < clen) offs[tid] = pos.Offset(r, g, j0 + tid);
  __syncthreads();

  // Scores.
  constexpr int kDimsPerLane = kMaxHeadDim / kWarp;
  for (int jj = warp; jj < clen; jj += kAttnWarps) {
    const float* k = kbase + offs[jj];
    float kr[kDimsPerLane];
#pragma unroll
    for (int e = 0; e < kDimsPerLane; ++e) kr[e] = lane + e * kWarp < d ? __ldg(k + lane + e * kWarp) : 0.0f;
    for (int h = 0; h < group; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kDimsPerLane; ++e) {
        if (lane + e * kWarp < d) dot = fmaf(qs[h * d + lane + e * kWarp], kr[e], dot);
      }
      dot = WarpSum(dot);
      if (lane == 0) s[h * kAttentionChunk + jj] = __fmul_rn(dot, scale);
    }
  }
  __syncthreads();

  // Softmax statistics of the chunk, one warp per head.
  constexpr int kPosPerLane = kAttentionChunk / kWarp;
  for (int h = warp; h < group; h += kAttnWarps) {
    float* sh = s + h * kAttentionChunk;
    float m = -INFINITY;
#pragma unroll
    for (int e = 0; e < kPosPerLane; ++e) {
      if (lane + e * kWarp < clen) m = fmaxf(m, sh[lane + e * kWarp]);
    }
    m = WarpMax(m);
    float l = 0.0f;
#pragma unroll
    for (int e = 0; e < kPosPerLane; ++e) {
      const int jj = lane + e * kWarp;
      if (jj < clen) {
        const float p = expf(__fsub_rn(sh[jj], m));
        sh[jj] = p;
        l = __fadd_rn(l, p);
      }
    }
    l = WarpSum(l);
    if (lane == 0) part.ml[(r * num_heads + h0 + h) * max_chunks + chunk] = make_float2(m, l);
  }
  __syncthreads();

  // Weighted V: thread (slice p, dimension i) sums positions p, p + slices, ... for every head.
  const int slices = kAttnThreads / d;
  const int i = tid % d, p = tid / d;
  if (p < slices) {
    float acc[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) acc[h] = 0.0f;
    for (int jj = p; jj < clen; jj += slices) {
      const float v = __ldg(vbase + offs[jj] + i);
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h < group) acc[h] = fmaf(s[h * kAttentionChunk + jj], v, acc[h]);
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h < group) qs[(p * group + h) * d + i] = acc[h];  // the queries are no longer needed
    }
  }
  __syncthreads();
  for (int t = tid; t < group * d; t += kAttnThreads) {
    float sum = qs[t];
    for (int sl = 1; sl < slices; ++sl) sum = __fadd_rn(sum, qs[sl * group * d + t]);
    const int h = t / d;
    part.acc[((r * num_heads + h0 + h) * max_chunks + chunk) * d + t % d] = sum;
  }
}

// One block per (row, head): rescales each chunk's partial to the overall max and adds the chunks
// in chunk order. Every thread computes the same running sum l, so all use the same 1/l.
template <typename Positions>
__global__ void AttentionMergeKernel(int num_heads, int num_kv_heads, int d, Positions pos, int64_t max_chunks,
                                     Partials part, float* __restrict__ out) {
  const int64_t rh = blockIdx.x;  // row * num_heads + head
  const int64_t r = rh / num_heads;
  const int32_t len = pos.Len(r, static_cast<int>(rh % num_heads) / (num_heads / num_kv_heads));
  float* o = out + rh * d;
  if (len <= 0) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const int64_t chunks = min((static_cast<int64_t>(len) + kAttentionChunk - 1) / kAttentionChunk, max_chunks);
  const float2* ml = part.ml + rh * max_chunks;
  const float* acc = part.acc + rh * max_chunks * d;
  float m = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, ml[c].x);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float l = 0.0f, sum = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float2 mc = ml[c];
      const float w = expf(__fsub_rn(mc.x, m));
      l = fmaf(mc.y, w, l);
      sum = fmaf(acc[c * d + i], w, sum);
    }
    o[i] = __fmul_rn(sum, __fdiv_rn(1.0f, l));
  }
}

// The launch shared by both sources; the shape has been checked by the caller.
template <typename Positions>
absl::Status LaunchAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int d, const Positions& pos,
                             const float* k, const float* v, int32_t max_len, float scale, void* workspace,
                             size_t workspace_bytes, float* out, cudaStream_t stream) {
  if (max_len < 0) return absl::InvalidArgumentError("attention: negative max length");
  if (workspace_bytes < AttentionWorkspaceBytes(n, num_heads, d, max_len) ||
      reinterpret_cast<uintptr_t>(workspace) % alignof(float2) != 0) {
    return absl::InvalidArgumentError("attention: workspace too small or misaligned");
  }
  const int64_t max_chunks = MaxChunks(max_len);
  const int64_t chunk_blocks = max_chunks * num_kv_heads * n;
  if (chunk_blocks > kMaxGridX || n * num_heads > kMaxGridX) {
    return absl::InvalidArgumentError("attention: grid too large");
  }
  const int64_t count = PartialCount(n, num_heads, max_len);
  const Partials part{static_cast<float2*>(workspace),
                      reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + AccOffsetBytes(count))};
  const int group = num_heads / num_kv_heads;
  AttentionChunkKernel<<<static_cast<unsigned>(chunk_blocks), kAttnThreads, ChunkSmem::Bytes(group, d), stream>>>(
      q, num_heads, num_kv_heads, d, pos, k, v, scale, n, max_chunks, part);
  if (absl::Status s = LastLaunchStatus("attention chunk launch"); !s.ok()) return s;
  const int merge_threads = std::min(kMaxHeadDim, (d + kWarp - 1) / kWarp * kWarp);
  AttentionMergeKernel<<<static_cast<unsigned>(n * num_heads), merge_threads, 0, stream>>>(
      num_heads, num_kv_heads, d, pos, max_chunks, part, out);
  return LastLaunchStatus("attention merge launch");
}

absl::Status UnsupportedShape(int num_heads, int num_kv_heads, int head_dim) {
  return absl::InvalidArgumentError(absl::StrCat("attention: unsupported shape: num_heads ", num_heads,
                                                 ", num_kv_heads ", num_kv_heads, ", head_dim ", head_dim));
}

}  // namespace

absl::Status LaunchMatMul(const float* x, int64_t n, const WeightView& w, float* y, cudaStream_t stream) {
  if (n < 0 || w.rows < 0 || w.cols < 0) return absl::InvalidArgumentError("MatMul: negative shape");
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (w.cols == 0) {  // empty dot products
    return CudaStatus(cudaMemsetAsync(y, 0, static_cast<size_t>(n * w.rows) * sizeof(float), stream), "MatMul memset");
  }
  switch (w.dtype) {
    case DType::kF32: return LaunchMatMulTyped<DType::kF32>(x, n, w, y, stream);
    case DType::kBF16: return LaunchMatMulTyped<DType::kBF16>(x, n, w, y, stream);
    case DType::kF16: return LaunchMatMulTyped<DType::kF16>(x, n, w, y, stream);
  }
  return absl::InvalidArgumentError("MatMul: unknown weight dtype");
}

absl::Status LaunchRmsNorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y,
                           cudaStream_t stream) {
  if (n < 0 || dim < 0) return absl::InvalidArgumentError("RmsNorm: negative shape");
  if (n == 0 || dim == 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, kMaxGridX));
  RmsNormKernel<<<blocks, kNormThreads, 0, stream>>>(x, n, dim, weight, eps, y);
  return LastLaunchStatus("RmsNorm launch");
}

absl::Status LaunchRope(float* x, int64_t n, int heads, int head_dim, const float* cos, const float* sin,
                        cudaStream_t stream) {
  if (n < 0 || heads < 0 || head_dim < 0) return absl::InvalidArgumentError("Rope: negative shape");
  const int64_t total = n * heads * (head_dim / 2);
  if (total == 0) return absl::OkStatus();
  RopeKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(x, n, heads, head_dim, cos, sin);
  return LastLaunchStatus("Rope launch");
}

absl::Status LaunchSwiGlu(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream) {
  if (count < 0) return absl::InvalidArgumentError("SwiGlu: negative count");
  if (count == 0) return absl::OkStatus();
  SwiGluKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream>>>(gate, up, count, out);
  return LastLaunchStatus("SwiGlu launch");
}

bool AttentionShapeSupported(int num_heads, int num_kv_heads, int head_dim) {
  if (head_dim < 1 || head_dim > kMaxHeadDim || num_kv_heads < 1) return false;
  if (num_heads < num_kv_heads || num_heads % num_kv_heads != 0) return false;
  return num_heads / num_kv_heads <= kMaxGroup;
}

bool PagedAttentionSupported(int num_heads, const PagedKvLayer& kv) {
  return kv.block_size >= 1 && AttentionShapeSupported(num_heads, kv.num_kv_heads, kv.head_dim);
}

size_t AttentionWorkspaceBytes(int64_t n, int num_heads, int head_dim, int32_t max_len) {
  const int64_t count = PartialCount(n, num_heads, max_len);
  return AccOffsetBytes(count) + static_cast<size_t>(count) * head_dim * sizeof(float);
}

absl::Status LaunchPagedAttention(const float* q, int64_t n, int num_heads, const DeviceAttentionRows& rows,
                                  const PagedKvLayer& kv, float scale, void* workspace, size_t workspace_bytes,
                                  float* out, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("PagedAttention: negative row count");
  if (n == 0 || num_heads == 0) return absl::OkStatus();
  if (!PagedAttentionSupported(num_heads, kv)) {
    return UnsupportedShape(num_heads, kv.num_kv_heads, kv.head_dim);
  }
  if (kv.dtype != DType::kF32) {
    return absl::InvalidArgumentError("PagedAttention on the device reads float32 K/V (the host widens bf16 and f16)");
  }
  const PagedPositions pos{rows, kv.block_stride, kv.block_size, kv.num_kv_heads, kv.head_dim};
  return LaunchAttention(q, n, num_heads, kv.num_kv_heads, kv.head_dim, pos, static_cast<const float*>(kv.k),
                         static_cast<const float*>(kv.v), rows.max_kv_len, scale, workspace, workspace_bytes, out,
                         stream);
}

absl::Status LaunchListAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int head_dim,
                                 const DeviceKvLists& kv, float scale, void* workspace, size_t workspace_bytes,
                                 float* out, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("ListAttention: negative row count");
  if (n == 0 || num_heads == 0) return absl::OkStatus();
  if (!AttentionShapeSupported(num_heads, num_kv_heads, head_dim)) {
    return UnsupportedShape(num_heads, num_kv_heads, head_dim);
  }
  const ListPositions pos{kv, num_kv_heads};
  return LaunchAttention(q, n, num_heads, num_kv_heads, head_dim, pos, kv.k, kv.v, kv.max_len, scale, workspace,
                         workspace_bytes, out, stream);
}

}  // namespace vc::kernels::cuda
