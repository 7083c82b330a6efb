// The avx512vl kernels without VBMI ("avx512vl-novbmi"): see avx512vl.cc.
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
namespace avx512vl_novbmi {
#include "kernels/avx2_kernels.inc"
}  // namespace avx512vl_novbmi

const Backend* Avx512vlNoVbmiBackend() {
  static const Backend* backend = new avx512vl_novbmi::Avx2("avx512vl-novbmi", /*fixed_split=*/true);
  return backend;
}

}  // namespace vc::kernels
