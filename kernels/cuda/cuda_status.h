// CUDA runtime errors as absl::Status, so that no CUDA failure leaves the kernels module as anything
// but a Status.
#ifndef VC_KERNELS_CUDA_CUDA_STATUS_H_
#define VC_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace vc::kernels::cuda {

// OkStatus for cudaSuccess; otherwise a Status naming `what` and the runtime's error. The code says
// how the caller should react: out of memory is kResourceExhausted (free something, retry), a bad
// launch configuration kInvalidArgument, anything else (a faulted context, a missing driver)
// kInternal.
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// The status of the launch just made on this thread (clears the runtime's last-error slot).
inline absl::Status LastLaunchStatus(const char* kernel) { return CudaStatus(cudaGetLastError(), kernel); }

}  // namespace vc::kernels::cuda

#endif  // VC_KERNELS_CUDA_CUDA_STATUS_H_
