// The architecture of a Llama-family checkpoint, from its Hugging Face config.json.
#ifndef VC_WORKER_RUNTIME_MODEL_CONFIG_H_
#define VC_WORKER_RUNTIME_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace vc {

// Llama 3 style frequency-dependent RoPE scaling ("rope_type": "llama3").
struct RopeScaling {
  bool enabled = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int vocab_size = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // biases on q/k/v projections (Qwen2, Llama attention_bias)
  bool o_bias = false;    // bias on the output projection (Llama attention_bias)
  std::string tokenizer;  // "vericache-byte"; empty when the checkpoint does not say
  int bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // any of them ends a generation; empty: none
  // The checkpoint's own dtype (torch_dtype: float32, bfloat16 or float16); unset when it does not
  // say.
  std::optional<DType> torch_dtype;
};

// Parses config.json text. Returns kInvalidArgument naming the field for invalid JSON, a missing or
// ill-typed required field, inconsistent sizes, or an unsupported architecture or feature.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

// Reads and parses `dir`/config.json (kNotFound if absent).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_MODEL_CONFIG_H_
