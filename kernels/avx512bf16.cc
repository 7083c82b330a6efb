// The avx512vl kernels built with AVX512-BF16 as well ("avx512bf16"), chosen at run time when the
// CPU has it. Products of bf16 weights take bf16 products: each row of a product's input is rounded
// to bf16 once, and VDPBF16PS sums exact bf16 x bf16 products in float32 (see MatMulBf16Range in
// avx2_kernels.inc), at twice the multiply-adds per instruction of float32 FMAs. Every other kernel
// (float32 and f16 weights, attention, the draft kernels) is the avx512vl build's, bit for bit. Its
// numerics are its own ("avx512bf16"): batch-invariant like every fixed-split build, but not
// bitwise avx2's; the rounding of the input costs what PyTorch's bf16 linear layers cost.
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
namespace avx512bf16 {
#include "kernels/avx2_kernels.inc"
}  // namespace avx512bf16

const Backend* Avx512Bf16Backend() {
  static const Backend* backend = new avx512bf16::Avx2("avx512bf16", /*fixed_split=*/true);
  return backend;
}

}  // namespace vc::kernels
