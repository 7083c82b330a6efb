// A Llama-family decoder: loads a Hugging Face-layout checkpoint (memory-mapped) and runs the
// forward pass over a batch of sequence chunks against a paged KV cache.
#ifndef VC_WORKER_RUNTIME_MODEL_H_
#define VC_WORKER_RUNTIME_MODEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernels.h"
#include "worker/runtime/attention_cache.h"
#include "worker/runtime/kv_cache.h"
#include "worker/runtime/model_config.h"
#include "worker/runtime/safetensors.h"
#include "worker/runtime/tokenizer.h"

namespace vc {

// New tokens of one sequence. They occupy positions [cache.Length(seq), + tokens.size()).
struct SequenceChunk {
  SeqId seq = 0;
  absl::Span<const int32_t> tokens;
};

enum class LogitsFor {
  kAllRows,   // one logits row per input token (verification)
  kLastRows,  // one logits row per chunk, for its last token (prefill, decode)
};

// What a pass that sampled from a NaN or infinite logit returns: kDataLoss.
absl::Status NonFiniteLogits();

// The element type of KV caches, as a flag or option names it: "auto" (nullopt: the checkpoint's
// torch_dtype, else the dtype of its weights), "bf16", "f16" or "f32". kInvalidArgument for
// anything else.
absl::StatusOr<std::optional<DType>> ParseKvDType(absl::string_view name);

// The KV dtype a model of the checkpoint in `dir` runs with: `asked` if set, else the checkpoint's
// torch_dtype, else the dtype of its embedding weights (what Model::Load picks). Errors as reading
// its config and tensors.
absl::StatusOr<DType> ModelKvDType(const std::string& dir, std::optional<DType> asked);

struct ModelOptions {
  const kernels::Backend* backend = nullptr;  // kernels::DefaultBackend() when null; must outlive the model
  std::optional<DType> kv_dtype;              // unset: the checkpoint's (ParseKvDType's "auto")
};

// Immutable after Load(); Forward() is thread-safe for distinct caches.
class Model {
 public:
  // Loads `dir` (config.json + model.safetensors or its sharded index). Errors name the file and
  // the problem: kNotFound for missing files or tensors, kInvalidArgument for an unsupported or
  // inconsistent config or a tensor of the wrong shape or dtype, kDataLoss for a truncated file.
  // `backend` defaults to kernels::DefaultBackend(); it must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const kernels::Backend* backend = nullptr);
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, const ModelOptions& options);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const kernels::Backend& backend() const { return *backend_; }
  // The KV layout of this model for a given block size, in its KV dtype.
  KvLayout kv_layout(int block_size) const;
  // The element type of its KV: every K and V row a forward pass writes to a cache is rounded to it
  // first, so full and compressed caches alike hold what a cache of this dtype holds.
  DType kv_dtype() const { return kv_dtype_; }

  // Runs `chunks` (distinct sequences, each non-empty) in one pass: appends their K/V to `cache`
  // (the full paged cache or a compressed one) and writes logits [rows, vocab] to `logits`, rows as
  // `which` says, in chunk order. kInvalidArgument for an empty chunk, a token outside the
  // vocabulary or a position beyond max_position_embeddings; kResourceExhausted if the cache has
  // no room (the cache is unchanged). Finite weights can still overflow float32 (values near the
  // largest bf16): without `finite`, a NaN or infinite logit in any row fails the pass
  // (NonFiniteLogits()); with it, (*finite)[r] says whether row r is, and the caller decides (a row
  // it does not sample from cannot change its output).
  absl::Status Forward(absl::Span<const SequenceChunk> chunks, AttentionCache& cache, LogitsFor which,
                       std::vector<float>* logits, std::vector<bool>* finite = nullptr) const;
  // Forward passes finished since the model loaded (by any thread): a long prefill, one engine
  // step, makes progress pass by pass.
  uint64_t forward_passes() const { return forward_passes_.load(std::memory_order_relaxed); }

  // Appends `tokens` to `seq` of `cache` in passes of at most `chunk` tokens (a prefill); the
  // kernels are batch-invariant, so the chunking changes no bit of the K/V. `logits` (may be null)
  // gets the last token's row. Errors as Forward (a non-finite logit only in that row, the one a
  // caller samples from); kInvalidArgument for chunk < 1.
  absl::Status Prefill(absl::Span<const int32_t> tokens, SeqId seq, int chunk, AttentionCache& cache,
                       std::vector<float>* logits) const;

 private:
  struct Layer {
    kernels::WeightView q, k, v, o, gate, up, down;
    std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty when absent
    std::vector<float> attn_norm, mlp_norm;
  };
  Model() = default;
  absl::Status LoadWeights();
  void RopeTables(absl::Span<const int64_t> positions, std::vector<float>* cos,
                  std::vector<float>* sin) const;

  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<TensorStore> tensors_;
  const kernels::Backend* backend_ = nullptr;
  DType kv_dtype_ = DType::kF32;
  TensorView embed_;
  kernels::WeightView lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
  mutable std::atomic<uint64_t> forward_passes_{0};
};

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_MODEL_H_
