#include "worker/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "common/utf8.h"
#include "worker/chat/python_str.h"

namespace vc::jinja {
namespace {

constexpr double kTwoPow63 = 9223372036854775808.0;
// Values nested deeper than this are refused (as Python's recursion limit would refuse them).
constexpr int kMaxNesting = 500;

// -1, 0 or 1 as a <, == or > b, exactly (an int is not rounded to a float); nullopt for NaN.
std::optional<int> CompareNumbers(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) {
    const int64_t x = a.int_value(), y = b.int_value();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_float() && b.is_float()) {
    const double x = a.float_value(), y = b.float_value();
    if (std::isnan(x) || std::isnan(y)) return std::nullopt;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const bool int_first = !a.is_float();
  const int64_t i = int_first ? a.int_value() : b.int_value();
  const double d = int_first ? b.float_value() : a.float_value();
  if (std::isnan(d)) return std::nullopt;
  int c;  // i against d
  if (d >= kTwoPow63) {
    c = -1;
  } else if (d < -kTwoPow63) {
    c = 1;
  } else {
    const double whole = std::trunc(d);
    const auto t = static_cast<int64_t>(whole);
    c = i < t ? -1 : i > t ? 1 : d > whole ? -1 : d < whole ? 1 : 0;
  }
  return int_first ? c : -c;
}

const char* OrderSymbol(Order order) {
  switch (order) {
    case Order::kLess:
      return "<";
    case Order::kLessEqual:
      return "<=";
    case Order::kGreater:
      return ">";
    case Order::kGreaterEqual:
      return ">=";
  }
  return "";
}

bool Holds(Order order, int c) {
  switch (order) {
    case Order::kLess:
      return c < 0;
    case Order::kLessEqual:
      return c <= 0;
    case Order::kGreater:
      return c > 0;
    case Order::kGreaterEqual:
      return c >= 0;
  }
  return false;
}

bool SequenceEqual(const std::vector<Value>& a, const std::vector<Value>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!Equal(a[i], b[i])) return false;
  }
  return true;
}

// Equality of set-like views (dict keys and items): the same members in any order.
bool SetEqual(const std::vector<Value>& a, const std::vector<Value>& b) {
  if (a.size() != b.size()) return false;
  for (const Value& x : a) {
    if (std::none_of(b.begin(), b.end(), [&](const Value& y) { return Equal(x, y); })) return false;
  }
  return true;
}

absl::StatusOr<std::string> ReprAt(const Value& value, int depth);

absl::StatusOr<std::string> JoinReprs(const std::vector<Value>& items, int depth) {
  std::vector<std::string> parts;
  parts.reserve(items.size());
  for (const Value& item : items) {
    VC_ASSIGN_OR_RETURN(std::string r, ReprAt(item, depth + 1));
    parts.push_back(std::move(r));
  }
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<std::string> SequenceRepr(const Sequence& s, int depth) {
  VC_ASSIGN_OR_RETURN(const std::string items, JoinReprs(s.items, depth));
  switch (s.type) {
    case SequenceType::kList:
      return absl::StrCat("[", items, "]");
    case SequenceType::kTuple:
      return absl::StrCat("(", items, s.items.size() == 1 ? ",)" : ")");
    case SequenceType::kRange:
      return s.range_step == 1 ? absl::StrCat("range(", s.range_start, ", ", s.range_stop, ")")
                               : absl::StrCat("range(", s.range_start, ", ", s.range_stop, ", ", s.range_step, ")");
    case SequenceType::kDictKeys:
      return absl::StrCat("dict_keys([", items, "])");
    case SequenceType::kDictValues:
      return absl::StrCat("dict_values([", items, "])");
    case SequenceType::kDictItems:
      return absl::StrCat("dict_items([", items, "])");
  }
  return items;
}

absl::StatusOr<std::string> DictRepr(const Dict& d, int depth) {
  std::vector<std::string> parts;
  parts.reserve(d.items.size());
  for (const auto& [key, value] : d.items) {
    VC_ASSIGN_OR_RETURN(const std::string k, ReprAt(key, depth + 1));
    VC_ASSIGN_OR_RETURN(const std::string v, ReprAt(value, depth + 1));
    parts.push_back(absl::StrCat(k, ": ", v));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

absl::Status UndefinedError(const Value& v) { return absl::InvalidArgumentError(v.undefined_message()); }

absl::Status UnsupportedOperands(absl::string_view symbol, const Value& a, const Value& b) {
  return TypeError(
      absl::StrCat("unsupported operand type(s) for ", symbol, ": '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<Value> CheckedInt(bool overflow, int64_t result) {
  if (overflow) return absl::InvalidArgumentError("integer result past 64 bits (not supported)");
  return Value::Int(result);
}

// CPython's float floor division and modulo (float_divmod).
std::pair<double, double> FloatDivMod(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floor_div;
  if (div != 0) {
    floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
  } else {
    floor_div = std::copysign(0.0, x / y);
  }
  return {floor_div, mod};
}

absl::StatusOr<Value> Repeat(const Value& sequence, const Value& count) {
  const int64_t n = std::max<int64_t>(count.int_value(), 0);
  constexpr int64_t kMaxBytes = int64_t{1} << 30;
  if (sequence.is_string()) {
    const std::string& s = sequence.string();
    if (n > 0 && static_cast<int64_t>(s.size()) > kMaxBytes / n) {
      return absl::InvalidArgumentError("repeated string too large");
    }
    std::string out;
    out.reserve(s.size() * n);
    for (int64_t i = 0; i < n; ++i) out += s;
    return sequence.is_markup() ? Value::Markup(std::move(out)) : Value::String(std::move(out));
  }
  const std::vector<Value>& items = sequence.sequence().items;
  if (n > 0 && static_cast<int64_t>(items.size()) > (kMaxBytes / 64) / n) {
    return absl::InvalidArgumentError("repeated list too large");
  }
  std::vector<Value> out;
  out.reserve(items.size() * n);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return sequence.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

bool IsRepeatable(const Value& v) { return v.is_string() || v.is_list() || v.is_tuple(); }

absl::StatusOr<Value> Add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value::Float(a.float_value() + b.float_value());
    int64_t r;
    const bool overflow = __builtin_add_overflow(a.int_value(), b.int_value(), &r);
    return CheckedInt(overflow, r);
  }
  if (a.is_string() && b.is_string()) {
    // Markup + str escapes the str, whichever side it is on.
    if (a.is_markup() != b.is_markup()) {
      VC_ASSIGN_OR_RETURN(const Value left, a.is_markup() ? Value(a) : Escape(a));
      VC_ASSIGN_OR_RETURN(const Value right, b.is_markup() ? Value(b) : Escape(b));
      return Value::Markup(left.string() + right.string());
    }
    std::string s = a.string() + b.string();
    return a.is_markup() ? Value::Markup(std::move(s)) : Value::String(std::move(s));
  }
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    std::vector<Value> items = a.sequence().items;
    items.insert(items.end(), b.sequence().items.begin(), b.sequence().items.end());
    return a.is_list() ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
  }
  if (a.is_string() || a.is_list() || a.is_tuple()) {
    return TypeError(
        absl::StrCat("can only concatenate ", TypeName(a), " (not \"", TypeName(b), "\") to ", TypeName(a)));
  }
  return UnsupportedOperands("+", a, b);
}

absl::StatusOr<Value> Power(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float() && b.int_value() >= 0) {
    int64_t result = 1, base = a.int_value();
    for (int64_t e = b.int_value(); e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return CheckedInt(true, 0);
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) return CheckedInt(true, 0);
    }
    return Value::Int(result);
  }
  const double x = a.float_value(), y = b.float_value();
  if (x == 0 && y < 0) return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
  if (x < 0 && std::isfinite(x) && std::isfinite(y) && y != std::floor(y)) {
    return absl::InvalidArgumentError("a negative number to a fractional power is complex (not supported)");
  }
  const double r = std::pow(x, y);
  if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) {
    return absl::InvalidArgumentError("(34, 'Numerical result out of range')");
  }
  return Value::Float(r);
}

// Python's json string encoding; with `ensure_ascii`, what is past printable ASCII as \uXXXX
// (UTF-16 surrogate pairs past U+FFFF).
void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (const char32_t c : python::Decode(s)) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f && c < 0x10000)) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<uint32_t>(c));
        } else if (ensure_ascii && c >= 0x10000) {
          const uint32_t v = c - 0x10000;
          absl::StrAppendFormat(out, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
        } else {
          AppendUtf8(c, out);
        }
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return FloatRepr(f);
}

absl::Status NotSerializable(const Value& v) {
  return TypeError(absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonFormat& format) : format_(format) {}

  absl::Status Write(const Value& v, int level, std::string* out) {
    if (level > kMaxNesting) return absl::InvalidArgumentError("values nested too deeply");
    switch (v.kind()) {
      case Value::Kind::kNone:
        out->append("null");
        return absl::OkStatus();
      case Value::Kind::kBool:
        out->append(v.bool_value() ? "true" : "false");
        return absl::OkStatus();
      case Value::Kind::kInt:
        absl::StrAppend(out, v.int_value());
        return absl::OkStatus();
      case Value::Kind::kFloat:
        out->append(JsonFloat(v.float_value()));
        return absl::OkStatus();
      case Value::Kind::kString:
        AppendJsonString(v.string(), format_.ensure_ascii, out);
        return absl::OkStatus();
      case Value::Kind::kSequence:
        if (!v.is_list() && !v.is_tuple()) return NotSerializable(v);
        return WriteList(v.sequence().items, level, out);
      case Value::Kind::kDict:
        return WriteDict(v.dict(), level, out);
      default:
        return NotSerializable(v);
    }
  }

 private:
  // What opens the next item (or closes the container) at `level`.
  std::string Break(int level) const {
    std::string s = "\n";
    for (int i = 0; i < level; ++i) s += *format_.indent;
    return s;
  }

  absl::Status WriteList(const std::vector<Value>& items, int level, std::string* out) {
    if (items.empty()) {
      out->append("[]");
      return absl::OkStatus();
    }
    out->push_back('[');
    const bool indented = format_.indent.has_value();
    if (indented) out->append(Break(level + 1));
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out->append(format_.item_separator);
        if (indented) out->append(Break(level + 1));
      }
      VC_RETURN_IF_ERROR(Write(items[i], level + 1, out));
    }
    if (indented) out->append(Break(level));
    out->push_back(']');
    return absl::OkStatus();
  }

  static absl::StatusOr<std::string> KeyText(const Value& key) {
    switch (key.kind()) {
      case Value::Kind::kString:
        return key.string();
      case Value::Kind::kFloat:
        return JsonFloat(key.float_value());
      case Value::Kind::kBool:
        return std::string(key.bool_value() ? "true" : "false");
      case Value::Kind::kNone:
        return std::string("null");
      case Value::Kind::kInt:
        return absl::StrCat(key.int_value());
      default:
        return TypeError(absl::StrCat("keys must be str, int, float, bool or None, not ", TypeName(key)));
    }
  }

  absl::Status WriteDict(const Dict& dict, int level, std::string* out) {
    if (dict.items.empty()) {
      out->append("{}");
      return absl::OkStatus();
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& item : dict.items) items.push_back(&item);
    if (format_.sort_keys) {
      absl::Status error;
      std::stable_sort(items.begin(), items.end(), [&](const auto* x, const auto* y) {
        absl::StatusOr<bool> less = Compare(Order::kLess, x->first, y->first);
        if (!less.ok()) {
          error.Update(less.status());
          return false;
        }
        return *less;
      });
      VC_RETURN_IF_ERROR(error);
    }
    out->push_back('{');
    const bool indented = format_.indent.has_value();
    if (indented) out->append(Break(level + 1));
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out->append(format_.item_separator);
        if (indented) out->append(Break(level + 1));
      }
      VC_ASSIGN_OR_RETURN(const std::string key, KeyText(items[i]->first));
      AppendJsonString(key, format_.ensure_ascii, out);
      out->append(format_.key_separator);
      VC_RETURN_IF_ERROR(Write(items[i]->second, level + 1, out));
    }
    if (indented) out->append(Break(level));
    out->push_back('}');
    return absl::OkStatus();
  }

  const JsonFormat& format_;
};

absl::StatusOr<Value> FromJsonAt(const nlohmann::ordered_json& json, int depth) {
  if (depth > kMaxNesting) return absl::InvalidArgumentError("values nested too deeply");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return absl::InvalidArgumentError("an integer past 64 bits");
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = json.get_ref<const std::string&>();
      if (!IsUtf8(s)) return absl::InvalidArgumentError("a string that is not UTF-8");
      return Value::String(s);
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) {
        VC_ASSIGN_OR_RETURN(Value v, FromJsonAt(item, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(json.size());
      for (const auto& [key, item] : json.items()) {
        if (!IsUtf8(key)) return absl::InvalidArgumentError("a key that is not UTF-8");
        VC_ASSIGN_OR_RETURN(Value v, FromJsonAt(item, depth + 1));
        d.items.emplace_back(Value::String(key), std::move(v));
      }
      return Value::FromDict(std::move(d));
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("unsupported JSON value of type ", json.type_name()));
  }
}

absl::StatusOr<std::string> ReprAt(const Value& value, int depth) {
  if (depth > kMaxNesting) return absl::InvalidArgumentError("values nested too deeply");
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return std::string("Undefined");
    case Value::Kind::kString:
      return value.is_markup() ? absl::StrCat("Markup(", python::Repr(value.string()), ")")
                               : python::Repr(value.string());
    case Value::Kind::kSequence:
      return SequenceRepr(value.sequence(), depth);
    case Value::Kind::kDict:
      return DictRepr(value.dict(), depth);
    case Value::Kind::kIterator:
      return absl::InvalidArgumentError(
          absl::StrCat("printing a ", TypeName(value), " (Python prints its address; not supported)"));
    case Value::Kind::kObject:
      return value.object().Repr();
    default:
      return Str(value);
  }
}

}  // namespace

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (Equal(k, key)) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (Equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string message) {
  Value v = String(std::move(message));
  v.kind_ = Kind::kUndefined;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.scalar_.b = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.scalar_.i = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.scalar_.f = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.heap_ = std::make_shared<std::string>(std::move(s));
  return v;
}

Value Value::Markup(std::string s) {
  Value v = String(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::List(std::vector<Value> items) { return FromSequence(Sequence{SequenceType::kList, std::move(items)}); }

Value Value::Tuple(std::vector<Value> items) { return FromSequence(Sequence{SequenceType::kTuple, std::move(items)}); }

Value Value::FromSequence(Sequence s) {
  Value v;
  v.kind_ = Kind::kSequence;
  v.heap_ = std::make_shared<Sequence>(std::move(s));
  return v;
}

Value Value::FromDict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.heap_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::FromIterator(std::string type_name, std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kIterator;
  v.heap_ = std::make_shared<Iterator>(Iterator{std::move(type_name), std::move(items)});
  return v;
}

Value Value::FromObject(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::kObject;
  v.heap_ = std::move(object);
  return v;
}

absl::StatusOr<Value> Object::Call(CallArgs) const {
  return TypeError(absl::StrCat("'", TypeName(), "' object is not callable"));
}

absl::StatusOr<int64_t> Object::Length() const {
  return TypeError(absl::StrCat("object of type '", TypeName(), "' has no len()"));
}

absl::Status TypeError(absl::string_view message) { return absl::InvalidArgumentError(message); }

absl::Status Unsupported(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is not supported"));
}

absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(absl::string_view function, const CallArgs& args,
                                                           const std::vector<absl::string_view>& names) {
  if (args.positional.size() > names.size()) {
    return TypeError(
        absl::StrCat(function, "() takes at most ", names.size(), " argument(s) (", args.positional.size(), " given)"));
  }
  std::vector<std::optional<Value>> bound(names.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) {
      return TypeError(absl::StrCat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    std::optional<Value>& slot = bound[static_cast<size_t>(it - names.begin())];
    if (slot.has_value()) return TypeError(absl::StrCat(function, "() got multiple values for argument '", key, "'"));
    slot = value;
  }
  return bound;
}

Value ArgOr(const std::optional<Value>& arg, Value fallback) { return arg.has_value() ? *arg : std::move(fallback); }

absl::StatusOr<int64_t> AsIndex(const Value& value) {
  if (value.is_int() || value.is_bool()) return value.int_value();
  if (value.is_undefined()) return UndefinedError(value);
  return TypeError(absl::StrCat("'", TypeName(value), "' object cannot be interpreted as an integer"));
}

absl::StatusOr<std::string> StrArgument(const Value& value, absl::string_view function) {
  if (value.is_string()) return value.string();
  if (value.is_undefined()) return UndefinedError(value);
  return TypeError(absl::StrCat(function, "() argument must be str, not ", TypeName(value)));
}

absl::StatusOr<int64_t> PaddingWidth(const Value& value) {
  constexpr int64_t kMaxPadding = int64_t{1} << 20;
  VC_ASSIGN_OR_RETURN(const int64_t width, AsIndex(value));
  if (width > kMaxPadding) return Unsupported(absl::StrCat("a width of ", width));
  return width;
}

Value StringLike(const Value& like, std::string text) {
  return like.is_markup() ? Value::Markup(std::move(text)) : Value::String(std::move(text));
}

std::string TypeName(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return value.is_markup() ? "Markup" : "str";
    case Value::Kind::kSequence:
      switch (value.sequence().type) {
        case SequenceType::kList:
          return "list";
        case SequenceType::kTuple:
          return "tuple";
        case SequenceType::kRange:
          return "range";
        case SequenceType::kDictKeys:
          return "dict_keys";
        case SequenceType::kDictValues:
          return "dict_values";
        case SequenceType::kDictItems:
          return "dict_items";
      }
      break;
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kIterator:
      return value.iterator().type_name;
    case Value::Kind::kObject:
      return value.object().TypeName();
  }
  return "object";
}

std::string TypeRepr(const Value& value) {
  if (value.is_none()) return "None";
  if (value.is_markup()) return "markupsafe.Markup object";
  if (value.is_object()) return value.object().TypeRepr();
  return TypeName(value) + " object";
}

bool Truthy(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return value.bool_value();
    case Value::Kind::kInt:
      return value.int_value() != 0;
    case Value::Kind::kFloat:
      return value.float_value() != 0;
    case Value::Kind::kString:
      return !value.string().empty();
    case Value::Kind::kSequence:
      return !value.sequence().items.empty();
    case Value::Kind::kDict:
      return !value.dict().items.empty();
    case Value::Kind::kIterator:
    case Value::Kind::kObject:
      return true;
  }
  return true;
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  const std::string text(buf, result.ptr);  // shortest round trip: [-]d[.ddd]e±XX
  const size_t e = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  const int exponent = std::atoi(text.c_str() + e + 1);
  const int point = exponent + 1;  // digits[0:point] come before the decimal point
  const int n = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(-point, '0') + digits;
    } else if (point >= n) {
      out += digits + std::string(point - n, '0') + ".0";
    } else {
      out += digits.substr(0, point) + "." + digits.substr(point);
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    absl::StrAppendFormat(&out, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return out;
}

absl::StatusOr<std::string> Str(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return std::string();
    case Value::Kind::kString:
      return value.string();
    case Value::Kind::kNone:
      return std::string("None");
    case Value::Kind::kBool:
      return std::string(value.bool_value() ? "True" : "False");
    case Value::Kind::kInt:
      return absl::StrCat(value.int_value());
    case Value::Kind::kFloat:
      return FloatRepr(value.float_value());
    default:
      return Repr(value);
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return CompareNumbers(a, b) == 0;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.string() == b.string();
    case Value::Kind::kSequence: {
      const Sequence &x = a.sequence(), &y = b.sequence();
      if (x.type != y.type) return false;
      switch (x.type) {
        case SequenceType::kDictKeys:
        case SequenceType::kDictItems:
          return SetEqual(x.items, y.items);
        case SequenceType::kDictValues:
          return a.identity() == b.identity();
        default:
          return SequenceEqual(x.items, y.items);
      }
    }
    case Value::Kind::kDict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [key, v] : x.items) {
        const Value* w = y.Find(key);
        if (w == nullptr || !Equal(v, *w)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

absl::StatusOr<bool> Compare(Order order, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    const std::optional<int> c = CompareNumbers(a, b);
    return c.has_value() && Holds(order, *c);
  }
  if (a.is_string() && b.is_string()) return Holds(order, a.string().compare(b.string()));
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const std::vector<Value>&x = a.sequence().items, &y = b.sequence().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Compare(order, x[i], y[i]);
    }
    return Holds(order, x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0);
  }
  return TypeError(absl::StrCat("'", OrderSymbol(order), "' not supported between instances of '", TypeName(a),
                                "' and '", TypeName(b), "'"));
}

absl::Status CheckHashable(const Value& value) {
  if (value.is_dict() || value.is_list() ||
      (value.is_sequence() && value.sequence().type != SequenceType::kTuple &&
       value.sequence().type != SequenceType::kRange)) {
    return TypeError(absl::StrCat("unhashable type: '", TypeName(value), "'"));
  }
  if (value.is_tuple()) {
    for (const Value& item : value.sequence().items) VC_RETURN_IF_ERROR(CheckHashable(item));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Arithmetic(ArithmeticOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  switch (op) {
    case ArithmeticOp::kAdd:
      return Add(a, b);
    case ArithmeticOp::kSubtract: {
      if (!numbers) return UnsupportedOperands("-", a, b);
      if (floats) return Value::Float(a.float_value() - b.float_value());
      int64_t r;
      const bool overflow = __builtin_sub_overflow(a.int_value(), b.int_value(), &r);
      return CheckedInt(overflow, r);
    }
    case ArithmeticOp::kMultiply: {
      if (IsRepeatable(a) && (b.is_int() || b.is_bool())) return Repeat(a, b);
      if (IsRepeatable(b) && (a.is_int() || a.is_bool())) return Repeat(b, a);
      if (!numbers) return UnsupportedOperands("*", a, b);
      if (floats) return Value::Float(a.float_value() * b.float_value());
      int64_t r;
      const bool overflow = __builtin_mul_overflow(a.int_value(), b.int_value(), &r);
      return CheckedInt(overflow, r);
    }
    case ArithmeticOp::kDivide: {
      if (!numbers) return UnsupportedOperands("/", a, b);
      if (b.float_value() == 0) {
        return absl::InvalidArgumentError(floats ? "float division by zero" : "division by zero");
      }
      constexpr int64_t kExact = int64_t{1} << 53;  // ints a double holds exactly
      if (!floats && std::abs(a.int_value()) > kExact) {
        return absl::InvalidArgumentError("true division of an int past 2**53 (not supported)");
      }
      return Value::Float(a.float_value() / b.float_value());
    }
    case ArithmeticOp::kFloorDivide:
    case ArithmeticOp::kModulo: {
      const bool floor = op == ArithmeticOp::kFloorDivide;
      if (!numbers) {
        if (!floor && a.is_string()) return absl::InvalidArgumentError("str % formatting is not supported");
        return UnsupportedOperands(floor ? "//" : "%", a, b);
      }
      if (floats) {
        if (b.float_value() == 0) {
          return absl::InvalidArgumentError(floor ? "float floor division by zero" : "float modulo");
        }
        const auto [q, r] = FloatDivMod(a.float_value(), b.float_value());
        return Value::Float(floor ? q : r);
      }
      const int64_t x = a.int_value(), y = b.int_value();
      if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return floor ? CheckedInt(true, 0) : Value::Int(0);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value::Int(floor ? q : r);
    }
    case ArithmeticOp::kPower:
      if (!numbers) return UnsupportedOperands("** or pow()", a, b);
      return Power(a, b);
  }
  return absl::InternalError("unknown operator");
}

absl::StatusOr<Value> Negate(const Value& value) {
  if (value.is_undefined()) return UndefinedError(value);
  if (value.is_float()) return Value::Float(-value.float_value());
  if (value.is_number()) {
    if (value.int_value() == INT64_MIN) return CheckedInt(true, 0);
    return Value::Int(-value.int_value());
  }
  return TypeError(absl::StrCat("bad operand type for unary -: '", TypeName(value), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.string().find(item.string()) != std::string::npos;
    case Value::Kind::kSequence: {
      const std::vector<Value>& items = container.sequence().items;
      return std::any_of(items.begin(), items.end(), [&](const Value& x) { return Equal(x, item); });
    }
    case Value::Kind::kDict:
      VC_RETURN_IF_ERROR(CheckHashable(item));
      return container.dict().Find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kIterator: {
      Iterator& it = container.iterator();
      while (it.next < it.items.size()) {
        if (Equal(it.items[it.next++], item)) return true;
      }
      return false;
    }
    default:
      return TypeError(absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return python::Length(value.string());
    case Value::Kind::kSequence:
      return static_cast<int64_t>(value.sequence().items.size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(value.dict().items.size());
    case Value::Kind::kObject:
      return value.object().Length();
    default:
      return TypeError(absl::StrCat("object of type '", TypeName(value), "' has no len()"));
  }
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>();
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (const char32_t c : python::Decode(value.string())) {
        std::string s;
        AppendUtf8(c, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    case Value::Kind::kSequence:
      return value.sequence().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(value.dict().items.size());
      for (const auto& item : value.dict().items) keys.push_back(item.first);
      return keys;
    }
    case Value::Kind::kIterator: {
      Iterator& it = value.iterator();
      std::vector<Value> rest(it.items.begin() + static_cast<std::ptrdiff_t>(it.next), it.items.end());
      it.next = it.items.size();
      return rest;
    }
    default:
      return TypeError(absl::StrCat("'", TypeName(value), "' object is not iterable"));
  }
}

absl::StatusOr<Value> Escape(const Value& value) {
  if (value.is_markup()) return value;
  VC_ASSIGN_OR_RETURN(const std::string s, Str(value));
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::Markup(std::move(out));
}

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json) { return FromJsonAt(json, 0); }

absl::StatusOr<std::string> Repr(const Value& value) { return ReprAt(value, 0); }

absl::StatusOr<std::string> ToJson(const Value& value, const JsonFormat& format) {
  std::string out;
  VC_RETURN_IF_ERROR(JsonWriter(format).Write(value, 0, &out));
  return out;
}

}  // namespace vc::jinja
