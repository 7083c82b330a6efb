// Token selection. The token at position p is a pure function of (logits, params, p): greedy takes
// the highest logit (ties to the lowest id); sampling draws one uniform from a counter-based RNG
// (Philox4x32-10 keyed by the seed, counter = p) and inverts the CDF of the filtered distribution.
// So a run is reproducible and independent of batching and of how many tokens a pass produced.
#ifndef VC_WORKER_RUNTIME_SAMPLER_H_
#define VC_WORKER_RUNTIME_SAMPLER_H_

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace vc {

struct SamplingParams {
  float temperature = 0.0f;  // 0 selects greedy decoding
  int top_k = 0;             // 0 keeps every token
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
};

// kInvalidArgument for a negative or non-finite temperature, negative top_k, top_p outside (0, 1].
absl::Status ValidateSamplingParams(const SamplingParams& params);

// Philox4x32-10 block for (counter, key).
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A uniform double in [0, 1) for (seed, position).
double PositionUniform(uint64_t seed, int64_t position);

// The token for `position` from logits [vocab]. Params must be valid. Thread-safe.
int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params, int64_t position);

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_SAMPLER_H_
