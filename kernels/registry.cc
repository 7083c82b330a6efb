#include <cpuid.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "kernels/backends.h"

namespace vc::kernels {

const Backend* Avx2Backend();
const Backend* Avx2VariableSplitBackend();
const Backend* Avx512vlBackend();
const Backend* Avx512vlNoVbmiBackend();
const Backend* Avx512Bf16Backend();

namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not name it.
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
}
bool CpuHasAvx512vlVnni() {
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}

}  // namespace

const Backend* Avx512vlBackendIfSupported() {
  return CpuHasAvx512vlVnni() && __builtin_cpu_supports("avx512vbmi") ? Avx512vlBackend() : nullptr;
}
const Backend* Avx512Bf16BackendIfSupported() {
  return CpuHasAvx512vlVnni() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16")
             ? Avx512Bf16Backend()
             : nullptr;
}
const Backend* Avx512vlNoVbmiBackendIfSupported() {
  return CpuHasAvx512vlVnni() ? Avx512vlNoVbmiBackend() : nullptr;
}

const Backend* Avx2BackendIfSupported() { return CpuHasAvx2() ? Avx2Backend() : nullptr; }
const Backend* Avx2VariableSplitBackendIfSupported() {
  return CpuHasAvx2() ? Avx2VariableSplitBackend() : nullptr;
}

std::vector<const Backend*> AvailableBackends() {
  std::vector<const Backend*> out;
  for (const Backend* b : {CudaBackendIfAvailable(), Avx512Bf16BackendIfSupported(), Avx512vlBackendIfSupported(),
                           Avx512vlNoVbmiBackendIfSupported(), Avx2BackendIfSupported()}) {
    if (b != nullptr) out.push_back(b);
  }
  out.push_back(&ReferenceBackend());
  return out;
}

const Backend* BackendByName(absl::string_view name) {
  for (const Backend* b : {CudaBackendIfAvailable(), Avx512Bf16BackendIfSupported(), Avx512vlBackendIfSupported(),
                           Avx512vlNoVbmiBackendIfSupported(), Avx2BackendIfSupported(),
                           Avx2VariableSplitBackendIfSupported(), &ReferenceBackend()}) {
    if (b != nullptr && b->name() == name) return b;
  }
  return nullptr;
}

absl::Status CheckKernelsFromEnv() {
  const char* want = std::getenv("VC_KERNELS");
  if (want == nullptr || *want == '\0' || BackendByName(want) != nullptr) return absl::OkStatus();
  std::vector<std::string> names;
  for (const Backend* b : AvailableBackends()) names.emplace_back(b->name());
  return absl::InvalidArgumentError(absl::StrCat("VC_KERNELS='", absl::CHexEscape(want),
                                                 "' names no kernels available here (available: ",
                                                 absl::StrJoin(names, ", "), ")"));
}

const Backend& DefaultBackend() {
  static const Backend* chosen = [] {
    if (const char* want = std::getenv("VC_KERNELS"); want != nullptr && *want != '\0') {
      if (const Backend* b = BackendByName(want)) return b;
      std::cerr << "VC_KERNELS=" << want << " is not available here; using the default backend\n";
    }
    // The model runs on the host: the fastest CPU backend. (CUDA is chosen explicitly.)
    for (const Backend* b : {Avx512Bf16BackendIfSupported(), Avx512vlBackendIfSupported(),
                             Avx512vlNoVbmiBackendIfSupported(), Avx2BackendIfSupported()}) {
      if (b != nullptr) return b;
    }
    return &ReferenceBackend();
  }();
  return *chosen;
}

}  // namespace vc::kernels
