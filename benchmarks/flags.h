// Command lines of the benchmarks: --name value pairs over a table of known names and defaults.
#ifndef VC_BENCHMARKS_FLAGS_H_
#define VC_BENCHMARKS_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vc::bench {

// Sets flags[name] for every --name value of the command line; `flags` holds the known names with
// their defaults. False, with the reason on stderr, for an unknown name or one without a value.
bool ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags);

// The integers of flag `name`, a comma-separated list ("1,4,16"), each in [lo, hi]. A part that is
// not such an integer, or a list without one, exits the program (status 2) with a line that names
// the flag.
std::vector<int64_t> Ints(const std::map<std::string, std::string>& flags, const std::string& name,
                          int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
// Flag `name` as one integer in [lo, hi], or one finite number in [lo, hi]; anything else exits the
// program as Ints does.
int64_t Int(const std::map<std::string, std::string>& flags, const std::string& name, int64_t lo = INT64_MIN,
            int64_t hi = INT64_MAX);
double Double(const std::map<std::string, std::string>& flags, const std::string& name, double lo = -1e300,
              double hi = 1e300);

// The most MiB a size flag may give (a petabyte), so that shifting it to bytes cannot overflow.
inline constexpr int64_t kMaxMiB = int64_t{1} << 30;

}  // namespace vc::bench

#endif  // VC_BENCHMARKS_FLAGS_H_
