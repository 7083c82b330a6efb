// Sizing the store's tiers from a request trace: the trace's prefix blocks are replayed, in arrival
// order, through a real BlockStore (the RAM tier and a RocksDB tier in a scratch directory) as a
// worker drives it: look a request's blocks up, lease the leading ones present (a disk hit is
// brought up to RAM), and put the ones the store lacked. What comes out is what an operator sizes
// with: how many prompt tokens each tier serves, so the prefill it saves, and the bytes per second
// each tier reads and writes.
//
// Block payloads are scaled down by about a power of two (ReplayOptions::scale), and each tier by
// the ratio that keeps the number of blocks it holds, so a trace of terabytes replays in a scratch
// directory of gigabytes; a scaled block takes the RAM slot (unit times a power of two) the full
// one would. Requests replay one after another, so two that arrive together and share a new prefix
// count as a miss and a hit, where a busy worker fleet might miss twice.
#ifndef VC_CACHESTORE_TIER_REPLAY_H_
#define VC_CACHESTORE_TIER_REPLAY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vc::cachestore {

// One request of a Mooncake-format trace (a JSON object per line: `timestamp` in ms, `input_length`
// and `output_length` in tokens, `hash_ids` naming the prompt's blocks of the trace's block size;
// equal ids at the same position are the same prefix).
struct TraceRequest {
  double timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
};

// Requests [first, first + count) of the trace at `path`, a file or a pipe (count < 0: to the
// end; a FIFO no one writes to reads as empty). kNotFound when the file does not exist or holds
// no such request; kInvalidArgument for one that is neither a file nor a pipe, or naming the line
// for one that is not such an object (a field missing or of the wrong type, a negative length, no
// hash_ids, timestamps that go backwards, or, with block_tokens > 0, a number of hash ids other
// than the blocks of block_tokens its input_length makes: a trace of another block size).
absl::StatusOr<std::vector<TraceRequest>> ReadMooncakeTrace(const std::string& path, int64_t first = 0,
                                                            int64_t count = -1, int64_t block_tokens = 0);

struct ReplayOptions {
  int64_t block_tokens = 512;        // the trace's tokens per hash id
  uint64_t block_bytes = 0;          // one stored block, header included, at full scale
  uint64_t ram_bytes = 0;            // the RAM tier's capacity at full scale
  uint64_t disk_bytes = 0;           // the disk tier's budget at full scale
  uint64_t scale = 1;                // a power of two; blocks and tiers are about this much smaller
  double hot_fraction = 0.5;         // RamTierOptions::hot_fraction
  uint64_t slot_bytes = 4096;        // RamTierOptions::min_slot_bytes, at full scale
  std::string scratch_dir;           // the disk tier's RocksDB lives in a new directory under this one
  const std::atomic<bool>* stop = nullptr;  // when set and true, the replay ends (kCancelled)
};

struct ReplayStats {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;         // every request's input_length
  int64_t block_lookups = 0;         // whole blocks of the prompts, each looked up
  int64_t ram_hits = 0, disk_hits = 0;  // blocks served from each tier (the leading ones present)
  int64_t blocks_put = 0;            // whole blocks the store lacked, put after the request
  double duration_s = 0;             // from the first request to the last
  // At full scale: bytes leased out of RAM (every hit; remote reads), read from disk (disk hits,
  // brought up to RAM) and written to disk (puts).
  double ram_read_bytes = 0, disk_read_bytes = 0, disk_write_bytes = 0;
  // The busiest minute of each, bytes per second (of a trace shorter than a minute: its mean).
  double peak_ram_read_bps = 0, peak_disk_read_bps = 0, peak_disk_write_bps = 0;
  // Blocks in each tier at the end.
  uint64_t ram_blocks = 0, disk_blocks = 0;
  int64_t block_tokens = 0;
  // Prompt tokens the store served (the prefill they save).
  int64_t hit_tokens() const { return (ram_hits + disk_hits) * block_tokens; }
};

// What ReplayTrace would refuse `options` for before it reads a request: the sizes (as below),
// or a scratch directory that is not one.
absl::Status CheckReplay(const ReplayOptions& options);

// Replays `trace` through a BlockStore scaled from the options' sizes (see the top of this file).
// kInvalidArgument when a tier cannot hold one block, a scaled block is smaller than a block
// header and 16 bytes, the scaled RAM tier would pass 4 GiB, the scale is not a power of two, or
// the scratch directory is not one; kCancelled when options.stop turns true; the store's own
// errors otherwise.
absl::StatusOr<ReplayStats> ReplayTrace(const std::vector<TraceRequest>& trace, const ReplayOptions& options);

// What an unbounded store would serve: every leading block seen before, in any earlier request
// (all of it counted as RAM hits; disk_blocks is 0). Zeros for an empty trace; kInvalidArgument
// when block_tokens is not positive.
absl::StatusOr<ReplayStats> UnboundedReplay(const std::vector<TraceRequest>& trace, int64_t block_tokens,
                                            uint64_t block_bytes);

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_TIER_REPLAY_H_
