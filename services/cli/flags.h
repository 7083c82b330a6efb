// The flags of the vericache subcommands, each declared once: its name, type, default, range and
// help. The same declarations parse and check a command line (Args::Parse) and make the usage
// that --help prints (Usage).
#ifndef VC_SERVICES_CLI_FLAGS_H_
#define VC_SERVICES_CLI_FLAGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc::cli {

// One flag, `--name VALUE` (or `--name=VALUE`), or `--name` alone for a switch. Made by a factory
// and refined by the modifiers, which return a modified copy:
//   Flag::Int("staging-mib", 512, 1, 1 << 20, "worker memory for ...").Value("MIB")
struct Flag {
  enum class Type { kString, kInt, kNumber, kSwitch };

  // Text, `fallback` when absent ("" for none).
  static Flag Str(std::string name, std::string fallback, std::string help);
  // An integer in [lo, hi], `fallback` when absent. Without a fallback, Args::Int of the flag
  // absent is a programming error: the caller asks Has first, or the flag is Required.
  static Flag Int(std::string name, std::optional<int64_t> fallback, int64_t lo, int64_t hi, std::string help);
  // A finite number in [lo, hi] (any finite number without them), `fallback` when absent.
  static Flag Number(std::string name, double fallback, double lo, double hi, std::string help);
  static Flag Number(std::string name, double fallback, std::string help);
  // Given or not; takes no value.
  static Flag Switch(std::string name, std::string help);

  // What the usage shows for the value ("N" for an integer, "X" for a number, "TEXT" for text
  // unless told: "DIR", "HOST:PORT", "0|1").
  Flag Value(std::string placeholder) const;
  // A command line without the flag is refused.
  Flag Required() const;
  // The default as the usage shows it, where the default is not a constant ("half of
  // --ram-bytes") or reads better another way; the value when absent is unchanged.
  Flag ShownDefault(std::string text) const;

  std::string name;         // without the leading "--"
  Type type = Type::kString;
  std::string value;        // the usage's placeholder; empty for a switch
  std::string help;         // one sentence or a few; '\n' starts a new line in the usage
  bool required = false;
  std::string shown_default;  // empty: none shown
  std::string str_fallback;
  std::optional<int64_t> int_fallback;
  int64_t int_lo = 0, int_hi = 0;
  double number_fallback = 0, number_lo = 0, number_hi = 0;
};

// A subcommand's flags, in the order the usage lists them.
struct FlagSet {
  std::string command;      // "worker": the usage's `vericache worker`
  std::string synopsis;     // what the usage line shows after the required flags, e.g. "(--prompt TEXT | --prompt-file FILE)"
  std::string description;  // a paragraph; '\n' starts a new line
  std::vector<Flag> flags;

  // The flag named `name`, or null.
  const Flag* Find(absl::string_view name) const;
};

// The usage of `set`: "usage: vericache COMMAND <required flags> [options]", the description, then
// one entry per flag, its help from column 28 (or the next line, under a long name) with its
// default or "(required)" after it. No line is longer than 100 columns but for a single word
// that is.
std::string Usage(const FlagSet& set);

// A command line parsed against a FlagSet: every value checked against its flag's declaration.
// Reading a flag the set does not declare, or reading it as another type (Int of a text flag), is
// a programming error: it prints the mistake to stderr and aborts. Not thread-safe.
class Args {
 public:
  // Returns kInvalidArgument for an unknown option, one given twice, a missing value, a value for
  // a switch, a stray positional argument, a required flag missing ("--NAME is required"), or a
  // value outside its flag's type or range ("--NAME must be an integer in [lo, hi], got 'x'",
  // "--NAME must be a finite number, got 'x'", "--NAME must be in [lo, hi], got 'x'"); and
  // HelpRequested() for --help or -h where an option is expected (as an option's value, either is
  // just the value). `flags` must outlive the Args.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv, const FlagSet& flags);

  // Whether the flag was given on the command line.
  bool Has(absl::string_view name) const;
  // The flag's value, or its declared fallback when absent.
  std::string Str(absl::string_view name) const;
  int64_t Int(absl::string_view name) const;
  double Double(absl::string_view name) const;

  // For a limit that depends on another flag: kInvalidArgument, worded as Parse words a value out
  // of range, when the integer flag `name` was given a value above `hi`; OK otherwise.
  absl::Status CheckAtMost(absl::string_view name, int64_t hi) const;

 private:
  explicit Args(const FlagSet* flags) : flags_(flags) {}
  const Flag& Declared(absl::string_view name, Flag::Type type) const;
  const std::string* Given(absl::string_view name) const;

  const FlagSet* flags_;
  std::map<std::string, std::string, std::less<>> values_;
};

// `text` as the value of the integer flag `name` in [lo, hi]: kInvalidArgument "--NAME must be an
// integer in [lo, hi], got 'text'" otherwise (for a flag that is an integer only sometimes:
// --draft-window K|auto).
absl::StatusOr<int64_t> ParseIntFlag(absl::string_view name, absl::string_view text, int64_t lo, int64_t hi);

// What Args::Parse returns for --help or -h.
absl::Status HelpRequested();
bool IsHelpRequested(const absl::Status& s);

}  // namespace vc::cli

#endif  // VC_SERVICES_CLI_FLAGS_H_
