// `vericache generate` end to end, in process: output formats and every bad-input exit; the
// store and worker commands' flag checks; and the flag declarations every command parses and
// prints its usage from.
#include <sys/stat.h>

#include <fstream>
#include <initializer_list>
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/memory.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/cli/args.h"
#include "services/cli/demo_command.h"
#include "services/cli/flags.h"
#include "services/cli/generate_command.h"
#include "services/cli/request_command.h"
#include "services/cli/router_command.h"
#include "services/cli/size_tiers_command.h"
#include "services/cli/stats_command.h"
#include "services/cli/store_command.h"
#include "services/cli/worker_command.h"
#include "services/store_service.h"
#include "tests/testing/tiny_model.h"

namespace vc::cli {
namespace {

struct CliRun {
  int code;
  std::string out, err;
};

CliRun Generate(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunGenerateCommand(args, out, err);
  return {code, out.str(), err.str()};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = vc::testing::TempDir("cli");
    vc::testing::WriteTinyModel(dir_, vc::testing::TinyModelSpec{});
  }
  std::string dir_;
};

using Command = int (*)(const std::vector<std::string>&, std::ostream&, std::ostream&);

// `command` with `args` and then `flag value`, for each of `values`: refused as bad usage (2), the
// message naming the flag.
void ExpectRefused(Command command, std::vector<std::string> args, const std::string& flag,
                   std::initializer_list<const char*> values) {
  args.push_back(flag);
  args.emplace_back();
  for (const char* value : values) {
    args.back() = value;
    std::ostringstream out, err;
    EXPECT_EQ(command(args, out, err), 2) << flag << " " << value;
    EXPECT_NE(err.str().find(flag), std::string::npos) << err.str();
  }
}

TEST_F(CliTest, JsonOutput) {
  CliRun r = Generate({"--model", dir_, "--prompt", "def f(x):", "--max-tokens", "8", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt"], "def f(x):");
  EXPECT_EQ(j["prompt_ids"].size(), 10u);  // BOS + 9 bytes
  EXPECT_LE(j["token_ids"].size(), 8u);
  EXPECT_TRUE(j.contains("decode_tokens_per_s"));
  // Sampled runs are reproducible with a seed.
  CliRun a = Generate({"--model", dir_, "--prompt", "x", "--max-tokens", "12", "--temperature", "0.9",
                    "--top-k", "20", "--top-p", "0.9", "--seed", "5", "--json"});
  CliRun b = Generate({"--model", dir_, "--prompt", "x", "--max-tokens", "12", "--temperature", "0.9",
                    "--top-k", "20", "--top-p", "0.9", "--seed", "5", "--json"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["token_ids"], nlohmann::json::parse(b.out)["token_ids"]);
}

// Every mode through the command, greedy and sampled, against its full-KV decoding: VeriCache
// identical under any compressor and window, lossy identical when its compressor keeps everything.
TEST_F(CliTest, EveryModeAgainstFullDecoding) {
  const std::vector<std::string> base = {"--model", dir_, "--prompt", "def f(x):\n    return x", "--max-tokens",
                                         "24", "--json"};
  for (const std::vector<std::string>& sampling :
       {std::vector<std::string>{}, std::vector<std::string>{"--temperature", "0.9", "--top-k", "20", "--seed", "5"}}) {
    auto run = [&](const std::vector<std::string>& extra) {
      std::vector<std::string> args = base;
      args.insert(args.end(), sampling.begin(), sampling.end());
      args.insert(args.end(), extra.begin(), extra.end());
      CliRun r = Generate(args);
      EXPECT_EQ(r.code, 0) << r.err;
      return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
    };
    const nlohmann::json full = run({"--mode", "full"});
    const nlohmann::json want = full["token_ids"];
    ASSERT_GT(want.size(), 0u);
    for (const std::vector<std::string>& extra :
         {std::vector<std::string>{"--mode", "vericache"},
          std::vector<std::string>{"--mode", "vericache", "--draft-window", "auto"},
          std::vector<std::string>{"--mode", "vericache", "--draft-window", "3"},
          std::vector<std::string>{"--mode", "vericache", "--draft-window", "16", "--compressor", "kivi:bits=2"},
          std::vector<std::string>{"--mode", "vericache", "--draft-window", "4", "--compressor",
                                   "streaming:sinks=0,window=1"}}) {
      const nlohmann::json j = run(extra);
      SCOPED_TRACE(absl::StrJoin(extra, " ") + (sampling.empty() ? " greedy" : " sampled"));
      EXPECT_EQ(j["token_ids"], want);
      EXPECT_GT(j["stats"]["verifies"].get<int64_t>(), 0);
      if (extra.size() > 3 && extra[3] != "auto") {  // a fixed window
        EXPECT_GT(j["stats"]["drafted"].get<int64_t>(), 0);
      }
    }
    EXPECT_EQ(run({"--mode", "lossy", "--compressor", "none"})["token_ids"], want);
  }
}

// --kv-dtype: each KV dtype's vericache output is its own full decoding's, and a value that names
// no dtype is refused.
TEST_F(CliTest, KvDTypeEveryModeAgainstItsFullDecoding) {
  for (const char* dtype : {"f32", "bf16", "f16", "auto"}) {
    auto run = [&](const std::vector<std::string>& mode) {
      std::vector<std::string> args = {"--model", dir_, "--prompt", "class A:\n    def", "--max-tokens", "24",
                                       "--json", "--kv-dtype", dtype};
      args.insert(args.end(), mode.begin(), mode.end());
      CliRun r = Generate(args);
      EXPECT_EQ(r.code, 0) << r.err;
      return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
    };
    const nlohmann::json want = run({"--mode", "full"})["token_ids"];
    ASSERT_GT(want.size(), 0u) << dtype;
    EXPECT_EQ(run({"--mode", "vericache", "--draft-window", "4"})["token_ids"], want) << dtype;
  }
  ExpectRefused(RunGenerateCommand, {"--model", dir_, "--prompt", "x"}, "--kv-dtype", {"fp8", "BF16", ""});
}

// Secrets and cached KV stay their user's: a store's data directory is made 0700 (created so, or
// narrowed), and a token file others can read is named on stderr.
TEST_F(CliTest, DataDirIsMadePrivateAndOpenTokenFilesAreNamed) {
  const std::string fresh = dir_ + "/data-fresh", open_dir = dir_ + "/data-open";
  std::ostringstream out;
  ASSERT_TRUE(MakeDirPrivate(fresh, "--data-dir", out).ok());
  struct stat st;
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(out.str(), "");
  ASSERT_EQ(mkdir(open_dir.c_str(), 0755), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  ASSERT_TRUE(MakeDirPrivate(open_dir, "--data-dir", out).ok());
  ASSERT_EQ(stat(open_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_NE(out.str().find("made it 0700"), std::string::npos) << out.str();
  EXPECT_FALSE(MakeDirPrivate(dir_ + "/no/such/parent", "--data-dir", out).ok());

  const std::string token = dir_ + "/token";
  vc::testing::WriteFile(token, "a-token\n");
  for (const auto& [mode, named] : {std::pair<mode_t, bool>{0600, false}, {0644, true}, {0640, true}}) {
    ASSERT_EQ(chmod(token.c_str(), mode), 0);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(*ReadBearerTokenFile(token), "a-token");
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("can be read by other users") != std::string::npos, named) << std::oct << mode << ": " << err;
  }
}

TEST_F(CliTest, BadInputsExitNonZeroWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--prompt", "x"}, "--model"},
      {{"--model", dir_}, "--prompt"},
      {{"--model", dir_, "--prompt", ""}, "empty"},
      {{"--model", dir_, "--prompt", "x", "--prompt-file", "y"}, "exactly one"},
      {{"--model", dir_, "--prompt-file", "/nonexistent"}, "no such file"},
      {{"--model", dir_, "--prompt-file", dir_}, "not a regular file"},
      {{"--model", dir_, "--prompt", "x", "--max-tokens", "100000"}, "exceeds the model's context"},
      {{"--model", dir_, "--prompt", "x", "--max-tokens", "0"}, "--max-tokens"},
      {{"--model", dir_, "--prompt", "x", "--max-tokens", "ten"}, "--max-tokens"},
      {{"--model", dir_, "--prompt", "x", "--temperature", "-1"}, "temperature"},
      {{"--model", dir_, "--prompt", "x", "--top-p", "2"}, "top_p"},
      {{"--model", dir_, "--prompt", "x", "--bogus"}, "unknown option"},
      {{"--model", dir_, "--prompt", "x", "--mode", "vericache", "--draft-window", "65"}, "--draft-window"},
      {{"--model", dir_, "--prompt", "x", "--mode", "vericache", "--draft-window", "-1"}, "--draft-window"},
      {{"--model", dir_, "--prompt", "x", "--mode", "vericache", "--draft-window", "some"}, "--draft-window"},
      {{"--model", dir_, "--model", dir_, "--prompt", "x"}, "given twice"},
      {{"--model", "/nonexistent", "--prompt", "x"}, "config.json"},
      {{"--model", dir_, "--prompt", "x", "--temperature", "inf"}, "finite number"},
      {{"--model", dir_, "--prompt", "x", "--temperature", "1e50"}, "not a finite float"},
      {{"--model", dir_, "--prompt", "x", "--top-p", "1.0000001"}, "top_p 1.00000012"},
      {{"--model", dir_, "--prompt", "x", "--mode", "full", "--compressor", "bogus"}, "unknown compressor 'bogus'"},
      {{"--model", dir_, "--prompt", "x", "--compressor", "kivi:bits=4\nx"}, "control or non-ASCII"},
  };
  for (const Case& c : cases) {
    CliRun r = Generate(c.args);
    EXPECT_NE(r.code, 0) << c.expect;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << "stderr: " << r.err;
  }
}

// Certificate and key files hold PEM blocks of their kind; a file of something else (a path
// mixed up) is refused when read, where gRPC would only fail every connection later.
TEST_F(CliTest, TlsFilesMustHoldPemBlocksOfTheirKind) {
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  };
  const std::string cert = write("ca.pem", "junk\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  const std::string key = write("key.pem", "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n");
  const std::string other = write("passwd", "root:x:0:0:root:/root:/bin/bash\n");
  EXPECT_TRUE(ReadPemFile(cert, "TLS root certificates", "CERTIFICATE").ok());
  EXPECT_TRUE(ReadPemFile(key, "TLS key", "PRIVATE KEY").ok());
  for (const auto& [path, label] : {std::pair{other, "CERTIFICATE"}, std::pair{key, "CERTIFICATE"},
                                    std::pair{cert, "PRIVATE KEY"}}) {
    const absl::Status st = ReadPemFile(path, "TLS file", label).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << path << " " << label;
    EXPECT_NE(st.message().find("holds no PEM block"), std::string::npos) << st;
  }
  const std::string token = write("token", "store-token\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunWorkerCommand({"--model", dir_, "--listen", "127.0.0.1:0", "--store", "127.0.0.1:1",
                              "--store-token-file", token, "--store-tls-ca", other},
                             out, err),
            2);
  EXPECT_NE(err.str().find("holds no PEM block of a certificate"), std::string::npos) << err.str();
}

// A worker told VC_KERNELS it cannot have, or a store link's flag without --store, does not start.
TEST_F(CliTest, WorkerRefusesKernelsItLacksAndStoreFlagsWithoutAStore) {
  const char* before = std::getenv("VC_KERNELS");
  const std::string saved = before != nullptr ? before : "";
  setenv("VC_KERNELS", "bogus", 1);
  std::ostringstream out, err;
  EXPECT_EQ(RunWorkerCommand({"--model", dir_, "--listen", "127.0.0.1:0"}, out, err), 2);
  EXPECT_NE(err.str().find("VC_KERNELS='bogus' names no kernels available here"), std::string::npos) << err.str();
  if (before != nullptr) {
    setenv("VC_KERNELS", saved.c_str(), 1);
  } else {
    unsetenv("VC_KERNELS");
  }
  // (Values each flag takes: one out of its range is refused as such first.)
  for (const auto& [flag, value] : {std::pair{"--ucx", "1"}, std::pair{"--block-tokens", "256"},
                                    std::pair{"--publish-outputs", "1"}, std::pair{"--store-timeout-ms", "1"}}) {
    std::ostringstream o, e;
    EXPECT_EQ(RunWorkerCommand({"--model", dir_, "--listen", "127.0.0.1:0", flag, value}, o, e), 2) << flag;
    EXPECT_NE(e.str().find(std::string(flag) + " needs --store"), std::string::npos) << e.str();
  }
}

// What a worker would take and then ignore is refused: a draft window past what its compressor rolls
// back (it would run at that limit), a store with a compressor that chooses positions by the
// prompt's queries (its requests would never use the store), and compressed prefixes in the store
// from a compressor without a stored form there.
TEST_F(CliTest, WorkerRefusesWhatItWouldIgnore) {
  vc::testing::WriteFile(dir_ + "/store-token", "tok\n");
  const std::vector<std::string> store = {"--store", "127.0.0.1:1", "--store-token-file", dir_ + "/store-token"};
  const std::vector<std::string> snapkv = {"--compressor", "snapkv:capacity=64"};
  const std::vector<std::string> streaming = {"--compressor", "streaming:sinks=4,window=64", "--stored-compressed",
                                              "1"};
  const std::vector<std::string> small_blocks = {"--stored-compressed", "1", "--block-tokens", "16"};
  for (const auto& [flags, expect] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--draft-window", "33"}, "a draft window of 33: kivi:bits=4,group=32,residual=32 rolls back at most 32"},
           {{"--compressor", "kivi:bits=4,residual=8", "--draft-window", "9"}, "rolls back at most 8 drafts"},
           {snapkv, "chooses positions by the prompt's queries"},
           {streaming, "has no stored form"},
           {small_blocks, "divides the store's block of 16 tokens"}}) {
    std::vector<std::string> args = {"--model", dir_, "--listen", "127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    if (flags.size() != 2 || flags[0] != "--draft-window") args.insert(args.end(), store.begin(), store.end());
    std::ostringstream out, err;
    EXPECT_EQ(RunWorkerCommand(args, out, err), 2) << expect;
    EXPECT_NE(err.str().find(expect), std::string::npos) << err.str();
  }
}

// A draft window is checked against the compressor's rollback, and refused where nothing drafts.
TEST_F(CliTest, GenerateRefusesADraftWindowItWouldNotRun) {
  for (const auto& [args, expect] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--mode", "vericache", "--draft-window", "9", "--compressor", "kivi:bits=4,residual=8"},
            "rolls back at most 8 drafts"},
           {{"--mode", "full", "--draft-window", "4"}, "--draft-window is for --mode vericache"},
           {{"--mode", "lossy", "--draft-window", "auto"}, "--draft-window is for --mode vericache"}}) {
    std::vector<std::string> all = {"--model", dir_, "--prompt", "x"};
    all.insert(all.end(), args.begin(), args.end());
    const CliRun r = Generate(all);
    EXPECT_EQ(r.code, 2) << expect;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  }
}

// The demo's shared prefix comes from a file that holds some: an empty one is refused.
TEST_F(CliTest, DemoRefusesAnEmptyPrefixFile) {
  std::ofstream(dir_ + "/empty.py").close();
  std::ostringstream out, err;
  EXPECT_EQ(RunDemoCommand({"--model", dir_, "--prefix-file", dir_ + "/empty.py"}, out, err), 2);
  EXPECT_NE(err.str().find("is empty"), std::string::npos) << err.str();
}

// --help and -h ask for the usage where an option goes; as an option's value they are the value.
TEST_F(CliTest, HelpWhereAnOptionGoesAndNotAsAValue) {
  for (const char* help : {"--help", "-h"}) {
    CliRun r = Generate({"--model", dir_, help});
    EXPECT_EQ(r.code, 0) << help;
    EXPECT_NE(r.out.find("--prompt"), std::string::npos) << r.out;
    r = Generate({"--model", dir_, "--prompt", help, "--max-tokens", "2"});
    EXPECT_EQ(r.code, 0) << help << ": " << r.err;
    EXPECT_EQ(r.out.find("--prompt"), std::string::npos) << "usage printed for a prompt of " << help;
    EXPECT_FALSE(r.out.empty());
  }
}

// A store asked for more memory than the machine has, or given a data directory it cannot make,
// is refused as bad usage (2), like any other bad flag.
TEST_F(CliTest, StoreRefusesMoreRamThanTheMachineHasAndADataDirItCannotMake) {
  vc::testing::WriteFile(dir_ + "/tokens", "t tenant\n");
  // (On a machine of 1 TiB or more the store would start and wait for a signal.)
  if (UsableMemoryBytes() < (uint64_t{1} << 40)) {
    ExpectRefused(RunStoreCommand,
                  {"--listen", "127.0.0.1:0", "--data-dir", dir_ + "/store", "--tokens", dir_ + "/tokens"},
                  "--ram-bytes", {"1099511627776"});
  }
  ExpectRefused(RunStoreCommand, {"--listen", "127.0.0.1:0", "--tokens", dir_ + "/tokens"}, "--data-dir",
                {"/nonexistent/a/b", "/proc/version", "/proc/version/"});
}

// The store's flags are checked before it opens anything.
TEST_F(CliTest, StoreRefusesBadTierFlags) {
  const std::vector<std::string> store = {"--listen", "127.0.0.1:0", "--data-dir", dir_ + "/store", "--tokens",
                                          dir_ + "/absent-tokens"};
  ExpectRefused(RunStoreCommand, store, "--ram-hot-fraction", {"1.5", "-0.1", "nan", "half"});
  ExpectRefused(RunStoreCommand, store, "--ram-slot-bytes",
                {"100", "0", "-64", "2147483648"});  // the last: past the 1 GiB of RAM
  ExpectRefused(RunStoreCommand, store, "--disk-failure-grace-ms", {"-1", "soon", "86400001"});
  // A lease shorter than a reader can trust a read for without asking afterwards.
  ExpectRefused(RunStoreCommand, store, "--lease-ttl-ms", {"5", "1999", "0", "86400001"});
}

TEST_F(CliTest, WorkerRefusesMoreReplicasThanStores) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--store", "127.0.0.1:1", "--store-replicas", "2"},
        {"--store", "127.0.0.1:1,127.0.0.1:2", "--store-replicas", "3"},
        {"--store", "127.0.0.1:1", "--store-replicas", "0"},
        {"--store-replicas", "2"}}) {
    std::vector<std::string> args = {"--model", dir_, "--listen", "127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::ostringstream out, err;
    EXPECT_EQ(RunWorkerCommand(args, out, err), 2) << flags[1];
    EXPECT_NE(err.str().find("--store-replicas"), std::string::npos) << err.str();
  }
}

// Keepalive pings under a second apart would be closer than the servers accept; 0 turns them off.
// (A model that is not there and an unknown policy fail the commands later, with other messages,
// should the flag get through: the test then fails rather than waits on a started server.)
// Flags that would do nothing where they are given are refused.
TEST_F(CliTest, FlagsWithoutEffectAreRefused) {
  vc::testing::WriteFile(dir_ + "/tokens", "t tenant\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunStoreCommand({"--listen", "127.0.0.1:0", "--data-dir", dir_ + "/store", "--tokens", dir_ + "/tokens",
                             "--ucx", "off", "--ucx-across-tenants"},
                            out, err),
            2);
  EXPECT_NE(err.str().find("--ucx-across-tenants has no effect with --ucx off"), std::string::npos) << err.str();
  std::ostringstream rout, rerr;
  EXPECT_EQ(RunRouterCommand({"--listen", "127.0.0.1:0", "--workers", "127.0.0.1:1", "--refresh-seconds", "5"}, rout,
                             rerr),
            2);
  EXPECT_NE(rerr.str().find("--workers names none"), std::string::npos) << rerr.str();
}

TEST_F(CliTest, KeepaliveUnderASecondIsRefused) {
  ExpectRefused(RunWorkerCommand, {"--model", dir_ + "/absent", "--listen", "127.0.0.1:0"}, "--keepalive-ms",
                {"500", "-1", "some"});
  ExpectRefused(RunRouterCommand, {"--listen", "127.0.0.1:0", "--workers", "127.0.0.1:1", "--policy", "absent"},
                "--keepalive-ms", {"500", "-1", "some"});
}

TEST_F(CliTest, WorkerRefusesABadStallGrace) {
  ExpectRefused(RunWorkerCommand, {"--model", dir_ + "/absent", "--listen", "127.0.0.1:0"}, "--stall-grace-ms",
                {"-1", "later", "86400001"});
}

// A flag set of every kind of flag, for the parser's and the usage's tests.
const FlagSet& TestFlags() {
  static const FlagSet* const flags = new FlagSet{
      "test",
      "(--a | --b)",
      "A command for tests.",
      {
          Flag::Str("name", "", "a name").Value("NAME").Required(),
          Flag::Str("mode", "fast", "how").Value("fast|slow"),
          Flag::Int("count", 16, 1, 4096, "how many"),
          Flag::Int("limit", std::nullopt, 0, 100, "a limit").ShownDefault("none at all"),
          Flag::Number("ratio", 0.5, 0, 1, "a share").Value("F"),
          Flag::Number("scale", 1, "any finite number"),
          Flag::Switch("json", "print JSON"),
      }};
  return *flags;
}

absl::Status ParseError(const std::vector<std::string>& argv) { return Args::Parse(argv, TestFlags()).status(); }

TEST(Flags, ParseRefusesWhatItsDeclarationsDoNotAllow) {
  const std::vector<std::string> name = {"--name", "n"};
  const auto with_name = [&](std::vector<std::string> more) {
    more.insert(more.begin(), name.begin(), name.end());
    return more;
  };
  for (const auto& [argv, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--count", "8"}, "--name is required"},
           {with_name({"--bogus", "1"}), "unknown option --bogus"},
           {with_name({"--bogus=1"}), "unknown option --bogus"},
           {with_name({"--count", "2", "--count=3"}), "--count is given twice"},
           {with_name({"--json", "--json"}), "--json is given twice"},
           {with_name({"--count"}), "--count needs a value"},
           {with_name({"--json=1"}), "--json takes no value"},
           {with_name({"stray"}), "unexpected argument 'stray'"},
           {with_name({"--count", "0"}), "--count must be an integer in [1, 4096], got '0'"},
           {with_name({"--count", "4097"}), "--count must be an integer in [1, 4096], got '4097'"},
           {with_name({"--count", "ten"}), "--count must be an integer in [1, 4096], got 'ten'"},
           {with_name({"--count", "1.5"}), "--count must be an integer in [1, 4096], got '1.5'"},
           {with_name({"--limit", "-1"}), "--limit must be an integer in [0, 100], got '-1'"},
           {with_name({"--ratio", "half"}), "--ratio must be a finite number, got 'half'"},
           {with_name({"--ratio", "nan"}), "--ratio must be a finite number, got 'nan'"},
           {with_name({"--ratio", "1.5"}), "--ratio must be in [0, 1], got '1.5'"},
           {with_name({"--scale", "inf"}), "--scale must be a finite number, got 'inf'"},
       }) {
    const absl::Status s = ParseError(argv);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(s.message(), message);
  }
  // --help or -h where an option goes, even before a required flag is seen.
  EXPECT_TRUE(IsHelpRequested(ParseError({"--count", "3", "--help"})));
  EXPECT_TRUE(IsHelpRequested(ParseError({"-h"})));
}

TEST(Flags, GettersGiveTheValueOrTheDeclaredDefault) {
  absl::StatusOr<Args> a = Args::Parse({"--name", "n"}, TestFlags());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Str("name"), "n");
  EXPECT_EQ(a->Str("mode"), "fast");
  EXPECT_EQ(a->Int("count"), 16);
  EXPECT_EQ(a->Double("ratio"), 0.5);
  EXPECT_EQ(a->Double("scale"), 1.0);
  EXPECT_TRUE(a->Has("name"));
  EXPECT_FALSE(a->Has("mode"));
  EXPECT_FALSE(a->Has("limit"));
  EXPECT_FALSE(a->Has("json"));

  // --name=value, an '=' in the value kept, an empty value allowed; an option's value may look
  // like an option.
  a = Args::Parse({"--name=a=b", "--mode=", "--count=4096", "--limit", "0", "--ratio=1", "--scale", "-2.5e3",
                   "--json"},
                  TestFlags());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Str("name"), "a=b");
  EXPECT_TRUE(a->Has("mode"));
  EXPECT_EQ(a->Str("mode"), "");
  EXPECT_EQ(a->Int("count"), 4096);
  EXPECT_EQ(a->Int("limit"), 0);
  EXPECT_EQ(a->Double("ratio"), 1.0);
  EXPECT_EQ(a->Double("scale"), -2500.0);
  EXPECT_TRUE(a->Has("json"));
  a = Args::Parse({"--name", "--help", "--mode", "--count"}, TestFlags());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Str("name"), "--help");
  EXPECT_EQ(a->Str("mode"), "--count");
}

// A limit that depends on another flag is checked after parsing, worded as the parser words one.
TEST(Flags, CheckAtMostWordsALimitAsTheParserDoes) {
  absl::StatusOr<Args> a = Args::Parse({"--name", "n", "--count", "100"}, TestFlags());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->CheckAtMost("count", 100).ok());
  EXPECT_EQ(a->CheckAtMost("count", 99).message(), "--count must be an integer in [1, 99], got '100'");
  EXPECT_TRUE(a->CheckAtMost("limit", 0).ok());  // absent
  EXPECT_EQ(ParseIntFlag("draft-window", "65", 0, 64).status().message(),
            "--draft-window must be an integer in [0, 64], got '65'");
  EXPECT_EQ(*ParseIntFlag("draft-window", "64", 0, 64), 64);
}

// Reading a flag as something it is not declared as is the program's mistake: it stops there.
TEST(FlagsDeathTest, ReadingAFlagOtherThanDeclaredAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const absl::StatusOr<Args> a = Args::Parse({"--name", "n"}, TestFlags());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DEATH((void)a->Str("bogus"), "vericache test declares no --bogus");
  EXPECT_DEATH((void)a->Has("bogus"), "vericache test declares no --bogus");
  EXPECT_DEATH((void)a->Int("mode"), "--mode of vericache test is a text flag, read as an integer");
  EXPECT_DEATH((void)a->Str("count"), "--count of vericache test is an integer flag, read as a text");
  EXPECT_DEATH((void)a->Int("limit"), "--limit has no default");
  FlagSet twice = TestFlags();
  twice.flags.push_back(Flag::Switch("json", "again"));
  EXPECT_DEATH((void)Args::Parse({}, twice), "vericache test declares --json twice");
}

TEST(Flags, UsageListsEveryFlagWithItsDefault) {
  EXPECT_EQ(Usage(TestFlags()),
            "usage: vericache test --name NAME (--a | --b) [options]\n"
            "  A command for tests.\n"
            "\n"
            "  --name NAME               a name (required)\n"
            "  --mode fast|slow          how (default fast)\n"
            "  --count N                 how many (default 16)\n"
            "  --limit N                 a limit (default none at all)\n"
            "  --ratio F                 a share (default 0.5)\n"
            "  --scale X                 any finite number (default 1)\n"
            "  --json                    print JSON\n");
}

// Help and descriptions are wrapped at 100 columns under column 28; a flag too long for the
// column has its help on the next line; '\n' starts a line.
TEST(Flags, UsageWrapsAt100Columns) {
  std::string words;
  for (int i = 0; i < 40; ++i) absl::StrAppend(&words, i == 0 ? "" : " ", "word", i);
  const FlagSet set = {
      "wrap",
      "",
      words,
      {
          Flag::Int("n", 7, 0, 10, words),
          Flag::Str("a-rather-long-flag-name", "x", "short").Value("VALUE"),
          Flag::Str("lines", "", "one\ntwo"),
      }};
  const std::string usage = Usage(set);
  const std::vector<std::string> lines = absl::StrSplit(usage, '\n');
  ASSERT_GT(lines.size(), 8u) << usage;
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_EQ(lines[0], "usage: vericache wrap [options]");
  EXPECT_EQ(lines[1].substr(0, 8), "  word0 ");
  EXPECT_EQ(lines[2].substr(0, 2), "  ");
  EXPECT_NE(lines[2][2], ' ');
  EXPECT_GT(lines[1].size() + 1 + lines[2].substr(2, lines[2].find(' ', 2) - 2).size(), 100u)
      << "the next word would have fit:\n" << usage;
  size_t n = 0;
  while (n < lines.size() && lines[n].rfind("  --n N", 0) != 0) ++n;
  ASSERT_LT(n + 2, lines.size()) << usage;
  EXPECT_EQ(lines[n].substr(0, 34), "  --n N                     word0 ");
  EXPECT_EQ(lines[n + 1].substr(0, 29), std::string(28, ' ') + "w");
  // The default is not split: past the last column, it goes whole to the next line.
  EXPECT_NE(usage.find(" word39\n" + std::string(28, ' ') + "(default 7)\n"), std::string::npos) << usage;
  EXPECT_NE(usage.find("\n  --a-rather-long-flag-name VALUE\n" + std::string(28, ' ') + "short (default x)\n"),
            std::string::npos)
      << usage;
  EXPECT_NE(usage.find("\n  --lines TEXT              one\n" + std::string(28, ' ') + "two\n"), std::string::npos)
      << usage;
}

// Every subcommand prints its usage for --help: every flag it declares, in lines of at most 100
// columns.
TEST(Flags, EverySubcommandsHelpNamesEachOfItsFlags) {
  for (const auto& [command, flags] : std::vector<std::pair<Command, const FlagSet*>>{
           {RunGenerateCommand, &GenerateFlags()},
           {RunDemoCommand, &DemoFlags()},
           {RunStoreCommand, &StoreFlags()},
           {RunWorkerCommand, &WorkerFlags()},
           {RunRequestCommand, &RequestFlags()},
           {RunStatsCommand, &StatsFlags()},
           {RunRouterCommand, &RouterFlags()},
           {RunSizeTiersCommand, &SizeTiersFlags()},
       }) {
    std::ostringstream out, err;
    ASSERT_EQ(command({"--help"}, out, err), 0) << flags->command << ": " << err.str();
    const std::string usage = out.str();
    EXPECT_EQ(usage.rfind("usage: vericache " + flags->command + " ", 0), 0u) << usage;
    EXPECT_EQ(usage, Usage(*flags));
    for (const Flag& f : flags->flags) {
      const std::string entry = "\n  --" + f.name + (f.value.empty() ? "" : " " + f.value);
      const size_t at = usage.find(entry);
      ASSERT_NE(at, std::string::npos) << flags->command << " --" << f.name << "\n" << usage;
      EXPECT_TRUE(usage[at + entry.size()] == ' ' || usage[at + entry.size()] == '\n') << f.name;
    }
    for (absl::string_view line : absl::StrSplit(usage, '\n')) {
      EXPECT_LE(line.size(), 100u) << flags->command << ": " << line;
    }
  }
}

// A server's first line says where it listens: gRPC reports a unix socket's port as 1.
TEST(ListeningOn, PortForTcpAddressForUnixSockets) {
  EXPECT_EQ(ListeningOn("127.0.0.1:0", 40123), "port 40123");
  EXPECT_EQ(ListeningOn("[::]:7070", 7070), "port 7070");
  EXPECT_EQ(ListeningOn("unix:/run/vericache.sock", 1), "unix:/run/vericache.sock");
}

// srv: stores are counted once looked up (by the worker, at start); an empty name is refused here.
TEST_F(CliTest, WorkerStoresFromDns) {
  std::ostringstream out, err;
  EXPECT_EQ(RunWorkerCommand({"--model", dir_, "--listen", "127.0.0.1:0", "--store", "srv:", "--store-token-file",
                              dir_ + "/nothing"},
                             out, err),
            2);
  EXPECT_NE(err.str().find("srv: names no DNS name"), std::string::npos) << err.str();
}

TEST_F(CliTest, ClientTokenFiles) {
  const std::string path = dir_ + "/client-tokens";
  std::ofstream(path) << "# operators\nops\n\nt-a1 team-a\n  t-a2\tteam-a  \nt-b team-b\n";
  auto tokens = ReadClientTokens(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::map<std::string, std::string>{
                         {"ops", ""}, {"t-a1", "team-a"}, {"t-a2", "team-a"}, {"t-b", "team-b"}}));
  for (const char* text : {"a b c\n", "a t1\nb t2\na t3\n", "# none\n\n", "tok ten\x01" "ant\n"}) {
    std::ofstream(path) << text;
    const absl::Status st = ReadClientTokens(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(path), std::string::npos) << st;
  }
}

// The store's token file: `token tenant` a line, both printable ASCII (a tenant salts its blocks'
// keys and labels its metrics, as a worker's does).
TEST_F(CliTest, StoreTokenFiles) {
  const std::string path = dir_ + "/store-tokens";
  std::ofstream(path) << "# workers\nt-1 pool-a\nt-2 pool-b\n";
  auto tokens = ReadTokenFile(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::map<std::string, std::string>{{"t-1", "pool-a"}, {"t-2", "pool-b"}}));
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"tok\n", "expected 'token tenant'"},
           {"tok pool\x01x\n", "the tenant holds a byte other than printable ASCII (1)"},
           {"tok pool\xc3\xa9\n", "the tenant holds a byte other than printable ASCII (195)"},
           {"t-1 a\nt-1 b\n", "listed already"}}) {
    std::ofstream(path) << text;
    const absl::Status st = ReadTokenFile(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(why), std::string::npos) << st;
  }
  // A worker's token file holds one token: a space in it is named as one, and so is a second line
  // (which a first line of a comment would have, the comment taken for the token).
  std::ofstream(path) << "tok tenant\n";
  EXPECT_NE(ReadBearerTokenFile(path).status().message().find("holds a space"), std::string::npos);
  std::ofstream(path) << "# the pool's token\ntok\n";
  EXPECT_NE(ReadBearerTokenFile(path).status().message().find("holds more than one line"), std::string::npos);
  std::ofstream(path) << "tok\n\n";
  ASSERT_TRUE(ReadBearerTokenFile(path).ok());
  EXPECT_EQ(*ReadBearerTokenFile(path), "tok");
}

}  // namespace
}  // namespace vc::cli
