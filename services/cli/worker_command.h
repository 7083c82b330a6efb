// `vericache worker`: runs an inference worker until SIGINT or SIGTERM.
#ifndef VC_SERVICES_CLI_WORKER_COMMAND_H_
#define VC_SERVICES_CLI_WORKER_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& WorkerFlags();

int RunWorkerCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_WORKER_COMMAND_H_
