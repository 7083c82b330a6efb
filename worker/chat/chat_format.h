// How a checkpoint's chat model wants a conversation written: its chat template (Jinja, see
// chat_template.h) and the text of its BOS and EOS tokens, which the template writes itself.
#ifndef VC_WORKER_CHAT_CHAT_FORMAT_H_
#define VC_WORKER_CHAT_CHAT_FORMAT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/chat/chat_template.h"

namespace vc {

// Thread-safe (immutable).
class ChatFormat {
 public:
  ChatFormat(ChatTemplate tmpl, std::string bos_token, std::string eos_token)
      : template_(std::move(tmpl)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {}

  // The prompt text of a conversation: `messages_json`, a JSON array of message objects, and
  // `tools_json`, empty or a JSON array of tool specs, given to the template as `messages` and
  // `tools`, with `add_generation_prompt`, `bos_token` and `eos_token`. kInvalidArgument for JSON
  // that is malformed, too large or nested too deep, messages that are not objects with a string
  // role, and for the template's own errors (raise_exception: its message).
  absl::StatusOr<std::string> Render(absl::string_view messages_json, absl::string_view tools_json,
                                     bool add_generation_prompt) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate template_;
  std::string bos_token_, eos_token_;
};

// The chat format of the checkpoint in `model_dir`: the template of `template_file` when it is not
// empty, else `model_dir`/chat_template.jinja, else tokenizer_config.json's chat_template (a
// string, or a list of named templates, of which "default"); the BOS and EOS texts from
// tokenizer_config.json (empty without it). nullopt when the checkpoint has no template and none
// is given. kNotFound for a missing `template_file`; kInvalidArgument for a template this
// implementation cannot render (naming the file, line and construct) or a malformed
// tokenizer_config.json.
absl::StatusOr<std::optional<ChatFormat>> LoadChatFormat(const std::string& model_dir,
                                                         const std::string& template_file);

}  // namespace vc

#endif  // VC_WORKER_CHAT_CHAT_FORMAT_H_
