// The values a Jinja template computes with, and Python's rules for them as jinja2 applies them:
// truthiness, str() and repr(), ==, ordering, arithmetic, len(), iteration, and json.dumps.
//
// A value is None, a bool, an int (64 bits; past that is an error, not a big integer), a float, a
// str (UTF-8; possibly marked safe as markupsafe's Markup), a sequence (list, tuple, range, or a
// dict's keys/values/items view), a dict (insertion-ordered), a one-shot iterator (what jinja2's
// filters return as generators), jinja2's Undefined (carrying the message of its error), or an
// object (namespace, loop, macro, function, method). Lists and dicts are immutable once built, as
// the template cannot change them (jinja2's ImmutableSandboxedEnvironment); values share them.
// Thread-compatible: values of the immutable kinds may be read from several threads (a parsed
// template's literals are); iterators and objects change, and belong to one rendering.
#ifndef VC_WORKER_CHAT_JINJA_VALUE_H_
#define VC_WORKER_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace vc::jinja {

class Value;
class Object;

enum class SequenceType { kList, kTuple, kRange, kDictKeys, kDictValues, kDictItems };

struct Sequence {
  SequenceType type = SequenceType::kList;
  std::vector<Value> items;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // kRange's arguments, for its repr
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // insertion order; keys are distinct and hashable
  // The value under `key` (Python's == of hashable keys: 1, 1.0 and True are one key), or null.
  const Value* Find(const Value& key) const;
  // Sets `key`, keeping its place when it is there already.
  void Set(Value key, Value value);
};

// A generator or reverse iterator: iterating takes the items not taken yet.
struct Iterator {
  std::string type_name;  // Python's: "generator", "list_reverseiterator" ...
  std::vector<Value> items;
  size_t next = 0;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kSequence, kDict, kIterator, kObject };

  Value() = default;  // None
  static Value Undefined(std::string message);
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value Markup(std::string s);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value FromSequence(Sequence s);
  static Value FromDict(Dict d);
  static Value FromIterator(std::string type_name, std::vector<Value> items);
  static Value FromObject(std::shared_ptr<Object> object);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // bool, int or float (Python's bool is an int).
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  bool is_sequence() const { return kind_ == Kind::kSequence; }
  bool is_list() const { return is_sequence_of(SequenceType::kList); }
  bool is_tuple() const { return is_sequence_of(SequenceType::kTuple); }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_iterator() const { return kind_ == Kind::kIterator; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool bool_value() const { return scalar_.b; }
  // An int's or bool's value.
  int64_t int_value() const { return kind_ == Kind::kBool ? scalar_.b : scalar_.i; }
  // A number's value as a float.
  double float_value() const { return kind_ == Kind::kFloat ? scalar_.f : static_cast<double>(int_value()); }
  const std::string& string() const { return *static_cast<const std::string*>(heap_.get()); }
  const std::string& undefined_message() const { return string(); }
  const Sequence& sequence() const { return *static_cast<const Sequence*>(heap_.get()); }
  const Dict& dict() const { return *static_cast<const Dict*>(heap_.get()); }
  Iterator& iterator() const { return *static_cast<Iterator*>(heap_.get()); }
  Object& object() const { return *static_cast<Object*>(heap_.get()); }
  // Python's `is` for the shared kinds (sequence, dict, iterator, object).
  const void* identity() const { return heap_.get(); }

 private:
  bool is_sequence_of(SequenceType t) const { return kind_ == Kind::kSequence && sequence().type == t; }

  Kind kind_ = Kind::kNone;
  bool markup_ = false;
  union {
    bool b;
    int64_t i;
    double f;
  } scalar_{};
  std::shared_ptr<void> heap_;  // string (or Undefined's message), Sequence, Dict, Iterator or Object
};

// What is not a plain value: a namespace, a loop, a callable.
class Object {
 public:
  virtual ~Object() = default;
  // Python's name of the type ("Namespace", "LoopContext", "Macro", "function" ...).
  virtual std::string TypeName() const = 0;
  // jinja2's name of the type in messages (object_type_repr: "jinja2.utils.Namespace object").
  virtual std::string TypeRepr() const { return TypeName() + " object"; }
  // The attribute `name`, or nullopt when the object has none.
  virtual std::optional<Value> Attribute(const std::string& name) const = 0;
  virtual absl::StatusOr<std::string> Repr() const = 0;
  virtual bool callable() const { return false; }
  // Whether Python can iterate it (a loop can; what iterating gives is not supported).
  virtual bool iterable() const { return false; }
  virtual absl::StatusOr<Value> Call(CallArgs args) const;
  // Python's len(), where the object has one.
  virtual absl::StatusOr<int64_t> Length() const;
};

// A TypeError-like failure (kInvalidArgument) with `message`.
absl::Status TypeError(absl::string_view message);
// kInvalidArgument "<what> is not supported".
absl::Status Unsupported(absl::string_view what);

// Binds `args` to the parameters `names`, as Python binds a call: positional ones first, then by
// keyword. An absent argument is nullopt. A TypeError naming `function` for too many arguments, an
// unknown keyword or one given twice.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(absl::string_view function, const CallArgs& args,
                                                           const std::vector<absl::string_view>& names);
// The bound argument, or `fallback` when it is absent.
Value ArgOr(const std::optional<Value>& arg, Value fallback);
// operator.index: an int's or bool's value; a TypeError for anything else.
absl::StatusOr<int64_t> AsIndex(const Value& value);
// A str argument of `function`; a TypeError for anything else.
absl::StatusOr<std::string> StrArgument(const Value& value, absl::string_view function);
// A width of padding or indentation (an index); wider than 2**20 is refused, not allocated.
absl::StatusOr<int64_t> PaddingWidth(const Value& value);
// A str of `text`, Markup when `like` is (what the methods of Markup return).
Value StringLike(const Value& like, std::string text);

// Python's type(value).__name__ ("str", "NoneType", "dict_items" ...).
std::string TypeName(const Value& value);
// jinja2's object_type_repr: "None", "dict object", "jinja2.utils.Namespace object" ...
std::string TypeRepr(const Value& value);

bool Truthy(const Value& value);
// str(value); an error for what Python prints with a memory address (functions, iterators).
absl::StatusOr<std::string> Str(const Value& value);
absl::StatusOr<std::string> Repr(const Value& value);
// Python's float repr: the shortest text that reads back the same (1.0, 0.1, 1e-05, inf).
std::string FloatRepr(double f);

// Python's ==.
bool Equal(const Value& a, const Value& b);
enum class Order { kLess, kLessEqual, kGreater, kGreaterEqual };
// Python's <, <=, > and >=; a TypeError for values without an order between them.
absl::StatusOr<bool> Compare(Order order, const Value& a, const Value& b);
// A TypeError naming the type when `value` cannot be a dict key or set member.
absl::Status CheckHashable(const Value& value);

enum class ArithmeticOp { kAdd, kSubtract, kMultiply, kDivide, kFloorDivide, kModulo, kPower };
// Python's + - * / // % ** (numbers, str and sequence + and *, Markup's escaping +); an error for
// what Python raises on, for an Undefined operand (its message), and for an int result past 64 bits.
absl::StatusOr<Value> Arithmetic(ArithmeticOp op, const Value& a, const Value& b);
absl::StatusOr<Value> Negate(const Value& value);
// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// Python's len().
absl::StatusOr<int64_t> Length(const Value& value);
// Python's iteration: a sequence's items, a dict's keys, a str's characters, nothing for
// Undefined; an iterator gives the items it has left (and has none after).
absl::StatusOr<std::vector<Value>> Iterate(const Value& value);

// markupsafe.escape of str(value) (& < > " ' as entities); a Markup value is returned as it is.
absl::StatusOr<Value> Escape(const Value& value);

// A JSON document as the values Python's json.loads gives: objects are dicts, arrays lists,
// integers ints, other numbers floats. kInvalidArgument for an integer past 64 bits, a string that
// is not UTF-8, or nesting deeper than 500.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json);

// json.dumps(value, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
struct JsonFormat {
  bool ensure_ascii = false;          // write what is not printable ASCII as \uXXXX
  std::optional<std::string> indent;  // the indentation of one level; none: all on one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& value, const JsonFormat& format);

}  // namespace vc::jinja

#endif  // VC_WORKER_CHAT_JINJA_VALUE_H_
