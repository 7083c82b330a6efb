// `vericache size-tiers`: replays a request trace through the cache store's tiers at several
// sizes and prints what each would serve (cachestore/tier_replay.h).
#ifndef VC_SERVICES_CLI_SIZE_TIERS_COMMAND_H_
#define VC_SERVICES_CLI_SIZE_TIERS_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/cli/flags.h"

namespace vc::cli {

// The subcommand's flags, which its usage lists.
const FlagSet& SizeTiersFlags();

int RunSizeTiersCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// A byte count: digits with an optional binary suffix K, M, G or T (KiB, MiB, GiB and TiB are
// read the same), at least 1 and below 2^60. kInvalidArgument otherwise.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_SIZE_TIERS_COMMAND_H_
