// What a Jinja template finds ready-made, as jinja2 3.1's ImmutableSandboxedEnvironment gives it:
// filters, tests, the namespace object, and the global functions range, dict and namespace.
//
// Filters: abs, attr, batch, capitalize, center, count, d/default, dictsort, e/escape, first,
// float, indent, int, items, join, last, length, list, lower, map, max, min, reject, rejectattr,
// replace, reverse, round, safe, select, selectattr, sort, string, sum, title, tojson, trim,
// unique, upper, wordcount. Tests: all of jinja2's (sameas only for None, True, False and
// containers). Not supported (unknown to Parse): filesizeformat, forceescape, format, groupby,
// pprint, random, slice, striptags, truncate, urlencode, urlize, wordwrap, xmlattr; the globals
// cycler, joiner and lipsum fail when called.
//
// Filters and tests follow jinja2's own, autoescaping off; `tojson` is transformers'
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)). What jinja2
// computes lazily (the generators of map, select, unique ...) is computed at once here, so an error
// in an item shows even when nothing reads the item. Not thread-safe: values belong to one rendering.
#ifndef VC_WORKER_CHAT_JINJA_BUILTINS_H_
#define VC_WORKER_CHAT_JINJA_BUILTINS_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/chat/jinja_value.h"

namespace vc::jinja {

struct FilterDef {
  const char* name;
  absl::StatusOr<Value> (*apply)(const Value& value, const CallArgs& args);
};
struct TestDef {
  const char* name;
  absl::StatusOr<bool> (*apply)(const Value& value, const CallArgs& args);
};

// The filter or test named `name`, or null when there is none.
const FilterDef* FindFilter(absl::string_view name);
const TestDef* FindTest(absl::string_view name);

// jinja2's Namespace: attributes that `{% set ns.name = ... %}` changes.
class Namespace final : public Object {
 public:
  explicit Namespace(Dict attributes) : attributes_(std::move(attributes)) {}
  std::string TypeName() const override { return "Namespace"; }
  std::string TypeRepr() const override { return "jinja2.utils.Namespace object"; }
  std::optional<Value> Attribute(const std::string& name) const override;
  absl::StatusOr<std::string> Repr() const override;
  void Set(const std::string& name, Value value);

 private:
  Dict attributes_;
};

// A function of the template's globals: `name` and what a call does.
class Function final : public Object {
 public:
  Function(std::string name, std::function<absl::StatusOr<Value>(CallArgs)> body)
      : name_(std::move(name)), body_(std::move(body)) {}
  std::string TypeName() const override { return "function"; }
  std::optional<Value> Attribute(const std::string&) const override { return std::nullopt; }
  absl::StatusOr<std::string> Repr() const override;
  bool callable() const override { return true; }
  absl::StatusOr<Value> Call(CallArgs args) const override { return body_(std::move(args)); }

 private:
  std::string name_;
  std::function<absl::StatusOr<Value>(CallArgs)> body_;
};

// range, dict and namespace, by name.
std::vector<std::pair<std::string, Value>> BuiltinGlobals();

}  // namespace vc::jinja

#endif  // VC_WORKER_CHAT_JINJA_BUILTINS_H_
