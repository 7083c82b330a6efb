// Hugging Face tokenizers, from a checkpoint's tokenizer.json and tokenizer_config.json.
//
// What is read: a BPE model (merges by rank; byte-level alphabets as GPT-2, Llama 3 and Qwen use,
// or SentencePiece-style pieces with byte fallback as Llama 2, Mistral and Gemma use; ignore_merges);
// added tokens, split out of the text before anything else, longest first at the leftmost place;
// the normalizers NFC, NFD, NFKC, NFKD, Replace, Prepend and Sequence; the pre-tokenizers Split
// (regex or string, every behavior), ByteLevel, Metaspace and Sequence; the post-processors
// TemplateProcessing, ByteLevel and Sequence (BOS and EOS as the template adds them); and the
// decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence.
//
// Ids are those of the JavaScript port of the reference library (@lenml/tokenizers, checked over
// tests/tokenizers/corpus). Where the two references differ, the JavaScript one is followed: a
// regex's \s takes U+FEFF and not U+0085, and every added token is matched in the raw text.
#ifndef VC_WORKER_RUNTIME_HF_TOKENIZER_H_
#define VC_WORKER_RUNTIME_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/runtime/tokenizer.h"

namespace vc {

// Thread-safe (immutable).
class HfTokenizer final : public Tokenizer {
 public:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  ~HfTokenizer() override;

  // The ids of `text`; with `add_special_tokens`, what the post-processor adds too (a BOS, say).
  // Bytes of `text` that are not UTF-8 are read as U+FFFD, as a JavaScript string would hold them.
  std::vector<int32_t> Encode(absl::string_view text, bool add_special_tokens) const;

  // Tokenizer: Encode adds the special tokens, as the reference does by default. Decode drops
  // special tokens and does no clean-up of spaces (so decode(encode(x)) == x where the tokenizer
  // keeps everything: byte-level ones and byte-fallback ones without a normalizer that changes
  // text); bytes that do not make UTF-8 become U+FFFD.
  std::vector<int32_t> Encode(absl::string_view text) const override { return Encode(text, true); }
  std::vector<int32_t> EncodeTemplated(absl::string_view text) const override { return Encode(text, false); }
  std::string Decode(absl::Span<const int32_t> ids) const override;
  std::string DecodeBytes(absl::Span<const int32_t> ids) const override;
  int32_t bos() const override;
  bool IsEos(int32_t id) const override;

  // The largest id the tokenizer gives or takes, plus one.
  int32_t id_limit() const;
  // The text of one token as the vocabulary holds it (empty for an unknown id).
  std::string TokenText(int32_t id) const;

 private:
  std::unique_ptr<const Impl> impl_;
};

// Builds a tokenizer from the text of tokenizer.json and of tokenizer_config.json (empty when the
// checkpoint has none). `bos` and `eos` are the model config's ids: -1 and empty leave them to
// tokenizer_config.json's bos_token and eos_token. kInvalidArgument naming the field and what is
// wrong with it for malformed or unsupported content.
absl::StatusOr<std::unique_ptr<HfTokenizer>> ParseHfTokenizer(absl::string_view tokenizer_json,
                                                              absl::string_view tokenizer_config_json,
                                                              int32_t bos = -1, std::vector<int32_t> eos = {});

// Reads `dir`/tokenizer.json (kNotFound if absent) and `dir`/tokenizer_config.json (optional).
absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadHfTokenizer(const std::string& dir, int32_t bos = -1,
                                                             std::vector<int32_t> eos = {});

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_HF_TOKENIZER_H_
