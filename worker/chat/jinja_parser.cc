#include "worker/chat/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "worker/chat/jinja_builtins.h"
#include "worker/chat/python_str.h"

namespace vc::jinja {
namespace {

// Deeper nesting than this (of expressions or of blocks) is refused rather than risking the stack.
constexpr int kMaxDepth = 200;

absl::Status ErrorAt(Location at, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", at.line, ", column ", at.column, ": ", message));
}

// ---------------------------------------------------------------------------------------------
// Lexer

enum class TokenType {
  kData,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof
};

struct Token {
  TokenType type;
  std::string text;  // data, a name, a string's value, an operator
  int64_t integer = 0;
  double number = 0;
  Location at;
};

// The length of the whitespace code point (Python's \s) at text[i], or 0.
size_t SpaceAt(absl::string_view text, size_t i) {
  if (i >= text.size()) return 0;
  const auto c = static_cast<uint8_t>(text[i]);
  if (c < 0x80) return python::IsSpace(c) ? 1 : 0;
  const size_t n = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
  const std::u32string cp = python::Decode(text.substr(i, n));
  return !cp.empty() && python::IsSpace(cp[0]) ? n : 0;
}

size_t SkipSpaces(absl::string_view text, size_t i) {
  for (size_t n; (n = SpaceAt(text, i)) > 0;) i += n;
  return i;
}

bool AllSpaces(absl::string_view text) { return SkipSpaces(text, 0) == text.size(); }

// Python's str.rstrip().
absl::string_view RStrip(absl::string_view text) {
  const std::u32string cps = python::Decode(text);
  size_t keep = cps.size();
  while (keep > 0 && python::IsSpace(cps[keep - 1])) --keep;
  return text.substr(0, python::Encode(std::u32string_view(cps).substr(0, keep)).size());
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's unicode-escape decoding of a string literal's body, after jinja2's encoding of what is
// past ASCII as backslash escapes (so a backslash before such a character stays a backslash, and
// the character becomes its escape's text: '\é' is the four characters \xe9).
absl::StatusOr<std::string> Unescape(absl::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size();) {
    if (body[i] != '\\') {
      out.push_back(body[i++]);
      continue;
    }
    const char d = body[i + 1];  // the lexer ends a literal only after a complete escape
    i += 2;
    if (static_cast<uint8_t>(d) >= 0x80) {
      const size_t start = i - 1;
      size_t end = start + 1;
      while (end < body.size() && (static_cast<uint8_t>(body[end]) & 0xc0) == 0x80) ++end;
      const char32_t c = python::Decode(body.substr(start, end - start))[0];
      out += c <= 0xff     ? absl::StrFormat("\\x%02x", static_cast<uint32_t>(c))
             : c <= 0xffff ? absl::StrFormat("\\u%04x", static_cast<uint32_t>(c))
                           : absl::StrFormat("\\U%08x", static_cast<uint32_t>(c));
      i = end;
      continue;
    }
    switch (d) {
      case '\n':
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(d);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = d == 'x' ? 2 : d == 'u' ? 4 : 8;
        uint32_t c = 0;
        for (size_t k = 0; k < digits; ++k) {
          const int h = i + k < body.size() ? HexValue(body[i + k]) : -1;
          if (h < 0) return absl::InvalidArgumentError(absl::StrCat("truncated \\", std::string(1, d), " escape"));
          c = c * 16 + static_cast<uint32_t>(h);
        }
        i += digits;
        if (c > 0x10ffff) return absl::InvalidArgumentError("illegal Unicode character");
        if (c >= 0xd800 && c < 0xe000) {
          return absl::InvalidArgumentError("a surrogate code point in a string literal (not supported)");
        }
        AppendUtf8(c, &out);
        break;
      }
      case 'N':
        return absl::InvalidArgumentError("\\N{...} escapes are not supported");
      default:
        if (d >= '0' && d <= '7') {
          uint32_t c = static_cast<uint32_t>(d - '0');
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k) {
            c = c * 8 + static_cast<uint32_t>(body[i++] - '0');
          }
          AppendUtf8(c, &out);
        } else {
          out.push_back('\\');  // an unknown escape stays as written
          out.push_back(d);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) : source_(Normalize(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source_.size(); ++i) {
      if (source_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Tokenize() {
    while (pos_ < source_.size()) VC_RETURN_IF_ERROR(LexRoot());
    Emit(TokenType::kEof, "", source_.size());
    return std::move(tokens_);
  }

 private:
  enum class Tag { kComment, kBlock, kVariable, kRaw };

  // jinja2 reads "\r\n" and "\r" as "\n", and drops one newline at the very end.
  static std::string Normalize(absl::string_view source) {
    std::string out;
    out.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        out.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        out.push_back(source[i]);
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  Location At(size_t pos) const {
    const auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - 1;
    const int column = static_cast<int>(python::Length(absl::string_view(source_).substr(*line, pos - *line))) + 1;
    return Location{static_cast<int>(line - line_starts_.begin()) + 1, column};
  }

  absl::Status Error(size_t pos, absl::string_view message) const { return ErrorAt(At(pos), message); }

  void Emit(TokenType type, std::string text, size_t pos) {
    tokens_.push_back(Token{type, std::move(text), 0, 0, At(pos)});
  }

  bool StartsWith(size_t pos, absl::string_view s) const {
    return absl::string_view(source_).substr(pos, s.size()) == s;
  }

  // The end of `{%[-+]?\s*<word>\s*(-%}\s*|%}<suffix>)` at `pos` (the raw and endraw tags), or npos.
  // `plus_end` allows "+%}"; `trim_newline` takes one "\n" after "%}".
  size_t MatchWordTag(size_t pos, absl::string_view word, bool plus_end, bool trim_newline) const {
    if (!StartsWith(pos, "{%")) return std::string::npos;
    size_t i = pos + 2;
    if (i < source_.size() && (source_[i] == '-' || source_[i] == '+')) ++i;
    i = SkipSpaces(source_, i);
    if (!StartsWith(i, word)) return std::string::npos;
    i = SkipSpaces(source_, i + word.size());
    if (plus_end && StartsWith(i, "+%}")) return i + 3;
    if (StartsWith(i, "-%}")) return SkipSpaces(source_, i + 3);
    if (StartsWith(i, "%}")) return i + 2 + (trim_newline && StartsWith(i + 2, "\n") ? 1 : 0);
    return std::string::npos;
  }

  // Data up to a tag, stripped as the tag's sign and lstrip_blocks ask.
  void EmitData(size_t begin, size_t end, char sign, bool lstrip) {
    absl::string_view text = absl::string_view(source_).substr(begin, end - begin);
    if (sign == '-') {
      text = RStrip(text);
    } else if (sign != '+' && lstrip) {
      const size_t line = text.rfind('\n') + 1;  // npos + 1 == 0
      if ((line > 0 || line_starting_) && line < text.size() && AllSpaces(text.substr(line))) {
        text = text.substr(0, line);
      }
    }
    if (!text.empty()) Emit(TokenType::kData, std::string(text), begin);
  }

  absl::Status LexRoot() {
    // The next "{{", "{%" or "{#".
    size_t at = pos_;
    while (true) {
      at = source_.find('{', at);
      if (at == std::string::npos || at + 1 == source_.size()) {
        at = std::string::npos;
        break;
      }
      const char next = source_[at + 1];
      if (next == '{' || next == '%' || next == '#') break;
      ++at;
    }
    if (at == std::string::npos) {
      Emit(TokenType::kData, source_.substr(pos_), pos_);
      pos_ = source_.size();
      return absl::OkStatus();
    }
    const size_t raw_end = MatchWordTag(at, "raw", /*plus_end=*/false, /*trim_newline=*/false);
    const Tag tag = raw_end != std::string::npos ? Tag::kRaw
                    : source_[at + 1] == '#'     ? Tag::kComment
                    : source_[at + 1] == '%'     ? Tag::kBlock
                                                 : Tag::kVariable;
    const char sign =
        at + 2 < source_.size() && (source_[at + 2] == '-' || source_[at + 2] == '+') ? source_[at + 2] : 0;
    EmitData(pos_, at, sign, /*lstrip=*/tag != Tag::kVariable);
    line_starting_ = false;
    pos_ = at + 2 + (sign != 0 ? 1 : 0);
    switch (tag) {
      case Tag::kComment:
        return LexComment(at);
      case Tag::kBlock:
        Emit(TokenType::kBlockBegin, "", at);
        return LexTag(at, /*block=*/true);
      case Tag::kVariable:
        Emit(TokenType::kVariableBegin, "", at);
        return LexTag(at, /*block=*/false);
      case Tag::kRaw:
        line_starting_ = source_[raw_end - 1] == '\n';
        pos_ = raw_end;
        return LexRaw(at);
    }
    return absl::OkStatus();
  }

  absl::Status LexComment(size_t begin) {
    for (size_t i = pos_; i < source_.size(); ++i) {
      size_t end = std::string::npos;
      if (StartsWith(i, "+#}")) {
        end = i + 3;
      } else if (StartsWith(i, "-#}")) {
        end = SkipSpaces(source_, i + 3);
      } else if (StartsWith(i, "#}")) {
        end = i + 2 + (StartsWith(i + 2, "\n") ? 1 : 0);
      }
      if (end != std::string::npos) {
        line_starting_ = source_[end - 1] == '\n';
        pos_ = end;
        return absl::OkStatus();
      }
    }
    return Error(begin, "missing end of comment tag");
  }

  absl::Status LexRaw(size_t begin) {
    for (size_t i = pos_; i < source_.size(); ++i) {
      const size_t end = MatchWordTag(i, "endraw", /*plus_end=*/true, /*trim_newline=*/true);
      if (end == std::string::npos) continue;
      const char sign = source_[i + 2] == '-' || source_[i + 2] == '+' ? source_[i + 2] : 0;
      EmitData(pos_, i, sign, /*lstrip=*/true);
      line_starting_ = source_[end - 1] == '\n';
      pos_ = end;
      return absl::OkStatus();
    }
    return Error(begin, "missing end of raw directive");
  }

  // The end of the tag at pos_ ("%}" or "}}" with their whitespace control), or npos.
  size_t TagEnd(bool block) const {
    if (block) {
      if (StartsWith(pos_, "+%}")) return pos_ + 3;
      if (StartsWith(pos_, "-%}")) return SkipSpaces(source_, pos_ + 3);
      if (StartsWith(pos_, "%}")) return pos_ + 2 + (StartsWith(pos_ + 2, "\n") ? 1 : 0);
    } else {
      if (StartsWith(pos_, "-}}")) return SkipSpaces(source_, pos_ + 3);
      if (StartsWith(pos_, "}}")) return pos_ + 2;
    }
    return std::string::npos;
  }

  absl::Status LexTag(size_t begin, bool block) {
    std::vector<char> open_brackets;  // tag ends count only outside brackets
    while (pos_ < source_.size()) {
      if (open_brackets.empty()) {
        const size_t end = TagEnd(block);
        if (end != std::string::npos) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", pos_);
          line_starting_ = source_[end - 1] == '\n';
          pos_ = end;
          return absl::OkStatus();
        }
      }
      const size_t after_space = SkipSpaces(source_, pos_);
      if (after_space > pos_) {
        line_starting_ = source_[after_space - 1] == '\n';
        pos_ = after_space;
        continue;
      }
      line_starting_ = false;
      VC_RETURN_IF_ERROR(LexToken(&open_brackets));
    }
    return Error(begin, block ? "unexpected end of template: the block tag is not closed"
                              : "unexpected end of template: the expression tag is not closed");
  }

  // `(\d+_)*\d+` at i: the end, or i when there is no digit.
  size_t Digits(size_t i) const {
    if (i >= source_.size() || !IsDigit(source_[i])) return i;
    while (i < source_.size() && IsDigit(source_[i])) ++i;
    while (i + 1 < source_.size() && source_[i] == '_' && IsDigit(source_[i + 1])) {
      for (++i; i < source_.size() && IsDigit(source_[i]);) ++i;
    }
    return i;
  }

  // jinja2's float: digits, then an exponent (after an optional fraction) or a fraction; not
  // right after a dot. The end, or npos.
  size_t FloatEnd() const {
    if (pos_ > 0 && source_[pos_ - 1] == '.') return std::string::npos;
    const size_t whole = Digits(pos_);
    if (whole == pos_) return std::string::npos;
    size_t fraction = std::string::npos;
    if (StartsWith(whole, ".")) {
      const size_t f = Digits(whole + 1);
      if (f > whole + 1) fraction = f;
    }
    const auto exponent = [&](size_t i) -> size_t {
      if (i >= source_.size() || (source_[i] != 'e' && source_[i] != 'E')) return std::string::npos;
      ++i;
      if (i < source_.size() && (source_[i] == '+' || source_[i] == '-')) ++i;
      const size_t e = Digits(i);
      return e > i ? e : std::string::npos;
    };
    if (fraction != std::string::npos) {
      const size_t e = exponent(fraction);
      return e != std::string::npos ? e : fraction;
    }
    return exponent(whole);
  }

  // jinja2's integer: 0b.., 0o.., 0x.. (with "_" between digits), decimal, or zeros. The end and
  // the base, or npos.
  std::pair<size_t, int> IntegerEnd() const {
    if (!IsDigit(source_[pos_])) return {std::string::npos, 0};
    if (source_[pos_] == '0' && pos_ + 1 < source_.size()) {
      const char p = static_cast<char>(source_[pos_ + 1] | 0x20);
      const int base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
      if (base != 0) {
        const auto in_base = [&](char c) { return HexValue(c) >= 0 && HexValue(c) < base; };
        size_t i = pos_ + 2;
        while (i < source_.size()) {
          if (in_base(source_[i])) {
            ++i;
          } else if (source_[i] == '_' && i + 1 < source_.size() && in_base(source_[i + 1])) {
            i += 2;
          } else {
            break;
          }
        }
        if (i > pos_ + 2) return {i, base};
      }
    }
    if (source_[pos_] != '0') return {Digits(pos_), 10};
    size_t i = pos_ + 1;
    while (i < source_.size() && (source_[i] == '0' || (source_[i] == '_' && StartsWith(i + 1, "0")))) {
      i += source_[i] == '_' ? 2 : 1;
    }
    return {i, 10};
  }

  absl::Status LexToken(std::vector<char>* open_brackets) {
    const size_t start = pos_;
    const char c = source_[pos_];
    if (const size_t end = FloatEnd(); end != std::string::npos) {
      std::string digits = source_.substr(start, end - start);
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      tokens_.push_back(Token{TokenType::kFloat, digits, 0, std::strtod(digits.c_str(), nullptr), At(start)});
      pos_ = end;
      return absl::OkStatus();
    }
    if (const auto [end, base] = IntegerEnd(); end != std::string::npos) {
      std::string digits = source_.substr(start + (base == 10 ? 0 : 2), end - start - (base == 10 ? 0 : 2));
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      errno = 0;
      const unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
      if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
        return Error(start, "an integer literal past 64 bits (not supported)");
      }
      tokens_.push_back(
          Token{TokenType::kInteger, source_.substr(start, end - start), static_cast<int64_t>(v), 0, At(start)});
      pos_ = end;
      return absl::OkStatus();
    }
    if (IsNameStart(c)) {
      size_t end = start;
      while (end < source_.size() && IsNameChar(source_[end])) ++end;
      if (end < source_.size() && static_cast<uint8_t>(source_[end]) >= 0x80) {
        return Error(end, "a name with characters outside ASCII (not supported)");
      }
      Emit(TokenType::kName, source_.substr(start, end - start), start);
      pos_ = end;
      return absl::OkStatus();
    }
    if (c == '\'' || c == '"') {
      size_t end = start + 1;
      while (end < source_.size() && source_[end] != c) end += source_[end] == '\\' ? 2 : 1;
      if (end < source_.size()) {
        absl::StatusOr<std::string> value = Unescape(absl::string_view(source_).substr(start + 1, end - start - 1));
        if (!value.ok()) return Error(start, value.status().message());
        Emit(TokenType::kString, *std::move(value), start);
        pos_ = end + 1;
        return absl::OkStatus();
      }
    }
    for (const char* op : {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                           "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"}) {
      if (!StartsWith(start, op)) continue;
      const char o = op[0];
      if (op[1] == '\0' && (o == '(' || o == '[' || o == '{')) {
        open_brackets->push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      } else if (op[1] == '\0' && (o == ')' || o == ']' || o == '}')) {
        if (open_brackets->empty()) return Error(start, absl::StrCat("unexpected '", op, "'"));
        const char expected = open_brackets->back();
        open_brackets->pop_back();
        if (expected != o) {
          return Error(start, absl::StrCat("unexpected '", op, "', expected '", std::string(1, expected), "'"));
        }
      }
      Emit(TokenType::kOperator, op, start);
      pos_ = start + std::strlen(op);
      return absl::OkStatus();
    }
    const char32_t code_point = python::Decode(absl::string_view(source_).substr(start, 4))[0];
    if (code_point >= 0x80 && python::IsAlnum(code_point)) {
      return Error(start, "a name with characters outside ASCII (not supported)");
    }
    return Error(start, absl::StrCat("unexpected char ", python::Repr(python::Encode(std::u32string(1, code_point)))));
  }

  const std::string source_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // whether what was read last ended a line (lstrip_blocks needs it)
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------
// Parser

ExprPtr MakeExpr(Location at, decltype(Expr::node) node) {
  return std::make_unique<const Expr>(Expr{std::move(node), at});
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData:
      return "template data";
    case TokenType::kVariableBegin:
      return "begin of print statement";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kEof:
      return "end of template";
    case TokenType::kString:
      return "string";
    default:
      return t.text;
  }
}

// Names the body of a macro reads that the call fills in.
struct MacroReads {
  bool caller = false, varargs = false, kwargs = false;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> Parse() {
    VC_ASSIGN_OR_RETURN(Body body, Subparse({}));
    if (current().type != TokenType::kEof) return Fail(absl::StrCat("unexpected '", Describe(current()), "'"));
    return body;
  }

 private:
  // An open block: its tag and the tags that may continue or end it.
  struct OpenBlock {
    std::string tag;
    Location at;
    std::vector<absl::string_view> ends;
  };

  const Token& current() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(absl::string_view op) const { return current().type == TokenType::kOperator && current().text == op; }
  bool IsName(absl::string_view name) const { return current().type == TokenType::kName && current().text == name; }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  absl::Status Fail(absl::string_view message) const { return ErrorAt(current().at, message); }

  absl::Status Expected(absl::string_view what) const {
    return Fail(absl::StrCat("expected token '", what, "', got '", Describe(current()), "'"));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Expected(op);
    return absl::OkStatus();
  }
  absl::Status ExpectType(TokenType type, absl::string_view what) {
    if (current().type != type) return Expected(what);
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectNameToken() {
    if (current().type != TokenType::kName) return Expected("name");
    return Next().text;
  }

  // Guards the recursion of nested expressions and blocks.
  class Nesting {
   public:
    explicit Nesting(int* depth) : depth_(depth) { ++*depth_; }
    ~Nesting() { --*depth_; }
    bool too_deep() const { return *depth_ > kMaxDepth; }

   private:
    int* depth_;
  };

  // ------------------------------------------------------------------------- statements

  bool AtEndTag(const std::vector<absl::string_view>& ends) const {
    return current().type == TokenType::kName && std::find(ends.begin(), ends.end(), current().text) != ends.end();
  }

  absl::StatusOr<Body> Subparse(const std::vector<absl::string_view>& ends) {
    Body body;
    while (current().type != TokenType::kEof) {
      const Token& token = current();
      if (token.type == TokenType::kData) {
        body.push_back(Stmt{stmt::Text{token.text}, token.at});
        Next();
      } else if (token.type == TokenType::kVariableBegin) {
        const Location at = token.at;
        Next();
        VC_ASSIGN_OR_RETURN(ExprPtr value, ParseTuple(false, true, {}, false));
        VC_RETURN_IF_ERROR(ExpectType(TokenType::kVariableEnd, "end of print statement"));
        body.push_back(Stmt{stmt::Output{std::move(value)}, at});
      } else if (token.type == TokenType::kBlockBegin) {
        Next();
        if (!ends.empty() && AtEndTag(ends)) return body;
        VC_RETURN_IF_ERROR(ParseStatement(&body));
        VC_RETURN_IF_ERROR(ExpectType(TokenType::kBlockEnd, "end of statement block"));
      } else {
        return Fail(absl::StrCat("unexpected '", Describe(token), "'"));
      }
    }
    return body;
  }

  // The body of a block up to one of `ends`, which becomes the current token (consumed when
  // `drop_end`).
  absl::StatusOr<Body> ParseStatements(const std::string& tag, Location at, std::vector<absl::string_view> ends,
                                       bool drop_end) {
    SkipOp(":");
    VC_RETURN_IF_ERROR(ExpectType(TokenType::kBlockEnd, "end of statement block"));
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return ErrorAt(at, "blocks nested too deeply");
    open_.push_back(OpenBlock{tag, at, ends});
    absl::StatusOr<Body> body = Subparse(ends);
    open_.pop_back();
    if (!body.ok()) return body.status();
    if (current().type == TokenType::kEof) {
      std::vector<std::string> quoted;
      for (const absl::string_view e : ends) quoted.push_back(absl::StrCat("'", e, "'"));
      return Fail(absl::StrCat("unexpected end of template, expected ", absl::StrJoin(quoted, " or "), " to close '",
                               tag, "' of line ", at.line));
    }
    if (drop_end) Next();
    return body;
  }

  absl::Status UnknownTag(const Token& name) const {
    std::string message = absl::StrCat("unknown tag '", name.text, "'");
    if (!open_.empty()) {
      std::vector<std::string> quoted;
      for (const absl::string_view e : open_.back().ends) quoted.push_back(absl::StrCat("'", e, "'"));
      absl::StrAppend(&message, "; expected ", absl::StrJoin(quoted, " or "), " to close '", open_.back().tag,
                      "' of line ", open_.back().at.line);
    }
    return ErrorAt(name.at, message);
  }

  absl::Status ParseStatement(Body* body) {
    const Token& token = current();
    if (token.type != TokenType::kName) return Fail("tag name expected");
    const std::string tag = token.text;
    const Location at = token.at;
    if (tag == "for") return ParseFor(at, body);
    if (tag == "if") return ParseIf(at, body);
    if (tag == "set") return ParseSet(at, body);
    if (tag == "macro") return ParseMacro(at, body);
    if (tag == "call") return ParseCallBlock(at, body);
    if (tag == "filter") return ParseFilterBlock(at, body);
    if (tag == "with") return ParseWith(at, body);
    if (tag == "print") return ParsePrint(body);
    if (tag == "break" || tag == "continue") {
      Next();
      if (loop_depth_ == 0) return ErrorAt(at, absl::StrCat("'", tag, "' outside loop"));
      body->push_back(tag == "break" ? Stmt{stmt::Break{}, at} : Stmt{stmt::Continue{}, at});
      return absl::OkStatus();
    }
    for (const char* unsupported : {"extends", "block", "include", "import", "from", "autoescape"}) {
      if (tag == unsupported) return ErrorAt(at, absl::StrCat("the '", tag, "' tag is not supported"));
    }
    return UnknownTag(token);
  }

  absl::Status ParseFor(Location at, Body* body) {
    Next();
    VC_ASSIGN_OR_RETURN(Target target, ParseAssignTarget(/*name_only=*/false, {"in"}, /*with_namespace=*/false));
    if (!SkipName("in")) return Expected("in");
    VC_ASSIGN_OR_RETURN(ExprPtr iterable, ParseTuple(false, false, {"recursive"}, false));
    ExprPtr condition;
    if (SkipName("if")) {
      VC_ASSIGN_OR_RETURN(condition, ParseExpression(true));
    }
    if (IsName("recursive")) return Fail("recursive loops are not supported");
    ++loop_depth_;
    absl::StatusOr<Body> loop_body = ParseStatements("for", at, {"endfor", "else"}, false);
    --loop_depth_;
    if (!loop_body.ok()) return loop_body.status();
    Body otherwise;
    if (Next().text == "else") {
      VC_ASSIGN_OR_RETURN(otherwise, ParseStatements("for", at, {"endfor"}, true));
    }
    body->push_back(Stmt{stmt::For{std::move(target), std::move(iterable), std::move(condition), *std::move(loop_body),
                                   std::move(otherwise)},
                         at});
    return absl::OkStatus();
  }

  absl::Status ParseIf(Location at, Body* body) {
    Next();
    stmt::If node;
    while (true) {
      VC_ASSIGN_OR_RETURN(ExprPtr test, ParseTuple(false, false, {}, false));
      VC_ASSIGN_OR_RETURN(Body branch, ParseStatements("if", at, {"elif", "else", "endif"}, false));
      node.branches.emplace_back(std::move(test), std::move(branch));
      const std::string end = Next().text;
      if (end == "elif") continue;
      if (end == "else") {
        VC_ASSIGN_OR_RETURN(node.otherwise, ParseStatements("if", at, {"endif"}, true));
      }
      break;
    }
    body->push_back(Stmt{std::move(node), at});
    return absl::OkStatus();
  }

  absl::Status ParseSet(Location at, Body* body) {
    Next();
    VC_ASSIGN_OR_RETURN(Target target, ParseAssignTarget(/*name_only=*/false, {}, /*with_namespace=*/true));
    if (SkipOp("=")) {
      VC_ASSIGN_OR_RETURN(ExprPtr value, ParseTuple(false, true, {}, false));
      body->push_back(Stmt{stmt::Set{std::move(target), std::move(value)}, at});
      return absl::OkStatus();
    }
    VC_ASSIGN_OR_RETURN(std::vector<FilterCall> filters, ParseFilterChain(/*start_inline=*/false));
    VC_ASSIGN_OR_RETURN(Body block, ParseStatements("set", at, {"endset"}, true));
    body->push_back(Stmt{stmt::SetBlock{std::move(target), std::move(filters), std::move(block)}, at});
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Param>> ParseSignature() {
    std::vector<Param> params;
    VC_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!params.empty()) VC_RETURN_IF_ERROR(ExpectOp(","));
      Param p;
      VC_ASSIGN_OR_RETURN(p.name, ExpectNameToken());
      if (SkipOp("=")) {
        VC_ASSIGN_OR_RETURN(p.default_value, ParseExpression(true));
      } else if (!params.empty() && params.back().default_value != nullptr) {
        return Fail("non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    VC_RETURN_IF_ERROR(ExpectOp(")"));
    return params;
  }

  // A macro body (also a call block's): loops outside it do not reach in.
  absl::StatusOr<stmt::Macro> ParseMacroBody(std::string tag, Location at, std::string name, std::vector<Param> params,
                                             absl::string_view end) {
    const int loop_depth = loop_depth_;
    const MacroReads outer = reads_;
    loop_depth_ = 0;
    reads_ = MacroReads{};
    absl::StatusOr<Body> body = ParseStatements(tag, at, {end}, true);
    loop_depth_ = loop_depth;
    const MacroReads inner = reads_;
    reads_ = MacroReads{outer.caller || inner.caller, outer.varargs || inner.varargs, outer.kwargs || inner.kwargs};
    if (!body.ok()) return body.status();
    return stmt::Macro{std::move(name), std::move(params), *std::move(body), inner.caller, inner.varargs, inner.kwargs};
  }

  absl::Status ParseMacro(Location at, Body* body) {
    Next();
    VC_ASSIGN_OR_RETURN(std::string name, ExpectNameToken());
    VC_ASSIGN_OR_RETURN(std::vector<Param> params, ParseSignature());
    VC_ASSIGN_OR_RETURN(stmt::Macro macro, ParseMacroBody("macro", at, std::move(name), std::move(params), "endmacro"));
    body->push_back(Stmt{std::move(macro), at});
    return absl::OkStatus();
  }

  absl::Status ParseCallBlock(Location at, Body* body) {
    Next();
    std::vector<Param> params;
    if (IsOp("(")) {
      VC_ASSIGN_OR_RETURN(params, ParseSignature());
    }
    VC_ASSIGN_OR_RETURN(ExprPtr call, ParseExpression(true));
    if (!std::holds_alternative<expr::Call>(call->node)) return ErrorAt(at, "expected call");
    VC_ASSIGN_OR_RETURN(stmt::Macro caller, ParseMacroBody("call", at, "caller", std::move(params), "endcall"));
    body->push_back(Stmt{stmt::CallBlock{std::move(caller), std::move(call)}, at});
    return absl::OkStatus();
  }

  absl::Status ParseFilterBlock(Location at, Body* body) {
    Next();
    VC_ASSIGN_OR_RETURN(std::vector<FilterCall> filters, ParseFilterChain(/*start_inline=*/true));
    VC_ASSIGN_OR_RETURN(Body block, ParseStatements("filter", at, {"endfilter"}, true));
    body->push_back(Stmt{stmt::FilterBlock{std::move(filters), std::move(block)}, at});
    return absl::OkStatus();
  }

  absl::Status ParseWith(Location at, Body* body) {
    Next();
    stmt::With node;
    while (current().type != TokenType::kBlockEnd) {
      if (!node.assignments.empty()) VC_RETURN_IF_ERROR(ExpectOp(","));
      VC_ASSIGN_OR_RETURN(Target target, ParseAssignTarget(/*name_only=*/false, {}, /*with_namespace=*/false));
      VC_RETURN_IF_ERROR(ExpectOp("="));
      VC_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      node.assignments.emplace_back(std::move(target), std::move(value));
    }
    VC_ASSIGN_OR_RETURN(node.body, ParseStatements("with", at, {"endwith"}, true));
    body->push_back(Stmt{std::move(node), at});
    return absl::OkStatus();
  }

  absl::Status ParsePrint(Body* body) {
    Next();
    bool first = true;
    while (current().type != TokenType::kBlockEnd) {
      if (!first) VC_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      const Location at = current().at;
      VC_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      body->push_back(Stmt{stmt::Output{std::move(value)}, at});
    }
    return absl::OkStatus();
  }

  // A name, names to unpack (a tuple of names, with or without parentheses), or with
  // `with_namespace` a namespace's attribute (name.attribute).
  absl::StatusOr<Target> ParseAssignTarget(bool name_only, std::vector<absl::string_view> extra_ends,
                                           bool with_namespace) {
    const Location at = current().at;
    if (with_namespace && current().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().text == ".") {
      Target t;
      t.names.push_back(Next().text);
      Next();
      VC_ASSIGN_OR_RETURN(t.attribute, ExpectNameToken());
      return t;
    }
    if (name_only) {
      VC_ASSIGN_OR_RETURN(std::string name, ExpectNameToken());
      return Target{{std::move(name)}, false, ""};
    }
    VC_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(/*simplified=*/true, true, std::move(extra_ends), false));
    Target t;
    if (const auto* name = std::get_if<expr::Name>(&e->node)) {
      t.names.push_back(name->name);
      return t;
    }
    if (const auto* tuple = std::get_if<expr::Tuple>(&e->node)) {
      t.unpack = true;
      for (const ExprPtr& item : tuple->items) {
        const auto* name = std::get_if<expr::Name>(&item->node);
        if (name == nullptr) {
          return ErrorAt(item->at, "only names can be unpacked into (nested unpacking is not supported)");
        }
        t.names.push_back(name->name);
      }
      return t;
    }
    return ErrorAt(at, "can't assign to this expression");
  }

  // ------------------------------------------------------------------------- expressions

  bool IsTupleEnd(const std::vector<absl::string_view>& extra_ends) const {
    const TokenType type = current().type;
    if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || IsOp(")")) return true;
    return AtEndTag(extra_ends);
  }

  // Expressions separated by commas (a tuple when there is a comma); `simplified` takes only
  // primaries (assignment targets).
  absl::StatusOr<ExprPtr> ParseTuple(bool simplified, bool with_condexpr, std::vector<absl::string_view> extra_ends,
                                     bool explicit_parentheses) {
    const Location at = current().at;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) VC_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_ends)) break;
      absl::StatusOr<ExprPtr> item = simplified ? ParsePrimary() : ParseExpression(with_condexpr);
      if (!item.ok()) return item.status();
      items.push_back(*std::move(item));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return Fail(absl::StrCat("expected an expression, got '", Describe(current()), "'"));
    }
    return MakeExpr(at, expr::Tuple{std::move(items)});
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return Fail("expression nested too deeply");
    if (!with_condexpr) return ParseOr();
    // A conditional is where jinja2 says it is: at the start of its first operand, then where the
    // previous one ended.
    Location at = current().at;
    VC_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (SkipName("if")) {
      VC_ASSIGN_OR_RETURN(ExprPtr condition, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        VC_ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      e = MakeExpr(at, expr::Conditional{std::move(condition), std::move(e), std::move(otherwise)});
      at = current().at;
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    VC_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const Location at = Next().at;
      VC_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = MakeExpr(at, expr::Logical{false, std::move(left), std::move(right)});
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    VC_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const Location at = Next().at;
      VC_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = MakeExpr(at, expr::Logical{true, std::move(left), std::move(right)});
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const Location at = Next().at;
      Nesting nesting(&depth_);
      if (nesting.too_deep()) return Fail("expression nested too deeply");
      VC_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      return MakeExpr(at, expr::Not{std::move(operand)});
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const Location at = current().at;
    VC_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::vector<std::pair<CompareOp, ExprPtr>> rest;
    while (true) {
      std::optional<CompareOp> op;
      static const std::pair<const char*, CompareOp> kOps[] = {
          {"==", CompareOp::kEqual},     {"!=", CompareOp::kNotEqual}, {"<", CompareOp::kLess},
          {"<=", CompareOp::kLessEqual}, {">", CompareOp::kGreater},   {">=", CompareOp::kGreaterEqual}};
      for (const auto& [symbol, o] : kOps) {
        if (IsOp(symbol)) op = o;
      }
      if (op.has_value()) {
        Next();
      } else if (IsName("in")) {
        Next();
        op = CompareOp::kIn;
      } else if (IsName("not") && Look().type == TokenType::kName && Look().text == "in") {
        Next();
        Next();
        op = CompareOp::kNotIn;
      } else {
        break;
      }
      VC_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      rest.emplace_back(*op, std::move(operand));
    }
    if (rest.empty()) return first;
    return MakeExpr(at, expr::Compare{std::move(first), std::move(rest)});
  }

  // Left-associative binary operators over `operand`.
  template <typename ParseOperand>
  absl::StatusOr<ExprPtr> ParseArithmetic(std::initializer_list<std::pair<const char*, ArithmeticOp>> ops,
                                          ParseOperand operand) {
    VC_ASSIGN_OR_RETURN(ExprPtr left, (this->*operand)());
    while (true) {
      const auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return IsOp(o.first); });
      if (it == ops.end()) return left;
      const Location at = Next().at;
      VC_ASSIGN_OR_RETURN(ExprPtr right, (this->*operand)());
      left = MakeExpr(at, expr::Arithmetic{it->second, std::move(left), std::move(right)});
    }
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseArithmetic({{"+", ArithmeticOp::kAdd}, {"-", ArithmeticOp::kSubtract}}, &Parser::ParseConcat);
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const Location at = current().at;
    VC_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    std::vector<ExprPtr> parts;
    parts.push_back(std::move(first));
    while (SkipOp("~")) {
      VC_ASSIGN_OR_RETURN(ExprPtr part, ParseMath2());
      parts.push_back(std::move(part));
    }
    return MakeExpr(at, expr::Concat{std::move(parts)});
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseArithmetic({{"*", ArithmeticOp::kMultiply},
                            {"/", ArithmeticOp::kDivide},
                            {"//", ArithmeticOp::kFloorDivide},
                            {"%", ArithmeticOp::kModulo}},
                           &Parser::ParsePow);
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseArithmetic({{"**", ArithmeticOp::kPower}}, &Parser::ParseUnaryWithFilters);
  }

  absl::StatusOr<ExprPtr> ParseUnaryWithFilters() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return Fail("expression nested too deeply");
    const Location at = current().at;
    ExprPtr node;
    if (SkipOp("-")) {
      VC_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = MakeExpr(at, expr::Negate{std::move(operand)});
    } else if (SkipOp("+")) {
      VC_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = MakeExpr(at, expr::Plus{std::move(operand)});
    } else {
      VC_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    VC_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      VC_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = current();
    const Location at = token.at;
    switch (token.type) {
      case TokenType::kName: {
        const std::string name = Next().text;
        if (name == "true" || name == "True") return MakeExpr(at, expr::Literal{Value::Bool(true)});
        if (name == "false" || name == "False") return MakeExpr(at, expr::Literal{Value::Bool(false)});
        if (name == "none" || name == "None") return MakeExpr(at, expr::Literal{Value()});
        if (name == "caller") reads_.caller = true;
        if (name == "varargs") reads_.varargs = true;
        if (name == "kwargs") reads_.kwargs = true;
        return MakeExpr(at, expr::Name{name});
      }
      case TokenType::kString: {
        std::string text;
        while (current().type == TokenType::kString) text += Next().text;
        return MakeExpr(at, expr::Literal{Value::String(std::move(text))});
      }
      case TokenType::kInteger:
        return MakeExpr(at, expr::Literal{Value::Int(Next().integer)});
      case TokenType::kFloat:
        return MakeExpr(at, expr::Literal{Value::Float(Next().number)});
      case TokenType::kOperator:
        if (SkipOp("(")) {
          VC_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
          VC_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (IsOp("[")) return ParseList();
        if (IsOp("{")) return ParseDict();
        break;
      default:
        break;
    }
    return Fail(absl::StrCat("unexpected '", Describe(token), "'"));
  }

  absl::StatusOr<ExprPtr> ParseList() {
    const Location at = Next().at;
    std::vector<ExprPtr> items;
    while (!IsOp("]")) {
      if (!items.empty()) VC_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      VC_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      items.push_back(std::move(item));
    }
    VC_RETURN_IF_ERROR(ExpectOp("]"));
    return MakeExpr(at, expr::List{std::move(items)});
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    const Location at = Next().at;
    std::vector<std::pair<ExprPtr, ExprPtr>> items;
    while (!IsOp("}")) {
      if (!items.empty()) VC_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      VC_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      VC_RETURN_IF_ERROR(ExpectOp(":"));
      VC_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      items.emplace_back(std::move(key), std::move(value));
    }
    VC_RETURN_IF_ERROR(ExpectOp("}"));
    return MakeExpr(at, expr::Dict{std::move(items)});
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        VC_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        VC_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        VC_ASSIGN_OR_RETURN(std::vector<FilterCall> chain, ParseFilterChain(/*start_inline=*/false));
        for (FilterCall& call : chain) {
          const Location at = call.at;
          node = MakeExpr(at, expr::Filter{std::move(node), std::move(call)});
        }
      } else if (IsName("is")) {
        VC_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        VC_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const Token& token = Next();
    const Location at = token.at;
    if (token.text == ".") {
      const Token& attribute = Next();
      if (attribute.type == TokenType::kName) return MakeExpr(at, expr::GetAttr{std::move(node), attribute.text});
      if (attribute.type != TokenType::kInteger) return ErrorAt(attribute.at, "expected name or number");
      return MakeExpr(
          at, expr::GetItem{std::move(node), MakeExpr(attribute.at, expr::Literal{Value::Int(attribute.integer)})});
    }
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) VC_RETURN_IF_ERROR(ExpectOp(","));
      VC_ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed(node, args.empty()));
      args.push_back(std::move(arg));
    }
    VC_RETURN_IF_ERROR(ExpectOp("]"));
    if (args.empty()) return ErrorAt(at, "expected an expression, got ']'");
    if (args.size() == 1) {
      if (std::holds_alternative<expr::Slice>(args[0]->node)) return std::move(args[0]);
      return MakeExpr(at, expr::GetItem{std::move(node), std::move(args[0])});
    }
    for (const ExprPtr& arg : args) {
      if (std::holds_alternative<expr::Slice>(arg->node)) {
        return ErrorAt(arg->at, "a slice in a tuple subscript is not supported");
      }
    }
    return MakeExpr(at, expr::GetItem{std::move(node), MakeExpr(at, expr::Tuple{std::move(args)})});
  }

  // One subscript: an expression, or a slice of `object` (taking it over) when there is a colon.
  absl::StatusOr<ExprPtr> ParseSubscribed(ExprPtr& object, bool first) {
    const Location at = current().at;
    ExprPtr start;
    if (!IsOp(":")) {
      VC_ASSIGN_OR_RETURN(start, ParseExpression(true));
      if (!IsOp(":")) return start;
    }
    Next();
    if (!first) return ErrorAt(at, "a slice in a tuple subscript is not supported");
    ExprPtr stop, step;
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
      VC_ASSIGN_OR_RETURN(stop, ParseExpression(true));
    }
    if (SkipOp(":") && !IsOp("]") && !IsOp(",")) {
      VC_ASSIGN_OR_RETURN(step, ParseExpression(true));
    }
    return MakeExpr(at, expr::Slice{std::move(object), std::move(start), std::move(stop), std::move(step)});
  }

  absl::StatusOr<ArgExprs> ParseCallArgs() {
    const Location at = current().at;
    VC_RETURN_IF_ERROR(ExpectOp("("));
    ArgExprs args;
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        VC_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) return Fail("*args and **kwargs in calls are not supported");
      if (current().type == TokenType::kName && Look().type == TokenType::kOperator && Look().text == "=") {
        std::string key = Next().text;
        Next();
        VC_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args.keyword.emplace_back(std::move(key), std::move(value));
      } else {
        if (!args.keyword.empty()) return ErrorAt(at, "invalid syntax for function call expression");
        VC_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args.positional.push_back(std::move(value));
      }
      require_comma = true;
    }
    VC_RETURN_IF_ERROR(ExpectOp(")"));
    return args;
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    const Location at = current().at;
    VC_ASSIGN_OR_RETURN(ArgExprs args, ParseCallArgs());
    return MakeExpr(at, expr::Call{std::move(callee), std::move(args)});
  }

  // A dotted name, as filter and test names may be.
  absl::StatusOr<std::string> ParseDottedName() {
    VC_ASSIGN_OR_RETURN(std::string name, ExpectNameToken());
    while (SkipOp(".")) {
      VC_ASSIGN_OR_RETURN(std::string part, ExpectNameToken());
      absl::StrAppend(&name, ".", part);
    }
    return name;
  }

  // `|f(args)|g ...`, or with `start_inline` `f(args)|g ...` (a filter block's head).
  absl::StatusOr<std::vector<FilterCall>> ParseFilterChain(bool start_inline) {
    std::vector<FilterCall> chain;
    while (IsOp("|") || start_inline) {
      if (!start_inline) Next();
      start_inline = false;
      const Location at = current().at;
      VC_ASSIGN_OR_RETURN(const std::string name, ParseDottedName());
      const FilterDef* filter = FindFilter(name);
      if (filter == nullptr) return ErrorAt(at, absl::StrCat("no filter named '", name, "'"));
      ArgExprs args;
      if (IsOp("(")) {
        VC_ASSIGN_OR_RETURN(args, ParseCallArgs());
      }
      chain.push_back(FilterCall{filter, std::move(args), at});
    }
    return chain;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr operand) {
    const Location at = Next().at;
    const bool negated = SkipName("not");
    const Location name_at = current().at;
    VC_ASSIGN_OR_RETURN(const std::string name, ParseDottedName());
    const TestDef* test = FindTest(name);
    if (test == nullptr) return ErrorAt(name_at, absl::StrCat("no test named '", name, "'"));
    ArgExprs args;
    const TokenType type = current().type;
    if (IsOp("(")) {
      VC_ASSIGN_OR_RETURN(args, ParseCallArgs());
    } else if ((type == TokenType::kName || type == TokenType::kString || type == TokenType::kInteger ||
                type == TokenType::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      // One argument without parentheses: `x is divisibleby 3`.
      if (IsName("is")) return Fail("You cannot chain multiple tests with is");
      VC_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      VC_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      args.positional.push_back(std::move(arg));
    }
    return MakeExpr(at, expr::Test{std::move(operand), test, std::move(args), negated});
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // loops around the statement being parsed, within its macro
  MacroReads reads_;    // what the macro being parsed reads so far
  std::vector<OpenBlock> open_;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source) {
  VC_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lexer(source).Tokenize());
  return Parser(std::move(tokens)).Parse();
}

}  // namespace vc::jinja
