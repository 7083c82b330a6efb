// `vericache store`: runs a cache-store server until SIGINT or SIGTERM.
#ifndef VC_SERVICES_CLI_STORE_COMMAND_H_
#define VC_SERVICES_CLI_STORE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& StoreFlags();

int RunStoreCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_STORE_COMMAND_H_
