// What the disk tier takes on the filesystem against its budget, under churn: blocks of one size
// are put, never read, until `--churn` times the budget has been written, so the tier evicts its
// least recently used blocks all along. With --hot-every n, every n-th block stays in use (touched
// after every put, as a shared prefix is), so the blob files it sits in hold garbage until
// RocksDB's garbage collection rewrites them. Prints the footprint (DiskTier::footprint_bytes)
// sampled after every put, by kind of file, as a multiple of the budget, and the blocks the tier
// held on average once full.
//
// With --dir on a filesystem too small for the footprint, it shows what the tier does as that
// filesystem fills: with --reserve-mib 0 (no room kept free), puts fail once it is full.
//
//   disk_footprint --capacity-mib 1024 --block-kib 1536 --churn 6 [--hot-every 100]
//                  [--memtable-mib 64] [--blob-file-mib 256] [--reserve-mib 256] [--dir /var/tmp]
//                  [--json out.json]
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmarks/flags.h"
#include "cachestore/tiers.h"
#include "common/files.h"
#include "nlohmann/json.hpp"

namespace {

using vc::bench::Int;
using vc::cachestore::BlockKey;
using vc::cachestore::DiskTier;
using vc::cachestore::DiskTierOptions;

// Space allocated in the directory (as DiskTier::footprint_bytes counts it) by kind of file:
// "blob", "sst", "log" (write-ahead) and "other" (RocksDB's own LOG files, MANIFEST, OPTIONS).
std::map<std::string, uint64_t> ByKind(const std::string& dir) {
  std::map<std::string, uint64_t> out = {{"blob", 0}, {"sst", 0}, {"log", 0}, {"other", 0}};
  vc::ForEachFileAllocation(dir, [&](const std::filesystem::path& path, uint64_t bytes) {
    const std::string ext = path.extension().string();
    out[ext == ".blob" ? "blob" : ext == ".sst" ? "sst" : ext == ".log" ? "log" : "other"] += bytes;
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"capacity-mib", "1024"}, {"block-kib", "1536"},
                                              {"churn", "6"},           {"blob-file-mib", "256"}, {"memtable-mib", "64"}, {"reserve-mib", "256"},
                                              {"dir", "/var/tmp"},      {"json", ""}, {"hot-every", "0"}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  // Every number is checked before the directory is made.
  const uint64_t capacity = static_cast<uint64_t>(Int(flags, "capacity-mib", 1, vc::bench::kMaxMiB)) << 20;
  const uint64_t block = static_cast<uint64_t>(Int(flags, "block-kib", 1, 1 << 20)) << 10;
  const int64_t churn = Int(flags, "churn", 1, 1000);
  if (block > capacity) {
    std::cerr << "need --block-kib <= --capacity-mib\n";
    return 2;
  }
  const uint64_t blob_file = static_cast<uint64_t>(Int(flags, "blob-file-mib", 1, 1 << 20)) << 20;
  const uint64_t memtable = static_cast<uint64_t>(Int(flags, "memtable-mib", 1, 1 << 20)) << 20;
  const uint64_t reserve = static_cast<uint64_t>(Int(flags, "reserve-mib", 0, vc::bench::kMaxMiB)) << 20;
  const int64_t hot_every = Int(flags, "hot-every", 0, INT64_MAX);
  std::string dir = (std::filesystem::path(flags["dir"]) / "vericache-footprint-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    std::cerr << "cannot make a directory in " << flags["dir"] << "\n";
    return 1;
  }
  DiskTierOptions o;
  o.path = dir;
  o.capacity_bytes = capacity;
  o.blob_file_bytes = blob_file;
  o.memtable_bytes = memtable;
  o.reserve_bytes = reserve;
  auto tier = DiskTier::Open(o);
  if (!tier.ok()) {
    std::cerr << tier.status() << "\n";
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return 1;
  }
  // Incompressible payloads (RocksDB compresses nothing here, but a filesystem might).
  std::string payload(block, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : payload) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  const int64_t puts = static_cast<int64_t>(churn * capacity / block);
  uint64_t peak = 0;
  std::vector<BlockKey> hot;
  int64_t failed = 0, failed_run = 0;
  double held = 0;  // blocks stored, summed over the puts after the first budget's worth
  int64_t held_samples = 0;
  std::map<std::string, uint64_t> at_peak;
  for (int64_t i = 0; i < puts; ++i) {
    BlockKey key;
    std::memcpy(key.bytes.data(), &i, sizeof(i));
    std::memcpy(payload.data(), &i, sizeof(i));  // no two blocks alike
    // On a filesystem too small for the tier, puts fail once it fills: counted, and the first
    // failure and the first success after one are printed.
    if (absl::Status s = (*tier)->Put(key, payload); !s.ok()) {
      if (failed_run == 0) std::cout << "put " << i << " failed: " << s << "\n";
      ++failed, ++failed_run;
      if (i >= puts / churn) held += static_cast<double>((*tier)->used_bytes()), ++held_samples;
      continue;
    } else if (failed_run > 0) {
      std::cout << "put " << i << " succeeded after " << failed_run << " failed\n";
      failed_run = 0;
    }
    // Every hot-every-th block put stays in use (touched after every put): a shared prefix.
    if (hot_every > 0) {
      if (i % hot_every == 0) hot.push_back(key);
      for (const BlockKey& h : hot) (*tier)->Touch(h);
    }
    const uint64_t now = (*tier)->footprint_bytes();
    if (i >= puts / churn) held += static_cast<double>((*tier)->used_bytes()), ++held_samples;
    if (now > peak) peak = now, at_peak = ByKind(dir);
  }
  const std::map<std::string, uint64_t> end = ByKind(dir);
  uint64_t end_total = 0;
  for (const auto& [kind, bytes] : end) end_total += bytes;
  const double cap = static_cast<double>(capacity);
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  const double mean_held = held_samples > 0 ? held / static_cast<double>(held_samples) : 0;
  std::cout << absl::StrFormat(
      "budget %.0f MiB, blocks of %.0f KiB, %d puts (%d x the budget), %s; memtable %.0f MiB, blob files "
      "up to %.0f MiB; %.0f MiB kept free; blocks held once full: %.2f of the budget on average; %d puts "
      "failed, %d blocks evicted for room on the filesystem\n",
      mib(capacity), static_cast<double>(block) / 1024, puts, churn,
      hot_every > 0 ? absl::StrFormat("every %d-th block kept in use", hot_every) : std::string("no block reused"),
      mib(o.memtable_bytes), mib(o.blob_file_bytes), mib(o.reserve_bytes), mean_held / cap, failed,
      (*tier)->reserve_evictions());
  std::cout << "| footprint | total | x budget | blob | sst | write-ahead log | other |\n|---|---:|---:|---:|---:|---:|---:|\n";
  auto row = [&](const char* name, uint64_t total, std::map<std::string, uint64_t> k) {
    std::cout << absl::StrFormat("| %s | %.1f MiB | %.2f | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB |\n", name,
                                 mib(total), static_cast<double>(total) / cap, mib(k["blob"]), mib(k["sst"]),
                                 mib(k["log"]), mib(k["other"]));
  };
  row("peak", peak, at_peak);
  row("end", end_total, end);
  if (!flags["json"].empty()) {
    nlohmann::json j = {{"capacity_bytes", capacity}, {"block_bytes", block},      {"puts", puts},
                        {"blob_file_bytes", o.blob_file_bytes}, {"memtable_bytes", o.memtable_bytes}, {"hot_every", hot_every},
                        {"mean_held_bytes", mean_held}, {"failed_puts", failed}, {"reserve_bytes", o.reserve_bytes},
                        {"reserve_evictions", (*tier)->reserve_evictions()}, {"peak_bytes", peak}, {"peak_by_kind", at_peak},
                        {"end_bytes", end_total},              {"end_by_kind", end},  {"used_bytes", (*tier)->used_bytes()}};
    std::ofstream(flags["json"]) << j.dump(1) << "\n";
  }
  tier->reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
