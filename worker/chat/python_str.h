// Python's str operations on UTF-8 text, as CPython 3.11 does them: indices and lengths count code
// points, whitespace and case are Unicode's (case mapping by utf8proc plus Unicode's unconditional
// special casings, and the final-sigma rule of str.lower), repr picks its quotes and escapes as
// Python does. Every function takes valid UTF-8.
#ifndef VC_WORKER_CHAT_PYTHON_STR_H_
#define VC_WORKER_CHAT_PYTHON_STR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace vc::python {

std::u32string Decode(absl::string_view text);
std::string Encode(std::u32string_view code_points);
// The number of code points (len()).
int64_t Length(absl::string_view text);

// str.isspace of one code point (what str.split() and str.strip() take as whitespace).
bool IsSpace(char32_t c);
// str.isalpha of one code point (the letter categories).
bool IsAlpha(char32_t c);
// Letters and numbers (the categories L* and N*: what a regex's \w takes, with "_").
bool IsAlnum(char32_t c);

std::string Upper(absl::string_view text);
std::string Lower(absl::string_view text);
std::string Title(absl::string_view text);
std::string Capitalize(absl::string_view text);
// str.islower / str.isupper: some cased character, and none of the other case.
bool IsLower(absl::string_view text);
bool IsUpper(absl::string_view text);

// str.strip / lstrip / rstrip; `chars` absent strips whitespace.
std::string Strip(absl::string_view text, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; `sep` absent splits on runs of whitespace. `sep` must not be empty;
// `max_split` < 0 splits everywhere.
std::vector<std::string> Split(absl::string_view text, const std::optional<std::string>& sep, int64_t max_split);
std::vector<std::string> RSplit(absl::string_view text, const std::optional<std::string>& sep, int64_t max_split);
// str.splitlines (Python's line boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029).
std::vector<std::string> SplitLines(absl::string_view text, bool keep_ends);
// str.replace; `count` < 0 replaces every occurrence.
std::string Replace(absl::string_view text, absl::string_view old, absl::string_view replacement, int64_t count);
enum class Align { kLeft, kCenter, kRight };
// str.ljust / str.center / str.rjust: `text` padded with `fill` to `width` code points.
std::string Pad(absl::string_view text, int64_t width, char32_t fill, Align align);

// repr(text): 'text' in single quotes unless it holds ' and not ", escapes as Python's.
std::string Repr(absl::string_view text);

}  // namespace vc::python

#endif  // VC_WORKER_CHAT_PYTHON_STR_H_
