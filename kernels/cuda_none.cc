// Built when nvcc is absent: no CUDA backend.
#include "kernels/backends.h"

namespace vc::kernels {

const Backend* CudaBackendIfAvailable() { return nullptr; }

}  // namespace vc::kernels
