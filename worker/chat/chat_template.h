// A model's chat template: the Jinja template of its tokenizer_config.json ("chat_template") that
// turns an OpenAI-style list of messages into the prompt text.
//
// Rendering is Hugging Face transformers' apply_chat_template's, output for output: jinja2 3.1's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls; the globals
// raise_exception(message) and strftime_now(format) (local time); transformers' tojson
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)); values as
// Python holds the JSON context (objects are dicts in key order, 1.0 stays a float).
//
// The supported language is listed in worker/chat/jinja_parser.h (statements) and
// worker/chat/jinja_builtins.h (filters, tests, methods, globals). What is outside it is an
// error, at Parse where it can be seen there (a tag, filter or test), else at Render: never a
// prompt that differs from transformers'.
#ifndef VC_WORKER_CHAT_CHAT_TEMPLATE_H_
#define VC_WORKER_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace vc {

// A parsed chat template. Thread-safe (immutable after Parse); copies share the parsed tree.
class ChatTemplate {
 public:
  // kInvalidArgument "line L, column C: what" when `source` has a syntax error or uses a
  // construct this implementation does not support (a tag such as include or block, an unknown
  // filter or test).
  static absl::StatusOr<ChatTemplate> Parse(absl::string_view source);

  // The prompt for `context`, an object (messages, add_generation_prompt, bos_token, eos_token,
  // tools, ...). `now` is the time strftime_now formats. kInvalidArgument with the template's
  // message for raise_exception, and with jinja2's message for what jinja2 raises at render time
  // (an attribute of an undefined value, operands of the wrong types, a method that does not
  // exist ...) or for a value this implementation does not hold (an int past 64 bits ...).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context, absl::Time now = absl::Now()) const;

 private:
  struct Parsed;
  explicit ChatTemplate(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}

  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace vc

#endif  // VC_WORKER_CHAT_CHAT_TEMPLATE_H_
