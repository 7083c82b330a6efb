// The AVX2 kernels compiled with AVX-512VL as well (-mavx512f -mavx512vl -mavx512bw -mavx512vnni,
// this file only), chosen at run time when the CPU has those features. The code still uses 256-bit
// vectors, so the arithmetic is that of the "avx2" backend, bit for bit (kernels_parity_test checks
// it); what AVX-512VL adds is 32 vector registers instead of 16, which the attention kernel's
// multi-head loops fill without spilling, and VNNI one instruction for the 4-bit draft kernel's
// integer dot products (exact, so the same sums as the AVX2 build's three).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace vc::kernels {
namespace avx512vl {
#include "kernels/avx2_kernels.inc"
}  // namespace avx512vl

const Backend* Avx512vlBackend() {
  static const Backend* backend = new avx512vl::Avx2("avx512vl", /*fixed_split=*/true);
  return backend;
}

}  // namespace vc::kernels
