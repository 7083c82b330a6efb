#include "services/cli/stats_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "services/cli/args.h"
#include "services/inference_client.h"
#include "vericache/v1/cache_store.grpc.pb.h"
#include "vericache/v1/inference.grpc.pb.h"

namespace vc::cli {
namespace {

namespace v1 = vericache::v1;

std::string Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& target) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(target, ": ", s.error_message()));
}

std::string Json(const google::protobuf::Message& m, const char* kind) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string body;
  (void)google::protobuf::util::MessageToJsonString(m, &body, o);
  return absl::StrCat("{\"kind\": \"", kind, "\", \"stats\": ", body, "}\n");
}

void PrintWorker(const std::string& target, const v1::WorkerStats& s, std::ostream& out) {
  const int64_t up = static_cast<int64_t>(s.uptime_micros() / 1000000);
  out << absl::StrFormat("worker %s, up %dh %02dm %02ds\n", target, up / 3600, up / 60 % 60, up % 60);
  out << absl::StrFormat("requests: %d in flight, %d ended, %d failed, %d refused (at a request limit or draining), %d invalid\n",
                         s.requests_in_flight(), s.requests_ended(), s.requests_failed(), s.requests_refused(),
                         s.requests_invalid());
  const uint64_t p = s.prompt_tokens();
  out << absl::StrFormat(
      "prompt tokens: %d (full KV from the store %s, compressed KV reused %s, compressed KV from the store %s, "
      "recomputed after a failed read %s); generated tokens: %d\n",
      p, Share(s.prefix_store_tokens(), p), Share(s.prefix_compressed_tokens(), p),
      Share(s.prefix_compressed_store_tokens(), p), Share(s.recomputed_tokens(), p), s.generated_tokens());
  out << absl::StrFormat("drafts: %d drafted, %d accepted (%s), %d verify passes\n", s.drafted_tokens(),
                         s.accepted_drafts(), Share(s.accepted_drafts(), s.drafted_tokens()), s.verify_passes());
  const v1::WorkerMemory& m = s.memory();
  out << absl::StrFormat("memory: host KV %s of %s reserved, compressed KV %s of %s reserved, prefix cache %s of %s\n",
                         FormatBytes(m.host_kv_used_bytes()), FormatBytes(m.host_kv_capacity_bytes()),
                         FormatBytes(m.compressed_kv_used_bytes()), FormatBytes(m.compressed_kv_capacity_bytes()),
                         FormatBytes(m.prefix_cache_used_bytes()), FormatBytes(m.prefix_cache_capacity_bytes()));
  // Tenants, when any client token names one.
  if (s.tenants_size() > 1 || (s.tenants_size() == 1 && !s.tenants(0).tenant().empty())) {
    for (const v1::TenantStats& t : s.tenants()) {
      out << absl::StrFormat(
          "  tenant %s: %d in flight, %d ended, %d failed, %d refused; prompt tokens %d (full KV from the store %s); "
          "generated tokens %d; %d drafted, %d accepted (%s)\n",
          t.tenant().empty() ? "(default)" : t.tenant(), t.requests_in_flight(), t.requests_ended(),
          t.requests_failed(), t.requests_refused(), t.prompt_tokens(),
          Share(t.prefix_store_tokens(), t.prompt_tokens()), t.generated_tokens(), t.drafted_tokens(),
          t.accepted_drafts(), Share(t.accepted_drafts(), t.drafted_tokens()));
    }
  }
  if (!s.has_store()) {
    out << "cache store: none\n";
    return;
  }
  const v1::StoreLinkStats& c = s.store();
  out << absl::StrFormat(
      "cache store: %d lookups (%d failed, %d skipped while backing off), %d blocks found; %d blocks read "
      "(%s, %d reads failed); %d blocks published (%d failed, %d dropped with the put queue full)\n",
      c.lookups(), c.lookup_failures(), c.lookups_skipped(), c.blocks_hit(), c.blocks_read(), FormatBytes(c.bytes_read()),
      c.read_failures(), c.blocks_published(), c.publish_failures(), c.publish_dropped());
  if (c.shards_size() < 2) return;
  for (const v1::StoreShardStats& sh : c.shards()) {
    out << absl::StrFormat(
        "  shard %s: %d lookups (%d failed, %d skipped), %d blocks read (%s, %d reads failed), %d published "
        "(%d failed, %d dropped)\n",
        sh.target(), sh.lookups(), sh.lookup_failures(), sh.lookups_skipped(), sh.blocks_read(),
        FormatBytes(sh.bytes_read()), sh.read_failures(), sh.blocks_published(), sh.publish_failures(),
        sh.publish_dropped());
  }
}

void PrintStore(const std::string& target, const v1::StatsResponse& s, std::ostream& out) {
  out << absl::StrFormat("cache store %s\n", target);
  out << absl::StrFormat("RAM tier: %s of %s in slots (%s), %d blocks of %s (%s of their slots)\n",
                         FormatBytes(s.ram_used_bytes()), FormatBytes(s.ram_capacity_bytes()),
                         Share(s.ram_used_bytes(), s.ram_capacity_bytes()), s.ram_blocks(), FormatBytes(s.ram_block_bytes()),
                         Share(s.ram_block_bytes(), s.ram_used_bytes()));
  out << absl::StrFormat("disk tier: %s of %s used (%s), %d blocks; %s on disk with logs and garbage\n",
                         FormatBytes(s.disk_used_bytes()), FormatBytes(s.disk_capacity_bytes()),
                         Share(s.disk_used_bytes(), s.disk_capacity_bytes()), s.disk_blocks(),
                         FormatBytes(s.disk_footprint_bytes()));
  const uint64_t reads = s.hits_ram() + s.hits_disk() + s.misses();
  out << absl::StrFormat("block reads: %d from RAM (%s), %d from disk (%s), %d not found (%s); %d corrupt blocks dropped\n",
                         s.hits_ram(), Share(s.hits_ram(), reads), s.hits_disk(), Share(s.hits_disk(), reads),
                         s.misses(), Share(s.misses(), reads), s.corrupt_blocks_dropped());
  out << absl::StrFormat(
      "blocks stored: %d; evicted to make room: %d from RAM, %d from disk (%d of them for room on the "
      "filesystem); %d puts failed on disk\n",
      s.puts(), s.ram_evictions(), s.disk_evictions(), s.disk_reserve_evictions(), s.disk_write_errors());
  if (s.disk_writes_failing_ms() > 0) {
    out << absl::StrFormat("disk writes failing for %.1f s (%s): puts are refused until RocksDB takes writes again\n",
                           s.disk_writes_failing_ms() / 1000.0,
                           s.disk_full() != 0 ? "no space left" : "an I/O error; a restart reopens RocksDB");
  }
}

void PrintRouter(const std::string& target, const v1::RouterStats& s, std::ostream& out) {
  const int64_t up = static_cast<int64_t>(s.uptime_micros() / 1000000);
  out << absl::StrFormat("router %s, up %dh %02dm %02ds\n", target, up / 3600, up / 60 % 60, up % 60);
  out << absl::StrFormat("requests: %d in flight, %d routed, %d with no worker to take them; %d moved to another "
                         "worker before their first token, %d after it (their worker failed)\n",
                         s.requests_in_flight(), s.requests_routed(), s.requests_unrouted(), s.retries(),
                         s.failovers());
  out << absl::StrFormat("prefixes: %d requests to a worker that served their leading blocks (%d blocks), %d "
                         "passed to a less busy one; %d blocks remembered\n",
                         s.prefix_routed(), s.prefix_blocks_matched(), s.load_spills(), s.affinity_blocks());
  for (const v1::RouterWorkerStats& w : s.workers()) {
    out << absl::StrFormat("  worker %s: %s; %d in flight, %d routed, %d failures, %d refused as full\n",
                           w.target(), w.state(), w.requests_in_flight(), w.requests_routed(), w.failures(),
                           w.busy());
  }
}

absl::Status Run(const Args& a, std::ostream& out) {
  const std::string target = a.Str("target");
  VC_RETURN_IF_ERROR(CheckAddress("--target", target, false));
  VC_ASSIGN_OR_RETURN(const std::string token, ClientToken(a));
  const int64_t timeout_ms = a.Int("timeout-ms");
  std::string tls_roots;
  if (a.Has("tls-ca")) {
    VC_ASSIGN_OR_RETURN(tls_roots, ReadPemFile(a.Str("tls-ca"), "TLS root certificates", "CERTIFICATE"));
  }
  const std::shared_ptr<grpc::Channel> channel = InferenceChannel(target, tls_roots);
  const auto call = [&](grpc::ClientContext* ctx) {
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(timeout_ms)));
  };
  if (a.Has("router")) {
    grpc::ClientContext ctx;
    call(&ctx);
    v1::RouterStats stats;
    const grpc::Status s = v1::Router::NewStub(channel)->GetRouterStats(&ctx, v1::GetRouterStatsRequest(), &stats);
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(absl::StrCat(target, " is not a router"));
    }
    if (!s.ok()) return FromGrpc(s, target);
    if (a.Has("json")) {
      out << Json(stats, "router");
    } else {
      PrintRouter(target, stats, out);
    }
    return absl::OkStatus();
  }
  {
    grpc::ClientContext ctx;
    call(&ctx);
    v1::WorkerStats stats;
    const grpc::Status s = v1::Inference::NewStub(channel)->GetStats(&ctx, v1::GetStatsRequest(), &stats);
    if (s.ok()) {
      if (a.Has("json")) {
        out << Json(stats, "worker");
      } else {
        PrintWorker(target, stats, out);
      }
      return absl::OkStatus();
    }
    if (s.error_code() != grpc::StatusCode::UNIMPLEMENTED) return FromGrpc(s, target);
  }
  // Not a worker: a cache store?
  grpc::ClientContext ctx;
  call(&ctx);
  v1::StatsResponse stats;
  const grpc::Status s = v1::CacheStore::NewStub(channel)->Stats(&ctx, v1::StatsRequest(), &stats);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(target, " serves neither vericache.v1.Inference nor vericache.v1.CacheStore"));
  }
  if (!s.ok()) return FromGrpc(s, target);
  if (a.Has("json")) {
    out << Json(stats, "store");
  } else {
    PrintStore(target, stats, out);
  }
  return absl::OkStatus();
}

}  // namespace

const FlagSet& StatsFlags() {
  static const FlagSet* const flags = new FlagSet{
      "stats",
      "",
      "Asks a worker (Inference.GetStats) or, when the target is a cache store, the store (CacheStore.Stats) what "
      "it has done since it started, and prints it. A router answers GetStats with its serving workers' stats "
      "summed.",
      {
          Flag::Str("target", "", "the worker, store or router").Value("HOST:PORT").Required(),
          TokenFlag("the bearer token the target takes (a store needs one of a tenant of its --stats-tenants)"),
          TokenFileFlag(),
          TlsCaFlag(),
          Flag::Int("timeout-ms", 5000, 1, int64_t{24} * 3600 * 1000, "the deadline of each call"),
          Flag::Switch("json", "print the stats as one JSON object"),
          Flag::Switch("router", "ask a router for its own counts instead (Router.GetRouterStats)"),
      }};
  return *flags;
}

int RunStatsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunSubcommand(StatsFlags(), args, out, err, Run);
}

}  // namespace vc::cli
