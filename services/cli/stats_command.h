// `vericache stats`: what a running worker or cache store reports of itself.
#ifndef VC_SERVICES_CLI_STATS_COMMAND_H_
#define VC_SERVICES_CLI_STATS_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& StatsFlags();

int RunStatsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_STATS_COMMAND_H_
