#include "worker/runtime/full_decoder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace vc {

absl::Status CheckFitsContext(const Model& model, int64_t prompt_tokens, int64_t max_tokens, bool at_least) {
  const int64_t ctx = model.config().max_position_embeddings;
  if (prompt_tokens + max_tokens <= ctx) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("prompt of ", at_least ? "at least " : "", prompt_tokens,
                                                 " tokens plus max_tokens ", max_tokens,
                                                 " exceeds the model's context of ", ctx));
}

absl::Status ValidateGenerate(const Model& model, absl::Span<const int32_t> prompt,
                              const GenerateOptions& o) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens ", o.max_tokens, " must be at least 1"));
  }
  if (o.prefill_chunk < 1 || o.block_size < 1) {
    return absl::InvalidArgumentError("prefill_chunk and block_size must be at least 1");
  }
  VC_RETURN_IF_ERROR(ValidateSamplingParams(o.sampling));
  VC_RETURN_IF_ERROR(CheckFitsContext(model, static_cast<int64_t>(prompt.size()), o.max_tokens));
  for (int32_t t : prompt) {
    if (t < 0 || t >= model.config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", t, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerateResult> GenerateFull(const Model& model, absl::Span<const int32_t> prompt,
                                            const GenerateOptions& o) {
  VC_RETURN_IF_ERROR(ValidateGenerate(model, prompt, o));
  const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  PagedKvCache cache(model.kv_layout(o.block_size), (total + o.block_size - 1) / o.block_size);
  const SeqId seq = cache.NewSequence();
  GenerateResult result;
  std::vector<float> logits;

  absl::Duration t0 = SteadyClock()->Now();
  VC_RETURN_IF_ERROR(model.Prefill(prompt, seq, o.prefill_chunk, cache, &logits));
  absl::Duration t1 = SteadyClock()->Now();
  result.prefill_seconds = absl::ToDoubleSeconds(t1 - t0);

  for (int i = 0; i < o.max_tokens; ++i) {
    const int64_t position = cache.Length(seq);
    const int32_t next = SampleToken(logits, o.sampling, position);
    result.tokens.push_back(next);
    if (o.stop_at_eos && model.tokenizer().IsEos(next)) break;
    if (i + 1 == o.max_tokens) break;
    SequenceChunk chunk{seq, {&result.tokens.back(), 1}};
    VC_RETURN_IF_ERROR(model.Forward({&chunk, 1}, cache, LogitsFor::kLastRows, &logits));
  }
  result.decode_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - t1);
  return result;
}

}  // namespace vc
