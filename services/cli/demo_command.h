// `vericache demo`: the engine on a few code prompts, next to full-KV decoding.
#ifndef VC_SERVICES_CLI_DEMO_COMMAND_H_
#define VC_SERVICES_CLI_DEMO_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& DemoFlags();

// Exit code as RunGenerateCommand.
int RunDemoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_DEMO_COMMAND_H_
