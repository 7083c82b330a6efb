// Decoding from a compressed KV cache alone: the lossy baseline that users of KV compression run
// today. The prompt (all but its last token) is prefilled with the full cache, compressed, and
// every later step reads only the compressed cache. Its output may diverge from full-KV decoding.
#ifndef VC_WORKER_COMPRESSION_LOSSY_DECODER_H_
#define VC_WORKER_COMPRESSION_LOSSY_DECODER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/compression/compressed_cache.h"
#include "worker/runtime/full_decoder.h"

namespace vc {

struct LossyResult {
  GenerateResult generation;
  int64_t compressed_bytes = 0;  // held for the sequence at the end
  std::string compressor;        // canonical spec
};

// kInvalidArgument for a bad request (ValidateGenerate) or compressor spec.
absl::StatusOr<LossyResult> GenerateLossy(const Model& model, absl::Span<const int32_t> prompt,
                                          const GenerateOptions& options, absl::string_view compressor);

// Prefills `tokens` into `seq` of `full` in passes of `prefill_chunk`, and returns the queries of
// the last `window` of those positions (count 0, none recorded, when `window` is 0): what a
// compressor that chooses by prompt queries (CompressedKvCache::prompt_query_window) builds from.
absl::StatusOr<PromptQueries> PrefillRecordingQueries(const Model& model, absl::Span<const int32_t> tokens,
                                                      int prefill_chunk, PagedKvCache& full, SeqId seq,
                                                      int64_t window);

// What CompressedKvCache::BuildFrom takes for queries PrefillRecordingQueries returned: null when
// none were recorded.
inline const PromptQueries* RecordedQueries(const PromptQueries& queries) {
  return queries.count > 0 ? &queries : nullptr;
}

// Prefills positions [0, n) of `tokens` into `seq` of `full`, recording the queries of the last
// prompt positions when the compressor uses them, then builds `cseq` of `compressed`.
absl::Status PrefillAndCompress(const Model& model, absl::Span<const int32_t> tokens, int64_t n, int prefill_chunk,
                                PagedKvCache& full, SeqId seq, CompressedKvCache& compressed, SeqId cseq);

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_LOSSY_DECODER_H_
