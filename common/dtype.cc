#include "common/dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace vc {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype '", name, "' (supported: F32, BF16, F16)"));
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    v = man ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {                // subnormal half: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint(std::ldexp(m, 11)));  // 11 significant bits
  if (mant == 2048) {
    mant = 1024;
    ++e;
  }
  const uint32_t hexp = static_cast<uint32_t>(e + 14);
  if (hexp >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((hexp << 10) | (mant & 0x3ffu));
}

void WidenToF32(const void* src, DType dtype, int64_t n, float* out) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  switch (dtype) {
    case DType::kF32: std::memcpy(out, src, static_cast<size_t>(n) * 4); return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = BF16ToF32(h[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(h[i]);
      return;
  }
}

void NarrowFromF32(const float* src, int64_t n, DType dtype, void* dest) {
  uint16_t* h = static_cast<uint16_t*>(dest);
  switch (dtype) {
    case DType::kF32: std::memcpy(dest, src, static_cast<size_t>(n) * 4); return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToBF16(src[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(src[i]);
      return;
  }
}

void RoundThroughDType(float* x, int64_t n, DType dtype) {
  switch (dtype) {
    case DType::kF32: return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) x[i] = BF16ToF32(F32ToBF16(x[i]));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) x[i] = F16ToF32(F32ToF16(x[i]));
      return;
  }
}

}  // namespace vc
