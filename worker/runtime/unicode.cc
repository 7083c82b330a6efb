#include "worker/runtime/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

// The length of the valid UTF-8 character at the start of `s`, or 0 when it is not one. `*prefix`
// is set to the length of the longest prefix that could still become one (for invalid input).
size_t ValidCharLength(absl::string_view s, size_t* prefix) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  *prefix = 0;
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629's table)
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  *prefix = 1;
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return 0;
    const uint8_t x = b(i);
    if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return 0;
    *prefix = i + 1;
  }
  return need;
}

// JavaScript's \s, as the body of a character class.
constexpr absl::string_view kJsSpaceClass = "\\t\\n\\x{0B}\\f\\r\\x{FEFF}\\x{2028}\\x{2029}\\p{Zs}";

// `pattern` with \s and \S spelled out as JavaScript means them (PCRE2's \s, under Unicode rules,
// leaves out U+FEFF). kInvalidArgument for \S inside a character class, which has no spelling.
absl::StatusOr<std::string> WithJsSpaces(absl::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? kJsSpaceClass : absl::StrCat("[", kJsSpaceClass, "]"));
      } else if (e == 'S') {
        if (in_class) {
          return absl::InvalidArgumentError(absl::StrCat("\\S inside a character class (at offset ", i - 1, ")"));
        }
        absl::StrAppend(&out, "[^", kJsSpaceClass, "]");
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' (or '^]') first in a class is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string ToValidUtf8(absl::string_view bytes) {
  std::string out;
  size_t i = 0, copied = 0;
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t prefix;
    const size_t n = ValidCharLength(bytes.substr(i), &prefix);
    if (n > 0) {
      i += n;
      continue;
    }
    if (out.empty() && copied == 0) out.reserve(bytes.size() + 8);
    out.append(bytes.data() + copied, i - copied);
    out.append("\xEF\xBF\xBD");
    i += prefix > 0 ? prefix : 1;
    copied = i;
  }
  if (copied == 0) return std::string(bytes);
  out.append(bytes.data() + copied, bytes.size() - copied);
  return out;
}

size_t IncompleteUtf8Suffix(absl::string_view bytes) {
  // A character is at most 4 bytes: only a lead byte among the last 3 can begin an unfinished one.
  for (size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const uint8_t c = static_cast<uint8_t>(bytes[bytes.size() - back]);
    if (c < 0x80) return 0;
    if (c >= 0xC0) {
      size_t prefix;
      const absl::string_view tail = bytes.substr(bytes.size() - back);
      return ValidCharLength(tail, &prefix) == 0 && prefix == back ? back : 0;
    }
  }
  return 0;
}

absl::StatusOr<std::string> NormalizeUnicode(absl::string_view text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &out, static_cast<utf8proc_option_t>(options));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Unicode normalization: ", utf8proc_errmsg(n)));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

struct UnicodeRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

UnicodeRegex::UnicodeRegex(std::unique_ptr<Code> code) : code_(std::move(code)) {}
UnicodeRegex::~UnicodeRegex() = default;

absl::StatusOr<std::unique_ptr<UnicodeRegex>> UnicodeRegex::Compile(absl::string_view pattern) {
  absl::StatusOr<std::string> js = WithJsSpaces(pattern);
  if (!js.ok()) return absl::InvalidArgumentError(absl::StrCat("regex '", pattern, "': ", js.status().message()));
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(js->data()), js->size(), PCRE2_UTF | PCRE2_UCP, &error,
                             &offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex '", pattern, "' does not compile: ",
                                                   reinterpret_cast<const char*>(message), " (at offset ", offset,
                                                   " of its PCRE2 form '", *js, "')"));
  }
  // Without JIT (a platform PCRE2 has none for) matching still works, more slowly.
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<UnicodeRegex>(new UnicodeRegex(std::move(code)));
}

void UnicodeRegex::ForEachMatch(absl::string_view text, const std::function<void(size_t, size_t)>& on_match) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), at, 0, md.get(), nullptr)
                        : PCRE2_ERROR_JIT_BADOPTION;
    // The JIT's stack is small; the interpreter keeps its backtracking on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      rc = pcre2_match(code_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    }
    if (rc < 0) return;  // no more matches (text is valid UTF-8, so nothing else can fail)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      on_match(begin, end);
      at = end;
    } else {
      // An empty match: go on from the next character, as matchAll does.
      at = begin + 1;
      while (at < text.size() && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80) ++at;
    }
  }
}

}  // namespace vc
