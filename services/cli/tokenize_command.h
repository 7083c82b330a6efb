// `vericache tokenize`: a checkpoint's Hugging Face tokenizer on the command line, text to ids
// (--json: {"ids": [...]}) or, with --decode, ids to text.
#ifndef VC_SERVICES_CLI_TOKENIZE_COMMAND_H_
#define VC_SERVICES_CLI_TOKENIZE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& TokenizeFlags();

int RunTokenizeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_TOKENIZE_COMMAND_H_
