// Command lines of the benchmarks: --name value pairs over a table of known names and defaults.
#ifndef VC_BENCHMARKS_FLAGS_H_
#define VC_BENCHMARKS_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace vc::bench {

// Sets flags[name] for every --name value of the command line; `flags` holds the known names with
// their defaults. False, with the reason on stderr, for an unknown name or one without a value.
bool ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags);

// The integers of a comma-separated list ("1,4,16"); parts that are not integers are skipped.
std::vector<int64_t> Ints(absl::string_view list);

}  // namespace vc::bench

#endif  // VC_BENCHMARKS_FLAGS_H_
