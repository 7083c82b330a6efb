#include "worker/chat/chat_format.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace vc {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxTemplateBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxTokenizerConfigBytes = uint64_t{64} << 20;
// Conversations nest a few levels (messages, content parts, tool calls, their arguments).
constexpr int kMaxJsonDepth = 32;

absl::StatusOr<ordered_json> ParseJson(absl::string_view text, absl::string_view what) {
  VC_RETURN_IF_ERROR(CheckJsonText(text, kMaxJsonDepth));
  ordered_json j = ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  return j;
}

// tokenizer_config.json names a token as a string or as {"content": string}.
std::string TokenName(const ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

// tokenizer_config.json's chat_template: a string, or a list of {"name", "template"} of which the
// one named "default". Empty when it has none.
absl::StatusOr<std::string> TemplateOfConfig(const ordered_json& config) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const ordered_json& t : *it) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        return t["template"].get<std::string>();
      }
    }
    return absl::InvalidArgumentError("tokenizer_config.json: chat_template lists no template named \"default\"");
  }
  return absl::InvalidArgumentError("tokenizer_config.json: chat_template is neither a string nor a list");
}

}  // namespace

absl::StatusOr<std::string> ChatFormat::Render(absl::string_view messages_json, absl::string_view tools_json,
                                               bool add_generation_prompt) const {
  VC_ASSIGN_OR_RETURN(ordered_json messages, ParseJson(messages_json, "messages"));
  if (!messages.is_array() || messages.empty()) {
    return absl::InvalidArgumentError("messages must be a non-empty array of message objects");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "] is not an object with a string role"));
    }
  }
  ordered_json context = ordered_json::object();
  context["messages"] = std::move(messages);
  if (!tools_json.empty()) {
    VC_ASSIGN_OR_RETURN(ordered_json tools, ParseJson(tools_json, "tools"));
    if (!tools.is_array()) return absl::InvalidArgumentError("tools must be an array");
    context["tools"] = std::move(tools);
  }
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token_;
  context["eos_token"] = eos_token_;
  absl::StatusOr<std::string> text = template_.Render(context);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the chat template: ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::optional<ChatFormat>> LoadChatFormat(const std::string& model_dir,
                                                         const std::string& template_file) {
  ordered_json config = ordered_json::object();
  const std::string config_path = model_dir + "/tokenizer_config.json";
  if (absl::StatusOr<std::string> text = ReadFileLimited(config_path, kMaxTokenizerConfigBytes, "tokenizer_config.json");
      text.ok()) {
    absl::StatusOr<ordered_json> parsed = ParseJson(*text, config_path);
    if (!parsed.ok()) return parsed.status();
    if (!parsed->is_object()) return absl::InvalidArgumentError(absl::StrCat(config_path, " is not a JSON object"));
    config = *std::move(parsed);
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  std::string source, origin;
  if (!template_file.empty()) {
    VC_ASSIGN_OR_RETURN(source, ReadFileLimited(template_file, kMaxTemplateBytes, "chat template"));
    origin = template_file;
  } else if (absl::StatusOr<std::string> file =
                 ReadFileLimited(model_dir + "/chat_template.jinja", kMaxTemplateBytes, "chat template");
             file.ok()) {
    source = *std::move(file);
    origin = model_dir + "/chat_template.jinja";
  } else if (!absl::IsNotFound(file.status())) {
    return file.status();
  } else {
    VC_ASSIGN_OR_RETURN(source, TemplateOfConfig(config));
    origin = config_path + " (chat_template)";
  }
  if (source.empty()) return std::optional<ChatFormat>();
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message(),
                                                   " (--chat-template FILE gives the worker another template)"));
  }
  return std::optional<ChatFormat>(
      ChatFormat(*std::move(parsed), TokenName(config, "bos_token"), TokenName(config, "eos_token")));
}

}  // namespace vc
