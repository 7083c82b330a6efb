// The VeriCache engine: sequences draft from a compressed KV cache held in the worker, the full KV
// is fetched from a FullKvTier while they draft, and one multi-token pass over the full KV verifies
// each draft window. Only verified tokens are emitted: the output equals sequential full-KV
// decoding (GenerateFull) token for token, greedy or sampled.
//
// One engine thread runs the loop below; the tier's thread moves the full KV meanwhile.
//   admit:  prefill the prompt on staging memory, append its KV to the tier, build the compressed
//           copy, free the staging blocks
//   draft:  every drafting sequence advances one token in one batched pass over compressed KV;
//           when a sequence starts a window it reserves staging blocks and starts its fetch
//   verify: sequences whose drafts are done and whose fetch has landed are verified together in
//           one batched pass over their full KV; accept the longest matching prefix plus the
//           target's own next token; append the exact K/V of accepted positions to the tier and,
//           compressed, to the compressed cache in place of the drafted entries
#ifndef VC_WORKER_ENGINE_H_
#define VC_WORKER_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/compressed_cache.h"
#include "worker/draft_window.h"
#include "worker/full_decoder.h"
#include "worker/full_kv_tier.h"
#include "worker/model.h"

namespace vc {

struct EngineOptions {
  std::string compressor = "kivi:bits=4,group=32,residual=32";
  int draft_window = 0;       // fixed k when > 0; 0 adapts per sequence
  int max_draft_window = 16;  // capped by the compressor's MaxRollback
  int block_size = 16;
  // Staging blocks for full KV being prefilled or verified; 0 sizes it for every sequence at once.
  int64_t staging_blocks = 0;
  int max_batch = 16;  // sequences in flight
};

struct EngineStats {
  int64_t drafted = 0;
  int64_t accepted_drafts = 0;
  int64_t verifies = 0;
  int64_t emitted = 0;
  int64_t bytes_fetched = 0;
  int64_t compressed_bytes = 0;  // held for the sequence at its end
  double prefill_seconds = 0;
  double draft_seconds = 0;   // this sequence's share of batched draft passes
  double verify_seconds = 0;  // its share of batched verify passes
  double fetch_wait_seconds = 0;
  double acceptance_rate() const { return drafted ? double(accepted_drafts) / drafted : 0.0; }
  double tokens_per_verify() const { return verifies ? double(emitted) / verifies : 0.0; }
};

// Full KV computed elsewhere for positions [0, prompt.size() - 1) of a request (a prefix found in
// a cache store, or a benchmark's shared prefill). Must stay valid until Generate returns.
struct PrefilledKv {
  const PagedKvCache* cache = nullptr;
  SeqId seq = 0;
};

struct EngineRequest {
  std::vector<int32_t> prompt;
  GenerateOptions options;  // max_tokens, sampling, stop_at_eos
  PrefilledKv prefilled;    // optional: skips the prefill compute
};

struct EngineResult {
  std::vector<int32_t> tokens;
  EngineStats stats;
};

// Not thread-safe: Generate runs the loop on the calling thread.
class VeriCacheEngine {
 public:
  // `model` and `tier` must outlive the engine.
  static absl::StatusOr<std::unique_ptr<VeriCacheEngine>> Create(const Model& model, FullKvTier* tier,
                                                                 const EngineOptions& options);

  // Generates for every request; results in request order. kInvalidArgument for a bad request
  // (see ValidateGenerate); kResourceExhausted if staging memory cannot hold one sequence.
  absl::StatusOr<std::vector<EngineResult>> Generate(absl::Span<const EngineRequest> requests);

  const std::string& compressor_spec() const { return spec_; }

 private:
  struct Sequence;
  VeriCacheEngine(const Model& model, FullKvTier* tier, const EngineOptions& options);
  absl::Status Admit(Sequence& s);
  absl::Status DraftStep(std::vector<Sequence*>& drafting);
  absl::Status StartWindow(Sequence& s);
  absl::Status Verify(std::vector<Sequence*>& ready);

  const Model& model_;
  FullKvTier* const tier_;
  const EngineOptions options_;
  std::string spec_;
  int64_t max_rollback_ = 0;
  uint64_t next_key_ = 1;
  // State of the Generate call in progress.
  std::unique_ptr<CompressedKvCache> compressed_;
  std::unique_ptr<PagedKvCache> staging_;
  DraftCostModel costs_;
};

}  // namespace vc

#endif  // VC_WORKER_ENGINE_H_
