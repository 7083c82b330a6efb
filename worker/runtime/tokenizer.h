// Tokenizers of a checkpoint: the built-in byte-level one, a Hugging Face tokenizer.json in the
// checkpoint's folder (hf_tokenizer.h), or, with neither, none: token ids alone.
#ifndef VC_WORKER_RUNTIME_TOKENIZER_H_
#define VC_WORKER_RUNTIME_TOKENIZER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/runtime/model_config.h"

namespace vc {

// Thread-safe (immutable).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids for `text`, starting with BOS when the tokenizer has one.
  virtual std::vector<int32_t> Encode(absl::string_view text) const = 0;
  // Token ids for text a chat template wrote, which holds its own special tokens as text: no BOS
  // is added, except by a tokenizer whose BOS has no text to write (the byte-level one).
  virtual std::vector<int32_t> EncodeTemplated(absl::string_view text) const { return Encode(text); }
  // The text of `ids`; special tokens are dropped.
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
  // The bytes of `ids` before any repair of invalid UTF-8 (so a character may be cut short at the
  // end): what TextStream reads to hold back a character until its last byte has come. Decode(ids)
  // is these bytes, repaired where the tokenizer repairs them.
  virtual std::string DecodeBytes(absl::Span<const int32_t> ids) const { return Decode(ids); }
  virtual int32_t bos() const = 0;
  // Whether `id` ends a generation (with none, a generation ends at max_tokens only).
  virtual bool IsEos(int32_t id) const = 0;
  // Whether Encode and Decode work; false: requests give token ids and get token ids.
  virtual bool handles_text() const { return true; }
  // The fewest ids Encode can give for a text of `bytes` bytes (0 when unknown): lets a request
  // too long for the context be refused before its text is encoded.
  virtual int64_t MinTokens(size_t /*bytes*/) const { return 0; }
  // OK when it handles text; otherwise kInvalidArgument saying that `who` (a tool that sends or
  // reads text) needs a model with a tokenizer (the built-in one or a tokenizer.json).
  absl::Status CheckHandlesText(absl::string_view who) const;
};

// Byte-level: ids 0..255 are bytes, 256 is BOS, 257 is EOS.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  std::vector<int32_t> Encode(absl::string_view text) const override;
  std::string Decode(absl::Span<const int32_t> ids) const override;
  int32_t bos() const override { return kBos; }
  bool IsEos(int32_t id) const override { return id == kEos; }
  int64_t MinTokens(size_t bytes) const override { return static_cast<int64_t>(bytes) + 1; }
};

// A checkpoint with no tokenizer this worker can run (neither the built-in one nor a tokenizer.json):
// prompts come as token ids and outputs go out as token ids; Encode gives nothing and Decode no
// text. BOS is the config's id (-1 when it names none), and each of its EOS ids ends a generation.
class TokenIdsOnly final : public Tokenizer {
 public:
  TokenIdsOnly(int32_t bos, std::vector<int32_t> eos) : bos_(bos), eos_(std::move(eos)) {}
  std::vector<int32_t> Encode(absl::string_view) const override { return {}; }
  std::string Decode(absl::Span<const int32_t>) const override { return ""; }
  int32_t bos() const override { return bos_; }
  bool IsEos(int32_t id) const override { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }
  bool handles_text() const override { return false; }

 private:
  const int32_t bos_;
  const std::vector<int32_t> eos_;
};

// The checkpoint's tokenizer: the byte-level one when the config declares it; otherwise the
// Hugging Face tokenizer of `dir`/tokenizer.json (and tokenizer_config.json) when `dir` has one
// (the config's BOS and EOS ids kept, tokenizer_config.json's eos_token added); otherwise
// TokenIdsOnly. kInvalidArgument when the vocabulary cannot hold the byte-level tokenizer's ids or
// the config's BOS or EOS are not its own, when tokenizer.json is malformed (naming what is wrong),
// or when it gives ids the model's vocabulary does not have.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const ModelConfig& config, const std::string& dir = "");

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_TOKENIZER_H_
