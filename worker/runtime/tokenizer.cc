#include "worker/runtime/tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/runtime/hf_tokenizer.h"

namespace vc {

std::vector<int32_t> ByteTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  ids.push_back(kBos);
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

std::string ByteTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const ModelConfig& config, const std::string& dir) {
  if (config.tokenizer == "vericache-byte") {
    if (config.vocab_size < 258) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer vericache-byte needs vocab_size >= 258, the config has ", config.vocab_size));
    }
    // Ids the config names must be the tokenizer's own: prompts start with its BOS, and its EOS
    // ends a generation.
    if (config.bos_token_id >= 0 && config.bos_token_id != ByteTokenizer::kBos) {
      return absl::InvalidArgumentError(absl::StrCat("bos_token_id ", config.bos_token_id,
                                                     " is not the vericache-byte tokenizer's (", ByteTokenizer::kBos, ")"));
    }
    for (int32_t eos : config.eos_token_ids) {
      if (eos != ByteTokenizer::kEos) {
        return absl::InvalidArgumentError(
            absl::StrCat("eos_token_id ", eos, " is not the vericache-byte tokenizer's (", ByteTokenizer::kEos, ")"));
      }
    }
    return std::make_unique<ByteTokenizer>();
  }
  std::error_code ec;
  if (!dir.empty() && std::filesystem::exists(dir + "/tokenizer.json", ec)) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> hf = LoadHfTokenizer(dir, config.bos_token_id, config.eos_token_ids);
    if (!hf.ok()) return absl::InvalidArgumentError(hf.status().message());
    // An id past the embedding table would be read out of bounds.
    if ((*hf)->id_limit() > config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/tokenizer.json has ids up to ", (*hf)->id_limit() - 1,
                                                     ", past the model's vocab_size ", config.vocab_size));
    }
    return std::unique_ptr<Tokenizer>(*std::move(hf));
  }
  return std::make_unique<TokenIdsOnly>(config.bos_token_id, config.eos_token_ids);
}

absl::Status Tokenizer::CheckHandlesText(absl::string_view who) const {
  if (handles_text()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(who, " works on text: the model needs a tokenizer (a tokenizer.json in its folder, or the built-in vericache-byte)"));
}

}  // namespace vc
