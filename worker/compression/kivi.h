// KIVI-style asymmetric quantization of runs of values.
#ifndef VC_WORKER_COMPRESSION_KIVI_H_
#define VC_WORKER_COMPRESSION_KIVI_H_

#include <cstdint>

namespace vc {

// Quantizes n values x[0], x[stride], ... to `bits`-bit codes between their min and max: writes
// the codes packed (code i at bit i * bits, little-endian) into `codes`, which must hold
// ceil(n * bits / 8) zeroed bytes, and sets *scale = (max - min) / (2^bits - 1), *min = min.
// Dequantized value i = min + code_i * scale, within scale / 2 of x[i * stride].
void QuantizeAsymmetric(const float* x, int64_t stride, int n, int bits, uint8_t* codes, float* scale, float* min);

// Where QuantizeKiviGroup writes one group; the code arrays zeroed by the caller.
struct KiviGroupOut {
  uint8_t* k_codes = nullptr;  // [head_dim, group * bits / 8]: channel-major
  float* k_scale = nullptr;    // [head_dim]
  float* k_min = nullptr;      // [head_dim]
  uint8_t* v_codes = nullptr;  // [group, head_dim * bits / 8]
  float* v_scale = nullptr;    // [group, head_dim / value_group]
  float* v_min = nullptr;      // [group, head_dim / value_group]
};

// Quantizes one group of KIVI tokens, k and v [group, head_dim]: each key channel over the group's
// tokens, each token's values in runs of value_group channels. Bitwise what QuantizeAsymmetric
// gives run by run (its codes, scales and minimums): with SSE2, four values per instruction and
// no library call per value; without, QuantizeAsymmetric itself. bits is 2, 4 or 8; group and
// value_group are multiples of 8, and value_group divides head_dim.
void QuantizeKiviGroup(const float* k, const float* v, int group, int head_dim, int value_group, int bits,
                       const KiviGroupOut& out);

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_KIVI_H_
