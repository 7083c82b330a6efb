// What of a Generate request's output may be sent: its stop sequences, and characters whole.
#ifndef VC_SERVICES_STOP_SCANNER_H_
#define VC_SERVICES_STOP_SCANNER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "worker/runtime/text_stream.h"
#include "worker/runtime/tokenizer.h"

namespace vc {

// Tokens come in as they are verified, in batches of any size. The output ends at the stop that
// is complete first in the generated text (the one whose last byte comes earliest; of several
// ending on the same byte, the longest), before its first byte; the tokens sent are those whose
// text ends there or before. A token is held back while its text reaches into the last
// (longest stop - 1) bytes of the text so far, where a stop ending later could begin, and while
// its bytes end inside a character (TextStream): each batch sent carries whole characters. The
// result depends on the text alone, never on how the tokens were batched. Not thread-safe.
class StopScanner {
 public:
  // Tokens that may be sent now, and their text.
  struct Sendable {
    std::vector<int32_t> tokens;
    std::string text;
  };

  // `stops` must not hold an empty string; `context`: the ids before the output (the prompt's);
  // `tokenizer` must outlive the scanner.
  StopScanner(const Tokenizer& tokenizer, std::vector<std::string> stops, absl::Span<const int32_t> context = {});

  // Takes new tokens; returns those that may be sent now. `done`: no more will come (a character
  // still open is then sent, as U+FFFD).
  Sendable Take(absl::Span<const int32_t> tokens, bool done);
  bool stopped() const { return stop_at_ != std::string::npos; }

 private:
  const std::vector<std::string> stops_;
  size_t longest_ = 0;
  TextStream stream_;
  std::string text_;          // the generated text so far
  size_t sent_ = 0;           // how much of it has been sent
  std::deque<int32_t> held_;  // tokens not sent yet
  std::deque<size_t> ends_;   // where each held token's text ends in text_ (npos: its character is open)
  size_t stop_at_ = std::string::npos;
};

}  // namespace vc

#endif  // VC_SERVICES_STOP_SCANNER_H_
