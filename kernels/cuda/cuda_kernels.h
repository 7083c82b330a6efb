// CUDA launchers for the token-path kernels. Every pointer is device memory; every launcher enqueues
// its work on `stream`, returns without synchronizing, and does nothing (OkStatus) on empty input.
// A launch failure comes back as a Status (the process never aborts); kernel faults surface at the
// caller's next synchronization on the stream.
//
// Batch invariance, as in kernels.h: each output is reduced in an order fixed by the model's shapes
// (cols, dim, head_dim, group size), never by the row count, the grid size or where KV blocks sit.
//  - MatMul: a warp owns up to four output elements. For each, lane l accumulates its own fixed
//    slice of the columns sequentially, then the 32 lane sums meet in a fixed xor-butterfly tree. A
//    warp handles up to kMatMulRowTile rows of x against its weight rows to reuse the weight loads,
//    and its outputs share the loads of x (tile and outputs chosen from n), but each (row, output)
//    runs the same chain of operations, so neither choice matters.
//  - RmsNorm: one block of fixed size per row; fixed per-thread strides and a fixed block tree.
//  - PagedAttention, ListAttention: the positions of a row are cut into chunks of kAttentionChunk
//    positions (a function of the row's length alone). One block per (row, KV head, chunk)
//    produces (max, sum, weighted V); a second kernel merges the chunks of each (row, head) in
//    chunk order. The two differ only in where they find a position's K/V row.
//  - Rope, SwiGlu: elementwise.
//
// Thread-compatible: launchers hold no state; concurrent launches on different streams are fine.
#ifndef VC_KERNELS_CUDA_CUDA_KERNELS_H_
#define VC_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/kernels.h"

namespace vc::kernels::cuda {

// Most rows of x sharing one pass over a weight row.
inline constexpr int kMatMulRowTile = 8;
// Positions per attention chunk; the same split as the AVX2 backend.
inline constexpr int kAttentionChunk = 256;
// Largest head_dim and query heads per KV head the attention kernel handles.
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kMaxGroup = 16;

// y [n, w.rows] = x [n, w.cols] * w^T. When w.cols is a multiple of one 16-byte load (4 f32 or 8
// 16-bit elements), x and w.data must be 16-byte aligned (cudaMalloc gives 256).
// kInvalidArgument on a negative shape or misaligned pointers.
[[nodiscard]] absl::Status LaunchMatMul(const float* x, int64_t n, const WeightView& w, float* y,
                                        cudaStream_t stream);

// y [n, dim] = x [n, dim] * rsqrt(mean(x^2) + eps) * weight [dim]. y may alias x.
[[nodiscard]] absl::Status LaunchRmsNorm(const float* x, int64_t n, int64_t dim, const float* weight,
                                         float eps, float* y, cudaStream_t stream);

// Rotates x [n, heads, head_dim] in place (rotate-half); cos, sin [n, head_dim / 2].
[[nodiscard]] absl::Status LaunchRope(float* x, int64_t n, int heads, int head_dim, const float* cos,
                                      const float* sin, cudaStream_t stream);

// out [count] = silu(gate) * up. out may alias gate or up.
[[nodiscard]] absl::Status LaunchSwiGlu(const float* gate, const float* up, int64_t count, float* out,
                                        cudaStream_t stream);

// Whether the attention launchers handle this shape: 1 <= head_dim <= kMaxHeadDim, num_heads a
// multiple of num_kv_heads with at most kMaxGroup query heads per KV head.
bool AttentionShapeSupported(int num_heads, int num_kv_heads, int head_dim);

// Bytes of device workspace an attention launch needs for n rows of at most max_len positions.
size_t AttentionWorkspaceBytes(int64_t n, int num_heads, int head_dim, int32_t max_len);

// The rows of one paged attention call, in device memory. Row r reads physical block
// block_tables[r * table_stride + i] for its logical block i and attends to kv_lens[r] positions.
// max_kv_len bounds every kv_lens[r] (it sizes the grid and the workspace; it does not change any
// row's arithmetic).
struct DeviceAttentionRows {
  const int32_t* block_tables = nullptr;  // [n, table_stride]
  const int32_t* kv_lens = nullptr;       // [n]
  int64_t table_stride = 0;
  int32_t max_kv_len = 0;
};

// AttentionShapeSupported for kv's head counts and head_dim, and block_size >= 1.
bool PagedAttentionSupported(int num_heads, const PagedKvLayer& kv);

// Causal attention of q [n, num_heads, head_dim] over the paged cache kv (device pointers), as
// Backend::PagedAttention. out [n, num_heads, head_dim]; rows with kv_len 0 give zeros. workspace
// holds at least AttentionWorkspaceBytes(n, num_heads, kv.head_dim, rows.max_kv_len) bytes,
// 8-byte aligned, and must stay untouched until the launched work completes.
// kInvalidArgument for an unsupported shape or a workspace that is too small.
[[nodiscard]] absl::Status LaunchPagedAttention(const float* q, int64_t n, int num_heads,
                                                const DeviceAttentionRows& rows, const PagedKvLayer& kv,
                                                float scale, void* workspace, size_t workspace_bytes,
                                                float* out, cudaStream_t stream);

// K/V rows of one attention call given as explicit lists, in device memory: with i = r *
// num_kv_heads + g, (row r, KV head g) attends to lens[i] positions, and its position j has K at
// k + offsets[starts[i] + j] and V at v + offsets[starts[i] + j] (head_dim floats each). max_len
// bounds every lens[i].
struct DeviceKvLists {
  const float* k = nullptr;
  const float* v = nullptr;
  const int64_t* offsets = nullptr;  // concatenated lists, in floats
  const int64_t* starts = nullptr;   // [n, num_kv_heads]
  const int32_t* lens = nullptr;     // [n, num_kv_heads]
  int32_t max_len = 0;
};

// Attention of q [n, num_heads, head_dim] over K/V lists, with the arithmetic of
// LaunchPagedAttention: a list naming the same K/V values in the same order as a paged row gives
// bitwise the same output. Workspace as for LaunchPagedAttention, sized with kv.max_len.
[[nodiscard]] absl::Status LaunchListAttention(const float* q, int64_t n, int num_heads, int num_kv_heads,
                                               int head_dim, const DeviceKvLists& kv, float scale,
                                               void* workspace, size_t workspace_bytes, float* out,
                                               cudaStream_t stream);

}  // namespace vc::kernels::cuda

#endif  // VC_KERNELS_CUDA_CUDA_KERNELS_H_
