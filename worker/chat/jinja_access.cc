#include "worker/chat/jinja_access.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "worker/chat/python_str.h"

namespace vc::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

// A str argument that may be None (absent).
absl::StatusOr<std::optional<std::string>> OptionalStrArg(const std::optional<Value>& v, absl::string_view function) {
  if (!v.has_value() || v->is_none()) return std::optional<std::string>();
  VC_ASSIGN_OR_RETURN(std::string s, StrArgument(*v, function));
  return std::optional<std::string>(std::move(s));
}

Value ListOfStrings(const Value& like, std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(StringLike(like, std::move(p)));
  return Value::List(std::move(items));
}

// CPython's ADJUST_INDICES for the optional start and end of str methods.
absl::Status AdjustIndices(const std::optional<Value>& start_arg, const std::optional<Value>& end_arg, int64_t length,
                           int64_t* start, int64_t* end) {
  *start = 0;
  *end = length;
  if (start_arg.has_value() && !start_arg->is_none()) {
    VC_ASSIGN_OR_RETURN(*start, AsIndex(*start_arg));
  }
  if (end_arg.has_value() && !end_arg->is_none()) {
    VC_ASSIGN_OR_RETURN(*end, AsIndex(*end_arg));
  }
  if (*end > length) {
    *end = length;
  } else if (*end < 0) {
    *end = std::max<int64_t>(*end + length, 0);
  }
  if (*start < 0) *start = std::max<int64_t>(*start + length, 0);
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------
// Slicing and indexing

// Python's slice.indices (start, stop, step) and the number of items they take.
struct SliceIndices {
  int64_t start, stop, step, count;
};

absl::StatusOr<SliceIndices> AdjustSlice(const Value& start_v, const Value& stop_v, const Value& step_v,
                                         int64_t length) {
  const auto index = [](const Value& v) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is_none()) return std::optional<int64_t>();
    if (v.is_int() || v.is_bool()) return std::optional<int64_t>(v.int_value());
    if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
    return TypeError("slice indices must be integers or None or have an __index__ method");
  };
  VC_ASSIGN_OR_RETURN(const std::optional<int64_t> start_arg, index(start_v));
  VC_ASSIGN_OR_RETURN(const std::optional<int64_t> stop_arg, index(stop_v));
  VC_ASSIGN_OR_RETURN(const std::optional<int64_t> step_arg, index(step_v));
  const int64_t step = std::max(step_arg.value_or(1), -INT64_MAX);  // as CPython clamps it
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> i, int64_t absent) {
    if (!i.has_value()) return absent;
    int64_t v = *i;
    if (v < 0) {
      v += length;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= length) {
      v = step < 0 ? length - 1 : length;
    }
    return v;
  };
  const int64_t start = clamp(start_arg, step < 0 ? length - 1 : 0);
  const int64_t stop = clamp(stop_arg, step < 0 ? -1 : length);
  int64_t count = 0;
  if (step < 0) {
    if (stop < start) count = (start - stop - 1) / (-step) + 1;
  } else if (start < stop) {
    count = (stop - start - 1) / step + 1;
  }
  return SliceIndices{start, stop, step, count};
}

template <typename T>
T TakeSlice(const T& items, const SliceIndices& s) {
  T out;
  out.reserve(static_cast<size_t>(s.count));
  // Two items or more only with |step| < len(items): the index does not overflow.
  for (int64_t k = 0; k < s.count; ++k) out.push_back(items[static_cast<size_t>(s.start + k * s.step)]);
  return out;
}

// Whether `obj[i]` and `obj[a:b]` work: a str, list, tuple or range.
bool IsIndexable(const Value& obj) {
  return obj.is_string() ||
         (obj.is_sequence() && (obj.is_list() || obj.is_tuple() || obj.sequence().type == SequenceType::kRange));
}

// obj[key] for sequences, str and dicts; nullopt where Python raises a lookup or type error (which
// the sandbox turns into an attribute lookup, then Undefined).
std::optional<Value> ItemOnly(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (!CheckHashable(key).ok()) return std::nullopt;
    const Value* v = obj.dict().Find(key);
    return v != nullptr ? std::optional<Value>(*v) : std::nullopt;
  }
  if (!IsIndexable(obj) || !(key.is_int() || key.is_bool())) return std::nullopt;
  int64_t i = key.int_value();
  if (obj.is_string()) {
    const std::u32string s = python::Decode(obj.string());
    const auto n = static_cast<int64_t>(s.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return std::nullopt;
    return StringLike(obj, python::Encode(s.substr(static_cast<size_t>(i), 1)));
  }
  const std::vector<Value>& items = obj.sequence().items;
  const auto n = static_cast<int64_t>(items.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  return items[static_cast<size_t>(i)];
}

// ------------------------------------------------------------------------------------------
// Attributes and methods

// Python's attributes of the built-in types (the names an attribute lookup finds before an item),
// and the methods that change a list or dict, which the sandbox hides.
constexpr absl::string_view kStrAttributes[] = {
    "capitalize",   "casefold",   "center",    "count",       "encode",    "endswith",     "expandtabs",   "find",
    "format",       "format_map", "index",     "isalnum",     "isalpha",   "isascii",      "isdecimal",    "isdigit",
    "isidentifier", "islower",    "isnumeric", "isprintable", "isspace",   "istitle",      "isupper",      "join",
    "ljust",        "lower",      "lstrip",    "maketrans",   "partition", "removeprefix", "removesuffix", "replace",
    "rfind",        "rindex",     "rjust",     "rpartition",  "rsplit",    "rstrip",       "split",        "splitlines",
    "startswith",   "strip",      "swapcase",  "title",       "translate", "upper",        "zfill"};
constexpr absl::string_view kMarkupAttributes[] = {"escape", "unescape", "striptags"};
constexpr absl::string_view kDictAttributes[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                                 "pop",   "popitem", "setdefault", "update", "values"};
constexpr absl::string_view kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr absl::string_view kListAttributes[] = {"append", "clear", "copy",   "count",   "extend", "index",
                                                 "insert", "pop",   "remove", "reverse", "sort"};
constexpr absl::string_view kListMutators[] = {"append", "reverse", "insert", "sort", "extend", "remove"};
constexpr absl::string_view kTupleAttributes[] = {"count", "index"};
constexpr absl::string_view kRangeAttributes[] = {"count", "index", "start", "stop", "step"};
constexpr absl::string_view kIntAttributes[] = {
    "as_integer_ratio", "bit_count", "bit_length", "conjugate", "denominator",
    "from_bytes",       "imag",      "numerator",  "real",      "to_bytes"};
constexpr absl::string_view kFloatAttributes[] = {"as_integer_ratio", "conjugate", "fromhex", "hex", "imag",
                                                  "is_integer",       "real"};
constexpr absl::string_view kKeysAttributes[] = {"isdisjoint", "mapping"};
constexpr absl::string_view kValuesAttributes[] = {"mapping"};

template <size_t N>
bool OneOf(const absl::string_view (&names)[N], absl::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool HasPythonAttribute(const Value& obj, const std::string& name) {
  if (name.size() > 4 && absl::StartsWith(name, "__") && absl::EndsWith(name, "__")) return true;  // object's
  switch (obj.kind()) {
    case Value::Kind::kString:
      return OneOf(kStrAttributes, name) || (obj.is_markup() && OneOf(kMarkupAttributes, name));
    case Value::Kind::kDict:
      return OneOf(kDictAttributes, name);
    case Value::Kind::kSequence:
      switch (obj.sequence().type) {
        case SequenceType::kList:
          return OneOf(kListAttributes, name);
        case SequenceType::kTuple:
          return OneOf(kTupleAttributes, name);
        case SequenceType::kRange:
          return OneOf(kRangeAttributes, name);
        case SequenceType::kDictValues:
          return OneOf(kValuesAttributes, name);
        case SequenceType::kDictKeys:
        case SequenceType::kDictItems:
          return OneOf(kKeysAttributes, name);
      }
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return OneOf(kIntAttributes, name);
    case Value::Kind::kFloat:
      return OneOf(kFloatAttributes, name);
    default:
      return false;
  }
}

bool IsMutator(const Value& obj, const std::string& name) {
  return (obj.is_dict() && OneOf(kDictMutators, name)) || (obj.is_list() && OneOf(kListMutators, name));
}

// A method of a str, list, tuple or dict, bound to its object.
class Method final : public Object {
 public:
  Method(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  std::string TypeName() const override { return "builtin_function_or_method"; }
  std::optional<Value> Attribute(const std::string&) const override { return std::nullopt; }
  absl::StatusOr<std::string> Repr() const override {
    return Unsupported(absl::StrCat("printing the method ", jinja::TypeName(self_), ".", name_));
  }
  bool callable() const override { return true; }
  absl::StatusOr<Value> Call(CallArgs args) const override { return CallMethod(self_, name_, args); }

 private:
  Value self_;
  std::string name_;
};

absl::StatusOr<Value> StartsOrEndsWith(const Value& self, const std::string& name, const Args& a) {
  const std::u32string s = python::Decode(self.string());
  int64_t start, end;
  VC_RETURN_IF_ERROR(AdjustIndices(a[1], a[2], static_cast<int64_t>(s.size()), &start, &end));
  std::vector<Value> candidates;
  if (a[0]->is_tuple()) {
    candidates = a[0]->sequence().items;
  } else {
    candidates.push_back(*a[0]);
  }
  for (const Value& c : candidates) {
    if (!c.is_string()) {
      return TypeError(absl::StrCat(name, " first arg must be str or a tuple of str, not ", TypeName(c)));
    }
    const std::u32string sub = python::Decode(c.string());
    const int64_t last = end - static_cast<int64_t>(sub.size());
    if (last < start) continue;
    const size_t at = name == "startswith" ? static_cast<size_t>(start) : static_cast<size_t>(last);
    if (s.compare(at, sub.size(), sub) == 0) return Value::Bool(true);
  }
  return Value::Bool(false);
}

// find, rfind, index, rindex and count.
absl::StatusOr<Value> Search(const Value& self, const std::string& name, const Args& a) {
  VC_ASSIGN_OR_RETURN(const std::string sub_text, StrArgument(*a[0], name));
  const std::u32string s = python::Decode(self.string());
  const std::u32string sub = python::Decode(sub_text);
  int64_t start, end;
  VC_RETURN_IF_ERROR(AdjustIndices(a[1], a[2], static_cast<int64_t>(s.size()), &start, &end));
  const auto n = static_cast<int64_t>(sub.size());
  if (name == "count") {
    if (end - start < n) return Value::Int(0);
    if (n == 0) return Value::Int(end - start + 1);
    int64_t count = 0;
    for (int64_t i = start; i + n <= end;) {
      if (s.compare(static_cast<size_t>(i), sub.size(), sub) == 0) {
        ++count;
        i += n;
      } else {
        ++i;
      }
    }
    return Value::Int(count);
  }
  int64_t found = -1;
  if (end - start >= n) {
    const std::u32string_view window = std::u32string_view(s).substr(static_cast<size_t>(start), end - start);
    const size_t at = name[0] == 'r' ? window.rfind(sub) : window.find(sub);
    if (at != std::u32string_view::npos) found = start + static_cast<int64_t>(at);
  }
  if (found < 0 && (name == "index" || name == "rindex")) return absl::InvalidArgumentError("substring not found");
  return Value::Int(found);
}

absl::StatusOr<Value> CallStrMethod(const Value& self, const std::string& name, const CallArgs& call) {
  const std::string& s = self.string();
  // Markup's methods escape their str arguments and give Markup.
  CallArgs escaped = call;
  if (self.is_markup()) {
    for (Value& v : escaped.positional) {
      if (v.is_string()) {
        VC_ASSIGN_OR_RETURN(v, Escape(v));
      }
    }
    for (auto& [key, v] : escaped.keyword) {
      if (v.is_string()) {
        VC_ASSIGN_OR_RETURN(v, Escape(v));
      }
    }
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    VC_RETURN_IF_ERROR(BindArgs(name, call, {}).status());
    if (name == "upper") return StringLike(self, python::Upper(s));
    if (name == "lower") return StringLike(self, python::Lower(s));
    if (name == "title") return StringLike(self, python::Title(s));
    return StringLike(self, python::Capitalize(s));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, escaped, {"chars"}));
    VC_ASSIGN_OR_RETURN(const std::optional<std::string> chars, OptionalStrArg(a[0], name));
    return StringLike(self, python::Strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, call, {"sep", "maxsplit"}));
    VC_ASSIGN_OR_RETURN(const std::optional<std::string> sep, OptionalStrArg(a[0], name));
    if (sep.has_value() && sep->empty()) return absl::InvalidArgumentError("empty separator");
    VC_ASSIGN_OR_RETURN(const int64_t max_split, AsIndex(ArgOr(a[1], Value::Int(-1))));
    return ListOfStrings(self, name == "split" ? python::Split(s, sep, max_split) : python::RSplit(s, sep, max_split));
  }
  if (name == "splitlines") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, call, {"keepends"}));
    return ListOfStrings(self, python::SplitLines(s, Truthy(ArgOr(a[0], Value::Bool(false)))));
  }
  if (name == "startswith" || name == "endswith") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, call, {"prefix", "start", "end"}));
    if (!a[0].has_value()) return TypeError(absl::StrCat(name, "() takes at least 1 argument (0 given)"));
    return StartsOrEndsWith(self, name, a);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, call, {"sub", "start", "end"}));
    if (!a[0].has_value()) return TypeError(absl::StrCat(name, "() takes at least 1 argument (0 given)"));
    return Search(self, name, a);
  }
  if (name == "replace") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, escaped, {"old", "new", "count"}));
    if (!a[0].has_value() || !a[1].has_value()) return TypeError("replace expected at least 2 arguments");
    VC_ASSIGN_OR_RETURN(const std::string old, StrArgument(*a[0], name));
    VC_ASSIGN_OR_RETURN(const std::string replacement, StrArgument(*a[1], name));
    VC_ASSIGN_OR_RETURN(const int64_t count, AsIndex(ArgOr(a[2], Value::Int(-1))));
    return StringLike(self, python::Replace(s, old, replacement, count));
  }
  if (name == "join") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, call, {"iterable"}));
    if (!a[0].has_value()) return TypeError("join() takes exactly one argument (0 given)");
    VC_ASSIGN_OR_RETURN(const std::vector<Value> items, Iterate(*a[0]));
    std::vector<std::string> parts;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ", TypeName(items[i]), " found"));
      }
      VC_ASSIGN_OR_RETURN(const Value part, self.is_markup() ? Escape(items[i]) : absl::StatusOr<Value>(items[i]));
      parts.push_back(part.string());
    }
    return StringLike(self, absl::StrJoin(parts, s));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, escaped, {"width", "fillchar"}));
    if (!a[0].has_value()) return TypeError(absl::StrCat(name, "() takes at least 1 argument (0 given)"));
    VC_ASSIGN_OR_RETURN(const int64_t width, PaddingWidth(*a[0]));
    VC_ASSIGN_OR_RETURN(const std::string fill, StrArgument(ArgOr(a[1], Value::String(" ")), name));
    const std::u32string fill_chars = python::Decode(fill);
    if (fill_chars.size() != 1) return TypeError("The fill character must be exactly one character long");
    const python::Align align = name == "center"  ? python::Align::kCenter
                                : name == "ljust" ? python::Align::kLeft
                                                  : python::Align::kRight;
    return StringLike(self, python::Pad(s, width, fill_chars[0], align));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    VC_ASSIGN_OR_RETURN(const Args a, BindArgs(name, call, {"affix"}));
    if (!a[0].has_value()) return TypeError(absl::StrCat(name, "() takes exactly one argument (0 given)"));
    VC_ASSIGN_OR_RETURN(const std::string affix, StrArgument(*a[0], name));
    absl::string_view out = s;
    if (name == "removeprefix") {
      absl::ConsumePrefix(&out, affix);
    } else {
      absl::ConsumeSuffix(&out, affix);
    }
    return StringLike(self, std::string(out));
  }
  if (name == "isspace" || name == "islower" || name == "isupper" || name == "isalpha") {
    VC_RETURN_IF_ERROR(BindArgs(name, call, {}).status());
    if (name == "islower") return Value::Bool(python::IsLower(s));
    if (name == "isupper") return Value::Bool(python::IsUpper(s));
    const std::u32string cps = python::Decode(s);
    const auto test = [&](char32_t c) { return name == "isspace" ? python::IsSpace(c) : python::IsAlpha(c); };
    return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), test));
  }
  return Unsupported(absl::StrCat("the method str.", name, "()"));
}

absl::StatusOr<Value> CallContainerMethod(const Value& self, const std::string& name, const CallArgs& call) {
  if (self.is_dict()) {
    const Dict& d = self.dict();
    if (name == "get") {
      VC_ASSIGN_OR_RETURN(const Args a, BindArgs("get", call, {"key", "default"}));
      if (!a[0].has_value()) return TypeError("get expected at least 1 argument, got 0");
      VC_RETURN_IF_ERROR(CheckHashable(*a[0]));
      const Value* v = d.Find(*a[0]);
      return v != nullptr ? *v : ArgOr(a[1], Value());
    }
    if (name == "items" || name == "keys" || name == "values") {
      VC_RETURN_IF_ERROR(BindArgs(name, call, {}).status());
      Sequence view;
      view.type = name == "items"  ? SequenceType::kDictItems
                  : name == "keys" ? SequenceType::kDictKeys
                                   : SequenceType::kDictValues;
      for (const auto& [key, value] : d.items) {
        view.items.push_back(name == "items" ? Value::Tuple({key, value}) : name == "keys" ? key : value);
      }
      return Value::FromSequence(std::move(view));
    }
    if (name == "copy") {
      VC_RETURN_IF_ERROR(BindArgs(name, call, {}).status());
      return Value::FromDict(d);
    }
  } else if (self.is_sequence()) {
    const std::vector<Value>& items = self.sequence().items;
    if (name == "count") {
      VC_ASSIGN_OR_RETURN(const Args a, BindArgs("count", call, {"value"}));
      if (!a[0].has_value()) return TypeError("count() takes exactly one argument (0 given)");
      return Value::Int(std::count_if(items.begin(), items.end(), [&](const Value& x) { return Equal(x, *a[0]); }));
    }
    if (name == "index") {
      VC_ASSIGN_OR_RETURN(const Args a, BindArgs("index", call, {"value", "start", "stop"}));
      if (!a[0].has_value()) return TypeError("index expected at least 1 argument, got 0");
      int64_t start, end;
      VC_RETURN_IF_ERROR(AdjustIndices(a[1], a[2], static_cast<int64_t>(items.size()), &start, &end));
      for (int64_t i = start; i < end; ++i) {
        if (Equal(items[static_cast<size_t>(i)], *a[0])) return Value::Int(i);
      }
      return absl::InvalidArgumentError(absl::StrCat(TypeName(self), ".index(x): x not in ", TypeName(self)));
    }
    if (name == "copy" && self.is_list()) {
      VC_RETURN_IF_ERROR(BindArgs(name, call, {}).status());
      return Value::List(items);
    }
  }
  return Unsupported(absl::StrCat("the method ", TypeName(self), ".", name, "()"));
}

// The attribute `name` of `obj` (not its item), or nullopt.
std::optional<Value> LookupAttribute(const Value& obj, const std::string& name) {
  if (obj.is_object()) return obj.object().Attribute(name);
  if (!HasPythonAttribute(obj, name)) return std::nullopt;
  if (name[0] == '_' || IsMutator(obj, name)) {
    return Value::Undefined(absl::StrCat("access to attribute ", python::Repr(name), " of ",
                                         python::Repr(TypeName(obj)), " object is unsafe."));
  }
  return Value::FromObject(std::make_shared<Method>(obj, name));
}

Value NoAttribute(const Value& obj, const Value& name) {
  if (name.is_string()) {
    return Value::Undefined(
        absl::StrCat(python::Repr(TypeRepr(obj)), " has no attribute ", python::Repr(name.string())));
  }
  absl::StatusOr<std::string> key = Repr(name);
  return Value::Undefined(absl::StrCat(TypeRepr(obj), " has no element ", key.ok() ? *key : "?"));
}

}  // namespace

absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const CallArgs& args) {
  if (self.is_string()) return CallStrMethod(self, name, args);
  return CallContainerMethod(self, name, args);
}

absl::StatusOr<Value> GetAttributeOnly(const Value& object, const std::string& name) {
  if (object.is_undefined()) return absl::InvalidArgumentError(object.undefined_message());
  std::optional<Value> attribute = LookupAttribute(object, name);
  return attribute.has_value() ? *std::move(attribute) : NoAttribute(object, Value::String(name));
}

absl::StatusOr<Value> GetAttribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) return absl::InvalidArgumentError(object.undefined_message());
  if (std::optional<Value> attribute = LookupAttribute(object, name)) return *std::move(attribute);
  if (std::optional<Value> item = ItemOnly(object, Value::String(name))) return *std::move(item);
  return NoAttribute(object, Value::String(name));
}

absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) return absl::InvalidArgumentError(object.undefined_message());
  if (std::optional<Value> item = ItemOnly(object, key)) return *std::move(item);
  if (key.is_string()) {
    if (std::optional<Value> attribute = LookupAttribute(object, key.string())) return *std::move(attribute);
  }
  return NoAttribute(object, key);
}

absl::StatusOr<Value> GetSlice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) return absl::InvalidArgumentError(object.undefined_message());
  if (object.is_dict()) return TypeError("unhashable type: 'slice'");
  if (object.is_string()) {
    const std::u32string s = python::Decode(object.string());
    VC_ASSIGN_OR_RETURN(const SliceIndices indices, AdjustSlice(start, stop, step, static_cast<int64_t>(s.size())));
    return StringLike(object, python::Encode(TakeSlice(s, indices)));
  }
  if (!IsIndexable(object)) return TypeError(absl::StrCat("'", TypeName(object), "' object is not subscriptable"));
  const Sequence& seq = object.sequence();
  VC_ASSIGN_OR_RETURN(const SliceIndices indices,
                      AdjustSlice(start, stop, step, static_cast<int64_t>(seq.items.size())));
  Sequence out;
  out.type = seq.type;
  out.items = TakeSlice(seq.items, indices);
  if (seq.type == SequenceType::kRange) {
    // range(start + i * step, start + j * step, step * k), where these fit in 64 bits.
    const auto at = [&](int64_t i) {
      return static_cast<__int128>(seq.range_start) + static_cast<__int128>(i) * seq.range_step;
    };
    const __int128 bounds[] = {at(indices.start), at(indices.stop),
                               static_cast<__int128>(seq.range_step) * indices.step};
    for (const __int128 b : bounds) {
      if (b > INT64_MAX || b < INT64_MIN) {
        return absl::InvalidArgumentError("integer result past 64 bits (not supported)");
      }
    }
    out.range_start = static_cast<int64_t>(bounds[0]);
    out.range_stop = static_cast<int64_t>(bounds[1]);
    out.range_step = static_cast<int64_t>(bounds[2]);
  }
  return Value::FromSequence(std::move(out));
}

}  // namespace vc::jinja
