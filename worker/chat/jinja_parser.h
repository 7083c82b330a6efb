// Jinja template source to the tree of jinja_ast.h, lexed and parsed as jinja2 3.1 does with
// trim_blocks, lstrip_blocks and the loopcontrols extension (break, continue).
//
// Supported statements: if/elif/else, for (with unpacking, an inline `if`, else), set (to names, to
// a namespace's attribute, and the block form with filters), macro, call, filter, with, print,
// break, continue, and raw blocks. Statements that load other templates or change escaping
// (extends, block, include, import, from, autoescape), recursive loops, nested unpacking, `*args`
// and `**kwargs` in calls, and names outside ASCII are unsupported.
#ifndef VC_WORKER_CHAT_JINJA_PARSER_H_
#define VC_WORKER_CHAT_JINJA_PARSER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/chat/jinja_ast.h"

namespace vc::jinja {

// The statements of `source`. kInvalidArgument "line L, column C: what" for a syntax error, an
// unknown filter or test, or an unsupported construct.
absl::StatusOr<Body> ParseTemplate(absl::string_view source);

}  // namespace vc::jinja

#endif  // VC_WORKER_CHAT_JINJA_PARSER_H_
