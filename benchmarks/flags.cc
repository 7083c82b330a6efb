#include "benchmarks/flags.h"

#include <cstdlib>
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

namespace {

[[noreturn]] void BadFlag(const std::string& name, const std::string& value, absl::string_view want) {
  std::cerr << "--" << name << " '" << value << "': expected " << want << "\n";
  std::exit(2);
}

const std::string& Value(const std::map<std::string, std::string>& flags, const std::string& name) {
  static const std::string kNone;
  const auto it = flags.find(name);
  return it == flags.end() ? kNone : it->second;
}

}  // namespace

std::vector<int64_t> Ints(const std::map<std::string, std::string>& flags, const std::string& name) {
  const std::string& list = Value(flags, name);
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(p, &v)) BadFlag(name, list, "integers separated by commas");
    out.push_back(v);
  }
  if (out.empty()) BadFlag(name, list, "integers separated by commas");
  return out;
}

int64_t Int(const std::map<std::string, std::string>& flags, const std::string& name) {
  int64_t v;
  if (!absl::SimpleAtoi(Value(flags, name), &v)) BadFlag(name, Value(flags, name), "an integer");
  return v;
}

double Double(const std::map<std::string, std::string>& flags, const std::string& name) {
  double v;
  if (!absl::SimpleAtod(Value(flags, name), &v)) BadFlag(name, Value(flags, name), "a number");
  return v;
}

}  // namespace vc::bench
