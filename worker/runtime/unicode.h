// UTF-8 text as tokenizers need it: repairing invalid bytes, finding a character cut short,
// Unicode normalization (utf8proc) and regular expressions with Unicode classes (PCRE2).
#ifndef VC_WORKER_RUNTIME_UNICODE_H_
#define VC_WORKER_RUNTIME_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc {

// `bytes` with each maximal invalid UTF-8 subsequence replaced by U+FFFD (the WHATWG decoder's
// rule, which JavaScript's TextDecoder and Rust's from_utf8_lossy follow). Valid input is returned
// unchanged.
std::string ToValidUtf8(absl::string_view bytes);

// The number of bytes (0 to 3) at the end of `bytes` that begin a UTF-8 character not yet complete:
// more bytes could still make it valid.
size_t IncompleteUtf8Suffix(absl::string_view bytes);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// `text` (valid UTF-8) in normal form `form`, by utf8proc (Unicode 15). kInvalidArgument for
// invalid UTF-8.
absl::StatusOr<std::string> NormalizeUnicode(absl::string_view text, NormalForm form);

// A compiled regular expression over UTF-8 text, with Unicode properties (\p{L}, \p{N}, ...),
// lookahead and inline flags, by PCRE2 (JIT-compiled where the platform allows). `\s` means what it
// means in JavaScript (the tokenizers' reference port): tab, LF, VT, FF, CR, U+FEFF, U+2028, U+2029
// and the space separators (Zs). Thread-safe (immutable).
class UnicodeRegex {
 public:
  // kInvalidArgument naming the offset and PCRE2's reason when `pattern` does not compile.
  static absl::StatusOr<std::unique_ptr<UnicodeRegex>> Compile(absl::string_view pattern);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Calls `on_match(begin, end)` for each non-overlapping non-empty match in `text` (valid UTF-8),
  // left to right, as JavaScript's matchAll finds them.
  void ForEachMatch(absl::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

 private:
  struct Code;
  explicit UnicodeRegex(std::unique_ptr<Code> code);
  std::unique_ptr<Code> code_;
};

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_UNICODE_H_
