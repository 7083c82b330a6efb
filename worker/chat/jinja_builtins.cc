#include "worker/chat/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "worker/chat/jinja_access.h"
#include "worker/chat/python_str.h"

namespace vc::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

// jinja2's soft_str: Markup stays Markup, anything else becomes str().
absl::StatusOr<Value> SoftStr(const Value& v) {
  if (v.is_string()) return v;
  VC_ASSIGN_OR_RETURN(std::string s, Str(v));
  return Value::String(std::move(s));
}

// ------------------------------------------------------------------------------------------
// Attribute getters for filters (jinja2's make_attrgetter)

// Item keys, applied in turn.
using AttributePath = std::vector<Value>;

// "a.b.0" → ["a", "b", 0]; an int stays one key; None is no key at all.
AttributePath ParseAttributePath(const Value& attribute) {
  AttributePath path;
  if (attribute.is_none()) return path;
  if (!attribute.is_string()) {
    path.push_back(attribute);
    return path;
  }
  for (const absl::string_view part : absl::StrSplit(attribute.string(), '.')) {
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    int64_t i = 0;
    if (digits && absl::SimpleAtoi(part, &i)) {
      path.push_back(Value::Int(i));
    } else {
      path.push_back(Value::String(std::string(part)));
    }
  }
  return path;
}

// Follows `path` from `item`; with a `fallback`, an Undefined step becomes the fallback.
absl::StatusOr<Value> FollowPath(Value item, const AttributePath& path, const std::optional<Value>& fallback = {}) {
  for (const Value& part : path) {
    VC_ASSIGN_OR_RETURN(item, GetItem(item, part));
    if (fallback.has_value() && item.is_undefined()) item = *fallback;
  }
  return item;
}

// jinja2's ignore_case: str lowered, anything else as it is.
Value IgnoreCase(const Value& v) { return v.is_string() ? Value::String(python::Lower(v.string())) : v; }

absl::StatusOr<bool> LessThan(const Value& a, const Value& b) { return Compare(Order::kLess, a, b); }

// A stable sort by `keys` (Python's sorted: stable, reverse keeps the order of equal items).
absl::StatusOr<std::vector<Value>> SortBy(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!error.ok()) return false;
    absl::StatusOr<bool> less = reverse ? LessThan(keys[y], keys[x]) : LessThan(keys[x], keys[y]);
    if (!less.ok()) {
      error = less.status();
      return false;
    }
    return *less;
  });
  VC_RETURN_IF_ERROR(error);
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (const size_t i : order) sorted.push_back(std::move(items[i]));
  return sorted;
}

// ------------------------------------------------------------------------------------------
// Filters

absl::StatusOr<Value> FilterAbs(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("abs", call, {}).status());
  if (v.is_float()) return Value::Float(std::fabs(v.float_value()));
  if (v.is_int() || v.is_bool()) {
    if (v.int_value() == INT64_MIN) return absl::InvalidArgumentError("integer result past 64 bits (not supported)");
    return Value::Int(std::abs(v.int_value()));
  }
  return TypeError(absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

absl::StatusOr<Value> FilterAttr(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("attr", call, {"name"}));
  if (!a[0].has_value()) return TypeError("attr() missing 1 required positional argument: 'name'");
  VC_ASSIGN_OR_RETURN(const std::string name, StrArgument(*a[0], "attr"));
  return GetAttributeOnly(v, name);
}

absl::StatusOr<Value> FilterBatch(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("batch", call, {"linecount", "fill_with"}));
  if (!a[0].has_value()) return TypeError("do_batch() missing 1 required positional argument: 'linecount'");
  VC_ASSIGN_OR_RETURN(const int64_t size, AsIndex(*a[0]));
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  std::vector<Value> batches;
  std::vector<Value> batch;
  for (const Value& item : items) {
    if (static_cast<int64_t>(batch.size()) == size) batches.push_back(Value::List(std::exchange(batch, {})));
    batch.push_back(item);
  }
  if (!batch.empty()) {
    if (a[1].has_value() && !a[1]->is_none()) {
      while (static_cast<int64_t>(batch.size()) < size) batch.push_back(*a[1]);
    }
    batches.push_back(Value::List(std::move(batch)));
  }
  return Value::FromIterator("generator", std::move(batches));
}

// Filters that apply one str method to soft_str(value).
absl::StatusOr<Value> StrMethodFilter(const Value& v, const CallArgs& call, const std::string& method) {
  VC_ASSIGN_OR_RETURN(const Value s, SoftStr(v));
  return CallMethod(s, method, call);
}

absl::StatusOr<Value> FilterCapitalize(const Value& v, const CallArgs& call) {
  return StrMethodFilter(v, call, "capitalize");
}
absl::StatusOr<Value> FilterLower(const Value& v, const CallArgs& call) { return StrMethodFilter(v, call, "lower"); }
absl::StatusOr<Value> FilterUpper(const Value& v, const CallArgs& call) { return StrMethodFilter(v, call, "upper"); }

absl::StatusOr<Value> FilterCenter(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("center", call, {"width"}));
  VC_ASSIGN_OR_RETURN(const Value s, SoftStr(v));
  return CallMethod(s, "center", CallArgs{{ArgOr(a[0], Value::Int(80))}, {}});
}

absl::StatusOr<Value> FilterTrim(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("trim", call, {"chars"}));
  VC_ASSIGN_OR_RETURN(const Value s, SoftStr(v));
  return CallMethod(s, "strip", CallArgs{{ArgOr(a[0], Value())}, {}});
}

absl::StatusOr<Value> FilterTitle(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("title", call, {}).status());
  VC_ASSIGN_OR_RETURN(const Value s, SoftStr(v));
  // Words begin after runs of whitespace, "-", "(", "{", "[" and "<"; each word is its first
  // character upper-cased and the rest lower-cased.
  const std::u32string text = python::Decode(s.string());
  const auto is_break = [](char32_t c) {
    return python::IsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    size_t j = i;
    if (is_break(text[i])) {
      while (j < text.size() && is_break(text[j])) ++j;
      out += python::Encode(std::u32string_view(text).substr(i, j - i));
    } else {
      while (j < text.size() && !is_break(text[j])) ++j;
      out += python::Upper(python::Encode(std::u32string_view(text).substr(i, 1)));
      out += python::Lower(python::Encode(std::u32string_view(text).substr(i + 1, j - i - 1)));
    }
    i = j;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterLength(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("length", call, {}).status());
  VC_ASSIGN_OR_RETURN(const int64_t n, Length(v));
  return Value::Int(n);
}

absl::StatusOr<Value> FilterDefault(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("default", call, {"default_value", "boolean"}));
  const bool boolean = Truthy(ArgOr(a[1], Value::Bool(false)));
  if (v.is_undefined() || (boolean && !Truthy(v))) return ArgOr(a[0], Value::String(""));
  return v;
}

absl::StatusOr<std::vector<Value>> DictItems(const Value& v) {
  if (!v.is_dict()) return TypeError(absl::StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  std::vector<Value> items;
  for (const auto& [key, value] : v.dict().items) items.push_back(Value::Tuple({key, value}));
  return items;
}

absl::StatusOr<Value> FilterDictsort(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("dictsort", call, {"case_sensitive", "by", "reverse"}));
  const bool case_sensitive = Truthy(ArgOr(a[0], Value::Bool(false)));
  const Value by = ArgOr(a[1], Value::String("key"));
  size_t pos;
  if (by.is_string() && by.string() == "key") {
    pos = 0;
  } else if (by.is_string() && by.string() == "value") {
    pos = 1;
  } else {
    return absl::InvalidArgumentError("You can only sort by either \"key\" or \"value\"");
  }
  VC_ASSIGN_OR_RETURN(std::vector<Value> items, DictItems(v));
  std::vector<Value> keys;
  for (const Value& item : items) {
    const Value& k = item.sequence().items[pos];
    keys.push_back(case_sensitive ? k : IgnoreCase(k));
  }
  VC_ASSIGN_OR_RETURN(std::vector<Value> sorted,
                      SortBy(std::move(items), keys, Truthy(ArgOr(a[2], Value::Bool(false)))));
  return Value::List(std::move(sorted));
}

absl::StatusOr<Value> FilterEscape(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("escape", call, {}).status());
  return Escape(v);
}

absl::StatusOr<Value> FilterFirst(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("first", call, {}).status());
  if (v.is_iterator()) {
    Iterator& it = v.iterator();
    if (it.next < it.items.size()) return it.items[it.next++];
    return Value::Undefined("No first item, sequence was empty.");
  }
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FilterLast(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("last", call, {}).status());
  if (v.is_iterator()) return TypeError(absl::StrCat("'", TypeName(v), "' object is not reversible"));
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

// Skips digits with single "_" between them (as Python's numbers take them) from text[*i].
// Whether there was a digit.
bool SkipDigits(const std::string& text, size_t* i, int base = 10) {
  const auto is_digit = [&](size_t k) {
    if (k >= text.size()) return false;
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : base;
    return d < base;
  };
  const size_t start = *i;
  while (is_digit(*i) || (*i > start && *i < text.size() && text[*i] == '_' && is_digit(*i + 1))) ++*i;
  return *i > start;
}

std::string WithoutUnderscores(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  return s;
}

// Python's float() of a str: [sign] digits[.digits] or .digits, then [e[sign]digits]; or inf,
// infinity, nan; whitespace around.
std::optional<double> ParseFloat(const std::string& text) {
  const std::string s = python::Strip(text, std::nullopt, true, true);
  size_t i = s.empty() || (s[0] != '+' && s[0] != '-') ? 0 : 1;
  std::string word = s.substr(i);
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return std::tolower(c); });
  if (word == "inf" || word == "infinity") return s[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  if (word == "nan") return std::nan("");
  const bool whole = SkipDigits(s, &i);
  bool fraction = false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    fraction = SkipDigits(s, &i);
  }
  if (!whole && !fraction) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!SkipDigits(s, &i)) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  return std::strtod(WithoutUnderscores(s).c_str(), nullptr);
}

// Python's int(text, base) for bases 2, 8, 10 and 16: [sign] [0b/0o/0x as the base has it] digits;
// whitespace around. nullopt past 64 bits too.
std::optional<int64_t> ParseInt(const std::string& text, int base) {
  const std::string s = python::Strip(text, std::nullopt, true, true);
  size_t i = s.empty() || (s[0] != '+' && s[0] != '-') ? 0 : 1;
  const char prefix = base == 16 ? 'x' : base == 8 ? 'o' : base == 2 ? 'b' : 0;
  if (prefix != 0 && i + 1 < s.size() && s[i] == '0' && std::tolower(static_cast<unsigned char>(s[i + 1])) == prefix) {
    i += 2;
    if (i < s.size() && s[i] == '_') ++i;  // Python takes "0x_1f"
  }
  const size_t digits_start = i;
  if (!SkipDigits(s, &i, base) || i != s.size()) return std::nullopt;
  const std::string digits = WithoutUnderscores(s.substr(digits_start));
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
  if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) return std::nullopt;
  return s[0] == '-' ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
}

absl::StatusOr<Value> FilterFloat(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("float", call, {"default"}));
  if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
  if (v.is_number()) return Value::Float(v.float_value());
  if (v.is_string()) {
    if (const std::optional<double> d = ParseFloat(v.string())) return Value::Float(*d);
  }
  return ArgOr(a[0], Value::Float(0.0));
}

absl::StatusOr<Value> TruncateToInt(double d) {
  if (std::isinf(d)) return absl::InvalidArgumentError("cannot convert float infinity to integer");
  if (std::fabs(d) >= 9223372036854775808.0) {
    return absl::InvalidArgumentError("integer result past 64 bits (not supported)");
  }
  return Value::Int(static_cast<int64_t>(std::trunc(d)));
}

absl::StatusOr<Value> FilterInt(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("int", call, {"default", "base"}));
  const Value fallback = ArgOr(a[0], Value::Int(0));
  if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
  if (v.is_int() || v.is_bool()) return Value::Int(v.int_value());
  if (v.is_float()) {
    if (std::isnan(v.float_value())) return fallback;
    return TruncateToInt(v.float_value());
  }
  if (!v.is_string()) return fallback;
  VC_ASSIGN_OR_RETURN(const int64_t base, AsIndex(ArgOr(a[1], Value::Int(10))));
  if (base != 10 && base != 16 && base != 8 && base != 2) return Unsupported(absl::StrCat("int() with base ", base));
  if (const std::optional<int64_t> i = ParseInt(v.string(), static_cast<int>(base))) return Value::Int(*i);
  const std::optional<double> d = ParseFloat(v.string());
  if (!d.has_value() || std::isnan(*d)) return fallback;
  return TruncateToInt(*d);
}

absl::StatusOr<Value> FilterIndent(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("indent", call, {"width", "first", "blank"}));
  if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
  if (!v.is_string()) {
    return TypeError(absl::StrCat("unsupported operand type(s) for +=: '", TypeName(v), "' and 'str'"));
  }
  const Value width = ArgOr(a[0], Value::Int(4));
  std::string indention;
  if (width.is_string()) {
    indention = width.string();
  } else {
    VC_ASSIGN_OR_RETURN(const int64_t n, PaddingWidth(width));
    indention = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  std::vector<std::string> lines = python::SplitLines(v.string() + "\n", false);
  std::string out;
  if (Truthy(ArgOr(a[2], Value::Bool(false)))) {
    out = absl::StrJoin(lines, "\n" + indention);
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) absl::StrAppend(&out, "\n", lines[i].empty() ? "" : indention, lines[i]);
  }
  if (Truthy(ArgOr(a[1], Value::Bool(false)))) out = indention + out;
  return StringLike(v, std::move(out));
}

absl::StatusOr<Value> FilterItems(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("items", call, {}).status());
  if (v.is_undefined()) return Value::FromIterator("generator", {});
  if (!v.is_dict()) return TypeError("Can only get item pairs from a mapping.");
  VC_ASSIGN_OR_RETURN(std::vector<Value> items, DictItems(v));
  return Value::FromIterator("generator", std::move(items));
}

absl::StatusOr<Value> FilterJoin(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("join", call, {"d", "attribute"}));
  VC_ASSIGN_OR_RETURN(const std::string separator, Str(ArgOr(a[0], Value::String(""))));
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  const AttributePath path = ParseAttributePath(ArgOr(a[1], Value()));
  std::vector<std::string> parts;
  for (const Value& item : items) {
    VC_ASSIGN_OR_RETURN(const Value x, FollowPath(item, path));
    VC_ASSIGN_OR_RETURN(std::string s, Str(x));
    parts.push_back(std::move(s));
  }
  return Value::String(absl::StrJoin(parts, separator));
}

absl::StatusOr<Value> FilterList(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("list", call, {}).status());
  VC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  return Value::List(std::move(items));
}

// Calls the filter or test `name` at render time (map and select name them with a string).
absl::StatusOr<Value> ApplyFilterNamed(const Value& name, const Value& v, const CallArgs& call) {
  const FilterDef* f = name.is_string() ? FindFilter(name.string()) : nullptr;
  if (f == nullptr) {
    absl::StatusOr<std::string> n = Str(name);
    return absl::InvalidArgumentError(absl::StrCat("No filter named ", python::Repr(n.ok() ? *n : "?"), "."));
  }
  return f->apply(v, call);
}

absl::StatusOr<bool> ApplyTestNamed(const Value& name, const Value& v, const CallArgs& call) {
  const TestDef* t = name.is_string() ? FindTest(name.string()) : nullptr;
  if (t == nullptr) {
    absl::StatusOr<std::string> n = Str(name);
    return absl::InvalidArgumentError(absl::StrCat("No test named ", python::Repr(n.ok() ? *n : "?"), "."));
  }
  return t->apply(v, call);
}

absl::StatusOr<Value> FilterMap(const Value& v, const CallArgs& call) {
  if (!Truthy(v)) return Value::FromIterator("generator", {});
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  std::vector<Value> out;
  if (call.positional.empty() &&
      std::any_of(call.keyword.begin(), call.keyword.end(), [](const auto& kw) { return kw.first == "attribute"; })) {
    std::optional<Value> attribute, fallback;
    for (const auto& [key, value] : call.keyword) {
      if (key == "attribute") {
        attribute = value;
      } else if (key == "default") {
        fallback = value;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("Unexpected keyword argument ", python::Repr(key)));
      }
    }
    if (fallback.has_value() && fallback->is_none()) fallback.reset();
    const AttributePath path = ParseAttributePath(*attribute);
    for (const Value& item : items) {
      VC_ASSIGN_OR_RETURN(Value x, FollowPath(item, path, fallback));
      out.push_back(std::move(x));
    }
    return Value::FromIterator("generator", std::move(out));
  }
  if (call.positional.empty()) return absl::InvalidArgumentError("map requires a filter argument");
  const CallArgs rest{std::vector<Value>(call.positional.begin() + 1, call.positional.end()), call.keyword};
  for (const Value& item : items) {
    VC_ASSIGN_OR_RETURN(Value x, ApplyFilterNamed(call.positional[0], item, rest));
    out.push_back(std::move(x));
  }
  return Value::FromIterator("generator", std::move(out));
}

// select, reject, selectattr and rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& v, const CallArgs& call, bool select, bool by_attribute) {
  if (!Truthy(v)) return Value::FromIterator("generator", {});
  AttributePath path;
  size_t offset = 0;
  if (by_attribute) {
    if (call.positional.empty()) return absl::InvalidArgumentError("Missing parameter for attribute name");
    path = ParseAttributePath(call.positional[0]);
    offset = 1;
  }
  std::optional<Value> test;
  CallArgs rest{{}, call.keyword};
  if (call.positional.size() > offset) {
    test = call.positional[offset];
    rest.positional.assign(call.positional.begin() + static_cast<std::ptrdiff_t>(offset) + 1, call.positional.end());
  }
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  std::vector<Value> out;
  for (const Value& item : items) {
    VC_ASSIGN_OR_RETURN(const Value x, FollowPath(item, path));
    bool passed;
    if (test.has_value()) {
      VC_ASSIGN_OR_RETURN(passed, ApplyTestNamed(*test, x, rest));
    } else {
      passed = Truthy(x);
    }
    if (passed == select) out.push_back(item);
  }
  return Value::FromIterator("generator", std::move(out));
}

absl::StatusOr<Value> FilterSelect(const Value& v, const CallArgs& call) {
  return SelectOrReject(v, call, true, false);
}
absl::StatusOr<Value> FilterReject(const Value& v, const CallArgs& call) {
  return SelectOrReject(v, call, false, false);
}
absl::StatusOr<Value> FilterSelectattr(const Value& v, const CallArgs& call) {
  return SelectOrReject(v, call, true, true);
}
absl::StatusOr<Value> FilterRejectattr(const Value& v, const CallArgs& call) {
  return SelectOrReject(v, call, false, true);
}

// min and max: the first item whose key is least (greatest).
absl::StatusOr<Value> MinOrMax(const Value& v, const CallArgs& call, bool max) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs(max ? "max" : "min", call, {"case_sensitive", "attribute"}));
  const bool case_sensitive = Truthy(ArgOr(a[0], Value::Bool(false)));
  const AttributePath path = ParseAttributePath(ArgOr(a[1], Value()));
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    VC_ASSIGN_OR_RETURN(Value key, FollowPath(items[i], path));
    if (!case_sensitive) key = IgnoreCase(key);
    if (i > 0) {
      VC_ASSIGN_OR_RETURN(const bool better, Compare(max ? Order::kGreater : Order::kLess, key, best_key));
      if (!better) continue;
    }
    best = i;
    best_key = std::move(key);
  }
  return items[best];
}

absl::StatusOr<Value> FilterMin(const Value& v, const CallArgs& call) { return MinOrMax(v, call, false); }
absl::StatusOr<Value> FilterMax(const Value& v, const CallArgs& call) { return MinOrMax(v, call, true); }

absl::StatusOr<Value> FilterReplace(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("replace", call, {"old", "new", "count"}));
  if (!a[0].has_value() || !a[1].has_value()) {
    return TypeError("do_replace() missing required arguments: 'old' and 'new'");
  }
  VC_ASSIGN_OR_RETURN(const std::string s, Str(v));
  VC_ASSIGN_OR_RETURN(const std::string old, Str(*a[0]));
  VC_ASSIGN_OR_RETURN(const std::string replacement, Str(*a[1]));
  int64_t count = -1;
  if (a[2].has_value() && !a[2]->is_none()) {
    VC_ASSIGN_OR_RETURN(count, AsIndex(*a[2]));
  }
  return Value::String(python::Replace(s, old, replacement, count));
}

absl::StatusOr<Value> FilterReverse(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("reverse", call, {}).status());
  if (v.is_string()) {
    std::u32string s = python::Decode(v.string());
    std::reverse(s.begin(), s.end());
    return StringLike(v, python::Encode(s));
  }
  const bool reversible = v.is_sequence() || v.is_dict() || v.is_undefined();
  VC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::reverse(items.begin(), items.end());
  // Python's reversed() gives an iterator; what cannot be reversed in place becomes a list.
  if (reversible) return Value::FromIterator("list_reverseiterator", std::move(items));
  return Value::List(std::move(items));
}

// Python's round(x, digits) of a float: correctly rounded, ties to even.
absl::StatusOr<double> RoundFloat(double x, int64_t digits) {
  if (!std::isfinite(x) || digits > 323) return x;
  if (digits < 0) return Unsupported("round() of a float to negative digits");
  const int n = std::snprintf(nullptr, 0, "%.*f", static_cast<int>(digits), x);
  std::string text(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(text.data(), text.size(), "%.*f", static_cast<int>(digits), x);
  return std::strtod(text.c_str(), nullptr);
}

// Python's round(i, digits) of an int: to a multiple of 10**-digits, ties to even.
absl::StatusOr<Value> RoundInt(int64_t i, int64_t digits) {
  if (digits >= 0) return Value::Int(i);
  if (digits < -18) return Value::Int(0);
  int64_t unit = 1;
  for (int64_t k = 0; k < -digits; ++k) unit *= 10;
  int64_t q = i / unit, r = i % unit;
  if (r < 0) {
    r += unit;
    q -= 1;
  }
  if (2 * r > unit || (2 * r == unit && (q & 1))) ++q;
  int64_t result;
  if (__builtin_mul_overflow(q, unit, &result)) {
    return absl::InvalidArgumentError("integer result past 64 bits (not supported)");
  }
  return Value::Int(result);
}

absl::StatusOr<Value> FilterRound(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("round", call, {"precision", "method"}));
  VC_ASSIGN_OR_RETURN(const int64_t precision, AsIndex(ArgOr(a[0], Value::Int(0))));
  const Value method = ArgOr(a[1], Value::String("common"));
  const std::string m = method.is_string() ? method.string() : "";
  if (m != "common" && m != "ceil" && m != "floor") {
    return absl::InvalidArgumentError("method must be common, ceil or floor");
  }
  if (!v.is_number()) return TypeError(absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  if (m == "common") {
    if (!v.is_float()) return RoundInt(v.int_value(), precision);
    VC_ASSIGN_OR_RETURN(const double r, RoundFloat(v.float_value(), precision));
    return Value::Float(r);
  }
  // math.ceil/floor(value * 10**precision) / 10**precision, a float.
  VC_ASSIGN_OR_RETURN(const Value scale, Arithmetic(ArithmeticOp::kPower, Value::Int(10), Value::Int(precision)));
  VC_ASSIGN_OR_RETURN(const Value scaled, Arithmetic(ArithmeticOp::kMultiply, v, scale));
  const double x = scaled.float_value();
  if (!std::isfinite(x)) return absl::InvalidArgumentError("cannot convert float infinity or NaN to integer");
  VC_ASSIGN_OR_RETURN(const Value whole, TruncateToInt(m == "ceil" ? std::ceil(x) : std::floor(x)));
  return Arithmetic(ArithmeticOp::kDivide, whole, scale);
}

absl::StatusOr<Value> FilterSafe(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("safe", call, {}).status());
  VC_ASSIGN_OR_RETURN(std::string s, Str(v));
  return Value::Markup(std::move(s));
}

absl::StatusOr<Value> FilterSort(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("sort", call, {"reverse", "case_sensitive", "attribute"}));
  const bool case_sensitive = Truthy(ArgOr(a[1], Value::Bool(false)));
  const Value attribute = ArgOr(a[2], Value());
  // Several attributes may be named, separated by commas; the key is the list of their values.
  std::vector<AttributePath> paths;
  if (attribute.is_string()) {
    for (const absl::string_view part : absl::StrSplit(attribute.string(), ',')) {
      paths.push_back(ParseAttributePath(Value::String(std::string(part))));
    }
  } else {
    paths.push_back(ParseAttributePath(attribute));
  }
  VC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> keys;
  for (const Value& item : items) {
    std::vector<Value> key;
    for (const AttributePath& path : paths) {
      VC_ASSIGN_OR_RETURN(Value k, FollowPath(item, path));
      key.push_back(case_sensitive ? k : IgnoreCase(k));
    }
    keys.push_back(Value::List(std::move(key)));
  }
  VC_ASSIGN_OR_RETURN(std::vector<Value> sorted,
                      SortBy(std::move(items), keys, Truthy(ArgOr(a[0], Value::Bool(false)))));
  return Value::List(std::move(sorted));
}

absl::StatusOr<Value> FilterString(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("string", call, {}).status());
  return SoftStr(v);
}

absl::StatusOr<Value> FilterSum(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("sum", call, {"attribute", "start"}));
  const AttributePath path = ParseAttributePath(ArgOr(a[0], Value()));
  Value total = ArgOr(a[1], Value::Int(0));
  if (total.is_string()) return TypeError("sum() can't sum strings [use ''.join(seq) instead]");
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  for (const Value& item : items) {
    VC_ASSIGN_OR_RETURN(const Value x, FollowPath(item, path));
    VC_ASSIGN_OR_RETURN(total, Arithmetic(ArithmeticOp::kAdd, total, x));
  }
  return total;
}

absl::StatusOr<Value> FilterToJson(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("tojson", call, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonFormat format;
  format.ensure_ascii = Truthy(ArgOr(a[0], Value::Bool(false)));
  const Value indent = ArgOr(a[1], Value());
  if (indent.is_string()) {
    format.indent = indent.string();
  } else if (!indent.is_none()) {
    if (!indent.is_int() && !indent.is_bool()) {
      return TypeError(absl::StrCat("can't multiply sequence by non-int of type '", TypeName(indent), "'"));
    }
    VC_ASSIGN_OR_RETURN(const int64_t n, PaddingWidth(indent));
    format.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  const Value separators = ArgOr(a[2], Value());
  if (separators.is_none()) {
    format.item_separator = format.indent.has_value() ? "," : ", ";
  } else {
    VC_ASSIGN_OR_RETURN(const std::vector<Value> parts, Iterate(separators));
    if (parts.size() != 2) return absl::InvalidArgumentError(absl::StrCat("expected 2 separators, got ", parts.size()));
    if (!parts[0].is_string() || !parts[1].is_string()) return TypeError("separators must be str");
    format.item_separator = parts[0].string();
    format.key_separator = parts[1].string();
  }
  format.sort_keys = Truthy(ArgOr(a[3], Value::Bool(false)));
  VC_ASSIGN_OR_RETURN(std::string json, ToJson(v, format));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> FilterUnique(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("unique", call, {"case_sensitive", "attribute"}));
  const bool case_sensitive = Truthy(ArgOr(a[0], Value::Bool(false)));
  const AttributePath path = ParseAttributePath(ArgOr(a[1], Value()));
  VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(v));
  std::vector<Value> seen, out;
  for (const Value& item : items) {
    VC_ASSIGN_OR_RETURN(Value key, FollowPath(item, path));
    if (!case_sensitive) key = IgnoreCase(key);
    VC_RETURN_IF_ERROR(CheckHashable(key));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::FromIterator("generator", std::move(out));
}

absl::StatusOr<Value> FilterWordcount(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("wordcount", call, {}).status());
  VC_ASSIGN_OR_RETURN(const Value s, SoftStr(v));
  int64_t words = 0;
  bool in_word = false;
  for (const char32_t c : python::Decode(s.string())) {
    const bool word_char = c == '_' || python::IsAlnum(c);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::Int(words);
}

constexpr FilterDef kFilters[] = {
    {"abs", FilterAbs},
    {"attr", FilterAttr},
    {"batch", FilterBatch},
    {"capitalize", FilterCapitalize},
    {"center", FilterCenter},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"dictsort", FilterDictsort},
    {"e", FilterEscape},
    {"escape", FilterEscape},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", FilterLower},
    {"map", FilterMap},
    {"max", FilterMax},
    {"min", FilterMin},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectattr},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"round", FilterRound},
    {"safe", FilterSafe},
    {"select", FilterSelect},
    {"selectattr", FilterSelectattr},
    {"sort", FilterSort},
    {"string", FilterString},
    {"sum", FilterSum},
    {"title", FilterTitle},
    {"tojson", FilterToJson},
    {"trim", FilterTrim},
    {"unique", FilterUnique},
    {"upper", FilterUpper},
    {"wordcount", FilterWordcount},
};

// ------------------------------------------------------------------------------------------
// Tests

template <bool (*Check)(const Value&)>
absl::StatusOr<bool> UnaryTest(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("test", call, {}).status());
  return Check(v);
}

bool IsDefined(const Value& v) { return !v.is_undefined(); }
bool IsUndefined(const Value& v) { return v.is_undefined(); }
bool IsNone(const Value& v) { return v.is_none(); }
bool IsBoolean(const Value& v) { return v.is_bool(); }
bool IsFalse(const Value& v) { return v.is_bool() && !v.bool_value(); }
bool IsTrue(const Value& v) { return v.is_bool() && v.bool_value(); }
bool IsInteger(const Value& v) { return v.is_int(); }
bool IsFloat(const Value& v) { return v.is_float(); }
bool IsString(const Value& v) { return v.is_string(); }
bool IsMapping(const Value& v) { return v.is_dict(); }
bool IsNumber(const Value& v) { return v.is_number(); }
bool IsEscaped(const Value& v) { return v.is_markup(); }
// Has len() and item access (Undefined has both, though reading an item fails).
bool IsSequence(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_dict() ||
         (v.is_sequence() && (v.is_list() || v.is_tuple() || v.sequence().type == SequenceType::kRange));
}
bool IsIterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() || v.is_iterator() ||
         (v.is_object() && v.object().iterable());
}
// Undefined is callable (calling it raises the undefined error).
bool IsCallable(const Value& v) { return v.is_undefined() || (v.is_object() && v.object().callable()); }

absl::StatusOr<bool> TestLower(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("lower", call, {}).status());
  VC_ASSIGN_OR_RETURN(const std::string s, Str(v));
  return python::IsLower(s);
}

absl::StatusOr<bool> TestUpper(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("upper", call, {}).status());
  VC_ASSIGN_OR_RETURN(const std::string s, Str(v));
  return python::IsUpper(s);
}

// value % n == remainder, with Python's %.
absl::StatusOr<bool> ModuloIs(const Value& v, const Value& n, int64_t remainder) {
  VC_ASSIGN_OR_RETURN(const Value r, Arithmetic(ArithmeticOp::kModulo, v, n));
  return Equal(r, Value::Int(remainder));
}

absl::StatusOr<bool> TestOdd(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("odd", call, {}).status());
  return ModuloIs(v, Value::Int(2), 1);
}

absl::StatusOr<bool> TestEven(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("even", call, {}).status());
  return ModuloIs(v, Value::Int(2), 0);
}

absl::StatusOr<bool> TestDivisibleby(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs("divisibleby", call, {"num"}));
  if (!a[0].has_value()) return TypeError("test_divisibleby() missing 1 required positional argument: 'num'");
  return ModuloIs(v, *a[0], 0);
}

absl::StatusOr<Value> OneArgument(absl::string_view test, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Args a, BindArgs(test, call, {"other"}));
  if (!a[0].has_value()) return TypeError(absl::StrCat(test, " expected 2 arguments, got 1"));
  return *a[0];
}

using Relation = absl::StatusOr<bool> (*)(const Value& value, const Value& other);
absl::StatusOr<bool> IsEqual(const Value& a, const Value& b) { return Equal(a, b); }
absl::StatusOr<bool> IsNotEqual(const Value& a, const Value& b) { return !Equal(a, b); }
template <Order kOrder>
absl::StatusOr<bool> IsOrdered(const Value& a, const Value& b) {
  return Compare(kOrder, a, b);
}
absl::StatusOr<bool> IsIn(const Value& a, const Value& b) { return Contains(b, a); }

template <Relation kRelation>
absl::StatusOr<bool> RelationTest(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Value other, OneArgument("comparison", call));
  return kRelation(v, other);
}

absl::StatusOr<bool> TestSameas(const Value& v, const CallArgs& call) {
  VC_ASSIGN_OR_RETURN(const Value other, OneArgument("sameas", call));
  // Identity is knowable for None, True and False; for other values it is CPython's detail.
  const auto singleton = [](const Value& x) { return x.is_none() || x.is_bool(); };
  if (singleton(v) || singleton(other)) {
    return singleton(v) && singleton(other) && v.kind() == other.kind() && Equal(v, other);
  }
  if (v.is_sequence() || v.is_dict() || v.is_object() || v.is_iterator()) return v.identity() == other.identity();
  return Unsupported("the sameas test on values other than None, True, False and containers");
}

absl::StatusOr<bool> TestFilter(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("filter", call, {}).status());
  return v.is_string() && FindFilter(v.string()) != nullptr;
}

absl::StatusOr<bool> TestTest(const Value& v, const CallArgs& call) {
  VC_RETURN_IF_ERROR(BindArgs("test", call, {}).status());
  return v.is_string() && FindTest(v.string()) != nullptr;
}

constexpr TestDef kTests[] = {
    {"!=", RelationTest<IsNotEqual>},
    {"<", RelationTest<IsOrdered<Order::kLess>>},
    {"<=", RelationTest<IsOrdered<Order::kLessEqual>>},
    {"==", RelationTest<IsEqual>},
    {">", RelationTest<IsOrdered<Order::kGreater>>},
    {">=", RelationTest<IsOrdered<Order::kGreaterEqual>>},
    {"boolean", UnaryTest<IsBoolean>},
    {"callable", UnaryTest<IsCallable>},
    {"defined", UnaryTest<IsDefined>},
    {"divisibleby", TestDivisibleby},
    {"eq", RelationTest<IsEqual>},
    {"equalto", RelationTest<IsEqual>},
    {"escaped", UnaryTest<IsEscaped>},
    {"even", TestEven},
    {"false", UnaryTest<IsFalse>},
    {"filter", TestFilter},
    {"float", UnaryTest<IsFloat>},
    {"ge", RelationTest<IsOrdered<Order::kGreaterEqual>>},
    {"greaterthan", RelationTest<IsOrdered<Order::kGreater>>},
    {"gt", RelationTest<IsOrdered<Order::kGreater>>},
    {"in", RelationTest<IsIn>},
    {"integer", UnaryTest<IsInteger>},
    {"iterable", UnaryTest<IsIterable>},
    {"le", RelationTest<IsOrdered<Order::kLessEqual>>},
    {"lessthan", RelationTest<IsOrdered<Order::kLess>>},
    {"lower", TestLower},
    {"lt", RelationTest<IsOrdered<Order::kLess>>},
    {"mapping", UnaryTest<IsMapping>},
    {"ne", RelationTest<IsNotEqual>},
    {"none", UnaryTest<IsNone>},
    {"number", UnaryTest<IsNumber>},
    {"odd", TestOdd},
    {"sameas", TestSameas},
    {"sequence", UnaryTest<IsSequence>},
    {"string", UnaryTest<IsString>},
    {"test", TestTest},
    {"true", UnaryTest<IsTrue>},
    {"undefined", UnaryTest<IsUndefined>},
    {"upper", TestUpper},
};

// ------------------------------------------------------------------------------------------
// Globals

absl::StatusOr<Value> Range(CallArgs call) {
  if (!call.keyword.empty()) return TypeError("range() takes no keyword arguments");
  if (call.positional.empty() || call.positional.size() > 3) {
    return TypeError(absl::StrCat("range expected at most 3 arguments, got ", call.positional.size()));
  }
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < call.positional.size(); ++i) {
    VC_ASSIGN_OR_RETURN(bounds[call.positional.size() == 1 ? 1 : i], AsIndex(call.positional[i]));
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  // The number of items, ceil((stop - start) / step), in 128 bits where 64 could overflow.
  const __int128 span = static_cast<__int128>(stop) - start;
  const __int128 length =
      step > 0 ? (span > 0 ? (span + step - 1) / step : 0) : (span < 0 ? (-span - step - 1) / -step : 0);
  constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox refuses longer ranges
  if (length > kMaxRange) {
    return absl::InvalidArgumentError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  Sequence s;
  s.type = SequenceType::kRange;
  s.range_start = start;
  s.range_stop = stop;
  s.range_step = step;
  for (int64_t k = 0; k < length; ++k) s.items.push_back(Value::Int(start + k * step));
  return Value::FromSequence(std::move(s));
}

// dict(*args, **kwargs): a mapping or pairs, then keywords.
absl::StatusOr<Dict> DictFromArgs(const CallArgs& call, absl::string_view function) {
  if (call.positional.size() > 1) {
    return TypeError(absl::StrCat(function, " expected at most 1 argument, got ", call.positional.size()));
  }
  Dict d;
  if (!call.positional.empty()) {
    const Value& source = call.positional[0];
    if (source.is_dict()) {
      d = source.dict();
    } else {
      VC_ASSIGN_OR_RETURN(const std::vector<Value> pairs, Iterate(source));
      for (const Value& pair : pairs) {
        VC_ASSIGN_OR_RETURN(const std::vector<Value> kv, Iterate(pair));
        if (kv.size() != 2) {
          return absl::InvalidArgumentError(
              absl::StrCat("dictionary update sequence element has length ", kv.size(), "; 2 is required"));
        }
        VC_RETURN_IF_ERROR(CheckHashable(kv[0]));
        d.Set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : call.keyword) d.Set(Value::String(key), value);
  return d;
}
}  // namespace

const FilterDef* FindFilter(absl::string_view name) {
  for (const FilterDef& f : kFilters) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

const TestDef* FindTest(absl::string_view name) {
  for (const TestDef& t : kTests) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

std::optional<Value> Namespace::Attribute(const std::string& name) const {
  const Value* v = attributes_.Find(Value::String(name));
  if (v != nullptr) return *v;
  return std::nullopt;
}

absl::StatusOr<std::string> Namespace::Repr() const {
  VC_ASSIGN_OR_RETURN(const std::string attributes, jinja::Repr(Value::FromDict(attributes_)));
  return absl::StrCat("<Namespace ", attributes, ">");
}

void Namespace::Set(const std::string& name, Value value) { attributes_.Set(Value::String(name), std::move(value)); }

absl::StatusOr<std::string> Function::Repr() const {
  return Unsupported(absl::StrCat("printing the function ", name_));
}

std::vector<std::pair<std::string, Value>> BuiltinGlobals() {
  std::vector<std::pair<std::string, Value>> globals;
  const auto add = [&](const std::string& name, std::function<absl::StatusOr<Value>(CallArgs)> body) {
    globals.emplace_back(name, Value::FromObject(std::make_shared<Function>(name, std::move(body))));
  };
  add("range", Range);
  add("dict", [](CallArgs call) -> absl::StatusOr<Value> {
    VC_ASSIGN_OR_RETURN(Dict d, DictFromArgs(call, "dict"));
    return Value::FromDict(std::move(d));
  });
  add("namespace", [](CallArgs call) -> absl::StatusOr<Value> {
    VC_ASSIGN_OR_RETURN(Dict d, DictFromArgs(call, "namespace"));
    return Value::FromObject(std::make_shared<Namespace>(std::move(d)));
  });
  for (const char* name : {"cycler", "joiner", "lipsum"}) {
    add(name,
        [name](CallArgs) -> absl::StatusOr<Value> { return Unsupported(absl::StrCat("the global ", name, "()")); });
  }
  return globals;
}

}  // namespace vc::jinja