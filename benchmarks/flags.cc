#include "benchmarks/flags.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace vc::bench {

bool ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || flags->count(k.substr(2)) == 0) {
      std::cerr << "unknown option " << k << "\n";
      return false;
    }
    if (i + 1 >= argc) {
      std::cerr << "option " << k << " has no value\n";
      return false;
    }
    (*flags)[k.substr(2)] = argv[i + 1];
  }
  return true;
}

std::vector<int64_t> Ints(absl::string_view list) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int64_t v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace vc::bench
