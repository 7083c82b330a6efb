#include "worker/compression/lossy_decoder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "worker/compression/query_recorder.h"
#include "worker/compression/registry.h"

namespace vc {

absl::StatusOr<PromptQueries> PrefillRecordingQueries(const Model& model, absl::Span<const int32_t> tokens,
                                                      int prefill_chunk, PagedKvCache& full, SeqId seq,
                                                      int64_t window) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  window = std::min(n, window);
  if (window <= 0) {
    VC_RETURN_IF_ERROR(model.Prefill(tokens, seq, prefill_chunk, full, nullptr));
    return PromptQueries{};
  }
  QueryRecorder recorder(full, seq, n, window, model.config().num_layers);
  VC_RETURN_IF_ERROR(model.Prefill(tokens, seq, prefill_chunk, recorder, nullptr));
  return recorder.Take();
}

absl::Status PrefillAndCompress(const Model& model, absl::Span<const int32_t> tokens, int64_t n, int prefill_chunk,
                                PagedKvCache& full, SeqId seq, CompressedKvCache& compressed, SeqId cseq) {
  VC_ASSIGN_OR_RETURN(const PromptQueries queries,
                      PrefillRecordingQueries(model, tokens.first(static_cast<size_t>(n)), prefill_chunk, full, seq,
                                              compressed.prompt_query_window()));
  return compressed.BuildFrom(cseq, full, seq, n, RecordedQueries(queries));
}

absl::StatusOr<LossyResult> GenerateLossy(const Model& model, absl::Span<const int32_t> prompt,
                                          const GenerateOptions& o, absl::string_view compressor) {
  VC_RETURN_IF_ERROR(ValidateGenerate(model, prompt, o));
  const KvLayout layout = model.kv_layout(o.block_size);
  VC_ASSIGN_OR_RETURN(auto compressed, MakeCompressedKvCache(compressor, layout, model.config().num_heads));
  LossyResult out;
  out.compressor = compressed->spec();
  const int64_t n = static_cast<int64_t>(prompt.size()) - 1;
  const absl::Duration t0 = SteadyClock()->Now();
  {
    PagedKvCache full(layout, n / o.block_size + 1);
    const SeqId seq = full.NewSequence();
    const SeqId cseq = compressed->NewSequence();
    VC_RETURN_IF_ERROR(PrefillAndCompress(model, prompt, n, o.prefill_chunk, full, seq, *compressed, cseq));
  }
  const absl::Duration t1 = SteadyClock()->Now();
  std::vector<float> logits;
  GenerateResult& r = out.generation;
  int32_t feed = prompt.back();
  for (int i = 0; i < o.max_tokens; ++i) {
    const int64_t pos = compressed->Length(0);
    SequenceChunk ch{0, {&feed, 1}};
    VC_RETURN_IF_ERROR(model.Forward({&ch, 1}, *compressed, LogitsFor::kLastRows, &logits));
    feed = SampleToken(logits, o.sampling, pos + 1);
    r.tokens.push_back(feed);
    if (o.stop_at_eos && model.tokenizer().IsEos(feed)) break;
  }
  const absl::Duration t2 = SteadyClock()->Now();
  r.prefill_seconds = absl::ToDoubleSeconds(t1 - t0);
  r.decode_seconds = absl::ToDoubleSeconds(t2 - t1);
  out.compressed_bytes = compressed->Bytes(0);
  return out;
}

}  // namespace vc
