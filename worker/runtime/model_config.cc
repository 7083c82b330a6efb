#include "worker/runtime/model_config.h"

#include <cmath>


#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace vc {
namespace {

using json = nlohmann::json;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", what));
}

// Reads an integer field; `required` fields must be present. Range [lo, hi].
absl::Status ReadInt(const json& j, const char* key, bool required, int64_t lo, int64_t hi,
                     int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? Bad(absl::StrCat("missing '", key, "'")) : absl::OkStatus();
  }
  if (!it->is_number_integer()) return Bad(absl::StrCat("'", key, "' is not an integer"));
  // An unsigned value past int64's range would read back negative.
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(absl::StrCat("'", key, "' = ", it->get<uint64_t>(), " is outside [", lo, ", ", hi, "]"));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return Bad(absl::StrCat("'", key, "' = ", v, " is outside [", lo, ", ", hi, "]"));
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadInt(const json& j, const char* key, bool required, int64_t lo, int64_t hi, int* out) {
  int64_t v = *out;
  VC_RETURN_IF_ERROR(ReadInt(j, key, required, lo, hi, &v));
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadDouble(const json& j, const char* key, double lo, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(absl::StrCat("'", key, "' is not a number"));
  const double v = it->get<double>();
  if (!(v > lo)) return Bad(absl::StrCat("'", key, "' = ", v, " must be greater than ", lo));
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Bad(absl::StrCat("'", key, "' is not a boolean"));
  *out = it->get<bool>();
  return absl::OkStatus();
}

// "eos_token_id": one id or a list of them (as Llama 3's configs give), each in [0, vocab).
absl::Status ReadEosIds(const json& j, int vocab_size, std::vector<int32_t>* out) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) {
    int v = -1;
    VC_RETURN_IF_ERROR(ReadInt(j, "eos_token_id", false, 0, vocab_size - 1, &v));
    out->push_back(v);
    return absl::OkStatus();
  }
  constexpr size_t kMaxEos = 64;
  if (it->size() > kMaxEos) {
    return Bad(absl::StrCat("'eos_token_id' lists ", it->size(), " ids; at most ", kMaxEos));
  }
  for (const json& e : *it) {
    if (!e.is_number_integer()) return Bad("'eos_token_id' holds an item that is not an integer");
    // An unsigned value past int64's range would read back negative.
    if (e.is_number_unsigned() && e.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)) {
      return Bad(absl::StrCat("'eos_token_id' holds ", e.get<uint64_t>(), ", outside [0, ", vocab_size - 1, "]"));
    }
    const int64_t v = e.get<int64_t>();
    if (v < 0 || v >= vocab_size) {
      return Bad(absl::StrCat("'eos_token_id' holds ", v, ", outside [0, ", vocab_size - 1, "]"));
    }
    out->push_back(static_cast<int32_t>(v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text) {
  if (absl::Status depth = CheckJsonText(text, 64); !depth.ok()) return Bad(depth.message());
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("not valid JSON");
  if (!j.is_object()) return Bad("not a JSON object");
  ModelConfig c;

  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
    return Bad("missing 'architectures'");
  }
  c.architecture = (*arch)[0].get<std::string>();
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM" && !qwen2) {
    return Bad(absl::StrCat("unsupported architecture '", c.architecture,
                            "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)"));
  }

  constexpr int64_t kMaxDim = 1 << 20;
  VC_RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, 1, kMaxDim, &c.hidden_size));
  VC_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", true, 1, kMaxDim, &c.intermediate_size));
  VC_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, 1, 1024, &c.num_layers));
  VC_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, 1, 4096, &c.num_heads));
  c.num_kv_heads = c.num_heads;
  VC_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, 1, 4096, &c.num_kv_heads));
  c.head_dim = c.hidden_size / c.num_heads;
  VC_RETURN_IF_ERROR(ReadInt(j, "head_dim", false, 1, 4096, &c.head_dim));
  VC_RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, 1, 1 << 24, &c.vocab_size));
  VC_RETURN_IF_ERROR(
      ReadInt(j, "max_position_embeddings", true, 1, int64_t{1} << 24, &c.max_position_embeddings));
  double eps = c.rms_norm_eps;
  VC_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", 0.0, &eps));
  c.rms_norm_eps = static_cast<float>(eps);
  if (!(c.rms_norm_eps > 0.0f)) return Bad(absl::StrCat("rms_norm_eps ", eps, " is 0 in float32"));
  if (!std::isfinite(c.rms_norm_eps)) return Bad(absl::StrCat("rms_norm_eps ", eps, " is not finite in float32"));
  // Past 1, so that the rotary frequencies theta^(-2i/d) fall with i and all are finite.
  VC_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", 1.0, &c.rope_theta));
  VC_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  bool attention_bias = false;
  VC_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &attention_bias));
  c.qkv_bias = qwen2 || attention_bias;
  c.o_bias = !qwen2 && attention_bias;
  VC_RETURN_IF_ERROR(ReadInt(j, "bos_token_id", false, 0, c.vocab_size - 1, &c.bos_token_id));
  VC_RETURN_IF_ERROR(ReadEosIds(j, c.vocab_size, &c.eos_token_ids));

  if (c.num_heads % c.num_kv_heads != 0) {
    return Bad(absl::StrCat("num_attention_heads ", c.num_heads, " is not a multiple of num_key_value_heads ",
                            c.num_kv_heads));
  }
  if (c.head_dim < 1) {
    return Bad(absl::StrCat("head_dim is 0: hidden_size ", c.hidden_size, " is smaller than num_attention_heads ",
                            c.num_heads, " and no head_dim is given"));
  }
  if (c.head_dim % 2 != 0) return Bad(absl::StrCat("head_dim ", c.head_dim, " is odd; RoPE needs pairs"));

  auto sw = j.find("sliding_window");
  auto use_sw = j.find("use_sliding_window");
  const bool sliding = sw != j.end() && !sw->is_null() &&
                       !(use_sw != j.end() && use_sw->is_boolean() && !use_sw->get<bool>());
  if (sliding) return Bad("sliding-window attention is not supported");

  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) return Bad("'rope_scaling' is not an object");
    // "rope_type", or the older "type" when there is none (Hugging Face's precedence).
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
      auto t = rs->find(k);
      if (t != rs->end() && t->is_string()) {
        type = t->get<std::string>();
        break;
      }
    }
    if (type == "default") {
      // Plain RoPE.
    } else if (type == "llama3") {
      c.rope_scaling.enabled = true;
      // All four are required, as Hugging Face requires them: a default would run another RoPE
      // than the checkpoint was trained with.
      for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
        if (!rs->contains(k) || (*rs)[k].is_null()) return Bad(absl::StrCat("rope_scaling (llama3) lacks '", k, "'"));
      }
      VC_RETURN_IF_ERROR(ReadDouble(*rs, "factor", 0.0, &c.rope_scaling.factor));
      VC_RETURN_IF_ERROR(ReadDouble(*rs, "low_freq_factor", 0.0, &c.rope_scaling.low_freq_factor));
      VC_RETURN_IF_ERROR(ReadDouble(*rs, "high_freq_factor", 0.0, &c.rope_scaling.high_freq_factor));
      VC_RETURN_IF_ERROR(ReadInt(*rs, "original_max_position_embeddings", false, 1, int64_t{1} << 24,
                                 &c.rope_scaling.original_max_position_embeddings));
      for (double f : {c.rope_scaling.factor, c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor}) {
        // Outside this range the scaled frequencies overflow or vanish.
        if (!(f >= 1e-3 && f <= 1e6)) return Bad(absl::StrCat("rope_scaling: factor ", f, " is outside [0.001, 1e6]"));
      }
      if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor) {
        return Bad("rope_scaling: high_freq_factor must exceed low_freq_factor");
      }
    } else {
      return Bad(absl::StrCat("unsupported rope_scaling type '", type, "' (supported: llama3)"));
    }
  }

  auto tok = j.find("tokenizer_class");
  if (tok != j.end() && tok->is_string()) c.tokenizer = tok->get<std::string>();
  auto dtype = j.find("torch_dtype");
  if (dtype != j.end() && !dtype->is_null()) {
    const std::string name = dtype->is_string() ? dtype->get<std::string>() : std::string();
    if (name == "float32") {
      c.torch_dtype = DType::kF32;
    } else if (name == "bfloat16") {
      c.torch_dtype = DType::kBF16;
    } else if (name == "float16") {
      c.torch_dtype = DType::kF16;
    } else {
      return Bad("torch_dtype must be float32, bfloat16 or float16");
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  VC_ASSIGN_OR_RETURN(const std::string text, ReadFileLimited(dir + "/config.json", 16 << 20, "model config"));
  return ParseModelConfig(text);
}

}  // namespace vc
