// KIVI-style asymmetric quantization of runs of values.
#ifndef VC_WORKER_KIVI_H_
#define VC_WORKER_KIVI_H_

#include <cstdint>

namespace vc {

// Quantizes n values x[0], x[stride], ... to `bits`-bit codes between their min and max: writes
// the codes packed (code i at bit i * bits, little-endian) into `codes`, which must hold
// ceil(n * bits / 8) zeroed bytes, and sets *scale = (max - min) / (2^bits - 1), *min = min.
// Dequantized value i = min + code_i * scale, within scale / 2 of x[i * stride].
void QuantizeAsymmetric(const float* x, int64_t stride, int n, int bits, uint8_t* codes, float* scale, float* min);

}  // namespace vc

#endif  // VC_WORKER_KIVI_H_
