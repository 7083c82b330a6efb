// Writes small random checkpoints and raw safetensors files for tests.
#ifndef VC_TESTS_TESTING_TINY_MODEL_H_
#define VC_TESTS_TESTING_TINY_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "nlohmann/json.hpp"

namespace vc::testing {

struct RawTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  // stored converted to dtype
};

// Serializes tensors in safetensors format (header padded to 8 bytes).
std::string SafetensorsBytes(const std::map<std::string, RawTensor>& tensors);
void WriteFile(const std::string& path, const std::string& bytes);

struct TinyModelSpec {
  std::string architecture = "LlamaForCausalLM";
  int hidden = 32;
  int intermediate = 48;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int vocab = 258;
  int64_t max_positions = 4096;
  DType dtype = DType::kBF16;
  bool tie_embeddings = false;
  bool attention_bias = false;
  uint64_t seed = 1;
  float weight_scale = 0.2f;
};

// The shape most engine and compressor tests use: 128 wide, 4 query heads on 2 KV heads.
TinyModelSpec SmallGqaSpec();

// The config.json object of `spec`.
nlohmann::json TinyConfig(const TinyModelSpec& spec);
// Random weights under Hugging Face names for `spec`.
std::map<std::string, RawTensor> TinyWeights(const TinyModelSpec& spec);
// Writes config.json and model.safetensors of a random model into `dir` (created).
void WriteTinyModel(const std::string& dir, const TinyModelSpec& spec);

// Writes a SmallGqaSpec model (weight scale 0.15) into `dir` whose logits overflow float32 in
// every row whose input token is kOverflowToken, and in no other: hidden dimension 0 is that
// token's embedding alone (no other token's has it, no layer writes it), and the final norm and
// the LM head scale it past the largest float.
inline constexpr int32_t kOverflowToken = 200;
void WriteModelOverflowingOn(const std::string& dir);
// `tokens` with every kOverflowToken replaced by the next token id.
std::vector<int32_t> WithoutOverflowToken(std::vector<int32_t> tokens);

// A fresh empty directory under the test temp dir.
std::string TempDir(const std::string& name);

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_TINY_MODEL_H_
