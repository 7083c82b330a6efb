// The text of an output as its tokens come, one message at a time, never cutting a UTF-8 character
// (or a run of byte-fallback tokens) in two.
#ifndef VC_WORKER_RUNTIME_TEXT_STREAM_H_
#define VC_WORKER_RUNTIME_TEXT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "worker/runtime/tokenizer.h"

namespace vc {

// A token whose bytes end inside a character has no text of its own: its bytes come out with the
// token that completes the character. The texts given out add up to what the output adds to the
// decoded text of `context` (so a decoder's strip of a leading space applies to the prompt, not to
// each piece), with bytes that can never make UTF-8 as U+FFFD. Not thread-safe.
class TextStream {
 public:
  // `context`: the ids before the output (the prompt's, and output sent before a resume); only
  // the last few are kept. `tokenizer` must outlive the stream.
  TextStream(const Tokenizer& tokenizer, absl::Span<const int32_t> context);

  // Takes the output's next token; returns the text it completes ("" while a character is open,
  // or for a token with no text, such as a special one).
  std::string Add(int32_t id);
  // The tokens taken whose text has not come out yet (their character is still open).
  size_t held() const { return ids_.size() - read_; }
  // At the end of the output: the held tokens' bytes, an open character as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;  // a window: ids_[0, read_) decoded to prefix_, then those held
  size_t read_ = 0;
  std::string prefix_;
};

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_TEXT_STREAM_H_
