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

// The integers of flag `name`, a comma-separated list ("1,4,16"). A part that is not an integer,
// or a list without one, exits the program (status 2) with a line that names the flag.
std::vector<int64_t> Ints(const std::map<std::string, std::string>& flags, const std::string& name);
// Flag `name` as one integer, or as one number; anything else exits the program as Ints does.
int64_t Int(const std::map<std::string, std::string>& flags, const std::string& name);
double Double(const std::map<std::string, std::string>& flags, const std::string& name);

}  // namespace vc::bench

#endif  // VC_BENCHMARKS_FLAGS_H_
