// Built when nvcc is absent: no CUDA backend, no CUDA device.
#include "kernels/backends.h"
#include "kernels/device.h"

namespace vc::kernels {

const Backend* CudaBackendIfAvailable() { return nullptr; }

}  // namespace vc::kernels

namespace vc::device {

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int) {
  return absl::UnavailableError("this build has no CUDA (nvcc was not found)");
}

}  // namespace vc::device
