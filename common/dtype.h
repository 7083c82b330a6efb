// Element types of weights and caches, and exact conversions between them.
#ifndef VC_COMMON_DTYPE_H_
#define VC_COMMON_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element.
inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// "F32", "BF16", "F16" (the safetensors spelling).
absl::string_view DTypeName(DType t);

// Parses the safetensors spelling; kInvalidArgument for any other dtype.
absl::StatusOr<DType> ParseDType(absl::string_view name);

inline float BF16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE half to float, exact (subnormals, infinities and NaN included).
float F16ToF32(uint16_t h);

// Round to nearest even.
uint16_t F32ToF16(float f);

// n elements of `dtype` at src as float32 (exact) into out.
void WidenToF32(const void* src, DType dtype, int64_t n, float* out);
// n floats rounded to `dtype` (nearest even) into dest; a copy for kF32.
void NarrowFromF32(const float* src, int64_t n, DType dtype, void* dest);
// x[0, n) rounded to `dtype` and widened back, in place: the values a cache of that dtype holds.
void RoundThroughDType(float* x, int64_t n, DType dtype);

}  // namespace vc

#endif  // VC_COMMON_DTYPE_H_
