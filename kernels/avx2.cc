// The AVX2/FMA backend. Compiled with -mavx2 -mfma -mf16c for this file only and chosen at run time
// when the CPU has those features. The kernels are in avx2_kernels.inc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace vc::kernels {
namespace avx2 {
#include "kernels/avx2_kernels.inc"
}  // namespace avx2

const Backend* Avx2Backend() {
  static const Backend* backend = new avx2::Avx2("avx2", /*fixed_split=*/true);
  return backend;
}

const Backend* Avx2VariableSplitBackend() {
  static const Backend* backend = new avx2::Avx2("avx2-variable-split", /*fixed_split=*/false);
  return backend;
}

}  // namespace vc::kernels
