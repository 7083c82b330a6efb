#include "services/cli/size_tiers_command.h"

#include <atomic>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cachestore/block_format.h"
#include "cachestore/tier_replay.h"
#include "cachestore/tiers.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/cli/args.h"
#include "worker/runtime/model.h"
#include "worker/runtime/model_config.h"

namespace vc::cli {
namespace {

absl::StatusOr<std::vector<uint64_t>> Sizes(const Args& a, const std::string& name) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(a.Str(name), ',')) {
    absl::StatusOr<uint64_t> v = ParseByteSize(part);
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", v.status().message()));
    out.push_back(*v);
  }
  if (out.size() > 16) return absl::InvalidArgumentError(absl::StrCat("--", name, " lists more than 16 sizes"));
  return out;
}

std::string Rate(double bytes, double seconds) {
  return seconds > 0 ? absl::StrCat(FormatBytes(bytes / seconds), "/s") : "-";
}

nlohmann::json ToJson(const cachestore::ReplayStats& s) {
  return {{"requests", s.requests},
          {"prompt_tokens", s.prompt_tokens},
          {"block_lookups", s.block_lookups},
          {"ram_hits", s.ram_hits},
          {"disk_hits", s.disk_hits},
          {"blocks_put", s.blocks_put},
          {"hit_tokens", s.hit_tokens()},
          {"duration_s", s.duration_s},
          {"ram_read_bytes", s.ram_read_bytes},
          {"disk_read_bytes", s.disk_read_bytes},
          {"disk_write_bytes", s.disk_write_bytes},
          {"peak_ram_read_bps", s.peak_ram_read_bps},
          {"peak_disk_read_bps", s.peak_disk_read_bps},
          {"peak_disk_write_bps", s.peak_disk_write_bps},
          {"ram_blocks", s.ram_blocks},
          {"disk_blocks", s.disk_blocks}};
}

// The RAM slot a block takes with units of `slot` bytes, how full, and a unit that fits it: the
// block's size over 16, rounded up to 64 bytes, so a block fills 16 units and one of about a
// fifth of it (its 4-bit KIVI variant) four.
std::string SlotLine(uint64_t block, uint64_t slot) {
  const uint64_t taken = cachestore::RamSlotBytes(slot, block);
  const uint64_t fit = std::max<uint64_t>(64, ((block + 15) / 16 + 63) / 64 * 64);
  const uint64_t fit_taken = cachestore::RamSlotBytes(fit, block);
  return absl::StrFormat("RAM slots: a block takes %s with --ram-slot-bytes %d (%.1f%% of it used)%s\n",
                         FormatBytes(static_cast<double>(taken)), slot,
                         100.0 * static_cast<double>(block) / static_cast<double>(taken),
                         taken == fit_taken || static_cast<double>(block) / static_cast<double>(taken) > 0.99
                             ? std::string()
                             : absl::StrFormat("; --ram-slot-bytes %d would use %.1f%%", fit,
                                               100.0 * static_cast<double>(block) / static_cast<double>(fit_taken)));
}

void PrintRow(std::ostream& out, const std::string& ram, const std::string& disk, const cachestore::ReplayStats& s,
              bool unbounded) {
  const auto pct = [&](int64_t blocks) {
    if (s.prompt_tokens == 0) return std::string("-");
    return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(blocks * s.block_tokens) /
                                         static_cast<double>(s.prompt_tokens));
  };
  out << absl::StrFormat("| %s | %s | %s | %s | %s | %s (%s) | %s (%s) | %s (%s) |\n", ram, disk,
                         pct(s.ram_hits + s.disk_hits), pct(s.ram_hits), unbounded ? "0.0%" : pct(s.disk_hits),
                         Rate(s.ram_read_bytes, s.duration_s), FormatBytes(s.peak_ram_read_bps) + "/s",
                         unbounded ? "-" : Rate(s.disk_read_bytes, s.duration_s),
                         unbounded ? "-" : FormatBytes(s.peak_disk_read_bps) + "/s", Rate(s.disk_write_bytes, s.duration_s),
                         FormatBytes(s.peak_disk_write_bps) + "/s");
}

absl::Status Run(const Args& a, std::ostream& out) {
  if (a.Has("model") == a.Has("kv-bytes-per-token")) {
    return absl::InvalidArgumentError("give one of --model and --kv-bytes-per-token");
  }
  VC_ASSIGN_OR_RETURN(const std::vector<uint64_t> rams, Sizes(a, "ram-bytes"));
  VC_ASSIGN_OR_RETURN(const std::vector<uint64_t> disks, Sizes(a, "disk-bytes"));
  const int64_t block_tokens = a.Int("block-tokens");
  const int64_t first = a.Int("first");
  const int64_t requests = a.Has("requests") ? a.Int("requests") : -1;  // -1: to the trace's end
  const double hot_fraction = a.Double("ram-hot-fraction");
  // (Checked against the RAM sizes below: each must hold a block's slot.)
  VC_ASSIGN_OR_RETURN(const uint64_t slot_bytes, RamSlotBytes(a, uint64_t{1} << 50));
  const uint64_t copies = static_cast<uint64_t>(a.Int("replicas"));

  uint64_t block_bytes = 0;
  std::string what;
  if (a.Has("layers") && !a.Has("kv-bytes-per-token")) {
    return absl::InvalidArgumentError("--layers goes with --kv-bytes-per-token");
  }
  if (a.Has("kv-dtype") && !a.Has("model")) return absl::InvalidArgumentError("--kv-dtype goes with --model");
  if (a.Has("model")) {
    VC_ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(a.Str("model")));
    VC_ASSIGN_OR_RETURN(const std::optional<DType> asked, KvDType(a));
    VC_ASSIGN_OR_RETURN(const DType dtype, ModelKvDType(a.Str("model"), asked));
    cachestore::BlockLayout bl;
    bl.num_layers = static_cast<uint32_t>(c.num_layers);
    bl.num_kv_heads = static_cast<uint32_t>(c.num_kv_heads);
    bl.head_dim = static_cast<uint32_t>(c.head_dim);
    bl.tokens = static_cast<uint32_t>(block_tokens);
    bl.encoding = dtype == DType::kBF16  ? cachestore::BlockEncoding::kBFloat16
                  : dtype == DType::kF16 ? cachestore::BlockEncoding::kFloat16
                                         : cachestore::BlockEncoding::kFloat32;
    block_bytes = cachestore::BlockBytes(bl);
    what = absl::StrCat("blocks of ", a.Str("model"), "'s ", absl::AsciiStrToLower(DTypeName(dtype)), " KV");
  } else {
    const int64_t per_token = a.Int("kv-bytes-per-token");
    if (static_cast<uint64_t>(per_token) > (uint64_t{1} << 50) / static_cast<uint64_t>(block_tokens)) {
      return absl::InvalidArgumentError("--kv-bytes-per-token times --block-tokens is past 1 PiB");
    }
    const int64_t layers = a.Int("layers");
    block_bytes = static_cast<uint64_t>(per_token) * static_cast<uint64_t>(block_tokens) +
                  cachestore::BlockHeaderBytes(static_cast<uint32_t>(layers));
    what = absl::StrCat("blocks of ", per_token, " bytes per token and a header");
  }
  // A RAM tier holds a block only if it holds the block's slot: the unit times a power of two.
  const uint64_t slot = cachestore::RamSlotBytes(slot_bytes, block_bytes);
  const std::string per_copy = copies > 1 ? absl::StrCat(" (1/", copies, " of it per copy)") : "";
  for (uint64_t s : rams) {
    if (s / copies < slot) {
      return absl::InvalidArgumentError(absl::StrCat("--ram-bytes ", s, per_copy, " holds no slot of ", slot,
                                                     " bytes, which a block of ", block_bytes,
                                                     " takes with --ram-slot-bytes ", slot_bytes));
    }
  }
  for (uint64_t s : disks) {
    if (s / copies < block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("--disk-bytes ", s, per_copy, " holds no block of ", block_bytes, " bytes"));
    }
  }
  uint64_t scale = 1;
  if (a.Has("scale")) {
    scale = static_cast<uint64_t>(a.Int("scale"));
    if ((scale & (scale - 1)) != 0) return absl::InvalidArgumentError("--scale must be a power of two");
  } else {
    while (block_bytes / (scale * 2) >= 8192) scale *= 2;
  }
  std::string scratch = a.Str("scratch-dir");
  if (scratch.empty()) {
    std::error_code ec;
    scratch = std::filesystem::temp_directory_path(ec).string();
    if (ec) scratch = "/tmp";
  }

  // Every pair is checked before the first is replayed (each replay of a large trace takes a while).
  std::atomic<bool> stop{false};
  const auto options = [&](uint64_t ram, uint64_t disk) {
    cachestore::ReplayOptions o;
    o.block_tokens = block_tokens;
    o.block_bytes = block_bytes;
    o.ram_bytes = ram / copies;
    o.disk_bytes = disk / copies;
    o.scale = scale;
    o.hot_fraction = hot_fraction;
    o.slot_bytes = slot_bytes;
    o.scratch_dir = scratch;
    o.stop = &stop;
    return o;
  };
  for (uint64_t ram : rams) {
    for (uint64_t disk : disks) {
      if (absl::Status s = cachestore::CheckReplay(options(ram, disk)); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("--ram-bytes ", ram, " --disk-bytes ", disk, ": ", s.message()));
      }
    }
  }
  VC_ASSIGN_OR_RETURN(const std::vector<cachestore::TraceRequest> trace,
                      cachestore::ReadMooncakeTrace(a.Str("trace"), first, requests, block_tokens));
  VC_ASSIGN_OR_RETURN(cachestore::ReplayStats unbounded, cachestore::UnboundedReplay(trace, block_tokens, block_bytes));
  // Every block put is written to each of its replicas' disk tiers.
  const auto count_copies = [copies](cachestore::ReplayStats& s) {
    s.disk_write_bytes *= static_cast<double>(copies);
    s.peak_disk_write_bps *= static_cast<double>(copies);
  };
  count_copies(unbounded);
  // From here on, SIGINT or SIGTERM ends the replay at its next request, so that its scratch
  // directory is removed on the way out (before, nothing is on disk: a signal ends the process as
  // usual); a second one ends the process at once.
  const StopSignalWatch watch(BlockStopSignals(), [&stop] { stop = true; });  // before RocksDB's threads
  const bool json = a.Has("json");
  nlohmann::json results = nlohmann::json::array();
  if (!json) {
    out << absl::StrFormat(
        "%d requests over %.0f s, %d prompt tokens; %s: %s a block of %d tokens; replayed at 1/%d scale\n",
        unbounded.requests, unbounded.duration_s, unbounded.prompt_tokens, what, FormatBytes(static_cast<double>(block_bytes)),
        block_tokens, scale);
    out << SlotLine(block_bytes, slot_bytes);
    if (copies > 1) {
      out << absl::StrFormat("%d replicas: each pair of sizes is replayed as one store of 1/%d of them; disk writes "
                             "are %d times the replay's (an approximation: see --help)\n",
                             copies, copies, copies);
    }
    out << "| RAM | disk | prompt tokens from the store | from RAM | from disk | RAM reads: mean (peak minute) "
           "| disk reads | disk writes |\n|---|---|---:|---:|---:|---:|---:|---:|\n";
    const double distinct = static_cast<double>(unbounded.ram_blocks) * static_cast<double>(block_bytes);
    PrintRow(out, "unbounded",
             absl::StrCat("(", FormatBytes(distinct * static_cast<double>(copies)), " of blocks",
                          copies > 1 ? absl::StrCat(", ", copies, " copies") : "", ")"),
             unbounded, true);
    out.flush();
  }
  for (uint64_t ram : rams) {
    for (uint64_t disk : disks) {
      VC_ASSIGN_OR_RETURN(cachestore::ReplayStats s, cachestore::ReplayTrace(trace, options(ram, disk)));
      count_copies(s);
      if (json) {
        nlohmann::json j = ToJson(s);
        j["ram_bytes"] = ram;
        j["disk_bytes"] = disk;
        results.push_back(std::move(j));
      } else {
        PrintRow(out, FormatBytes(static_cast<double>(ram)), FormatBytes(static_cast<double>(disk)), s, false);
        out.flush();
      }
    }
  }
  if (json) {
    nlohmann::json j = {{"block_bytes", block_bytes}, {"block_tokens", block_tokens}, {"scale", scale},
                        {"replicas", copies},
                        {"ram_slot_bytes", slot_bytes}, {"block_slot_bytes", slot},
                        {"unbounded", ToJson(unbounded)}, {"replays", results}};
    out << j.dump(2) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  uint64_t shift = 0;
  for (const auto& [suffix, s] : {std::pair<absl::string_view, uint64_t>{"KiB", 10}, {"MiB", 20}, {"GiB", 30},
                                  {"TiB", 40}, {"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}}) {
    if (absl::ConsumeSuffix(&t, suffix)) {
      shift = s;
      break;
    }
  }
  uint64_t v = 0;
  if (t.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(t[0])) || !absl::SimpleAtoi(t, &v) || v == 0 ||
      v >= (uint64_t{1} << (60 - shift))) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (bytes, or with K, M, G or T) in [1, 2^60)"));
  }
  return v << shift;
}

const FlagSet& SizeTiersFlags() {
  static const FlagSet* const flags = new FlagSet{
      "size-tiers",
      "(--model DIR | --kv-bytes-per-token N)",
      "Replays a Mooncake-format trace (one JSON object per line: timestamp, input_length, output_length, "
      "hash_ids) through a real cache store, RAM tier over RocksDB, once per pair of sizes, as workers drive it: "
      "look a prompt's blocks up, read the leading ones present, put the rest. Prints the prompt tokens each tier "
      "serves and the bytes per second each reads and writes. A SIZE is bytes, or with a binary suffix: 512M, "
      "64G, 2T.",
      {
          Flag::Str("trace", "", "the trace: a file or a pipe, such as <(zcat trace.jsonl.gz)")
              .Value("FILE")
              .Required(),
          Flag::Str("model", "", "a checkpoint whose full-KV blocks the store would hold (K and V of every layer, "
                                 "in --kv-dtype)")
              .Value("DIR"),
          KvDTypeFlag(),
          Flag::Int("kv-bytes-per-token", std::nullopt, 1, int64_t{1} << 30,
                    "instead of --model, any other model's KV bytes per token, its blocks carrying a header for "
                    "--layers layers"),
          Flag::Int("layers", 1, 1, 4096, "with --kv-bytes-per-token, the model's layers").Value("L"),
          Flag::Str("ram-bytes", "", "the RAM tier's sizes to replay, at most 16").Value("SIZE[,SIZE...]").Required(),
          Flag::Str("disk-bytes", "", "the disk tier's sizes to replay, at most 16")
              .Value("SIZE[,SIZE...]")
              .Required(),
          Flag::Int("block-tokens", 512, 1, 1 << 20,
                    "tokens per hash id of the trace (512 for Mooncake's): a line's hash ids must be its "
                    "input_length over N, rounded up"),
          Flag::Int("first", 0, 0, int64_t{1} << 40, "requests at the start of the trace that are skipped"),
          Flag::Int("requests", std::nullopt, 1, int64_t{1} << 40, "requests replayed")
              .ShownDefault("all after --first"),
          Flag::Str("scratch-dir", "",
                    "where the disk tier is made at --scale, in a new directory removed afterwards, or on SIGINT or "
                    "SIGTERM")
              .Value("DIR")
              .ShownDefault("the temporary directory"),
          HotFractionFlag(),
          RamSlotBytesFlag(),
          Flag::Int("scale", std::nullopt, 1, int64_t{1} << 40,
                    "sizes are divided by this power of two for the replay")
              .ShownDefault("the largest that leaves blocks of 8 KiB or more"),
          Flag::Int("replicas", 1, 1, 64,
                    "the workers' --store-replicas: the sizes are those of all the store's shards together, which "
                    "hold every block R times, so they are replayed as one store of 1/R of each size, its disk "
                    "writes counted R times. An approximation: each shard keeps its own LRU over its share of the "
                    "blocks, and read repair's writes are not counted; block counts are of one copy")
              .Value("R"),
          Flag::Switch("json", "print the results as one JSON object"),
      }};
  return *flags;
}

int RunSizeTiersCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(SizeTiersFlags(), args, out, err, Run);
}

}  // namespace vc::cli
