#include "cachestore/tier_replay.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cachestore/block_format.h"
#include "cachestore/block_key.h"
#include "cachestore/store.h"
#include "cachestore/tiers.h"
#include "common/files.h"
#include "common/memory.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace vc::cachestore {
namespace {

// The longest trace line read (a request of a million-token prompt in 512-token blocks is
// about 20 KB of ids).
constexpr size_t kMaxLineBytes = size_t{16} << 20;

// The lines of a file descriptor (closed with the reader), each at most kMaxLineBytes: a file that
// is one huge line is refused without being held in memory.
class LineReader {
 public:
  enum Result { kLine, kEnd, kTooLong, kError };
  explicit LineReader(int fd) : fd_(fd) {}
  ~LineReader() { ::close(fd_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, without its '\n'; a last line without one counts. kError leaves errno set.
  Result Next(std::string* line) {
    while (true) {
      const size_t nl = buf_.find('\n', scanned_);
      if (nl != std::string::npos) {
        line->assign(buf_, start_, nl - start_);
        start_ = scanned_ = nl + 1;
        return kLine;
      }
      scanned_ = buf_.size();
      if (buf_.size() - start_ > kMaxLineBytes) return kTooLong;
      if (eof_) {
        if (start_ == buf_.size()) return kEnd;
        line->assign(buf_, start_, std::string::npos);
        start_ = scanned_ = buf_.size();
        return kLine;
      }
      buf_.erase(0, start_);
      scanned_ -= start_;
      start_ = 0;
      char chunk[1 << 16];
      const ssize_t got = ::read(fd_, chunk, sizeof(chunk));
      if (got < 0) {
        if (errno == EINTR) continue;
        return kError;
      }
      if (got == 0) eof_ = true;
      buf_.append(chunk, static_cast<size_t>(got));
    }
  }

 private:
  const int fd_;
  std::string buf_;
  size_t start_ = 0, scanned_ = 0;  // the current line's start; how far '\n' was looked for
  bool eof_ = false;
};

absl::Status BadLine(const std::string& path, int64_t line, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": line ", line, ": ", why));
}

// Past these a trace is not one of requests (and sums of its lengths could overflow).
constexpr int64_t kMaxLength = int64_t{1} << 40;  // tokens in one prompt or output
constexpr double kMaxTimestampMs = 1e15;           // about 31,700 years

// An integer field of `j` in [0, kMaxLength], or why not.
absl::StatusOr<int64_t> Count(const nlohmann::json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat("no \"", name, "\""));
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxLength) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not an integer in [0, 2^40]"));
  }
  return it->get<int64_t>();
}

absl::StatusOr<TraceRequest> ParseRequest(const std::string& text) {
  // A request nests two levels; brackets alone could make the parser build gigabytes of nodes.
  VC_RETURN_IF_ERROR(CheckJsonText(text, 8));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  TraceRequest r;
  const auto ts = j.find("timestamp");
  if (ts == j.end() || !ts->is_number() || !(ts->get<double>() >= 0 && ts->get<double>() <= kMaxTimestampMs)) {
    return absl::InvalidArgumentError("\"timestamp\" is not a number of milliseconds in [0, 1e15]");
  }
  r.timestamp_ms = ts->get<double>();
  VC_ASSIGN_OR_RETURN(r.input_length, Count(j, "input_length"));
  VC_ASSIGN_OR_RETURN(r.output_length, Count(j, "output_length"));
  const auto ids = j.find("hash_ids");
  if (ids == j.end() || !ids->is_array() || ids->empty()) {
    return absl::InvalidArgumentError("\"hash_ids\" is not a non-empty array");
  }
  for (const auto& id : *ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return absl::InvalidArgumentError("a hash id is not a non-negative integer");
    }
    r.hash_ids.push_back(id.get<int64_t>());
  }
  return r;
}

// Keys of the whole blocks of a request: the store's own chained keys, over each hash id as two
// 32-bit "tokens", so a block's key names its whole prefix as a worker's does.
std::vector<BlockKey> Keys(const TraceRequest& r, int64_t block_tokens) {
  const size_t whole = std::min<size_t>(r.hash_ids.size(), static_cast<size_t>(r.input_length / block_tokens));
  std::vector<int32_t> words;
  words.reserve(2 * whole);
  for (size_t i = 0; i < whole; ++i) {
    const uint64_t id = static_cast<uint64_t>(r.hash_ids[i]);
    words.push_back(static_cast<int32_t>(id & 0xffffffffu));
    words.push_back(static_cast<int32_t>(id >> 32));
  }
  KeyContext context;
  context.block_tokens = 2;
  return ChainBlockKeys(context, words);
}

// Bytes per second of the busiest minute of `events` (time in seconds, bytes) over a trace of
// `duration_s`: of the whole minutes from its start and the minute that ends it (so that a burst
// in the last, partial minute is measured over a minute, not diluted), each bytes over 60 s. A
// trace shorter than a minute has none: its busiest is the whole trace (the mean rate; 0 for a
// trace of one instant).
double PeakMinute(const std::vector<std::pair<double, double>>& events, double duration_s) {
  if (duration_s < 60.0) {
    double total = 0;
    for (const auto& [t, b] : events) total += b;
    return duration_s > 0 ? total / duration_s : 0.0;
  }
  const int64_t whole = static_cast<int64_t>(duration_s / 60.0);
  std::map<int64_t, double> per_minute;
  double last = 0;
  for (const auto& [t, b] : events) {
    const int64_t m = static_cast<int64_t>(t / 60.0);
    if (m < whole) per_minute[m] += b;
    if (t >= duration_s - 60.0) last += b;
  }
  double peak = last / 60.0;
  for (const auto& [m, b] : per_minute) peak = std::max(peak, b / 60.0);
  return peak;
}

// What the requests of a replay found and put, tallied into ReplayStats.
class Tally {
 public:
  Tally(const std::vector<TraceRequest>& trace, int64_t block_tokens, uint64_t block_bytes)
      : t0_(trace.front().timestamp_ms), block_(static_cast<double>(block_bytes)) {
    st_.block_tokens = block_tokens;
    st_.duration_s = (trace.back().timestamp_ms - t0_) / 1e3;
  }
  // Request r had `blocks` whole blocks; the leading `present` were in the store, `in_ram` of
  // them in RAM; the rest were put.
  void Add(const TraceRequest& r, size_t blocks, size_t present, size_t in_ram) {
    const double t = (r.timestamp_ms - t0_) / 1e3;
    st_.requests++;
    st_.prompt_tokens += r.input_length;
    st_.block_lookups += static_cast<int64_t>(blocks);
    st_.ram_hits += static_cast<int64_t>(in_ram);
    st_.disk_hits += static_cast<int64_t>(present - in_ram);
    st_.blocks_put += static_cast<int64_t>(blocks - present);
    if (present > 0) ram_reads_.emplace_back(t, static_cast<double>(present) * block_);
    if (present > in_ram) disk_reads_.emplace_back(t, static_cast<double>(present - in_ram) * block_);
    if (blocks > present) disk_writes_.emplace_back(t, static_cast<double>(blocks - present) * block_);
  }
  ReplayStats Finish(uint64_t ram_blocks, uint64_t disk_blocks) {
    st_.ram_read_bytes = static_cast<double>(st_.ram_hits + st_.disk_hits) * block_;
    st_.disk_read_bytes = static_cast<double>(st_.disk_hits) * block_;
    st_.disk_write_bytes = static_cast<double>(st_.blocks_put) * block_;
    st_.peak_ram_read_bps = PeakMinute(ram_reads_, st_.duration_s);
    st_.peak_disk_read_bps = PeakMinute(disk_reads_, st_.duration_s);
    st_.peak_disk_write_bps = PeakMinute(disk_writes_, st_.duration_s);
    st_.ram_blocks = ram_blocks;
    st_.disk_blocks = disk_blocks;
    return st_;
  }

 private:
  const double t0_, block_;
  ReplayStats st_;
  std::vector<std::pair<double, double>> ram_reads_, disk_reads_, disk_writes_;
};

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> ReadMooncakeTrace(const std::string& path, int64_t first, int64_t count,
                                                            int64_t block_tokens) {
  // A file, or a pipe (`--trace <(zcat trace.jsonl.gz)`). O_NONBLOCK: a FIFO no one writes to
  // opens at once (and then reads as empty) instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("trace ", path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat("trace ", path, ": cannot open: ", std::strerror(errno)));
  }
  LineReader in(fd);
  struct stat st;
  if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode))) {
    return absl::InvalidArgumentError(absl::StrCat("trace ", path, ": not a regular file or a pipe"));
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("trace ", path, ": ", std::strerror(errno)));
  }
  std::vector<TraceRequest> out;
  double last_ms = 0;
  int64_t seen = 0;        // requests before this line: --first counts requests, not blank lines
  int64_t prompt_sum = 0;  // the requests' prompt tokens, which ReplayStats sums
  std::string line;
  for (int64_t i = 0; count < 0 || static_cast<int64_t>(out.size()) < count; ++i) {
    const LineReader::Result got = in.Next(&line);
    if (got == LineReader::kEnd) break;
    if (got == LineReader::kTooLong) return BadLine(path, i + 1, "longer than 16 MiB");
    if (got == LineReader::kError) return absl::DataLossError(absl::StrCat("reading ", path, " failed: ", std::strerror(errno)));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line (the file's end)
    if (seen++ < first) continue;
    // (The JSON parser would take a NUL byte for the end of the text.)
    if (line.find('\0') != std::string::npos) return BadLine(path, i + 1, "holds a NUL byte");
    absl::StatusOr<TraceRequest> r = ParseRequest(line);
    if (!r.ok()) return BadLine(path, i + 1, r.status().message());
    if (block_tokens > 0) {
      const int64_t blocks = (r->input_length + block_tokens - 1) / block_tokens;
      if (static_cast<int64_t>(r->hash_ids.size()) != blocks) {
        return BadLine(path, i + 1,
                       absl::StrCat(r->hash_ids.size(), " hash ids for ", r->input_length, " prompt tokens, which blocks of ",
                                    block_tokens, " tokens make ", blocks, " (is the trace's block size another?)"));
      }
    }
    if (!out.empty() && r->timestamp_ms < last_ms) return BadLine(path, i + 1, "the timestamp goes back in time");
    prompt_sum += r->input_length;  // each at most 2^40: no overflow before the check
    if (prompt_sum > (int64_t{1} << 62)) return BadLine(path, i + 1, "the prompts up to here add up past 2^62 tokens");
    last_ms = r->timestamp_ms;
    out.push_back(*std::move(r));
  }
  if (out.empty()) {
    return absl::NotFoundError(
        absl::StrCat(path, first == 0 ? ": holds no requests" : absl::StrCat(": holds no requests past the first ", first)));
  }
  return out;
}

namespace {

// The scaled store a replay runs on: its block's layout, its RAM tier's unit and size, its disk
// tier's budget.
struct ScaledStore {
  BlockLayout layout;
  uint64_t unit = 0, ram = 0, disk = 0;
};

// The store `o` replays on, or why it cannot: the sizes, or a scratch directory that is not one.
absl::StatusOr<ScaledStore> Plan(const ReplayOptions& o) {
  if (o.scale == 0 || (o.scale & (o.scale - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the scale ", o.scale, " is not a power of two"));
  }
  if (o.block_tokens <= 0) return absl::InvalidArgumentError("block_tokens must be positive");
  if (o.ram_bytes < o.block_bytes || o.disk_bytes < o.block_bytes) {
    return absl::InvalidArgumentError("each tier must hold at least one block");
  }
  if (o.slot_bytes == 0) return absl::InvalidArgumentError("slot_bytes must be positive");
  // Each tier is scaled so that it holds as many blocks as the full-size one. The RAM tier gives a
  // block the smallest slot of unit times a power of two that holds it; the scaled tier's unit is
  // the full one's over the scale, rounded up, and its region as many units as the full one's.
  // The scaled block is the full one's size over the scale, moved if need be into the slot size
  // class the full block is in (so that, say, a block of a power-of-two payload plus its header
  // does not round down into a slot of half its size), and the disk tier holds as many of them as
  // the full one holds of full blocks. (Exact when the scale divides the unit; otherwise the
  // scaled region's size is rounded down to a byte, so the RAM watermarks, fractions of it, may
  // fall a slot apart from the full tier's.) A float32 layout of one layer whose payload makes up the
  // rest after the header gives a block any size in steps of 8 bytes (every block of the replay
  // has the same bytes; keys tell them apart).
  const uint64_t unit = (o.slot_bytes + o.scale - 1) / o.scale;
  // The class: sizes in (lo, hi], the scaled unit times the power of two the full slot is.
  const uint64_t hi = unit * (RamSlotBytes(o.slot_bytes, o.block_bytes) / o.slot_bytes);
  const uint64_t lo = hi == unit ? 0 : hi / 2;
  BlockLayout layout;
  layout.num_layers = 1;
  layout.head_dim = 1;
  const uint64_t header = BlockHeaderBytes(layout);
  const uint64_t want = (o.block_bytes + o.scale - 1) / o.scale;
  if (want < header + 16 || hi < header + 16) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", o.block_bytes, " bytes scaled by 1/", o.scale,
                                                   " is below the ", header + 16,
                                                   " bytes a replayed block takes (a header and 16 bytes)"));
  }
  uint64_t units = (std::min(want, hi) - header) / 8;  // one token's K and V of one float each
  if (header + 8 * units <= lo) units = (lo - header) / 8 + 1;
  constexpr uint64_t kMaxTokens = uint64_t{1} << 20;
  if (units > kMaxTokens * 4096) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", want, " bytes is too big to replay; raise the scale"));
  }
  layout.num_kv_heads = static_cast<uint32_t>((units + kMaxTokens - 1) / kMaxTokens);
  layout.tokens = static_cast<uint32_t>((units + layout.num_kv_heads - 1) / layout.num_kv_heads);
  if (BlockBytes(layout) > hi) layout.tokens = static_cast<uint32_t>(units / layout.num_kv_heads);
  const uint64_t block = BlockBytes(layout);
  const auto scaled = [](uint64_t bytes, uint64_t num, uint64_t den) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(bytes) * num / den);
  };
  const uint64_t ram = scaled(o.ram_bytes, unit, o.slot_bytes);
  const uint64_t disk = scaled(o.disk_bytes, block, o.block_bytes);
  constexpr uint64_t kMaxScaledRam = uint64_t{4} << 30;  // the RAM tier's region is allocated whole
  if (ram > kMaxScaledRam) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a RAM tier of ", o.ram_bytes, " bytes at 1/", o.scale, " scale is past 4 GiB; ",
        unit > 1 ? "raise the scale" : "a scale past the slot unit shrinks it no further: raise the slot unit"));
  }
  VC_RETURN_IF_ERROR(CheckFitsInMemory(ram, "the replayed RAM tier"));
  std::error_code ec;
  if (!std::filesystem::is_directory(o.scratch_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("the scratch directory ", o.scratch_dir, " is not a directory"));
  }
  return ScaledStore{layout, unit, ram, disk};
}

}  // namespace

absl::Status CheckReplay(const ReplayOptions& o) { return Plan(o).status(); }

absl::StatusOr<ReplayStats> ReplayTrace(const std::vector<TraceRequest>& trace, const ReplayOptions& o) {
  if (trace.empty()) return absl::InvalidArgumentError("the trace has no requests");
  VC_ASSIGN_OR_RETURN(const ScaledStore scaled, Plan(o));
  const BlockLayout& layout = scaled.layout;
  const uint64_t unit = scaled.unit, ram = scaled.ram, disk = scaled.disk;
  const std::string payload(layout.layer_bytes(), '\0');
  VC_ASSIGN_OR_RETURN(const std::string bytes, EncodeBlock({}, layout, {payload}));

  // The disk tier gets a directory of its own under scratch_dir, removed afterwards.
  std::string dir = (std::filesystem::path(o.scratch_dir) / "vericache-replay-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot make a directory in ", o.scratch_dir, ": ", std::strerror(errno)));
  }
  struct RemoveAfter {
    std::string path;
    ~RemoveAfter() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_after{dir};
  StoreOptions so;
  so.ram.capacity_bytes = ram;
  so.ram.min_slot_bytes = unit;
  so.ram.hot_fraction = o.hot_fraction;
  so.disk.path = dir;
  so.disk.capacity_bytes = disk;
  so.disk.allow_past_filesystem = true;
  so.disk.reserve_bytes = 0;  // the replay's hits must not depend on the scratch disk's free room
  VC_ASSIGN_OR_RETURN(std::unique_ptr<BlockStore> store, BlockStore::Open(so));

  Tally tally(trace, o.block_tokens, o.block_bytes);
  for (const TraceRequest& r : trace) {
    if (o.stop != nullptr && o.stop->load()) return absl::CancelledError("the replay was stopped");
    const std::vector<BlockKey> keys = Keys(r, o.block_tokens);
    // The leading blocks present, leased one by one as a worker's batch leases them: a lease
    // from disk brings its block up to RAM, which may push out a later block of the run (one
    // whose disk copy is gone, too); the run then ends there.
    const size_t listed = store->Lookup(keys).first;
    size_t present = 0, in_ram = 0;
    for (; present < listed; ++present) {
      const bool from_ram = store->ram().Contains(keys[present]);
      absl::StatusOr<BlockLease> lease = store->Lease(keys[present]);
      if (absl::IsNotFound(lease.status())) break;
      if (lease.ok()) {
        (void)store->Release(lease->id);
      } else if (!absl::IsResourceExhausted(lease.status())) {  // exhausted: served inline, still a hit
        return lease.status();
      }
      in_ram += from_ram;
    }
    for (size_t i = present; i < keys.size(); ++i) VC_RETURN_IF_ERROR(store->Put(keys[i], bytes));
    tally.Add(r, keys.size(), present, in_ram);
  }
  const StoreStats ss = store->Stats();
  return tally.Finish(ss.ram_blocks, ss.disk_blocks);
}

absl::StatusOr<ReplayStats> UnboundedReplay(const std::vector<TraceRequest>& trace, int64_t block_tokens,
                                            uint64_t block_bytes) {
  if (block_tokens <= 0) return absl::InvalidArgumentError("block_tokens must be positive");
  if (trace.empty()) return ReplayStats{};
  Tally tally(trace, block_tokens, block_bytes);
  absl::flat_hash_set<BlockKey> seen;
  for (const TraceRequest& r : trace) {
    const std::vector<BlockKey> keys = Keys(r, block_tokens);
    size_t present = 0;
    while (present < keys.size() && seen.contains(keys[present])) ++present;
    for (size_t i = present; i < keys.size(); ++i) seen.insert(keys[i]);
    tally.Add(r, keys.size(), present, present);
  }
  return tally.Finish(seen.size(), 0);
}

}  // namespace vc::cachestore
