// Replaying request traces through a real BlockStore (cachestore/tier_replay.h) and the
// `vericache size-tiers` command around it.
#include "cachestore/tier_replay.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <chrono>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cachestore/block_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/cli/size_tiers_command.h"
#include "tests/testing/tiny_model.h"

namespace vc::cachestore {
namespace {

constexpr int64_t kBt = 512;

TraceRequest Req(double ms, int64_t input, std::vector<int64_t> ids) {
  TraceRequest r;
  r.timestamp_ms = ms;
  r.input_length = input;
  r.output_length = 1;
  r.hash_ids = std::move(ids);
  return r;
}

// Prefixes shared as a conversation shares them; the last request's third block is partial, so
// it has two whole blocks. Every store that holds everything serves 2 + 3 + 2 = 7 blocks and is
// asked to put 3 + 1 + 1 + 1 = 6.
std::vector<TraceRequest> SharedPrefixes() {
  return {Req(0, 3 * kBt, {1, 2, 3}), Req(1000, 3 * kBt, {1, 2, 4}), Req(2000, kBt, {5}),
          Req(3000, 4 * kBt, {1, 2, 3, 6}), Req(61000, 2 * kBt + 100, {1, 2, 7})};
}

class TierReplayTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = vc::testing::TempDir("tier_replay"); }
  ReplayOptions Options(uint64_t ram_blocks, uint64_t disk_blocks) const {
    ReplayOptions o;
    o.block_tokens = kBt;
    o.block_bytes = 64 << 10;
    o.ram_bytes = ram_blocks * o.block_bytes;
    o.disk_bytes = disk_blocks * o.block_bytes;
    o.scale = 1;
    o.scratch_dir = dir_;
    return o;
  }
  std::string WriteTrace(const std::string& text, const std::string& name = "trace.jsonl") const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(TierReplayTest, AStoreThatHoldsEverythingServesWhatAnUnboundedOneWould) {
  const std::vector<TraceRequest> trace = SharedPrefixes();
  const ReplayStats u = *UnboundedReplay(trace, kBt, 64 << 10);
  EXPECT_EQ(UnboundedReplay(trace, 0, 64 << 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(u.ram_hits, 7);
  EXPECT_EQ(u.blocks_put, 6);
  EXPECT_EQ(u.block_lookups, 13);
  absl::StatusOr<ReplayStats> s = ReplayTrace(trace, Options(64, 64));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ram_hits, 7);
  EXPECT_EQ(s->disk_hits, 0);
  EXPECT_EQ(s->blocks_put, 6);
  EXPECT_EQ(s->hit_tokens(), 7 * kBt);
  EXPECT_EQ(s->prompt_tokens, (3 + 3 + 1 + 4 + 2) * kBt + 100);
  EXPECT_EQ(s->ram_blocks, 6u);
  EXPECT_EQ(s->disk_blocks, 6u);
  // Bytes at full scale, over the trace's 61 s. The busiest minutes: the first (reads of 5 blocks
  // at 1 and 3 s, all 6 puts) and the one that ends the trace, [1, 61] s (reads of 7 blocks: the
  // first minute's and 2 at 61 s; puts of 3). Minutes cut at 60 s would have missed the 7.
  EXPECT_DOUBLE_EQ(s->duration_s, 61.0);
  EXPECT_DOUBLE_EQ(s->ram_read_bytes, 7.0 * (64 << 10));
  EXPECT_DOUBLE_EQ(s->disk_read_bytes, 0);
  EXPECT_DOUBLE_EQ(s->disk_write_bytes, 6.0 * (64 << 10));
  EXPECT_DOUBLE_EQ(s->peak_ram_read_bps, 7.0 * (64 << 10) / 60);
  EXPECT_DOUBLE_EQ(s->peak_disk_write_bps, 6.0 * (64 << 10) / 60);
  // The scratch directory is left as it was.
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// A trace shorter than a minute has no busiest minute: its peak rates are its mean rates, never
// below them (bytes over a whole minute would be).
TEST_F(TierReplayTest, ATraceShorterThanAMinutePeaksAtItsMean) {
  std::vector<TraceRequest> trace = SharedPrefixes();
  trace.pop_back();  // 3 s
  absl::StatusOr<ReplayStats> s = ReplayTrace(trace, Options(64, 64));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->duration_s, 3.0);
  EXPECT_DOUBLE_EQ(s->peak_ram_read_bps, 5.0 * (64 << 10) / 3);
  EXPECT_DOUBLE_EQ(s->peak_disk_write_bps, 6.0 * (64 << 10) / 3);
  EXPECT_DOUBLE_EQ(UnboundedReplay(trace, kBt, 64 << 10)->peak_ram_read_bps, 5.0 * (64 << 10) / 3);
}

TEST_F(TierReplayTest, WhatRamCannotHoldIsServedFromDisk) {
  // RAM holds one block: the last one put or brought up, never one the next request starts with.
  absl::StatusOr<ReplayStats> s = ReplayTrace(SharedPrefixes(), Options(1, 64));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ram_hits, 0);
  EXPECT_EQ(s->disk_hits, 7);
  EXPECT_EQ(s->blocks_put, 6);
  EXPECT_DOUBLE_EQ(s->disk_read_bytes, 7.0 * (64 << 10));
  EXPECT_EQ(s->ram_blocks, 1u);
}

TEST_F(TierReplayTest, ScaledReplaysAgree) {
  // 1/64 of every size: the same hits.
  ReplayOptions o = Options(1, 64);
  o.scale = 64;
  absl::StatusOr<ReplayStats> s = ReplayTrace(SharedPrefixes(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ram_hits, 0);
  EXPECT_EQ(s->disk_hits, 7);
  EXPECT_EQ(s->ram_blocks, 1u);
  EXPECT_DOUBLE_EQ(s->disk_read_bytes, 7.0 * (64 << 10));  // reported at full scale
}

// A block just past a power of two (a power-of-two payload and its header) takes a slot twice its
// payload in the store's RAM; scaled down, it must too, or the scaled RAM would hold twice the
// blocks. So replays at any scale agree with the full-size one.
TEST_F(TierReplayTest, ScaledBlocksTakeTheSlotsFullOnesWould) {
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 40; ++i) {  // prefixes of 3 blocks: 0 and 1 often, the others once each
    const int64_t p = i % 3 < 2 ? i % 3 : i;
    trace.push_back(Req(1000.0 * i, 3 * kBt, {100 * p, 100 * p + 1, 100 * p + 2}));
  }
  ReplayOptions o = Options(0, 64);
  o.block_bytes = (64 << 10) + 100;
  o.ram_bytes = 8 * (128 << 10);  // eight slots of 128 KiB
  o.disk_bytes = 64 * o.block_bytes;
  absl::StatusOr<ReplayStats> full = ReplayTrace(trace, o);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_GT(full->ram_hits, 0);
  EXPECT_GT(full->disk_hits, 0);
  for (uint64_t scale : {8, 64, 512}) {
    o.scale = scale;
    absl::StatusOr<ReplayStats> s = ReplayTrace(trace, o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->ram_hits, full->ram_hits) << scale;
    EXPECT_EQ(s->disk_hits, full->disk_hits) << scale;
    EXPECT_EQ(s->ram_blocks, full->ram_blocks) << scale;
  }
}

TEST_F(TierReplayTest, BadOptionsAreRefused) {
  ReplayOptions o = Options(4, 4);
  o.scale = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayTrace(SharedPrefixes(), o).status()));
  o.scale = 1 << 16;  // a 1-byte block
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayTrace(SharedPrefixes(), o).status()));
  o = Options(4, 4);
  o.ram_bytes = o.block_bytes - 1;
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayTrace(SharedPrefixes(), o).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayTrace({}, Options(4, 4)).status()));
  o = Options(4, 4);
  o.ram_bytes = uint64_t{1} << 50;  // a 1 PiB region at 1/8: refused, not allocated
  o.scale = 8;
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayTrace(SharedPrefixes(), o).status()));
  o = Options(4, 4);
  o.scratch_dir = dir_ + "/no/such/dir";
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayTrace(SharedPrefixes(), o).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckReplay(o)));
  EXPECT_TRUE(CheckReplay(Options(4, 4)).ok());
}

TEST_F(TierReplayTest, ReadsMooncakeTraces) {
  const std::string path = WriteTrace(
      "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1, 2]}\n"
      "{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [0, 14]}\n"
      "\n"
      "{\"timestamp\": 5.5, \"input_length\": 10, \"output_length\": 0, \"hash_ids\": [9]}\n\n");
  absl::StatusOr<std::vector<TraceRequest>> t = ReadMooncakeTrace(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].input_length, 6758);
  EXPECT_EQ((*t)[0].output_length, 500);
  EXPECT_EQ((*t)[1].hash_ids, (std::vector<int64_t>{0, 14}));
  EXPECT_DOUBLE_EQ((*t)[2].timestamp_ms, 5.5);
  t = ReadMooncakeTrace(path, 1, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].input_length, 700);
  t = ReadMooncakeTrace(path, 2, 1);  // requests, not lines: the blank one is not counted
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].input_length, 10);
  EXPECT_TRUE(absl::IsNotFound(ReadMooncakeTrace(path, 3).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadMooncakeTrace(dir_ + "/absent.jsonl").status()));
}

TEST_F(TierReplayTest, BadTraceLinesAreNamed) {
  const std::string good = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n";
  for (const std::string& bad : {
           std::string("not json"),
           std::string("[1, 2]"),
           std::string("{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": 1, \"input_length\": 1.5, \"output_length\": 1, \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": \"2\", \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}"),
           std::string("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, \"x\"]}"),
           std::string("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [-3]}"),
           std::string("{\"timestamp\": 1, \"input_length\": 2000000000000, \"output_length\": 1, \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": 1e300, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}"),
           std::string("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}") +
               std::string(1, '\0') + "x",
           std::string(17 << 20, ' '),
           std::string(16 << 20, '['),
           "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1], \"x\": " +
               std::string(64, '[') + std::string(64, ']') + "}",
       }) {
    const absl::Status s = ReadMooncakeTrace(WriteTrace(good + bad + "\n")).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad.substr(0, 100) << ": " << s;
    EXPECT_NE(s.message().find("line 2"), std::string::npos) << s;
  }
  // With the block size given, a line's hash ids are its prompt's blocks of that size.
  const std::string three = "{\"timestamp\": 1, \"input_length\": 1100, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n";
  EXPECT_TRUE(ReadMooncakeTrace(WriteTrace(good + three), 0, -1, 512).ok());
  for (int64_t block_tokens : {256, 1024}) {
    const absl::Status s = ReadMooncakeTrace(WriteTrace(good + three), 0, -1, block_tokens).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(absl::StrCat("line 2: 3 hash ids for 1100 prompt tokens, which blocks of ", block_tokens)),
              std::string::npos)
        << s;
  }
  // A pipe is read (`--trace <(zcat trace.jsonl.gz)`); a FIFO no one writes to reads as empty, not
  // waited on for ever; neither a file nor a pipe is refused.
  int ends[2];
  ASSERT_EQ(pipe(ends), 0);
  ASSERT_EQ(write(ends[1], good.data(), good.size()), static_cast<ssize_t>(good.size()));
  close(ends[1]);
  absl::StatusOr<std::vector<TraceRequest>> piped = ReadMooncakeTrace(absl::StrCat("/proc/self/fd/", ends[0]));
  close(ends[0]);
  ASSERT_TRUE(piped.ok()) << piped.status();
  EXPECT_EQ(piped->size(), 1u);
  ASSERT_EQ(mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  const absl::Status fifo = ReadMooncakeTrace(dir_ + "/fifo").status();
  EXPECT_TRUE(absl::IsNotFound(fifo)) << fifo;
  EXPECT_NE(fifo.message().find("holds no requests"), std::string::npos) << fifo;
  for (const std::string& path : {dir_, std::string("/dev/null")}) {
    const absl::Status s = ReadMooncakeTrace(path).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("not a regular file or a pipe"), std::string::npos) << s;
  }
  const std::string back = "{\"timestamp\": 10, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n";
  const absl::Status s = ReadMooncakeTrace(WriteTrace(back + good)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("back in time"), std::string::npos) << s;
}

TEST(ByteSizeTest, ParsesBinarySuffixes) {
  EXPECT_EQ(*cli::ParseByteSize("100"), 100u);
  EXPECT_EQ(*cli::ParseByteSize("512M"), uint64_t{512} << 20);
  EXPECT_EQ(*cli::ParseByteSize("64G"), uint64_t{64} << 30);
  EXPECT_EQ(*cli::ParseByteSize("64GiB"), uint64_t{64} << 30);
  EXPECT_EQ(*cli::ParseByteSize("2T"), uint64_t{2} << 40);
  EXPECT_EQ(*cli::ParseByteSize("8K"), uint64_t{8} << 10);
  for (const char* bad : {"", "0", "-1", "1.5G", "G", "64g", "+5", "1048576T", "99999999999999999999"}) {
    EXPECT_FALSE(cli::ParseByteSize(bad).ok()) << bad;
  }
}

struct CommandRun {
  int code;
  std::string out, err;
};

CommandRun SizeTiers(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = cli::RunSizeTiersCommand(args, out, err);
  return {code, out.str(), err.str()};
}

TEST_F(TierReplayTest, Command) {
  std::string text;
  for (const TraceRequest& r : SharedPrefixes()) {
    nlohmann::json j = {{"timestamp", r.timestamp_ms}, {"input_length", r.input_length},
                        {"output_length", r.output_length}, {"hash_ids", r.hash_ids}};
    text += j.dump() + "\n";
  }
  const std::string trace = WriteTrace(text);
  // 128 bytes a token: 64 KiB blocks and a header, which take slots of 128 KiB: one in the first
  // RAM tier.
  CommandRun r = SizeTiers({"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "128K,4M",
                            "--disk-bytes", "4M", "--scratch-dir", dir_, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["block_bytes"], (64 << 10) + BlockHeaderBytes(1));
  EXPECT_EQ(j["unbounded"]["ram_hits"], 7);
  ASSERT_EQ(j["replays"].size(), 2u);
  EXPECT_EQ(j["replays"][0]["ram_bytes"], 128 << 10);
  EXPECT_EQ(j["replays"][0]["disk_hits"], 7);
  EXPECT_EQ(j["replays"][0]["ram_blocks"], 1);
  EXPECT_EQ(j["replays"][1]["ram_hits"], 7);

  r = SizeTiers({"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M",
                 "--scratch-dir", dir_});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| 4.00 MiB | 4.00 MiB | 53.0% | 53.0% | 0.0% |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a block takes 128 KiB with --ram-slot-bytes 4096 (50.0% of it used); --ram-slot-bytes 4160 "
                       "would use 98.6%"),
            std::string::npos)
      << r.out;

  // Two replicas over 256 KiB of RAM and 8 MiB of disk in all: the replay of 128 KiB over 4 MiB
  // (one block in RAM), twice its disk writes.
  r = SizeTiers({"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "256K", "--disk-bytes", "8M",
                 "--scratch-dir", dir_, "--replicas", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json twice = nlohmann::json::parse(r.out);
  EXPECT_EQ(twice["replicas"], 2);
  EXPECT_EQ(twice["replays"][0]["ram_blocks"], 1);
  for (const char* k : {"ram_hits", "disk_hits", "blocks_put", "ram_blocks", "disk_blocks"}) {
    EXPECT_EQ(twice["replays"][0][k], j["replays"][0][k]) << k;
  }
  EXPECT_GT(j["replays"][0]["disk_write_bytes"].get<double>(), 0);
  EXPECT_EQ(twice["replays"][0]["disk_write_bytes"].get<double>(), 2 * j["replays"][0]["disk_write_bytes"].get<double>());

  // Bad input: exit 2 and a line that names it.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M"}, "--trace is required"},
      {{"--trace", trace, "--ram-bytes", "4M", "--disk-bytes", "4M"}, "give one of --model and --kv-bytes-per-token"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--model", dir_, "--ram-bytes", "4M", "--disk-bytes", "4M"},
       "give one of --model and --kv-bytes-per-token"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4Q", "--disk-bytes", "4M"},
       "--ram-bytes: '4Q' is not a size"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "1K", "--disk-bytes", "4M"},
       "--ram-bytes 1024 holds no slot of 131072 bytes"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "100K", "--disk-bytes", "4M"},  // < a slot
       "--ram-bytes 102400 holds no slot of 131072 bytes"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M", "--ram-slot-bytes",
        "8388608"},
       "holds no slot of 8388608 bytes"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M", "--scale", "3"},
       "--scale must be a power of two"},
      {{"--trace", trace, "--kv-bytes-per-token", "0", "--ram-bytes", "4M", "--disk-bytes", "4M"},
       "--kv-bytes-per-token must be an integer"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M", "--ram-hot-fraction",
        "2"},
       "--ram-hot-fraction must be in [0, 1]"},
      {{"--trace", dir_ + "/absent", "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M"},
       "absent: no such file"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M", "--block-tokens",
        "64"},
       "line 1: 3 hash ids for 1536 prompt tokens, which blocks of 64 tokens make 24"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M", "--scratch-dir",
        dir_ + "/absent"},
       "absent is not a directory"},
      // Every pair is checked before any is replayed.
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M,1000T", "--disk-bytes", "4M"},
       "--ram-bytes 1099511627776000 --disk-bytes 4194304: a RAM tier of"},
      {{"--trace", WriteTrace("{]\n", "bad.jsonl"), "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes",
        "4M"},
       "bad.jsonl: line 1: not a JSON object"},
      {{"--trace", trace, "--model", dir_ + "/absent", "--ram-bytes", "4M", "--disk-bytes", "4M"},
       "absent/config.json: no such file"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "4M", "--disk-bytes", "4M", "--replicas", "0"},
       "--replicas must be an integer in [1, 64]"},
      {{"--trace", trace, "--kv-bytes-per-token", "128", "--ram-bytes", "200K", "--disk-bytes", "4M", "--replicas", "2"},
       "(1/2 of it per copy) holds no slot"},
  };
  for (const auto& [args, message] : bad) {
    r = SizeTiers(args);
    EXPECT_EQ(r.code, 2) << args[1] << " " << r.err;
    EXPECT_EQ(r.out, "") << "printed before refusing: " << message;
    EXPECT_EQ(r.err.rfind("vericache size-tiers: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << "want: " << message << "\ngot: " << r.err;
  }
}

// SIGINT during a replay ends it at its next request, and its scratch directory goes with it. The
// command runs as its own process, as an operator runs it, and is interrupted once it has printed
// its table's head, which it does just before the first replay (of two: each takes seconds).
TEST_F(TierReplayTest, AStopSignalEndsTheReplayAndRemovesItsDirectory) {
  const std::string err_path = dir_ + "/stderr";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0 || dup2(out[1], 1) < 0) _exit(126);
    const std::string bin = std::string(VC_BINARY_DIR) + "/services/vericache";
    const std::string trace = std::string(VC_SOURCE_DIR) + "/benchmarks/data/mooncake_conversation_trace.jsonl";
    execl(bin.c_str(), bin.c_str(), "size-tiers", "--trace", trace.c_str(), "--kv-bytes-per-token", "3072",
          "--ram-bytes", "8G", "--disk-bytes", "32G,64G", "--scratch-dir", dir_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  close(out[1]);
  struct Reaper {
    pid_t pid;
    int fd;
    ~Reaper() {
      close(fd);
      if (waitpid(pid, nullptr, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid, out[0]};
  std::string printed;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (printed.find("| RAM | disk |") == std::string::npos && std::chrono::steady_clock::now() < until) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) != 1) continue;
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    printed.append(buf, static_cast<size_t>(n));
  }
  ASSERT_NE(printed.find("| RAM | disk |"), std::string::npos) << printed;
  ASSERT_EQ(kill(pid, SIGINT), 0);
  int status = 0;
  const auto stopped_by = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < stopped_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(done, pid) << "size-tiers ran on for 15 s after SIGINT";
  std::ifstream err_file(err_path);
  const std::string err((std::istreambuf_iterator<char>(err_file)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ": " << err;
  EXPECT_EQ(WEXITSTATUS(status), 1) << err;
  EXPECT_NE(err.find("the replay was stopped"), std::string::npos) << err;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().rfind("vericache-replay-", 0), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace vc::cachestore
