// `vericache generate`: text generation from a checkpoint on this machine.
#ifndef VC_SERVICES_CLI_GENERATE_COMMAND_H_
#define VC_SERVICES_CLI_GENERATE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& GenerateFlags();

// Runs the subcommand with `args` (the words after "generate"). Writes the generated text (or one
// JSON object with --json) to `out` and errors to `err`. Returns the process exit code: 0 on
// success, 2 for bad usage or input, 1 for other failures.
int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_GENERATE_COMMAND_H_
