// The CUDA device (kernels/device.h): cudaMalloc'd device memory, cudaMallocHost'd pinned host
// memory, CUDA streams and events; host functions run through cudaLaunchHostFunc.
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/device.h"

namespace vc::device {
namespace {

using kernels::cuda::CudaStatus;

// Makes `ordinal` the calling thread's device for the scope.
class OnDevice {
 public:
  explicit OnDevice(int ordinal) {
    cudaGetDevice(&previous_);
    status_ = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice");
  }
  ~OnDevice() { cudaSetDevice(previous_); }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = 0;
  absl::Status status_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaEvent() override {
    OnDevice on(ordinal_);
    cudaEventDestroy(event_);
  }
  absl::Status Synchronize() override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    VC_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize"));
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }
  bool Done() override {
    OnDevice on(ordinal_);
    return cudaEventQuery(event_) != cudaErrorNotReady;
  }
  cudaEvent_t get() const { return event_; }
  // The error of the stream's host functions when it was last recorded.
  void SetStatus(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    status_ = std::move(s);
  }

 private:
  const int ordinal_;
  const cudaEvent_t event_;
  std::mutex mu_;
  absl::Status status_;  // guarded by mu_
};

class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaStream() override {
    OnDevice on(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  absl::Status CopyAsync(const Buffer& dst, size_t dst_offset, const Buffer& src, size_t src_offset,
                         size_t bytes) override {
    VC_RETURN_IF_ERROR(CheckCopyRange(dst, dst_offset, src, src_offset, bytes));
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    // Unified addressing: the runtime tells device from pinned host memory by the pointers.
    return CudaStatus(cudaMemcpyAsync(static_cast<char*>(dst.data()) + dst_offset,
                                      static_cast<const char*>(src.data()) + src_offset, bytes, cudaMemcpyDefault,
                                      stream_),
                      "cudaMemcpyAsync");
  }

  absl::Status HostAsync(std::function<absl::Status()> fn) override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    auto* call = new HostCall{this, std::move(fn)};
    const absl::Status s = CudaStatus(cudaLaunchHostFunc(stream_, &HostCall::Run, call), "cudaLaunchHostFunc");
    if (!s.ok()) delete call;
    return s;
  }

  absl::Status Record(Event& event) override {
    auto& e = static_cast<CudaEvent&>(event);
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    VC_RETURN_IF_ERROR(HostAsync([this, &e] {
      e.SetStatus(FirstError());
      return absl::OkStatus();
    }));
    return CudaStatus(cudaEventRecord(e.get(), stream_), "cudaEventRecord");
  }

  absl::Status Wait(Event& event) override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    return CudaStatus(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).get(), 0), "cudaStreamWaitEvent");
  }

  absl::Status Synchronize() override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    VC_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    return FirstError();
  }

 private:
  // A host function queued on the stream; it deletes itself once run.
  struct HostCall {
    CudaStream* stream;
    std::function<absl::Status()> fn;
    static void CUDART_CB Run(void* p) {
      std::unique_ptr<HostCall> call(static_cast<HostCall*>(p));
      absl::Status s = call->fn();
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(call->stream->mu_);
        if (call->stream->error_.ok()) call->stream->error_ = std::move(s);
      }
    }
  };

  absl::Status FirstError() {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }

  const int ordinal_;
  const cudaStream_t stream_;
  std::mutex mu_;
  absl::Status error_;  // guarded by mu_: the first failed host function's
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal), name_(absl::StrCat("cuda:", ordinal)) {}
  absl::string_view name() const override { return name_; }

  absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryKind kind) override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    void* p = nullptr;
    const int ordinal = ordinal_;
    if (kind == MemoryKind::kDevice) {
      VC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc"));
      return Buffer(p, bytes, kind, [ordinal](void* q) {
        OnDevice on(ordinal);
        cudaFree(q);
      });
    }
    VC_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&p, bytes), "cudaMallocHost"));
    return Buffer(p, bytes, kind, [](void* q) { cudaFreeHost(q); });
  }

  absl::StatusOr<std::unique_ptr<Stream>> NewStream() override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    cudaStream_t s = nullptr;
    VC_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    return std::unique_ptr<Stream>(new CudaStream(ordinal_, s));
  }

  absl::StatusOr<std::unique_ptr<Event>> NewEvent() override {
    OnDevice on(ordinal_);
    VC_RETURN_IF_ERROR(on.status());
    cudaEvent_t e = nullptr;
    VC_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, e));
  }

 private:
  const int ordinal_;
  const std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return absl::UnavailableError(CudaStatus(err, "cudaGetDeviceCount").message());
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::NotFoundError(absl::StrCat("no CUDA device ", ordinal, " (", count, " here)"));
  }
  return std::unique_ptr<Device>(new CudaDevice(ordinal));
}

}  // namespace vc::device
