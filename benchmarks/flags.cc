#include "benchmarks/flags.h"

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

[[noreturn]] void BadFlag(const std::string& name, const std::string& value, const std::string& want) {
  std::cerr << "--" << name << " '" << value << "': expected " << want << "\n";
  std::exit(2);
}

const std::string& Value(const std::map<std::string, std::string>& flags, const std::string& name) {
  static const std::string kNone;
  const auto it = flags.find(name);
  return it == flags.end() ? kNone : it->second;
}

template <typename T>
std::string Range(T lo, T hi, T min, T max) {
  if (lo == min && hi == max) return "";
  if (hi == max) return absl::StrCat(" of at least ", lo);
  if (lo == min) return absl::StrCat(" of at most ", hi);
  return absl::StrCat(" from ", lo, " to ", hi);
}

}  // namespace

std::vector<int64_t> Ints(const std::map<std::string, std::string>& flags, const std::string& name, int64_t lo,
                          int64_t hi) {
  const std::string& list = Value(flags, name);
  const std::string want = "integers" + Range(lo, hi, INT64_MIN, INT64_MAX) + " separated by commas";
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(p, &v) || v < lo || v > hi) BadFlag(name, list, want);
    out.push_back(v);
  }
  if (out.empty()) BadFlag(name, list, want);
  return out;
}

int64_t Int(const std::map<std::string, std::string>& flags, const std::string& name, int64_t lo, int64_t hi) {
  int64_t v;
  if (!absl::SimpleAtoi(Value(flags, name), &v) || v < lo || v > hi) {
    BadFlag(name, Value(flags, name), "an integer" + Range(lo, hi, INT64_MIN, INT64_MAX));
  }
  return v;
}

double Double(const std::map<std::string, std::string>& flags, const std::string& name, double lo, double hi) {
  double v;
  // Written so that NaN fails too.
  if (!absl::SimpleAtod(Value(flags, name), &v) || !(v >= lo && v <= hi) || !std::isfinite(v)) {
    BadFlag(name, Value(flags, name), "a finite number" + Range(lo, hi, -1e300, 1e300));
  }
  return v;
}

}  // namespace vc::bench
