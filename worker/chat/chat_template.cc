#include "worker/chat/chat_template.h"

#include <ctime>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/chat/jinja_ast.h"
#include "worker/chat/jinja_builtins.h"
#include "worker/chat/jinja_eval.h"
#include "worker/chat/jinja_parser.h"

namespace vc {

struct ChatTemplate::Parsed {
  jinja::Body body;
};

namespace {

using jinja::CallArgs;
using jinja::Value;

// raise_exception(message): fails the rendering with str(message).
absl::StatusOr<Value> RaiseException(CallArgs args) {
  VC_ASSIGN_OR_RETURN(const std::vector<std::optional<Value>> bound,
                      jinja::BindArgs("raise_exception", args, {"message"}));
  if (!bound[0].has_value()) {
    return jinja::TypeError("raise_exception() missing 1 required positional argument: 'message'");
  }
  VC_ASSIGN_OR_RETURN(const std::string message, jinja::Str(*bound[0]));
  return absl::InvalidArgumentError(message);
}

// Python's datetime.strftime of a local time without a time zone: %f is the microseconds, %z
// and %Z are empty, the rest is the C library's strftime (in the C locale, as Python's is).
std::string StrftimeLocal(const std::string& format, absl::Time now) {
  const int64_t micros = absl::ToUnixMicros(now);
  const int64_t micro_part = ((micros % 1000000) + 1000000) % 1000000;
  const std::time_t seconds = static_cast<std::time_t>((micros - micro_part) / 1000000);
  std::tm local{};
  localtime_r(&seconds, &local);
  local.tm_isdst = -1;
  std::string c_format;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 == format.size()) {
      c_format.push_back(format[i]);
      continue;
    }
    const char c = format[++i];
    if (c == 'f') {
      c_format += absl::StrFormat("%06d", micro_part);
    } else if (c != 'z' && c != 'Z') {
      c_format += {'%', c};
    }
  }
  // strftime's 0 means both "empty" and "too small": grow the buffer as Python does.
  for (size_t size = 1024;; size *= 2) {
    std::string out(size, '\0');
    const size_t n = std::strftime(out.data(), out.size(), c_format.c_str(), &local);
    if (n > 0 || c_format.empty() || size >= 256 * c_format.size()) {
      out.resize(n);
      return out;
    }
  }
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(absl::string_view source) {
  VC_ASSIGN_OR_RETURN(jinja::Body body, jinja::ParseTemplate(source));
  return ChatTemplate(std::make_shared<const Parsed>(Parsed{std::move(body)}));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, absl::Time now) const {
  if (!context.is_object()) return absl::InvalidArgumentError("the context of a chat template must be an object");
  absl::StatusOr<Value> values = jinja::FromJson(context);
  if (!values.ok()) return absl::InvalidArgumentError(absl::StrCat("context: ", values.status().message()));
  std::vector<std::pair<std::string, Value>> globals = jinja::BuiltinGlobals();
  const auto add = [&](const std::string& name, std::function<absl::StatusOr<Value>(CallArgs)> body) {
    globals.emplace_back(name, Value::FromObject(std::make_shared<jinja::Function>(name, std::move(body))));
  };
  add("raise_exception", RaiseException);
  add("strftime_now", [now](CallArgs args) -> absl::StatusOr<Value> {
    VC_ASSIGN_OR_RETURN(const std::vector<std::optional<Value>> bound,
                        jinja::BindArgs("strftime_now", args, {"format"}));
    if (!bound[0].has_value() || !bound[0]->is_string()) {
      return jinja::TypeError("strftime_now() takes a format string");
    }
    return Value::String(StrftimeLocal(bound[0]->string(), now));
  });
  return jinja::Render(parsed_->body, values->dict(), globals);
}

}  // namespace vc
