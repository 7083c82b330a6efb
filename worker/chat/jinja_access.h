// What `object.name` and `object[key]` find, as jinja2's ImmutableSandboxedEnvironment reads them,
// and the methods of str, list, tuple and dict that they can give.
//
// Methods: str's capitalize, center, count, endswith, find, index, isalpha, islower, isspace,
// isupper, join, ljust, lower, lstrip, removeprefix, removesuffix, replace, rfind, rindex, rjust,
// rsplit, rstrip, split, splitlines, startswith, strip, title and upper (Markup's escape their
// str arguments and give Markup); dict's get, items, keys, values and copy; list's and tuple's
// count and index, and list's copy. Python's other methods exist (a template can test them with
// `is defined`) but calling one is an error, as is calling what the sandbox hides.
#ifndef VC_WORKER_CHAT_JINJA_ACCESS_H_
#define VC_WORKER_CHAT_JINJA_ACCESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/chat/jinja_value.h"

namespace vc::jinja {

// `object.name`: an attribute (a method of str, list or dict; a namespace's, a loop's or a macro's
// attribute) first, else the item `name`, else Undefined. An attribute the sandbox hides (names
// from "_", methods that change a list or dict) is an Undefined that says so. The error of an
// Undefined `object`.
absl::StatusOr<Value> GetAttribute(const Value& object, const std::string& name);
// The attribute `name` only (jinja2's attr filter): no item lookup.
absl::StatusOr<Value> GetAttributeOnly(const Value& object, const std::string& name);
// `object[key]`: the item, else for a str key the attribute, else Undefined.
absl::StatusOr<Value> GetItem(const Value& object, const Value& key);
// `object[start:stop:step]` (None for an absent part) of a str, list, tuple or range.
absl::StatusOr<Value> GetSlice(const Value& object, const Value& start, const Value& stop, const Value& step);

// Calls the method `name` of the str, list, tuple or dict `self`.
absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const CallArgs& args);

}  // namespace vc::jinja

#endif  // VC_WORKER_CHAT_JINJA_ACCESS_H_
