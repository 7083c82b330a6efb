// `vericache request`: sends one Generate call to a worker and prints what it streams back.
#ifndef VC_SERVICES_CLI_REQUEST_COMMAND_H_
#define VC_SERVICES_CLI_REQUEST_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& RequestFlags();

int RunRequestCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_REQUEST_COMMAND_H_
