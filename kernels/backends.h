// Backends other than the reference, for the registry and for tests and benchmarks that compare
// them. Each returns nullptr when it was not built or this machine cannot run it.
#ifndef VC_KERNELS_BACKENDS_H_
#define VC_KERNELS_BACKENDS_H_

#include <vector>

#include "kernels/kernels.h"

namespace vc::kernels {

// AVX2 + FMA + F16C, with the fixed attention split (batch-invariant).
const Backend* Avx2BackendIfSupported();
// The same kernels built with AVX-512 (VL, BW, VNNI, VBMI) too: 32 vector registers,
// one-instruction integer dot products, 512-bit vectors where a lane's result does not depend on the
// width; bitwise equal to Avx2's results.
const Backend* Avx512vlBackendIfSupported();
// The avx512vl kernels with bf16 products for bf16 weights (AVX512-BF16): the input rounded to bf16
// once per product. Its own numerics ("avx512bf16"); everything but those products is bitwise
// avx512vl's.
const Backend* Avx512Bf16BackendIfSupported();
// The same without VBMI ("avx512vl-novbmi", for CPUs that lack it): the draft kernels' 4-bit codes
// are laid out with 256-bit shuffles. Bitwise equal to Avx2's results too.
const Backend* Avx512vlNoVbmiBackendIfSupported();
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
