#include "tests/testing/tiny_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>
#include <cstdlib>

namespace vc::testing {

std::string SafetensorsBytes(const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == DType::kF32) {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t h = t.dtype == DType::kBF16 ? F32ToBF16(v) : F32ToF16(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[name] = {{"dtype", std::string(DTypeName(t.dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

nlohmann::json TinyConfig(const TinyModelSpec& s) {
  return {{"architectures", {s.architecture}},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.intermediate},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.hidden / s.heads},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"vocab_size", s.vocab},
          {"max_position_embeddings", s.max_positions},
          {"tie_word_embeddings", s.tie_embeddings},
          {"attention_bias", s.attention_bias},
          {"bos_token_id", 256},
          {"eos_token_id", 257},
          {"tokenizer_class", "vericache-byte"}};
}

std::map<std::string, RawTensor> TinyWeights(const TinyModelSpec& s) {
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::map<std::string, RawTensor> w;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, float scale) {
    RawTensor t{s.dtype, {rows, cols}, {}};
    t.values.resize(static_cast<size_t>(rows * cols));
    for (float& v : t.values) v = normal(rng) * scale;
    w[name] = std::move(t);
  };
  auto vec = [&](const std::string& name, int64_t n, float center, float spread) {
    RawTensor t{s.dtype, {n}, {}};
    t.values.resize(static_cast<size_t>(n));
    for (float& v : t.values) v = center + normal(rng) * spread;
    w[name] = std::move(t);
  };
  const int hd = s.hidden / s.heads;
  const float sc = s.weight_scale;
  matrix("model.embed_tokens.weight", s.vocab, s.hidden, 1.0f);
  if (!s.tie_embeddings) matrix("lm_head.weight", s.vocab, s.hidden, sc);
  vec("model.norm.weight", s.hidden, 1.0f, 0.1f);
  const bool qwen2 = s.architecture == "Qwen2ForCausalLM";
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    matrix(p + "self_attn.q_proj.weight", s.heads * hd, s.hidden, sc);
    matrix(p + "self_attn.k_proj.weight", s.kv_heads * hd, s.hidden, sc);
    matrix(p + "self_attn.v_proj.weight", s.kv_heads * hd, s.hidden, sc);
    matrix(p + "self_attn.o_proj.weight", s.hidden, s.heads * hd, sc);
    matrix(p + "mlp.gate_proj.weight", s.intermediate, s.hidden, sc);
    matrix(p + "mlp.up_proj.weight", s.intermediate, s.hidden, sc);
    matrix(p + "mlp.down_proj.weight", s.hidden, s.intermediate, sc);
    vec(p + "input_layernorm.weight", s.hidden, 1.0f, 0.1f);
    vec(p + "post_attention_layernorm.weight", s.hidden, 1.0f, 0.1f);
    if (qwen2 || s.attention_bias) {
      vec(p + "self_attn.q_proj.bias", s.heads * hd, 0.0f, 0.1f);
      vec(p + "self_attn.k_proj.bias", s.kv_heads * hd, 0.0f, 0.1f);
      vec(p + "self_attn.v_proj.bias", s.kv_heads * hd, 0.0f, 0.1f);
    }
    if (!qwen2 && s.attention_bias) vec(p + "self_attn.o_proj.bias", s.hidden, 0.0f, 0.1f);
  }
  return w;
}

namespace {

// A model directory of `spec`'s config and the weights w.
void WriteModel(const std::string& dir, const TinyModelSpec& spec, const std::map<std::string, RawTensor>& w) {
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/config.json", TinyConfig(spec).dump(2));
  WriteFile(dir + "/model.safetensors", SafetensorsBytes(w));
}

}  // namespace

void WriteTinyModel(const std::string& dir, const TinyModelSpec& spec) { WriteModel(dir, spec, TinyWeights(spec)); }

void WriteModelOverflowingOn(const std::string& dir) {
  const int32_t token = kOverflowToken;
  TinyModelSpec spec = SmallGqaSpec();
  spec.weight_scale = 0.15f;
  std::map<std::string, RawTensor> w = TinyWeights(spec);
  const int64_t d = spec.hidden;
  std::vector<float>& embed = w["model.embed_tokens.weight"].values;
  for (int64_t t = 0; t < spec.vocab; ++t) embed[static_cast<size_t>(t * d)] = t == token ? 8.0f : 0.0f;
  for (int i = 0; i < spec.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* out : {"self_attn.o_proj.weight", "mlp.down_proj.weight"}) {
      RawTensor& m = w[p + out];
      std::fill_n(m.values.begin(), m.shape[1], 0.0f);  // output dimension 0
    }
  }
  w["model.norm.weight"].values[0] = 1e37f;
  std::vector<float>& head = w["lm_head.weight"].values;
  for (int64_t t = 0; t < spec.vocab; ++t) head[static_cast<size_t>(t * d)] = 100.0f;
  WriteModel(dir, spec, w);
}

std::vector<int32_t> WithoutOverflowToken(std::vector<int32_t> tokens) {
  for (int32_t& t : tokens) t = t == kOverflowToken ? kOverflowToken + 1 : t;
  return tokens;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path p = std::filesystem::path(base ? base : std::filesystem::temp_directory_path().string()) /
                            ("vc_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

TinyModelSpec SmallGqaSpec() {
  TinyModelSpec spec;
  spec.hidden = 128;
  spec.intermediate = 344;
  spec.heads = 4;
  spec.kv_heads = 2;
  return spec;
}

}  // namespace vc::testing
