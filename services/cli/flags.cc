#include "services/cli/flags.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <set>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace vc::cli {
namespace {

constexpr absl::string_view kHelpPayload = "vericache.dev/help";
constexpr size_t kUsageWidth = 100;
constexpr size_t kHelpColumn = 28;

// "a text", "an integer", ...
const char* TypeName(Flag::Type type) {
  switch (type) {
    case Flag::Type::kString:
      return "a text";
    case Flag::Type::kInt:
      return "an integer";
    case Flag::Type::kNumber:
      return "a number";
    case Flag::Type::kSwitch:
      return "a switch";
  }
  return "?";
}

// A mistake in the program, not in the command line: tests run every command, so it shows there.
[[noreturn]] void Misuse(const std::string& what) {
  std::cerr << "vericache: flag misuse: " << what << std::endl;
  std::abort();
}

absl::StatusOr<double> ParseNumber(const Flag& f, absl::string_view text) {
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", f.name, " must be a finite number, got '", text, "'"));
  }
  if (v < f.number_lo || v > f.number_hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", f.name, " must be in [", f.number_lo, ", ", f.number_hi, "], got '", text, "'"));
  }
  return v;
}

// Appends `units` (words, or groups that stay on one line) to `out`, whose last line is `column`
// wide, separated by spaces; a unit that would pass kUsageWidth starts a new line indented by
// `indent`. Returns the width of the last line.
size_t AppendWrapped(std::string* out, size_t column, size_t indent, const std::vector<std::string>& units) {
  bool line_empty = column <= indent;
  for (const std::string& unit : units) {
    if (!line_empty && column + 1 + unit.size() > kUsageWidth) {
      absl::StrAppend(out, "\n", std::string(indent, ' '));
      column = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out->push_back(' ');
      ++column;
    } else if (column < indent) {
      out->append(indent - column, ' ');
      column = indent;
    }
    out->append(unit);
    column += unit.size();
    line_empty = false;
  }
  return column;
}

// `text` and then `tail`, kept on one line, wrapped into lines that start at column `indent` (the
// first continuing at `column`); each '\n' in `text` starts a new line.
void AppendParagraph(std::string* out, size_t column, size_t indent, absl::string_view text,
                     const std::string& tail = "") {
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out->push_back('\n');
      column = 0;
    }
    std::vector<std::string> words = absl::StrSplit(lines[i], ' ', absl::SkipEmpty());
    if (i + 1 == lines.size() && !tail.empty()) words.push_back(tail);
    column = AppendWrapped(out, column, indent, words);
  }
  out->push_back('\n');
}

}  // namespace

Flag Flag::Str(std::string name, std::string fallback, std::string help) {
  Flag f;
  f.name = std::move(name);
  f.type = Type::kString;
  f.value = "TEXT";
  f.help = std::move(help);
  f.shown_default = fallback;
  f.str_fallback = std::move(fallback);
  return f;
}

Flag Flag::Int(std::string name, std::optional<int64_t> fallback, int64_t lo, int64_t hi, std::string help) {
  Flag f;
  f.name = std::move(name);
  f.type = Type::kInt;
  f.value = "N";
  f.help = std::move(help);
  if (fallback.has_value()) f.shown_default = absl::StrCat(*fallback);
  f.int_fallback = fallback;
  f.int_lo = lo;
  f.int_hi = hi;
  return f;
}

Flag Flag::Number(std::string name, double fallback, double lo, double hi, std::string help) {
  Flag f;
  f.name = std::move(name);
  f.type = Type::kNumber;
  f.value = "X";
  f.help = std::move(help);
  f.shown_default = absl::StrCat(fallback);
  f.number_fallback = fallback;
  f.number_lo = lo;
  f.number_hi = hi;
  return f;
}

Flag Flag::Number(std::string name, double fallback, std::string help) {
  return Number(std::move(name), fallback, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max(),
                std::move(help));
}

Flag Flag::Switch(std::string name, std::string help) {
  Flag f;
  f.name = std::move(name);
  f.type = Type::kSwitch;
  f.help = std::move(help);
  return f;
}

Flag Flag::Value(std::string placeholder) const {
  Flag f = *this;
  f.value = std::move(placeholder);
  return f;
}

Flag Flag::Required() const {
  Flag f = *this;
  f.required = true;
  return f;
}

Flag Flag::ShownDefault(std::string text) const {
  Flag f = *this;
  f.shown_default = std::move(text);
  return f;
}

const Flag* FlagSet::Find(absl::string_view name) const {
  for (const Flag& f : flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string Usage(const FlagSet& set) {
  std::string out;
  std::vector<std::string> synopsis;
  for (const Flag& f : set.flags) {
    if (f.required) synopsis.push_back(absl::StrCat("--", f.name, f.value.empty() ? "" : " ", f.value));
  }
  if (!set.synopsis.empty()) synopsis.push_back(set.synopsis);
  synopsis.push_back("[options]");
  const std::string head = absl::StrCat("usage: vericache ", set.command);
  out = head;
  AppendWrapped(&out, head.size(), head.size() + 1, synopsis);
  out.push_back('\n');
  if (!set.description.empty()) AppendParagraph(&out, 0, 2, set.description);
  out.push_back('\n');
  for (const Flag& f : set.flags) {
    const std::string entry = absl::StrCat("  --", f.name, f.value.empty() ? "" : " ", f.value);
    out += entry;
    size_t column = entry.size();
    if (column + 2 > kHelpColumn) {  // help under a long name
      out.push_back('\n');
      column = 0;
    }
    std::string tail;
    if (f.required) {
      tail = "(required)";
    } else if (!f.shown_default.empty()) {
      tail = absl::StrCat("(default ", f.shown_default, ")");
    }
    AppendParagraph(&out, column, kHelpColumn, f.help, tail);
  }
  return out;
}

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv, const FlagSet& flags) {
  std::set<absl::string_view> names;
  for (const Flag& f : flags.flags) {
    if (!names.insert(f.name).second) Misuse(absl::StrCat("vericache ", flags.command, " declares --", f.name, " twice"));
  }
  Args a(&flags);
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s == "--help" || s == "-h") return HelpRequested();
    if (s.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", s, "'"));
    std::string name = s.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Flag* f = flags.Find(name);
    if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    if (a.values_.count(name)) return absl::InvalidArgumentError(absl::StrCat("--", name, " is given twice"));
    if (f->type == Flag::Type::kSwitch) {
      if (inline_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      a.values_[name].assign(1, '1');  // not = "1": GCC 12 misreports -Wrestrict on that
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    if (f->type == Flag::Type::kInt) {
      if (absl::Status st = ParseIntFlag(name, value, f->int_lo, f->int_hi).status(); !st.ok()) return st;
    } else if (f->type == Flag::Type::kNumber) {
      if (absl::Status st = ParseNumber(*f, value).status(); !st.ok()) return st;
    }
    a.values_[name] = value;
  }
  for (const Flag& f : flags.flags) {
    if (f.required && !a.Has(f.name)) return absl::InvalidArgumentError(absl::StrCat("--", f.name, " is required"));
  }
  return a;
}

const Flag& Args::Declared(absl::string_view name, Flag::Type type) const {
  const Flag* f = flags_->Find(name);
  if (f == nullptr) Misuse(absl::StrCat("vericache ", flags_->command, " declares no --", name));
  if (f->type != type) {
    Misuse(absl::StrCat("--", name, " of vericache ", flags_->command, " is ", TypeName(f->type), " flag, read as ",
                        TypeName(type)));
  }
  return *f;
}

const std::string* Args::Given(absl::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

bool Args::Has(absl::string_view name) const {
  if (flags_->Find(name) == nullptr) Misuse(absl::StrCat("vericache ", flags_->command, " declares no --", name));
  return Given(name) != nullptr;
}

std::string Args::Str(absl::string_view name) const {
  const Flag& f = Declared(name, Flag::Type::kString);
  const std::string* v = Given(name);
  return v != nullptr ? *v : f.str_fallback;
}

int64_t Args::Int(absl::string_view name) const {
  const Flag& f = Declared(name, Flag::Type::kInt);
  const std::string* v = Given(name);
  if (v == nullptr) {
    if (!f.int_fallback.has_value()) Misuse(absl::StrCat("--", name, " has no default: ask Has() first"));
    return *f.int_fallback;
  }
  int64_t n = 0;
  (void)absl::SimpleAtoi(*v, &n);  // checked by Parse
  return n;
}

double Args::Double(absl::string_view name) const {
  const Flag& f = Declared(name, Flag::Type::kNumber);
  const std::string* v = Given(name);
  if (v == nullptr) return f.number_fallback;
  double x = 0;
  (void)absl::SimpleAtod(*v, &x);  // checked by Parse
  return x;
}

absl::Status Args::CheckAtMost(absl::string_view name, int64_t hi) const {
  const Flag& f = Declared(name, Flag::Type::kInt);
  const std::string* v = Given(name);
  if (v == nullptr) return absl::OkStatus();
  return ParseIntFlag(name, *v, f.int_lo, hi).status();
}

absl::StatusOr<int64_t> ParseIntFlag(absl::string_view name, absl::string_view text, int64_t lo, int64_t hi) {
  int64_t v;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer in [", lo, ", ", hi, "], got '", text, "'"));
  }
  return v;
}

absl::Status HelpRequested() {
  absl::Status s = absl::CancelledError("help requested");
  s.SetPayload(kHelpPayload, absl::Cord("1"));
  return s;
}

bool IsHelpRequested(const absl::Status& s) { return s.GetPayload(kHelpPayload).has_value(); }

}  // namespace vc::cli
