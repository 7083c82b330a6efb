// The compute kernels of the token path, behind one interface with run-time selected backends.
//
// Exactness rule for every backend: the result for a given row (a token position) is a function of
// that row's inputs alone, computed with a reduction order fixed by the model's shapes. It does not
// depend on how many rows are in the call, on the thread count, or on where KV blocks sit in memory.
// This is what makes a one-token decode step, a (k+1)-token verify pass and a prefill chunk produce
// bitwise the same logits for the same position.
//
// Arguments are non-owning views; shapes are given in comments as [dim0, dim1, ...], row-major.
// All backends are thread-safe (they hold no mutable state).
#ifndef VC_KERNELS_KERNELS_H_
#define VC_KERNELS_KERNELS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace vc::kernels {

// A weight matrix [rows, cols] of any DType.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// One layer of a paged KV cache. Block b holds K at element k + b * block_stride and V at
// v + b * block_stride, each [block_size, num_kv_heads, head_dim] of `dtype` (float32, bf16 or
// f16). Kernels widen each element to float32, exactly, before any arithmetic: K/V of bf16 values
// and float32 copies of those values give bitwise the same results.
struct PagedKvLayer {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t block_stride = 0;  // elements
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;
};

// Element i of a K/V row of `dtype`, as float32 (exact).
inline float KvElement(const void* row, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(row)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(row)[i]);
    default: return static_cast<const float*>(row)[i];
  }
}

// What one query row attends to: positions [0, kv_len) of the sequence whose physical block for
// logical block i is block_table[i].
struct AttentionRow {
  const int32_t* block_table = nullptr;
  int32_t kv_len = 0;
};

// KV of one KV head of one sequence held by a compressed cache: `quant.tokens` KIVI-quantized
// tokens followed by `dense.count` float32 tokens; attention reads them in that order.
struct QuantizedKvHead {
  int bits = 0;          // 2, 4 or 8 (unused when tokens == 0)
  int key_group = 32;    // tokens sharing one per-channel key scale/min
  int value_group = 32;  // channels sharing one per-token value scale/min
  int32_t tokens = 0;    // a multiple of key_group
  // Keys are stored channel-major within each group, so a kernel scores 8 tokens per vector op:
  const uint8_t* k_codes = nullptr;  // [tokens / key_group, head_dim, key_group * bits / 8]
  const float* k_scale = nullptr;    // [tokens / key_group, head_dim]
  const float* k_min = nullptr;      // [tokens / key_group, head_dim]
  const uint8_t* v_codes = nullptr;  // [tokens, head_dim * bits / 8]
  const float* v_scale = nullptr;    // [tokens, head_dim / value_group]
  const float* v_min = nullptr;      // [tokens, head_dim / value_group]
  // A view of some of the stored key groups (query-aware selection): quantized token j is stored
  // token StoredToken(*this, j), in key group group_table[j / key_group] of the arrays above, and
  // the arrays' indices in the comments above are stored ones. nullptr: token j is stored token j.
  const int32_t* group_table = nullptr;  // [tokens / key_group]
};

// Where quantized token j of a view is stored (see QuantizedKvHead::group_table).
inline int64_t StoredGroup(const QuantizedKvHead& qk, int64_t group) {
  return qk.group_table != nullptr ? qk.group_table[group] : group;
}
inline int64_t StoredToken(const QuantizedKvHead& qk, int64_t j) {
  if (qk.group_table == nullptr) return j;
  const int64_t kg = qk.key_group;
  // A shift for the usual power-of-two group: kernels call this in inner loops.
  const int64_t g = (kg & (kg - 1)) == 0 ? j >> __builtin_ctzll(static_cast<uint64_t>(kg)) : j / kg;
  return int64_t{qk.group_table[g]} * kg + (j - g * kg);
}

struct DenseKvHead {
  const float* k = nullptr;  // token i of the list is at k + rows[i] * stride (head_dim floats)
  const float* v = nullptr;
  int64_t stride = 0;
  const int32_t* rows = nullptr;  // [count]
  int32_t count = 0;
};

struct CompressedKvHead {
  QuantizedKvHead quant;
  DenseKvHead dense;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // A short name: "reference", "avx2", "avx512bf16", "cuda".
  virtual absl::string_view name() const = 0;

  // What fixes the bits of this backend's results: backends that return the same string compute
  // bitwise the same results for the same inputs (the avx512vl builds return "avx2"; the avx512bf16
  // build, whose products of bf16 weights take bf16 products, "avx512bf16"). Exact output
  // holds only for KV computed under this backend's numerics: KV of other numerics (from a cache
  // store shared with other workers) is near but not bitwise the same.
  virtual std::string numerics() const { return std::string(name()); }

  // y [n, w.rows] = x [n, w.cols] * w^T.
  virtual void MatMul(const float* x, int64_t n, const WeightView& w, float* y) const = 0;

  // ys[i] = MatMul(x, n, ws[i]) for `count` weights of x's width (a layer's q, k and v; its gate
  // and up), bitwise the same; a backend may run them as one parallel job.
  virtual void MatMuls(const float* x, int64_t n, const WeightView* ws, float* const* ys, int count) const {
    for (int i = 0; i < count; ++i) MatMul(x, n, ws[i], ys[i]);
  }

  // y [n, dim] = x [n, dim] * rsqrt(mean(x^2) + eps) * weight [dim]. y may alias x.
  virtual void RmsNorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps,
                       float* y) const = 0;

  // Rotates x [n, heads, head_dim] in place (rotate-half convention): for i < head_dim/2,
  // (a, b) = (x[i], x[i + head_dim/2]) -> (a*cos - b*sin, b*cos + a*sin); cos, sin [n, head_dim/2].
  virtual void Rope(float* x, int64_t n, int heads, int head_dim, const float* cos,
                    const float* sin) const = 0;

  // out [count] = silu(gate) * up. out may alias gate or up.
  virtual void SwiGlu(const float* gate, const float* up, int64_t count, float* out) const = 0;

  // Causal attention of q [n, num_heads, head_dim] over a paged cache with grouped KV heads
  // (query head h reads KV head h / (num_heads / kv.num_kv_heads)). Row r attends to
  // rows[r].kv_len positions. out [n, num_heads, head_dim]. Rows with kv_len 0 give zeros.
  virtual void PagedAttention(const float* q, int64_t n, int num_heads, const AttentionRow* rows,
                              const PagedKvLayer& kv, float scale, float* out) const = 0;

  // Attention of q [n, num_heads, head_dim] over compressed caches: kv [n, num_kv_heads] gives
  // what row r's KV head g holds. Same reduction scheme as PagedAttention: a dense-only list
  // holding positions 0..p in order gives bitwise the PagedAttention result. out like q.
  virtual void CompressedAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int head_dim,
                                   const CompressedKvHead* kv, float scale, float* out) const = 0;
};

// Unpacks code i of a row packed at `bits` bits per code (little-endian within bytes).
inline int UnpackCode(const uint8_t* row, int bits, int i) {
  const int bit = i * bits;
  return (row[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
}

// The plain, obviously-correct implementation every other backend is tested against.
const Backend& ReferenceBackend();

// The backend used by default: the VC_KERNELS environment variable names one ("reference", ...);
// otherwise the fastest this machine supports.
const Backend& DefaultBackend();

// kInvalidArgument when VC_KERNELS names no backend this machine has (DefaultBackend would fall
// back to the default with a warning): a worker stops at startup rather than run on other kernels
// than it was told to.
absl::Status CheckKernelsFromEnv();

}  // namespace vc::kernels

#endif  // VC_KERNELS_KERNELS_H_
