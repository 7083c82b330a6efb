// Stop sequences of a Generate request: what of the generated tokens may be sent.
#ifndef VC_SERVICES_STOP_SCANNER_H_
#define VC_SERVICES_STOP_SCANNER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "worker/runtime/tokenizer.h"

namespace vc {

// Tokens come in as they are verified, in batches of any size. The output ends at the stop that
// is complete first in the generated text (the one whose last byte comes earliest; of several
// ending on the same byte, the longest), before its first byte; the tokens sent are those whose
// text ends there or before. A token is held back while its text reaches into the last
// (longest stop - 1) bytes of the text so far, where a stop ending later could begin. The result
// depends on the text alone, never on how the tokens were batched.
class StopScanner {
 public:
  // `stops` must not hold an empty string; `tokenizer` must outlive the scanner.
  StopScanner(const Tokenizer& tokenizer, std::vector<std::string> stops);

  // Takes new tokens; returns those that may be sent now. `done`: no more will come.
  std::vector<int32_t> Take(absl::Span<const int32_t> tokens, bool done);
  bool stopped() const { return stop_at_ != std::string::npos; }

 private:
  const Tokenizer& tokenizer_;
  const std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::string text_;         // the generated text so far
  std::deque<int32_t> held_;  // tokens not sent yet
  std::deque<size_t> ends_;   // where each held token's text ends in text_
  size_t stop_at_ = std::string::npos;
};

}  // namespace vc

#endif  // VC_SERVICES_STOP_SCANNER_H_
