// The AVX2 kernels compiled with AVX-512 as well, twice, each chosen at run time when the CPU has
// its features: "avx512vl" (-mavx512f -mavx512vl -mavx512bw -mavx512vnni -mavx512vbmi, this file)
// and "avx512vl-novbmi" (the same without VBMI, avx512vl_novbmi.cc), for CPUs such as Cascade Lake.
// The results are those of the "avx2" backend, bit for bit (kernels_parity_test checks both). What
// AVX-512 adds: 32 vector registers instead of 16, which the attention kernel's multi-head loops
// fill without spilling; VNNI, one instruction for the 4-bit draft kernels' integer dot products
// (exact, so the same sums as the AVX2 build's three); and 512-bit vectors where a lane's result
// does not depend on the width: the softmax's exp, the exact attention's p.v sums, and (with VBMI)
// the draft kernels, whose 4-bit codes one byte permute lays out for those dot products where the
// 256-bit code takes a transpose of eight instructions.
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
namespace avx512vl {
#include "kernels/avx2_kernels.inc"
}  // namespace avx512vl

const Backend* Avx512vlBackend() {
  static const Backend* backend = new avx512vl::Avx2("avx512vl", /*fixed_split=*/true);
  return backend;
}

}  // namespace vc::kernels
