// Tokenizers a checkpoint can declare. The byte-level one is built in; a checkpoint that declares
// another (or none) is served on token ids alone.
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
  // The text of `ids`; special tokens are dropped.
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
  virtual int32_t bos() const = 0;
  // Whether `id` ends a generation (with none, a generation ends at max_tokens only).
  virtual bool IsEos(int32_t id) const = 0;
  // Whether Encode and Decode work; false: requests give token ids and get token ids.
  virtual bool handles_text() const { return true; }
  // The fewest ids Encode can give for a text of `bytes` bytes (0 when unknown): lets a request
  // too long for the context be refused before its text is encoded.
  virtual int64_t MinTokens(size_t /*bytes*/) const { return 0; }
  // OK when it handles text; otherwise kInvalidArgument saying that `who` (a tool that sends or
  // reads text) needs a model with the built-in tokenizer.
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

// A checkpoint whose tokenizer is not built in (Hugging Face tokenizers, say): prompts come as
// token ids and outputs go out as token ids; Encode gives nothing and Decode no text. BOS is the
// config's id (-1 when it names none), and each of its EOS ids ends a generation.
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

// The tokenizer the config declares: the byte-level one, or TokenIdsOnly for any other (or none).
// kInvalidArgument when the vocabulary cannot hold the byte-level tokenizer's ids or the config's
// BOS or EOS are not its own.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const ModelConfig& config);

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_TOKENIZER_H_
