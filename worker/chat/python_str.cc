#include "worker/chat/python_str.h"

#include <utf8proc.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"

namespace vc::python {
namespace {

// Unicode's unconditional special casings (SpecialCasing.txt): the code points whose full upper,
// title or lower case is more than one code point (nullptr where the simple mapping is enough).
struct SpecialCase {
  char32_t c;
  const char* upper;
  const char* title;
  const char* lower;
};
constexpr SpecialCase kSpecialCases[] = {
    {0x00df, "SS", "Ss", nullptr},
    {0x0130, nullptr, nullptr, "i\u0307"},
    {0x0149, "\u02bcN", "\u02bcN", nullptr},
    {0x01f0, "J\u030c", "J\u030c", nullptr},
    {0x0390, "\u0399\u0308\u0301", "\u0399\u0308\u0301", nullptr},
    {0x03b0, "\u03a5\u0308\u0301", "\u03a5\u0308\u0301", nullptr},
    {0x0587, "\u0535\u0552", "\u0535\u0582", nullptr},
    {0x1e96, "H\u0331", "H\u0331", nullptr},
    {0x1e97, "T\u0308", "T\u0308", nullptr},
    {0x1e98, "W\u030a", "W\u030a", nullptr},
    {0x1e99, "Y\u030a", "Y\u030a", nullptr},
    {0x1e9a, "A\u02be", "A\u02be", nullptr},
    {0x1f50, "\u03a5\u0313", "\u03a5\u0313", nullptr},
    {0x1f52, "\u03a5\u0313\u0300", "\u03a5\u0313\u0300", nullptr},
    {0x1f54, "\u03a5\u0313\u0301", "\u03a5\u0313\u0301", nullptr},
    {0x1f56, "\u03a5\u0313\u0342", "\u03a5\u0313\u0342", nullptr},
    {0x1f80, "\u1f08\u0399", nullptr, nullptr},
    {0x1f81, "\u1f09\u0399", nullptr, nullptr},
    {0x1f82, "\u1f0a\u0399", nullptr, nullptr},
    {0x1f83, "\u1f0b\u0399", nullptr, nullptr},
    {0x1f84, "\u1f0c\u0399", nullptr, nullptr},
    {0x1f85, "\u1f0d\u0399", nullptr, nullptr},
    {0x1f86, "\u1f0e\u0399", nullptr, nullptr},
    {0x1f87, "\u1f0f\u0399", nullptr, nullptr},
    {0x1f88, "\u1f08\u0399", nullptr, nullptr},
    {0x1f89, "\u1f09\u0399", nullptr, nullptr},
    {0x1f8a, "\u1f0a\u0399", nullptr, nullptr},
    {0x1f8b, "\u1f0b\u0399", nullptr, nullptr},
    {0x1f8c, "\u1f0c\u0399", nullptr, nullptr},
    {0x1f8d, "\u1f0d\u0399", nullptr, nullptr},
    {0x1f8e, "\u1f0e\u0399", nullptr, nullptr},
    {0x1f8f, "\u1f0f\u0399", nullptr, nullptr},
    {0x1f90, "\u1f28\u0399", nullptr, nullptr},
    {0x1f91, "\u1f29\u0399", nullptr, nullptr},
    {0x1f92, "\u1f2a\u0399", nullptr, nullptr},
    {0x1f93, "\u1f2b\u0399", nullptr, nullptr},
    {0x1f94, "\u1f2c\u0399", nullptr, nullptr},
    {0x1f95, "\u1f2d\u0399", nullptr, nullptr},
    {0x1f96, "\u1f2e\u0399", nullptr, nullptr},
    {0x1f97, "\u1f2f\u0399", nullptr, nullptr},
    {0x1f98, "\u1f28\u0399", nullptr, nullptr},
    {0x1f99, "\u1f29\u0399", nullptr, nullptr},
    {0x1f9a, "\u1f2a\u0399", nullptr, nullptr},
    {0x1f9b, "\u1f2b\u0399", nullptr, nullptr},
    {0x1f9c, "\u1f2c\u0399", nullptr, nullptr},
    {0x1f9d, "\u1f2d\u0399", nullptr, nullptr},
    {0x1f9e, "\u1f2e\u0399", nullptr, nullptr},
    {0x1f9f, "\u1f2f\u0399", nullptr, nullptr},
    {0x1fa0, "\u1f68\u0399", nullptr, nullptr},
    {0x1fa1, "\u1f69\u0399", nullptr, nullptr},
    {0x1fa2, "\u1f6a\u0399", nullptr, nullptr},
    {0x1fa3, "\u1f6b\u0399", nullptr, nullptr},
    {0x1fa4, "\u1f6c\u0399", nullptr, nullptr},
    {0x1fa5, "\u1f6d\u0399", nullptr, nullptr},
    {0x1fa6, "\u1f6e\u0399", nullptr, nullptr},
    {0x1fa7, "\u1f6f\u0399", nullptr, nullptr},
    {0x1fa8, "\u1f68\u0399", nullptr, nullptr},
    {0x1fa9, "\u1f69\u0399", nullptr, nullptr},
    {0x1faa, "\u1f6a\u0399", nullptr, nullptr},
    {0x1fab, "\u1f6b\u0399", nullptr, nullptr},
    {0x1fac, "\u1f6c\u0399", nullptr, nullptr},
    {0x1fad, "\u1f6d\u0399", nullptr, nullptr},
    {0x1fae, "\u1f6e\u0399", nullptr, nullptr},
    {0x1faf, "\u1f6f\u0399", nullptr, nullptr},
    {0x1fb2, "\u1fba\u0399", "\u1fba\u0345", nullptr},
    {0x1fb3, "\u0391\u0399", nullptr, nullptr},
    {0x1fb4, "\u0386\u0399", "\u0386\u0345", nullptr},
    {0x1fb6, "\u0391\u0342", "\u0391\u0342", nullptr},
    {0x1fb7, "\u0391\u0342\u0399", "\u0391\u0342\u0345", nullptr},
    {0x1fbc, "\u0391\u0399", nullptr, nullptr},
    {0x1fc2, "\u1fca\u0399", "\u1fca\u0345", nullptr},
    {0x1fc3, "\u0397\u0399", nullptr, nullptr},
    {0x1fc4, "\u0389\u0399", "\u0389\u0345", nullptr},
    {0x1fc6, "\u0397\u0342", "\u0397\u0342", nullptr},
    {0x1fc7, "\u0397\u0342\u0399", "\u0397\u0342\u0345", nullptr},
    {0x1fcc, "\u0397\u0399", nullptr, nullptr},
    {0x1fd2, "\u0399\u0308\u0300", "\u0399\u0308\u0300", nullptr},
    {0x1fd3, "\u0399\u0308\u0301", "\u0399\u0308\u0301", nullptr},
    {0x1fd6, "\u0399\u0342", "\u0399\u0342", nullptr},
    {0x1fd7, "\u0399\u0308\u0342", "\u0399\u0308\u0342", nullptr},
    {0x1fe2, "\u03a5\u0308\u0300", "\u03a5\u0308\u0300", nullptr},
    {0x1fe3, "\u03a5\u0308\u0301", "\u03a5\u0308\u0301", nullptr},
    {0x1fe4, "\u03a1\u0313", "\u03a1\u0313", nullptr},
    {0x1fe6, "\u03a5\u0342", "\u03a5\u0342", nullptr},
    {0x1fe7, "\u03a5\u0308\u0342", "\u03a5\u0308\u0342", nullptr},
    {0x1ff2, "\u1ffa\u0399", "\u1ffa\u0345", nullptr},
    {0x1ff3, "\u03a9\u0399", nullptr, nullptr},
    {0x1ff4, "\u038f\u0399", "\u038f\u0345", nullptr},
    {0x1ff6, "\u03a9\u0342", "\u03a9\u0342", nullptr},
    {0x1ff7, "\u03a9\u0342\u0399", "\u03a9\u0342\u0345", nullptr},
    {0x1ffc, "\u03a9\u0399", nullptr, nullptr},
    {0xfb00, "FF", "Ff", nullptr},
    {0xfb01, "FI", "Fi", nullptr},
    {0xfb02, "FL", "Fl", nullptr},
    {0xfb03, "FFI", "Ffi", nullptr},
    {0xfb04, "FFL", "Ffl", nullptr},
    {0xfb05, "ST", "St", nullptr},
    {0xfb06, "ST", "St", nullptr},
    {0xfb13, "\u0544\u0546", "\u0544\u0576", nullptr},
    {0xfb14, "\u0544\u0535", "\u0544\u0565", nullptr},
    {0xfb15, "\u0544\u053b", "\u0544\u056b", nullptr},
    {0xfb16, "\u054e\u0546", "\u054e\u0576", nullptr},
    {0xfb17, "\u0544\u053d", "\u0544\u056d", nullptr},
};

const SpecialCase* FindSpecialCase(char32_t c) {
  const auto* end = std::end(kSpecialCases);
  const auto* it =
      std::lower_bound(std::begin(kSpecialCases), end, c, [](const SpecialCase& s, char32_t key) { return s.c < key; });
  return it != end && it->c == c ? it : nullptr;
}

struct Range {
  char32_t first, last;
};
// Code points outside the categories Ll and Lu that Unicode still calls lowercase or uppercase
// (Other_Lowercase, Other_Uppercase: ª, º, modifier letters, Roman numerals, circled letters ...).
constexpr Range kOtherLowercase[] = {
    {0xaa, 0xaa},     {0xba, 0xba},     {0x2b0, 0x2b8},     {0x2c0, 0x2c1},     {0x2e0, 0x2e4},     {0x345, 0x345},
    {0x37a, 0x37a},   {0x1d2c, 0x1d6a}, {0x1d78, 0x1d78},   {0x1d9b, 0x1dbf},   {0x2071, 0x2071},   {0x207f, 0x207f},
    {0x2090, 0x209c}, {0x2170, 0x217f}, {0x24d0, 0x24e9},   {0x2c7c, 0x2c7d},   {0xa69c, 0xa69d},   {0xa770, 0xa770},
    {0xa7f8, 0xa7f9}, {0xab5c, 0xab5f}, {0x10780, 0x10780}, {0x10783, 0x10785}, {0x10787, 0x107b0}, {0x107b2, 0x107ba},
};
constexpr Range kOtherUppercase[] = {
    {0x2160, 0x216f}, {0x24b6, 0x24cf}, {0x1f130, 0x1f149}, {0x1f150, 0x1f169}, {0x1f170, 0x1f189},
};

template <size_t N>
bool InRanges(const Range (&ranges)[N], char32_t c) {
  for (const Range& r : ranges) {
    if (c >= r.first && c <= r.last) return true;
  }
  return false;
}

template <size_t N>
bool Among(const char32_t (&set)[N], char32_t c) {
  return std::find(std::begin(set), std::end(set), c) != std::end(set);
}

// What str.isspace takes, besides U+2000 to U+200A.
constexpr char32_t kSpaces[] = {'\t', '\n', 0x0b, 0x0c,   '\r',   0x1c,   0x1d,   0x1e,   0x1f,
                                ' ',  0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000};
// Where str.splitlines splits ("\r\n" is one break).
constexpr char32_t kLineBreaks[] = {'\n', '\r', 0x0b, 0x0c, 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029};
// Word-internal punctuation (Word_Break MidLetter, MidNumLet and Single_Quote), case-ignorable.
constexpr char32_t kWordInternalPunctuation[] = {0x27,   0x2e,   0x3a,   0xb7,   0x387,  0x55f,  0x5f4,  0x2018, 0x2019,
                                                 0x2024, 0x2027, 0xfe13, 0xfe52, 0xfe55, 0xff07, 0xff0e, 0xff1a};

utf8proc_category_t Category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool IsLowerChar(char32_t c) { return Category(c) == UTF8PROC_CATEGORY_LL || InRanges(kOtherLowercase, c); }
bool IsUpperChar(char32_t c) { return Category(c) == UTF8PROC_CATEGORY_LU || InRanges(kOtherUppercase, c); }
bool IsTitleChar(char32_t c) { return Category(c) == UTF8PROC_CATEGORY_LT; }
bool IsCased(char32_t c) { return IsLowerChar(c) || IsUpperChar(c) || IsTitleChar(c); }

// Unicode's Case_Ignorable: marks, format characters, modifiers and the word-internal punctuation.
bool IsCaseIgnorable(char32_t c) {
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      break;
  }
  return Among(kWordInternalPunctuation, c);
}

void AppendMapped(char32_t c, const char* special, utf8proc_int32_t (*simple)(utf8proc_int32_t), std::string* out) {
  if (special != nullptr) {
    out->append(special);
  } else {
    AppendUtf8(static_cast<char32_t>(simple(static_cast<utf8proc_int32_t>(c))), out);
  }
}

void AppendUpper(char32_t c, std::string* out) {
  const SpecialCase* s = FindSpecialCase(c);
  AppendMapped(c, s ? s->upper : nullptr, utf8proc_toupper, out);
}

void AppendTitle(char32_t c, std::string* out) {
  const SpecialCase* s = FindSpecialCase(c);
  AppendMapped(c, s ? s->title : nullptr, utf8proc_totitle, out);
}

// The lower case of text[i], with the final-sigma rule for capital sigma.
void AppendLower(const std::u32string& text, size_t i, std::string* out) {
  const char32_t c = text[i];
  if (c == 0x3a3) {
    size_t j = i;
    while (j > 0 && IsCaseIgnorable(text[j - 1])) --j;
    bool final_sigma = j > 0 && IsCased(text[j - 1]);
    if (final_sigma) {
      size_t k = i + 1;
      while (k < text.size() && IsCaseIgnorable(text[k])) ++k;
      final_sigma = k == text.size() || !IsCased(text[k]);
    }
    AppendUtf8(final_sigma ? 0x3c2 : 0x3c3, out);
    return;
  }
  const SpecialCase* s = FindSpecialCase(c);
  AppendMapped(c, s ? s->lower : nullptr, utf8proc_tolower, out);
}

bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool IsLineBreak(char32_t c) { return Among(kLineBreaks, c); }

std::vector<std::string> SplitOnWhitespace(const std::u32string& s, int64_t max_split) {
  std::vector<std::string> parts;
  size_t i = 0;
  const size_t n = s.size();
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    while (i < n && IsSpace(s[i])) ++i;
    if (i == n) break;
    const size_t j = i;
    while (i < n && !IsSpace(s[i])) ++i;
    parts.push_back(Encode(std::u32string_view(s).substr(j, i - j)));
  }
  while (i < n && IsSpace(s[i])) ++i;
  if (i < n) parts.push_back(Encode(std::u32string_view(s).substr(i)));
  return parts;
}

std::vector<std::string> RSplitOnWhitespace(const std::u32string& s, int64_t max_split) {
  std::vector<std::string> parts;
  size_t i = s.size();  // one past the next character to look at
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    while (i > 0 && IsSpace(s[i - 1])) --i;
    if (i == 0) break;
    const size_t end = i;
    while (i > 0 && !IsSpace(s[i - 1])) --i;
    parts.push_back(Encode(std::u32string_view(s).substr(i, end - i)));
  }
  while (i > 0 && IsSpace(s[i - 1])) --i;
  if (i > 0) parts.push_back(Encode(std::u32string_view(s).substr(0, i)));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::u32string Decode(absl::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<uint8_t>(text[i]);
    int n = c < 0x80 ? 0 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
    char32_t cp = n == 0 ? c : n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k <= n && i + k < text.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3f);
    out.push_back(cp);
    i += n + 1;
  }
  return out;
}

std::string Encode(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (const char32_t c : code_points) AppendUtf8(c, &out);
  return out;
}

int64_t Length(absl::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<uint8_t>(c) & 0xc0) != 0x80;
  return n;
}

bool IsSpace(char32_t c) { return Among(kSpaces, c) || (c >= 0x2000 && c <= 0x200a); }

bool IsAlpha(char32_t c) {
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool IsAlnum(char32_t c) {
  if (IsAlpha(c)) return true;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

std::string Upper(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t c : Decode(text)) AppendUpper(c, &out);
  return out;
}

std::string Lower(absl::string_view text) {
  const std::u32string s = Decode(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < s.size(); ++i) AppendLower(s, i, &out);
  return out;
}

std::string Title(absl::string_view text) {
  const std::u32string s = Decode(text);
  std::string out;
  out.reserve(text.size());
  bool previous_is_cased = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (previous_is_cased) {
      AppendLower(s, i, &out);
    } else {
      AppendTitle(s[i], &out);
    }
    previous_is_cased = IsCased(s[i]);
  }
  return out;
}

std::string Capitalize(absl::string_view text) {
  const std::u32string s = Decode(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 0) {
      AppendTitle(s[i], &out);
    } else {
      AppendLower(s, i, &out);
    }
  }
  return out;
}

bool IsLower(absl::string_view text) {
  bool cased = false;
  for (const char32_t c : Decode(text)) {
    if (IsUpperChar(c) || IsTitleChar(c)) return false;
    cased = cased || IsLowerChar(c);
  }
  return cased;
}

bool IsUpper(absl::string_view text) {
  bool cased = false;
  for (const char32_t c : Decode(text)) {
    if (IsLowerChar(c) || IsTitleChar(c)) return false;
    cased = cased || IsUpperChar(c);
  }
  return cased;
}

std::string Strip(absl::string_view text, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string s = Decode(text);
  const std::u32string set = chars ? Decode(*chars) : std::u32string();
  const auto strips = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : IsSpace(c); };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && strips(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strips(s[end - 1])) --end;
  }
  return Encode(std::u32string_view(s).substr(begin, end - begin));
}

std::vector<std::string> Split(absl::string_view text, const std::optional<std::string>& sep, int64_t max_split) {
  if (!sep) return SplitOnWhitespace(Decode(text), max_split);
  std::vector<std::string> parts;
  size_t i = 0;
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    const size_t at = text.find(*sep, i);
    if (at == absl::string_view::npos) break;
    parts.emplace_back(text.substr(i, at - i));
    i = at + sep->size();
  }
  parts.emplace_back(text.substr(i));
  return parts;
}

std::vector<std::string> RSplit(absl::string_view text, const std::optional<std::string>& sep, int64_t max_split) {
  if (!sep) return RSplitOnWhitespace(Decode(text), max_split);
  std::vector<std::string> parts;
  size_t end = text.size();
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    if (end < sep->size()) break;
    const size_t at = text.substr(0, end).rfind(*sep);
    if (at == absl::string_view::npos) break;
    parts.emplace_back(text.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  parts.emplace_back(text.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> SplitLines(absl::string_view text, bool keep_ends) {
  const std::u32string s = Decode(text);
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!IsLineBreak(s[i])) continue;
    size_t end = i + 1;
    if (s[i] == '\r' && end < s.size() && s[end] == '\n') ++end;
    lines.push_back(Encode(std::u32string_view(s).substr(begin, (keep_ends ? end : i) - begin)));
    begin = end;
    i = end - 1;
  }
  if (begin < s.size()) lines.push_back(Encode(std::u32string_view(s).substr(begin)));
  return lines;
}

std::string Replace(absl::string_view text, absl::string_view old, absl::string_view replacement, int64_t count) {
  std::string out;
  int64_t left = count < 0 ? INT64_MAX : count;
  if (old.empty()) {
    // An empty pattern matches before each character and at the end.
    const std::u32string s = Decode(text);
    for (const char32_t c : s) {
      if (left > 0) {
        absl::StrAppend(&out, replacement);
        --left;
      }
      AppendUtf8(c, &out);
    }
    if (left > 0) absl::StrAppend(&out, replacement);
    return out;
  }
  size_t i = 0;
  for (; left > 0; --left) {
    const size_t at = text.find(old, i);
    if (at == absl::string_view::npos) break;
    absl::StrAppend(&out, text.substr(i, at - i));
    absl::StrAppend(&out, replacement);
    i = at + old.size();
  }
  absl::StrAppend(&out, text.substr(i));
  return out;
}

std::string Pad(absl::string_view text, int64_t width, char32_t fill, Align align) {
  const int64_t length = Length(text);
  if (width <= length) return std::string(text);
  const int64_t margin = width - length;
  int64_t before = 0;
  switch (align) {
    case Align::kLeft:
      before = 0;
      break;
    case Align::kRight:
      before = margin;
      break;
    case Align::kCenter:
      before = margin / 2 + (margin & width & 1);  // CPython's rule for odd margins
      break;
  }
  std::string pad_before, pad_after;
  for (int64_t i = 0; i < before; ++i) AppendUtf8(fill, &pad_before);
  for (int64_t i = before; i < margin; ++i) AppendUtf8(fill, &pad_after);
  return pad_before + std::string(text) + pad_after;
}

std::string Repr(absl::string_view text) {
  const std::u32string s = Decode(text);
  const bool has_single = s.find(U'\'') != std::u32string::npos;
  const bool has_double = s.find(U'"') != std::u32string::npos;
  const char32_t quote = has_single && !has_double ? U'"' : U'\'';
  std::string out;
  AppendUtf8(quote, &out);
  for (const char32_t c : s) {
    if (c == quote || c == U'\\') {
      out.push_back('\\');
      AppendUtf8(c, &out);
    } else if (c == U'\t') {
      out.append("\\t");
    } else if (c == U'\n') {
      out.append("\\n");
    } else if (c == U'\r') {
      out.append("\\r");
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint32_t>(c));
    } else if (c < 0x7f || IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else if (c <= 0xff) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint32_t>(c));
    } else if (c <= 0xffff) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<uint32_t>(c));
    } else {
      absl::StrAppendFormat(&out, "\\U%08x", static_cast<uint32_t>(c));
    }
  }
  AppendUtf8(quote, &out);
  return out;
}

}  // namespace vc::python
