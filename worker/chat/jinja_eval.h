// Renders a parsed Jinja template (jinja_parser.h) as jinja2 3.1 renders it in an
// ImmutableSandboxedEnvironment without autoescaping.
//
// Scoping follows jinja2's: a for loop's body (each iteration afresh), its else block, a macro
// call, a with block and the body of a block set or filter block have their own variables; if
// blocks do not. A namespace is how a loop hands values out.
#ifndef VC_WORKER_CHAT_JINJA_EVAL_H_
#define VC_WORKER_CHAT_JINJA_EVAL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/chat/jinja_ast.h"
#include "worker/chat/jinja_value.h"

namespace vc::jinja {

// The text of `body`. Names resolve to the items of `context` (str keys), then to `globals`; the
// template's top-level sets hide both. kInvalidArgument with the message jinja2 would raise for
// the first failure (raise_exception's message as it is given); no partial output.
absl::StatusOr<std::string> Render(const Body& body, const Dict& context,
                                   const std::vector<std::pair<std::string, Value>>& globals);

}  // namespace vc::jinja

#endif  // VC_WORKER_CHAT_JINJA_EVAL_H_
