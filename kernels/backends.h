// Backends other than the reference, for the registry and for tests and benchmarks that compare
// them. Each returns nullptr when it was not built or this machine cannot run it.
#ifndef VC_KERNELS_BACKENDS_H_
#define VC_KERNELS_BACKENDS_H_

#include <vector>

#include "kernels/kernels.h"

namespace vc::kernels {

// AVX2 + FMA + F16C, with the fixed attention split (batch-invariant).
const Backend* Avx2BackendIfSupported();
// The same kernels built with AVX-512VL and VNNI too (32 vector registers, one-instruction integer
// dot products), bitwise equal to Avx2's results.
const Backend* Avx512vlBackendIfSupported();
// The same kernels with the usual shape-dependent attention split (one chunk per thread). Not
// batch-invariant; it exists to measure what invariance costs.
const Backend* Avx2VariableSplitBackendIfSupported();
// CUDA, when built with nvcc and a device is present.
const Backend* CudaBackendIfAvailable();

// Every backend usable here, fastest first, the reference last.
std::vector<const Backend*> AvailableBackends();

// The backend of that name, or nullptr.
const Backend* BackendByName(absl::string_view name);

}  // namespace vc::kernels

#endif  // VC_KERNELS_BACKENDS_H_
