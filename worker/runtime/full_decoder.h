// Sequential decoding with the full KV cache: the reference every other generation path in
// VeriCache must match token for token.
#ifndef VC_WORKER_RUNTIME_FULL_DECODER_H_
#define VC_WORKER_RUNTIME_FULL_DECODER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/runtime/model.h"
#include "worker/runtime/sampler.h"

namespace vc {

struct GenerateOptions {
  int max_tokens = 64;
  SamplingParams sampling;
  bool stop_at_eos = true;
  int prefill_chunk = 512;  // prompt tokens per forward pass
  int block_size = 16;      // KV cache block size in tokens
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (EOS included when it ended the run)
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// kInvalidArgument, saying why, when a prompt of `prompt_tokens` tokens (of at least that many,
// with `at_least`) plus `max_tokens` does not fit the model's context.
absl::Status CheckFitsContext(const Model& model, int64_t prompt_tokens, int64_t max_tokens, bool at_least = false);

// kInvalidArgument for an empty prompt, max_tokens < 1, invalid sampling params, or a prompt plus
// max_tokens beyond the model's context.
absl::Status ValidateGenerate(const Model& model, absl::Span<const int32_t> prompt,
                              const GenerateOptions& options);

// Prefills `prompt`, then decodes one token per step. The token at position p is
// SampleToken(logits of position p-1, options.sampling, p).
absl::StatusOr<GenerateResult> GenerateFull(const Model& model, absl::Span<const int32_t> prompt,
                                            const GenerateOptions& options);

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_FULL_DECODER_H_
