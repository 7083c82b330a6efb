#include "worker/runtime/text_stream.h"

#include <algorithm>

#include "worker/runtime/unicode.h"

namespace vc {
namespace {

// Context ids kept: enough for a decoder's view of what comes before (a leading space, the
// bytes of a character a context token left open).
constexpr size_t kContextIds = 4;

}  // namespace

TextStream::TextStream(const Tokenizer& tokenizer, absl::Span<const int32_t> context) : tokenizer_(tokenizer) {
  const size_t keep = std::min(context.size(), kContextIds);
  ids_.assign(context.end() - keep, context.end());
  read_ = ids_.size();
  prefix_ = tokenizer_.DecodeBytes(ids_);
}

std::string TextStream::Add(int32_t id) {
  ids_.push_back(id);
  std::string bytes = tokenizer_.DecodeBytes(ids_);
  if (IncompleteUtf8Suffix(bytes) > 0) return "";
  // Decoders read a token the same whatever follows it, so the window's text starts with the
  // prefix; should one not, the new bytes are taken from where the prefix ends all the same.
  std::string text = bytes.size() > prefix_.size() ? ToValidUtf8(absl::string_view(bytes).substr(prefix_.size())) : "";
  // Slide the window: the ids just read become the prefix.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_));
  read_ = ids_.size();
  prefix_ = tokenizer_.DecodeBytes(ids_);
  return text;
}

std::string TextStream::Flush() {
  if (held() == 0) return "";
  const std::string bytes = tokenizer_.DecodeBytes(ids_);
  std::string text = bytes.size() > prefix_.size() ? ToValidUtf8(absl::string_view(bytes).substr(prefix_.size())) : "";
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_));
  read_ = ids_.size();
  prefix_ = tokenizer_.DecodeBytes(ids_);
  return text;
}

}  // namespace vc
