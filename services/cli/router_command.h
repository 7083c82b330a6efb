// `vericache router`: runs a router in front of several workers until SIGINT or SIGTERM.
#ifndef VC_SERVICES_CLI_ROUTER_COMMAND_H_
#define VC_SERVICES_CLI_ROUTER_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& RouterFlags();

int RunRouterCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_ROUTER_COMMAND_H_
