// The "cuda" Backend: the launchers of cuda_kernels.h behind the host-pointer Backend interface.
//
// This wrapper exists for parity testing (the same inputs through the CUDA kernels and the CPU
// backends, compared on the host). Every call stages its inputs into device buffers, runs the
// kernels on one stream, copies the result back and synchronizes, so it is far slower than the
// kernels themselves. A device-resident forward path (activations and KV cache living on the device,
// launchers called directly) is future work.
//
// What is staged:
//  - weight matrices are copied once and kept, keyed by host pointer (and shape): they are
//    immutable memory-mapped data. A host address must therefore keep naming the same values for
//    the life of the process; one freed and reused for other values of the same shape would be
//    served from the stale device copy. The cache only grows.
//  - the KV pool is not cached (it changes between calls): each PagedAttention call gathers the
//    blocks its rows reference into a compact device pool and rewrites the block tables to match.
//    The kernels' results do not depend on block placement, so this changes no bits.
//  - CompressedAttention stages each (row, KV head)'s positions as float K/V rows, dequantizing
//    the quantized tokens on the host, and runs the list-attention kernel, which shares the paged
//    kernel's arithmetic. A device-side dequantizing loader belongs to the device-resident path.
//
// Errors: the Backend methods return nothing, so a CUDA failure is logged once and the call is
// computed by the reference backend instead (outputs are written only after the device work
// succeeded, so the inputs are intact).
//
// Thread-safe: calls are serialized on one mutex (they share the stream and staging buffers).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/backends.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace vc::kernels {
namespace {

using cuda::CudaStatus;

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, PinnedFree>;
using StreamPtr = std::unique_ptr<CUstream_st, StreamDestroy>;

absl::StatusOr<DevicePtr> DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  VC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc"));
  return DevicePtr(p);
}

// A staging buffer that grows to the largest size asked of it. Not thread-safe.
template <typename Ptr, cudaError_t (*Alloc)(void**, size_t)>
class GrowingBuffer {
 public:
  // A buffer of at least `bytes` (at least one byte, so the pointer is never null).
  absl::StatusOr<void*> Get(size_t bytes) {
    if (bytes <= bytes_ && ptr_ != nullptr) return ptr_.get();
    ptr_.reset();
    bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, 1);
    void* p = nullptr;
    VC_RETURN_IF_ERROR(CudaStatus(Alloc(&p, want), "staging allocation"));
    ptr_.reset(p);
    bytes_ = want;
    return p;
  }

 private:
  Ptr ptr_;
  size_t bytes_ = 0;
};

cudaError_t MallocDevice(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t MallocPinned(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
using DeviceBuffer = GrowingBuffer<DevicePtr, MallocDevice>;
using PinnedBuffer = GrowingBuffer<PinnedPtr, MallocPinned>;

template <typename T>
T* As(void* p) {
  return static_cast<T*>(p);
}

// Makes `device` current for the calling thread for the guard's lifetime, then restores the
// thread's previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
      switched_ = status_.ok();
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  absl::Status status_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, StreamPtr stream) : device_(device), stream_(std::move(stream)) {}

  absl::string_view name() const override { return "cuda"; }

  void MatMul(const float* x, int64_t n, const WeightView& w, float* y) const override {
    if (n <= 0 || w.rows <= 0) return;
    Run("MatMul", [&] { return MatMulOnDevice(x, n, w, y); },
        [&] { ReferenceBackend().MatMul(x, n, w, y); });
  }

  void RmsNorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y) const override {
    if (n <= 0 || dim <= 0) return;
    Run("RmsNorm", [&] { return RmsNormOnDevice(x, n, dim, weight, eps, y); },
        [&] { ReferenceBackend().RmsNorm(x, n, dim, weight, eps, y); });
  }

  void Rope(float* x, int64_t n, int heads, int head_dim, const float* cos, const float* sin) const override {
    if (n <= 0 || heads <= 0 || head_dim < 2) return;
    Run("Rope", [&] { return RopeOnDevice(x, n, heads, head_dim, cos, sin); },
        [&] { ReferenceBackend().Rope(x, n, heads, head_dim, cos, sin); });
  }

  void SwiGlu(const float* gate, const float* up, int64_t count, float* out) const override {
    if (count <= 0) return;
    Run("SwiGlu", [&] { return SwiGluOnDevice(gate, up, count, out); },
        [&] { ReferenceBackend().SwiGlu(gate, up, count, out); });
  }

  void PagedAttention(const float* q, int64_t n, int num_heads, const AttentionRow* rows, const PagedKvLayer& kv,
                      float scale, float* out) const override {
    if (n <= 0 || num_heads <= 0) return;
    // Shapes the kernel does not handle go to the reference; the choice depends on the shape only.
    if (!cuda::PagedAttentionSupported(num_heads, kv)) {
      return ReferenceBackend().PagedAttention(q, n, num_heads, rows, kv, scale, out);
    }
    Run("PagedAttention", [&] { return AttentionOnDevice(q, n, num_heads, rows, kv, scale, out); },
        [&] { ReferenceBackend().PagedAttention(q, n, num_heads, rows, kv, scale, out); });
  }

  void CompressedAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int head_dim,
                           const CompressedKvHead* kv, float scale, float* out) const override {
    if (n <= 0 || num_heads <= 0) return;
    // As for PagedAttention, plus the code widths the dequantizer handles; shape-only choices.
    bool supported = cuda::AttentionShapeSupported(num_heads, num_kv_heads, head_dim);
    for (int64_t i = 0; i < n * num_kv_heads && supported; ++i) {
      const QuantizedKvHead& qk = kv[i].quant;
      supported = qk.tokens == 0 || qk.bits == 2 || qk.bits == 4 || qk.bits == 8;
    }
    if (!supported) {
      return ReferenceBackend().CompressedAttention(q, n, num_heads, num_kv_heads, head_dim, kv, scale, out);
    }
    Run("CompressedAttention",
        [&] { return CompressedOnDevice(q, n, num_heads, num_kv_heads, head_dim, kv, scale, out); },
        [&] { ReferenceBackend().CompressedAttention(q, n, num_heads, num_kv_heads, head_dim, kv, scale, out); });
  }

 private:
  struct CachedWeight {
    DevicePtr data;
    DType dtype;
    int64_t rows, cols;
  };

  // Runs `on_device` under the lock; on failure logs once and runs `fallback`.
  template <typename OnDevice, typename Fallback>
  void Run(const char* op, OnDevice on_device, Fallback fallback) const {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      DeviceGuard guard(device_);
      status = guard.status().ok() ? on_device() : guard.status();
    }
    if (status.ok()) return;
    if (!reported_.exchange(true)) {
      std::cerr << "cuda backend: " << op << " failed: " << status
                << "; this and later failing calls are computed by the reference backend\n";
    }
    fallback();
  }

  // The device copy of w, uploaded on first use.
  absl::StatusOr<const void*> DeviceWeights(const WeightView& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = weights_.find(w.data);
    if (it != weights_.end() && it->second.dtype == w.dtype && it->second.rows == w.rows &&
        it->second.cols == w.cols) {
      return it->second.data.get();
    }
    const size_t bytes = static_cast<size_t>(w.rows * w.cols) * DTypeSize(w.dtype);
    VC_ASSIGN_OR_RETURN(DevicePtr data, DeviceAlloc(bytes));
    VC_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(data.get(), w.data, bytes, cudaMemcpyHostToDevice), "weight upload"));
    const void* p = data.get();
    weights_[w.data] = CachedWeight{std::move(data), w.dtype, w.rows, w.cols};
    return p;
  }

  absl::Status ToDevice(void* dst, const void* src, size_t bytes) const {
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()), "copy to device");
  }

  // Copies the result back and waits for all work on the stream.
  absl::Status ToHostAndWait(void* dst, const void* src, size_t bytes) const {
    VC_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()), "copy to host"));
    return CudaStatus(cudaStreamSynchronize(stream_.get()), "stream synchronize");
  }

  absl::Status MatMulOnDevice(const float* x, int64_t n, const WeightView& w, float* y) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    VC_ASSIGN_OR_RETURN(const void* dw, DeviceWeights(w));
    const size_t x_bytes = static_cast<size_t>(n * w.cols) * sizeof(float);
    const size_t y_bytes = static_cast<size_t>(n * w.rows) * sizeof(float);
    VC_ASSIGN_OR_RETURN(void* dx, in_a_.Get(x_bytes));
    VC_ASSIGN_OR_RETURN(void* dy, out_.Get(y_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dx, x, x_bytes));
    VC_RETURN_IF_ERROR(cuda::LaunchMatMul(As<float>(dx), n, WeightView{dw, w.dtype, w.rows, w.cols}, As<float>(dy),
                                          stream_.get()));
    return ToHostAndWait(y, dy, y_bytes);
  }

  absl::Status RmsNormOnDevice(const float* x, int64_t n, int64_t dim, const float* weight, float eps,
                               float* y) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t x_bytes = static_cast<size_t>(n * dim) * sizeof(float);
    const size_t w_bytes = static_cast<size_t>(dim) * sizeof(float);
    VC_ASSIGN_OR_RETURN(void* dx, in_a_.Get(x_bytes));
    VC_ASSIGN_OR_RETURN(void* dw, in_b_.Get(w_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dx, x, x_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dw, weight, w_bytes));
    VC_RETURN_IF_ERROR(cuda::LaunchRmsNorm(As<float>(dx), n, dim, As<float>(dw), eps, As<float>(dx), stream_.get()));
    return ToHostAndWait(y, dx, x_bytes);
  }

  absl::Status RopeOnDevice(float* x, int64_t n, int heads, int head_dim, const float* cos, const float* sin) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t x_bytes = static_cast<size_t>(n * heads * head_dim) * sizeof(float);
    const size_t cs_bytes = static_cast<size_t>(n * (head_dim / 2)) * sizeof(float);
    VC_ASSIGN_OR_RETURN(void* dx, in_a_.Get(x_bytes));
    VC_ASSIGN_OR_RETURN(void* dc, in_b_.Get(cs_bytes));
    VC_ASSIGN_OR_RETURN(void* ds, in_c_.Get(cs_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dx, x, x_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dc, cos, cs_bytes));
    VC_RETURN_IF_ERROR(ToDevice(ds, sin, cs_bytes));
    VC_RETURN_IF_ERROR(cuda::LaunchRope(As<float>(dx), n, heads, head_dim, As<float>(dc), As<float>(ds), stream_.get()));
    return ToHostAndWait(x, dx, x_bytes);
  }

  absl::Status SwiGluOnDevice(const float* gate, const float* up, int64_t count, float* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    VC_ASSIGN_OR_RETURN(void* dg, in_a_.Get(bytes));
    VC_ASSIGN_OR_RETURN(void* du, in_b_.Get(bytes));
    VC_RETURN_IF_ERROR(ToDevice(dg, gate, bytes));
    VC_RETURN_IF_ERROR(ToDevice(du, up, bytes));
    VC_RETURN_IF_ERROR(cuda::LaunchSwiGlu(As<float>(dg), As<float>(du), count, As<float>(dg), stream_.get()));
    return ToHostAndWait(out, dg, bytes);
  }

  absl::Status AttentionOnDevice(const float* q, int64_t n, int num_heads, const AttentionRow* rows,
                                 const PagedKvLayer& kv, float scale, float* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int d = kv.head_dim;
    // Compact the referenced blocks: physical id -> index in the device pool, in first-use order.
    int32_t max_len = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (rows[r].kv_len < 0) return absl::InvalidArgumentError("PagedAttention: negative kv_len");
      max_len = std::max(max_len, rows[r].kv_len);
    }
    const int64_t max_blocks = std::max<int64_t>(1, (max_len + kv.block_size - 1) / kv.block_size);
    std::vector<int32_t> tables(static_cast<size_t>(n * max_blocks), 0), lens(static_cast<size_t>(n));
    std::unordered_map<int32_t, int32_t> compact;
    std::vector<int32_t> physical;
    for (int64_t r = 0; r < n; ++r) {
      lens[r] = rows[r].kv_len;
      const int64_t blocks = (rows[r].kv_len + kv.block_size - 1) / kv.block_size;
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t phys = rows[r].block_table[b];
        auto [it, inserted] = compact.try_emplace(phys, static_cast<int32_t>(physical.size()));
        if (inserted) physical.push_back(phys);
        tables[r * max_blocks + b] = it->second;
      }
    }
    const int64_t block_floats = static_cast<int64_t>(kv.block_size) * kv.num_kv_heads * d;
    const size_t block_bytes = static_cast<size_t>(block_floats) * sizeof(float);
    const size_t side_bytes = physical.size() * block_bytes;  // all K blocks, then all V blocks

    VC_ASSIGN_OR_RETURN(void* staging, kv_staging_.Get(2 * side_bytes));
    // Blocks go to the device as float32: bf16 and f16 elements are widened here, exactly.
    const int64_t elem = static_cast<int64_t>(DTypeSize(kv.dtype));
    auto stage = [&](const void* pool, int64_t at, char* dest) {
      const char* src = static_cast<const char*>(pool) + at * elem;
      if (kv.dtype == DType::kF32) {
        std::memcpy(dest, src, block_bytes);
      } else {
        float* f = reinterpret_cast<float*>(dest);
        for (int64_t i = 0; i < block_floats; ++i) f[i] = KvElement(src, kv.dtype, i);
      }
    };
    for (size_t u = 0; u < physical.size(); ++u) {
      const int64_t src = physical[u] * kv.block_stride;
      stage(kv.k, src, As<char>(staging) + u * block_bytes);
      stage(kv.v, src, As<char>(staging) + side_bytes + u * block_bytes);
    }
    const size_t q_bytes = static_cast<size_t>(n * num_heads * d) * sizeof(float);
    const size_t table_bytes = tables.size() * sizeof(int32_t), len_bytes = lens.size() * sizeof(int32_t);
    const size_t ws_bytes = cuda::AttentionWorkspaceBytes(n, num_heads, d, max_len);
    VC_ASSIGN_OR_RETURN(void* dq, in_a_.Get(q_bytes));
    VC_ASSIGN_OR_RETURN(void* dtables, in_b_.Get(table_bytes));
    VC_ASSIGN_OR_RETURN(void* dlens, in_c_.Get(len_bytes));
    VC_ASSIGN_OR_RETURN(void* dkv, kv_.Get(2 * side_bytes));
    VC_ASSIGN_OR_RETURN(void* dws, workspace_.Get(ws_bytes));
    VC_ASSIGN_OR_RETURN(void* dout, out_.Get(q_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dq, q, q_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dtables, tables.data(), table_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dlens, lens.data(), len_bytes));
    if (side_bytes > 0) VC_RETURN_IF_ERROR(ToDevice(dkv, staging, 2 * side_bytes));

    const PagedKvLayer dev_kv{As<float>(dkv), reinterpret_cast<const float*>(As<char>(dkv) + side_bytes),
                              block_floats, kv.block_size, kv.num_kv_heads, d};
    const cuda::DeviceAttentionRows dev_rows{As<int32_t>(dtables), As<int32_t>(dlens), max_blocks, max_len};
    VC_RETURN_IF_ERROR(cuda::LaunchPagedAttention(As<float>(dq), n, num_heads, dev_rows, dev_kv, scale, dws, ws_bytes,
                                                  As<float>(dout), stream_.get()));
    return ToHostAndWait(out, dout, q_bytes);
  }

  // Attention of q over the K/V rows gathered into `staging` ([2, rows, d]: all K rows, then all V
  // rows), where (row r, KV head g) attends to rows starts[r * kvh + g] + j, j < lens[...].
  absl::Status ListAttentionOnDevice(const float* q, int64_t n, int num_heads, int num_kv_heads, int d,
                                     const std::vector<int64_t>& starts, const std::vector<int32_t>& lens,
                                     const void* staging, int64_t rows, float scale, float* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int32_t max_len = 0;
    for (int32_t len : lens) max_len = std::max(max_len, len);
    std::vector<int64_t> offsets(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) offsets[i] = i * d;
    const size_t side_bytes = static_cast<size_t>(rows * d) * sizeof(float);
    const size_t q_bytes = static_cast<size_t>(n * num_heads * d) * sizeof(float);
    const size_t ws_bytes = cuda::AttentionWorkspaceBytes(n, num_heads, d, max_len);
    VC_ASSIGN_OR_RETURN(void* dq, in_a_.Get(q_bytes));
    VC_ASSIGN_OR_RETURN(void* doffsets, in_b_.Get(offsets.size() * sizeof(int64_t)));
    VC_ASSIGN_OR_RETURN(void* dstarts, in_c_.Get(starts.size() * sizeof(int64_t)));
    VC_ASSIGN_OR_RETURN(void* dlens, in_d_.Get(lens.size() * sizeof(int32_t)));
    VC_ASSIGN_OR_RETURN(void* dkv, kv_.Get(2 * side_bytes));
    VC_ASSIGN_OR_RETURN(void* dws, workspace_.Get(ws_bytes));
    VC_ASSIGN_OR_RETURN(void* dout, out_.Get(q_bytes));
    VC_RETURN_IF_ERROR(ToDevice(dq, q, q_bytes));
    VC_RETURN_IF_ERROR(ToDevice(doffsets, offsets.data(), offsets.size() * sizeof(int64_t)));
    VC_RETURN_IF_ERROR(ToDevice(dstarts, starts.data(), starts.size() * sizeof(int64_t)));
    VC_RETURN_IF_ERROR(ToDevice(dlens, lens.data(), lens.size() * sizeof(int32_t)));
    if (side_bytes > 0) VC_RETURN_IF_ERROR(ToDevice(dkv, staging, 2 * side_bytes));
    const cuda::DeviceKvLists lists{As<float>(dkv),
                                    reinterpret_cast<const float*>(As<char>(dkv) + side_bytes),
                                    As<int64_t>(doffsets),
                                    As<int64_t>(dstarts),
                                    As<int32_t>(dlens),
                                    max_len};
    VC_RETURN_IF_ERROR(cuda::LaunchListAttention(As<float>(dq), n, num_heads, num_kv_heads, d, lists, scale, dws,
                                                 ws_bytes, As<float>(dout), stream_.get()));
    return ToHostAndWait(out, dout, q_bytes);
  }

  // Stages every (row, KV head)'s positions as float rows: quantized tokens dequantized here (code *
  // scale + min, one fused multiply-add per value, as the AVX2 backend), then the dense tokens.
  absl::Status CompressedOnDevice(const float* q, int64_t n, int num_heads, int num_kv_heads, int d,
                                  const CompressedKvHead* kv, float scale, float* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t pairs = n * num_kv_heads;
    std::vector<int64_t> starts(static_cast<size_t>(pairs));
    std::vector<int32_t> lens(static_cast<size_t>(pairs));
    int64_t rows = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t len = static_cast<int64_t>(kv[i].quant.tokens) + kv[i].dense.count;
      if (kv[i].quant.tokens < 0 || kv[i].dense.count < 0 || len > INT32_MAX) {
        return absl::InvalidArgumentError("CompressedAttention: bad token counts");
      }
      starts[i] = rows;
      lens[i] = static_cast<int32_t>(len);
      rows += len;
    }
    const size_t side_floats = static_cast<size_t>(rows * d);
    VC_ASSIGN_OR_RETURN(void* staging, kv_staging_.Get(2 * side_floats * sizeof(float)));
    float* const k_rows = As<float>(staging);
    float* const v_rows = k_rows + side_floats;
    for (int64_t i = 0; i < pairs; ++i) {
      const QuantizedKvHead& qk = kv[i].quant;
      const DenseKvHead& dense = kv[i].dense;
      for (int32_t j = 0; j < qk.tokens; ++j) {
        float* k = k_rows + (starts[i] + j) * d;
        float* v = v_rows + (starts[i] + j) * d;
        const int64_t row_bytes = static_cast<int64_t>(d) * qk.bits / 8;
        const int64_t run = static_cast<int64_t>(qk.key_group) * qk.bits / 8;
        const int64_t t = StoredToken(qk, j);
        const uint8_t* vc = qk.v_codes + t * row_bytes;
        const int64_t kg = StoredGroup(qk, j / qk.key_group) * d;
        const int64_t vg = t * (d / qk.value_group);
        for (int c = 0; c < d; ++c) {
          const int kcode = UnpackCode(qk.k_codes + (kg + c) * run, qk.bits, j % qk.key_group);
          k[c] = std::fma(static_cast<float>(kcode), qk.k_scale[kg + c], qk.k_min[kg + c]);
          const int64_t vgc = vg + c / qk.value_group;
          v[c] = std::fma(static_cast<float>(UnpackCode(vc, qk.bits, c)), qk.v_scale[vgc], qk.v_min[vgc]);
        }
      }
      for (int32_t j = 0; j < dense.count; ++j) {
        const int64_t src = static_cast<int64_t>(dense.rows[j]) * dense.stride;
        const int64_t dst = (starts[i] + qk.tokens + j) * d;
        std::memcpy(k_rows + dst, dense.k + src, static_cast<size_t>(d) * sizeof(float));
        std::memcpy(v_rows + dst, dense.v + src, static_cast<size_t>(d) * sizeof(float));
      }
    }
    return ListAttentionOnDevice(q, n, num_heads, num_kv_heads, d, starts, lens, staging, rows, scale, out);
  }

  const int device_;
  const StreamPtr stream_;

  mutable absl::Mutex mu_;
  mutable std::unordered_map<const void*, CachedWeight> weights_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer in_a_ ABSL_GUARDED_BY(mu_), in_b_ ABSL_GUARDED_BY(mu_), in_c_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer in_d_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer out_ ABSL_GUARDED_BY(mu_), kv_ ABSL_GUARDED_BY(mu_), workspace_ ABSL_GUARDED_BY(mu_);
  mutable PinnedBuffer kv_staging_ ABSL_GUARDED_BY(mu_);

  mutable std::atomic<bool> reported_{false};
};

// The backend on the calling thread's current device, or nullptr when there is no usable device.
// Quiet on machines without a driver: the runtime only returns an error code there.
const Backend* CreateCudaBackend() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();  // leave no error behind for other users of the runtime
    return nullptr;
  }
  int device = 0;
  cudaStream_t stream = nullptr;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return new CudaBackend(device, StreamPtr(stream));
}

}  // namespace

const Backend* CudaBackendIfAvailable() {
  // Built once and never destroyed: the CUDA runtime may already be torn down at exit.
  static const Backend* backend = CreateCudaBackend();
  return backend;
}

}  // namespace vc::kernels
