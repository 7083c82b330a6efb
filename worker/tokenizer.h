// Tokenizers a checkpoint can declare. Only the byte-level one exists so far.
#ifndef VC_WORKER_TOKENIZER_H_
#define VC_WORKER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/model_config.h"

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
  virtual int32_t eos() const = 0;
};

// Byte-level: ids 0..255 are bytes, 256 is BOS, 257 is EOS.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  std::vector<int32_t> Encode(absl::string_view text) const override;
  std::string Decode(absl::Span<const int32_t> ids) const override;
  int32_t bos() const override { return kBos; }
  int32_t eos() const override { return kEos; }
};

// The tokenizer the config declares; kInvalidArgument when it declares none or one not supported,
// or when the vocabulary cannot hold its ids.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const ModelConfig& config);

}  // namespace vc

#endif  // VC_WORKER_TOKENIZER_H_
