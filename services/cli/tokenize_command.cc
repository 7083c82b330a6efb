#include "services/cli/tokenize_command.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/cli/args.h"
#include "worker/runtime/hf_tokenizer.h"

namespace vc::cli {
namespace {

constexpr uint64_t kMaxInputBytes = uint64_t{1} << 30;

absl::StatusOr<std::string> ReadInput(const Args& a) {
  if (a.Has("text") == a.Has("text-file")) return absl::InvalidArgumentError("give exactly one of --text and --text-file");
  if (a.Has("text")) return a.Str("text");
  return ReadFileLimited(a.Str("text-file"), kMaxInputBytes, "text file");
}

// Ids as a JSON list, {"ids": [...]} (what --json prints), or integers apart by spaces or commas.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '[' || text[first] == '{')) {
    VC_RETURN_IF_ERROR(CheckJsonText(text, 8));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object() && j.contains("ids")) j = j["ids"];
    if (!j.is_array()) return absl::InvalidArgumentError("the ids are neither a JSON list nor {\"ids\": [...]}");
    std::vector<int32_t> ids;
    for (const auto& v : j) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("not a token id: ", v.dump()));
      }
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  }
  std::vector<int32_t> ids;
  const char* p = text.c_str();
  while (true) {
    while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
    if (*p == '\0') break;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || errno != 0 || v < 0 || v > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("not a token id at '", std::string(p, std::min<size_t>(strlen(p), 20)), "'"));
    }
    ids.push_back(static_cast<int32_t>(v));
    p = end;
  }
  return ids;
}

absl::Status Run(const Args& a, std::ostream& out) {
  VC_ASSIGN_OR_RETURN(const std::string input, ReadInput(a));
  VC_ASSIGN_OR_RETURN(const std::unique_ptr<HfTokenizer> tokenizer, LoadHfTokenizer(a.Str("tokenizer")));
  if (a.Has("decode")) {
    if (a.Has("add-special-tokens")) return absl::InvalidArgumentError("--add-special-tokens is for encoding");
    VC_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, ParseIds(input));
    for (int32_t id : ids) {
      if (id >= tokenizer->id_limit()) {
        return absl::InvalidArgumentError(absl::StrCat("id ", id, " is past the tokenizer's last (", tokenizer->id_limit() - 1, ")"));
      }
    }
    const std::string text = tokenizer->Decode(ids);
    if (a.Has("json")) {
      out << nlohmann::json{{"text", text}}.dump() << "\n";
    } else {
      out << text << "\n";
    }
    return absl::OkStatus();
  }
  const std::vector<int32_t> ids = tokenizer->Encode(input, a.Has("add-special-tokens"));
  if (a.Has("json")) {
    out << nlohmann::json{{"ids", ids}}.dump() << "\n";
  } else {
    out << absl::StrJoin(ids, " ") << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

const FlagSet& TokenizeFlags() {
  static const FlagSet* const flags = new FlagSet{
      "tokenize",
      "(--text TEXT | --text-file FILE)",
      "Encodes text with a Hugging Face tokenizer (tokenizer.json and tokenizer_config.json, as a "
      "checkpoint's folder holds them) and prints its token ids, apart by spaces (or {\"ids\": [...]} "
      "with --json). With --decode, the input is token ids (a JSON list, {\"ids\": [...]}, or integers "
      "apart by spaces or commas) and the text is printed (special tokens dropped).",
      {
          Flag::Str("tokenizer", "", "the folder that holds tokenizer.json (a checkpoint's)").Value("DIR").Required(),
          Flag::Str("text", "", "the text (or --text-file)"),
          Flag::Str("text-file", "", "a file that holds the text (or --text)").Value("FILE"),
          Flag::Switch("add-special-tokens", "add what the tokenizer's post-processor adds (a BOS, say)"),
          Flag::Switch("decode", "the input is token ids: print their text"),
          Flag::Switch("json", "print one JSON object: {\"ids\": [...]} or, with --decode, {\"text\": ...}"),
      }};
  return *flags;
}

int RunTokenizeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(TokenizeFlags(), args, out, err, Run);
}

}  // namespace vc::cli
