// Cache store throughput and latency against block size and client threads, next to what this
// machine does without the store, all measured in one run on loopback:
//   memcpy       each get is a memcpy of the block into the thread's buffer (the one-copy ceiling)
//   ucx          one-sided UCX gets of the same stored bytes from the store's RAM region, leased once
//                up front: the transport alone, no gRPC, no lease per get, no checks
//   store        StoreClient::GetRemote: a LeaseBlocks RPC, the UCX get, the end-to-end block
//                check, and the lease's release, carried by the next call's LeaseBlocks RPC (or,
//                with --release-delay-ms 0, a ReleaseLeases RPC that is not waited for), one block
//                per call; puts
//                are StoreClient::Put (checked by the store, written through to RocksDB and copied
//                into RAM)
//   store-batch  StoreClient::GetRemoteBatchInto: the same for up to --batch blocks (at most 16 MiB)
//                per call, under one LeaseBlocks RPC (releases as for store), into the thread's
//                reusable buffers (one per block of a batch; the region mapped and each block copied
//                and checked in one pass where UCX shares memory, error mode none)
//   store-stream StoreClient::GetRemoteBatchInto of --stream-mib MiB (as many blocks as fit, at
//                least one, at most the working set) per call into the thread's reusable buffers,
//                leased in rounds of --lease-round-mib MiB, each round's LeaseBlocks call in flight
//                while the round before is read (--streaming-copy-mib: the client's
//                streaming_copy_bytes in MiB, its default when not given)
//   redis        GET/SET of the same blocks over a unix socket to a redis-server this benchmark
//                starts (persistence off), with hiredis
// The BlockStore, its UCX region server and the gRPC service run in this process, as
// `vericache store` runs them. Every thread has its own StoreClient, UcxReader and Redis
// connection, and works through its own share of the blocks. Gets are measured for every size
// first, puts after, so that RocksDB's background work from the puts does not land on the gets.
// Each point is the best of --reps runs (other work on the machine only slows a run down).
//
//   store_bench [--sizes 65536,262144,1048576,4194304,16777216] [--threads 1,2,4] [--ucx none|peer]
//               [--region ucx|heap] [--systems memcpy,ucx,store,store-batch,store-stream,redis]
//               [--batch 8] [--stream-mib 64] [--lease-round-mib 16] [--streaming-copy-mib N]
//               [--release-delay-ms N] [--ops get,put] [--seconds 0.25] [--reps 3] [--working-set-mib 64]
//               [--redis-server /usr/bin/redis-server] [--redis on|off] [--json FILE]
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bandwidth.h"
#include "benchmarks/flags.h"
#include "benchmarks/redis_baseline.h"
#include "cachestore/block_format.h"
#include "cachestore/store_client.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/store_service.h"

namespace vc {
namespace {

using bench::Double;
using bench::Int;
using bench::kMaxMiB;
using bench::Ints;

using BenchClock = std::chrono::steady_clock;

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrFormat("%d MiB", bytes >> 20);
  return absl::StrFormat("%d KiB", bytes >> 10);
}

// A valid block (4 layers of float32 K/V, random payload) of at most `bytes` bytes: as many tokens
// as fit, so that it takes a RAM-tier slot of exactly `bytes` (a power of two).
std::string MakeBlock(int64_t bytes, uint64_t seed) {
  cachestore::BlockLayout layout{4, 2, 16, 1};
  const uint64_t per_token = layout.layer_bytes() * layout.num_layers;
  layout.tokens = static_cast<uint32_t>((bytes - cachestore::BlockHeaderBytes(4)) / per_token);
  std::vector<std::string> layers(4, std::string(layout.layer_bytes(), '\0'));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::string& l : layers) {
    for (size_t i = 0; i + 8 <= l.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      std::memcpy(&l[i], &x, 8);
    }
  }
  std::array<uint8_t, 32> fp{};
  fp[0] = 1;
  return *cachestore::EncodeBlock(fp, layout, {layers[0], layers[1], layers[2], layers[3]});
}

struct Point {
  double gbps = 0, p50_us = 0, p99_us = 0;
  int64_t ops = 0;
};

// Runs op(thread, i) for i = 0, 1, ... on `threads` threads. Each thread makes one untimed
// warm-up call, then all start together and go on until `seconds` have passed and each has made
// `min_ops` calls (or its share of `max_bytes` is moved). Throughput is all bytes moved over the
// wall time from the first start to the last finish.
absl::StatusOr<Point> Measure(int threads, double seconds, int min_ops, int64_t max_bytes, size_t bytes_per_op,
                              const std::function<absl::Status(int, int64_t)>& op) {
  std::vector<std::vector<double>> lat(threads);
  std::vector<BenchClock::time_point> start(threads), end(threads);
  absl::Mutex mu;
  absl::Status error;
  std::atomic<bool> failed{false};
  std::barrier sync(threads);
  const int64_t max_ops = std::max<int64_t>(min_ops, max_bytes / threads / static_cast<int64_t>(bytes_per_op));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      absl::Status s = op(t, 0);
      sync.arrive_and_wait();
      start[t] = BenchClock::now();
      for (int64_t done = 0; s.ok() && !failed.load(std::memory_order_relaxed); ++done) {
        const auto t0 = BenchClock::now();
        if (t0 - start[t] >= std::chrono::duration<double>(seconds) && done >= min_ops) break;
        if (done >= max_ops) break;
        s = op(t, done + 1);
        lat[t].push_back(std::chrono::duration<double, std::micro>(BenchClock::now() - t0).count());
      }
      end[t] = BenchClock::now();
      if (!s.ok()) {
        failed = true;
        absl::MutexLock l(&mu);
        error = s;
      }
    });
  }
  for (auto& th : pool) th.join();
  if (!error.ok()) return error;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  const double wall = std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                                    *std::min_element(start.begin(), start.end()))
                          .count();
  Point p;
  p.ops = static_cast<int64_t>(all.size());
  p.gbps = static_cast<double>(bytes_per_op) * p.ops / wall / 1e9;
  p.p50_us = all[all.size() / 2];
  p.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return p;
}

// What one client thread holds.
struct ThreadClient {
  std::unique_ptr<cachestore::StoreClient> store;
  std::unique_ptr<cachestore::UcxReader> reader;
  std::unique_ptr<bench::RedisConnection> redis;  // null without Redis
  std::string buffer;
  std::vector<std::string> batch_buffers;   // one per block of a batched get
  std::vector<std::string> stream_buffers;  // one per block of a streamed get
};

std::string KeyBytes(const cachestore::BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

int Run(std::map<std::string, std::string> flags) {
  // Every number is checked before anything starts: a bad one exits naming it, leaving nothing behind.
  const std::vector<int64_t> sizes = Ints(flags, "sizes", 4096, int64_t{1} << 30);
  const std::vector<int64_t> thread_counts = Ints(flags, "threads", 1, 256);
  const double seconds = Double(flags, "seconds", 1e-3, 1e6);
  const int64_t working_set = Int(flags, "working-set-mib", 1, kMaxMiB) << 20;
  const int reps = static_cast<int>(Int(flags, "reps", 1, 1000000));
  const int64_t batch = Int(flags, "batch", 1, 1 << 20);
  const int64_t stream_mib = Int(flags, "stream-mib", 1, kMaxMiB);
  // Unset: the client's defaults.
  const int64_t streaming_copy_mib =
      flags["streaming-copy-mib"] != "" ? Int(flags, "streaming-copy-mib", 0, kMaxMiB) : -1;
  const int64_t release_delay_ms = flags["release-delay-ms"] != "" ? Int(flags, "release-delay-ms", 0, 3600 * 1000) : -1;
  const int64_t round_mib = Int(flags, "lease-round-mib", 0, kMaxMiB);
  absl::StatusOr<cachestore::UcxErrorMode> mode = cachestore::ParseUcxErrorMode(flags["ucx"]);
  if (!mode.ok()) {
    std::cerr << mode.status() << "\n";
    return 2;
  }
  const std::set<std::string> systems = absl::StrSplit(flags["systems"], ',', absl::SkipEmpty());
  const std::set<std::string> ops = absl::StrSplit(flags["ops"], ',', absl::SkipEmpty());
  auto want = [&](const std::string& op, const std::string& system) {
    return ops.count(op) > 0 && systems.count(system) > 0;
  };
  const int max_threads = static_cast<int>(*std::max_element(thread_counts.begin(), thread_counts.end()));
  signal(SIGPIPE, SIG_IGN);  // a dead redis-server must be an error, not the end of the process
  // Keep freed blocks in the process for the next get, as a serving process with steady traffic
  // does, rather than returning them to the kernel and faulting fresh pages in for every get (which
  // cost more than the copy itself). Applies to every system alike.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  const double memcpy_bw = bench::MeasureMemcpyBandwidth();
  std::string dir_template = (std::filesystem::temp_directory_path() / "vc_store_bench.XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    std::cerr << "cannot make a temporary directory\n";
    return 1;
  }
  const std::string dir = dir_template;
  std::filesystem::create_directories(dir + "/redis");

  // Redis first: it is forked before this process starts any thread.
  std::unique_ptr<bench::RedisServer> redis;
  std::string redis_note = "off";
  if (flags["redis"] != "off" && systems.count("redis") > 0) {
    absl::StatusOr<std::unique_ptr<bench::RedisServer>> r =
        bench::RedisServer::Start(flags["redis-server"], dir + "/redis");
    if (r.ok()) {
      redis = std::move(*r);
      redis_note = absl::StrFormat("redis-server %s, unix socket, persistence off", redis->version());
    } else {
      redis_note = absl::StrFormat("left out: %s", r.status().message());
    }
  }

  // The store, as `vericache store` runs it.
  cachestore::StoreOptions o;
  int64_t ram = 64 << 20;
  for (int64_t s : sizes) ram += std::max<int64_t>(working_set / s, max_threads) * s;
  o.ram.capacity_bytes = static_cast<uint64_t>(ram / 0.9);  // under the high watermark: no eviction
  o.ram.lease_ttl_ms = 10 * 60 * 1000;                      // the raw UCX runs hold leases for a while
  o.disk.path = dir + "/store";
  o.disk.capacity_bytes = uint64_t{4} << 30;
  // As `vericache store` does, UCX allocates the RAM tier's region (--region heap registers
  // memory the tier allocated itself instead, which UCX can only serve by emulated gets).
  const bool heap_region = flags["region"] == "heap";
  std::unique_ptr<char[]> heap;
  absl::StatusOr<std::unique_ptr<cachestore::UcxRegionServer>> ucx;
  if (heap_region) {
    heap.reset(new char[o.ram.capacity_bytes]);
    ucx = cachestore::UcxRegionServer::Create(heap.get(), o.ram.capacity_bytes, *mode);
  } else {
    ucx = cachestore::UcxRegionServer::Allocate(o.ram.capacity_bytes, *mode);
  }
  if (!ucx.ok()) {
    std::cerr << ucx.status() << "\n";
    return 1;
  }
  o.ram.region = (*ucx)->region();
  absl::StatusOr<std::unique_ptr<cachestore::BlockStore>> store = cachestore::BlockStore::Open(o);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 1;
  }
  CacheStoreService service(store->get(), StoreServiceOptions{{{"bench-token", "bench"}}, "secret", ucx->get(), {"bench"}});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "cannot start the gRPC server\n";
    return 1;
  }
  const std::string target = absl::StrFormat("127.0.0.1:%d", port);

  std::vector<ThreadClient> clients(max_threads);
  for (ThreadClient& c : clients) {
    cachestore::StoreClientOptions client_options{target, "bench-token", 30000, ""};
    client_options.lease_round_bytes = static_cast<size_t>(round_mib) << 20;
    if (streaming_copy_mib >= 0) client_options.streaming_copy_bytes = static_cast<size_t>(streaming_copy_mib) << 20;
    // The client's release_delay_ms; 0: every round's leases go back in a ReleaseLeases call.
    if (release_delay_ms >= 0) client_options.release_delay_ms = release_delay_ms;
    c.store = *cachestore::StoreClient::Create(client_options);
    absl::StatusOr<std::unique_ptr<cachestore::UcxReader>> r = cachestore::UcxReader::Create(*mode);
    if (!r.ok()) {
      std::cerr << r.status() << "\n";
      return 1;
    }
    c.reader = std::move(*r);
    if (redis != nullptr) {
      absl::StatusOr<std::unique_ptr<bench::RedisConnection>> rc =
          bench::RedisConnection::Connect(redis->socket_path());
      if (!rc.ok()) {
        std::cerr << rc.status() << "\n";
        return 1;
      }
      c.redis = std::move(*rc);
    }
  }
  auto stub = vericache::v1::CacheStore::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));

  // The control plane's round trip alone: a one-key Lookup, no block bytes.
  const cachestore::BlockKey probe{};
  absl::StatusOr<Point> rpc = Measure(1, seconds, 3, INT64_MAX, 1, [&](int, int64_t) {
    return clients[0].store->Lookup(absl::MakeConstSpan(&probe, 1)).status();
  });
  if (!rpc.ok()) {
    std::cerr << "lookup: " << rpc.status() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "memcpy bandwidth (256 MiB copy): %.2f GB/s; UCX error mode: %s; RAM region allocated by %s; Redis: %s; %d "
      "hardware threads; best of %d runs of %.2f s per point; control-plane round trip (one-key Lookup over "
      "gRPC): p50 %.0f us, p99 %.0f us; CRC-32C: %s\n\n",
      memcpy_bw / 1e9, flags["ucx"], heap_region ? "the tier (heap)" : "UCX", redis_note,
      std::thread::hardware_concurrency(), reps, seconds, rpc->p50_us, rpc->p99_us, cachestore::Crc32cImplementation());

  nlohmann::json rows = nlohmann::json::array();
  // results[op][system][size][threads]
  std::map<std::string, std::map<std::string, std::map<int64_t, std::map<int64_t, Point>>>> results;
  // Measures `op` of `system` when the flags select it, and records the point; false on an error.
  // One call of `fn` moves `per_call` blocks of `actual` bytes.
  auto run = [&](const std::string& op, const std::string& system, int64_t size, size_t actual, int64_t threads,
                 int64_t per_call, int64_t max_bytes, const std::function<absl::Status(int, int64_t)>& fn) {
    if (!want(op, system) || (system == "redis" && redis == nullptr)) return true;
    // The best of `reps` runs: this machine's other work only ever slows a run down.
    absl::StatusOr<Point> p;
    for (int r = 0; r < reps; ++r) {
      absl::StatusOr<Point> q =
          Measure(static_cast<int>(threads), seconds, 3, max_bytes, actual * static_cast<size_t>(per_call), fn);
      if (!q.ok()) {
        std::cerr << op << " " << system << " " << size << " x" << threads << ": " << q.status() << "\n";
        return false;
      }
      if (r == 0 || q->gbps > p->gbps) p = q;
    }
    results[op][system][size][threads] = *p;
    rows.push_back({{"op", op}, {"system", system}, {"block_bytes", size}, {"stored_bytes", actual},
                    {"threads", threads}, {"blocks_per_call", per_call}, {"gbps", p->gbps}, {"p50_us", p->p50_us},
                    {"p99_us", p->p99_us}, {"calls", p->ops}});
    std::cerr << absl::StrFormat("  %s %-12s %6s x%d (%d per call): %6.2f GB/s, p50 %8.1f us, p99 %8.1f us (%d calls)\n",
                                 op, system, SizeName(size), threads, per_call, p->gbps, p->p50_us, p->p99_us,
                                 p->ops);
    return true;
  };

  struct SizeData {
    std::vector<std::string> blocks;
    std::vector<cachestore::BlockKey> keys;
  };
  std::map<int64_t, SizeData> data;
  std::map<int64_t, std::map<int64_t, int64_t>> batch_of;   // [size][threads] -> blocks per batched get
  std::map<int64_t, std::map<int64_t, int64_t>> stream_of;  // [size][threads] -> blocks per streamed get
  const int64_t put_cap = int64_t{256} << 20;  // bytes per put point: bounds RocksDB's work

  // ----- gets
  for (int64_t size : sizes) {
    SizeData& d = data[size];
    const int64_t n = std::max<int64_t>(working_set / size, max_threads);
    for (int64_t i = 0; i < n; ++i) {
      d.blocks.push_back(MakeBlock(size, static_cast<uint64_t>(size * 7919 + i)));
      cachestore::BlockKey k;
      k.bytes = cachestore::Sha256(absl::StrFormat("store_bench %d %d", size, i));
      d.keys.push_back(k);
      if (absl::Status s = clients[0].store->Put(k, d.blocks.back()); !s.ok()) {
        std::cerr << "store put: " << s << "\n";
        return 1;
      }
      if (redis != nullptr) {
        if (absl::Status s = clients[0].redis->Set(KeyBytes(k), d.blocks.back()); !s.ok()) {
          std::cerr << s << "\n";
          return 1;
        }
      }
    }
    const size_t actual = d.blocks[0].size();
    // Blocks per batched get: at most --batch and 16 MiB.
    const int64_t max_batch = std::min<int64_t>(batch, std::max<int64_t>(1, (int64_t{16} << 20) / size));
    for (ThreadClient& c : clients) {
      c.buffer.assign(actual, '\0');
      c.batch_buffers.assign(max_batch, std::string(actual, '\0'));
      // Blocks of a streamed get: --stream-mib of them, at least one, at most the working set.
      c.stream_buffers.clear();
      if (want("get", "store-stream")) {
        c.stream_buffers.assign(std::clamp<int64_t>((stream_mib << 20) / size, 1, n),
                                std::string(actual, '\0'));
      }
    }
    // The raw transport reads where the store keeps the blocks, under leases taken once here.
    std::vector<vericache::v1::RemoteBlock> remote;
    for (const cachestore::BlockKey& k : d.keys) {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", "Bearer bench-token");
      vericache::v1::GetRequest req;
      req.set_key(KeyBytes(k));
      req.set_remote(true);
      vericache::v1::GetResponse resp;
      if (!stub->Get(&ctx, req, &resp).ok() || !resp.has_remote()) {
        std::cerr << "the store did not lease a block for a remote read\n";
        return 1;
      }
      remote.push_back(resp.remote());
    }
    // Thread t of `threads` starts at its own share of the blocks.
    auto block_of = [&](int t, int64_t i, int64_t threads) { return (t * n / threads + i) % n; };
    for (int64_t threads : thread_counts) {
      // Batches of distinct blocks: at most max_batch, and each thread's share of the blocks.
      const int64_t batch = std::max<int64_t>(1, std::min(max_batch, n / threads));
      batch_of[size][threads] = batch;
      bool ok = run("get", "memcpy", size, actual, threads, 1, INT64_MAX, [&](int t, int64_t i) {
        const std::string& b = d.blocks[block_of(t, i, threads)];
        std::memcpy(clients[t].buffer.data(), b.data(), b.size());
        return absl::OkStatus();
      });
      ok = ok && run("get", "ucx", size, actual, threads, 1, INT64_MAX, [&](int t, int64_t i) {
        const vericache::v1::RemoteBlock& r = remote[block_of(t, i, threads)];
        return clients[t].reader->Get(r.worker_address(), r.rkey(), r.address(), clients[t].buffer.data(),
                                      r.size_bytes());
      });
      ok = ok && run("get", "store", size, actual, threads, 1, INT64_MAX, [&](int t, int64_t i) -> absl::Status {
        absl::StatusOr<std::string> b =
            clients[t].store->GetRemote(d.keys[block_of(t, i, threads)], clients[t].reader.get());
        if (!b.ok()) return b.status();
        return b->size() == actual ? absl::OkStatus() : absl::InternalError("store get: wrong size");
      });
      // One GetRemoteBatchInto of `per_call` distinct blocks into the thread's `buffers`.
      const auto batched_get = [&](int64_t per_call, std::vector<std::string> ThreadClient::*buffers,
                                   absl::string_view what) {
        return [&, per_call, buffers, what](int t, int64_t i) -> absl::Status {
          std::vector<cachestore::BlockKey> keys;
          std::vector<absl::Span<char>> dest;
          keys.reserve(per_call);
          dest.reserve(per_call);
          for (int64_t k = 0; k < per_call; ++k) {
            keys.push_back(d.keys[block_of(t, i * per_call + k, threads)]);
            std::string& b = (clients[t].*buffers)[k];
            dest.emplace_back(b.data(), b.size());
          }
          for (const absl::StatusOr<size_t>& b :
               clients[t].store->GetRemoteBatchInto(keys, dest, clients[t].reader.get())) {
            if (!b.ok()) return b.status();
            if (*b != actual) return absl::InternalError(absl::StrCat(what, ": wrong size"));
          }
          return absl::OkStatus();
        };
      };
      ok = ok && run("get", "store-batch", size, actual, threads, batch, INT64_MAX,
                     batched_get(batch, &ThreadClient::batch_buffers, "store batched get"));
      const auto stream = static_cast<int64_t>(clients[0].stream_buffers.size());
      stream_of[size][threads] = stream;
      ok = ok && run("get", "store-stream", size, actual, threads, stream, INT64_MAX,
                     batched_get(stream, &ThreadClient::stream_buffers, "store streamed get"));
      ok = ok && run("get", "redis", size, actual, threads, 1, INT64_MAX, [&](int t, int64_t i) -> absl::Status {
        absl::StatusOr<size_t> got = clients[t].redis->Get(KeyBytes(d.keys[block_of(t, i, threads)]));
        if (!got.ok()) return got.status();
        return *got == actual ? absl::OkStatus() : absl::InternalError("redis get: wrong size");
      });
      if (!ok) return 1;
    }
    for (const vericache::v1::RemoteBlock& r : remote) {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", "Bearer bench-token");
      vericache::v1::ReleaseLeaseRequest req;
      req.set_lease_id(r.lease_id());
      vericache::v1::ReleaseLeaseResponse resp;
      (void)stub->ReleaseLease(&ctx, req, &resp);
    }
  }

  // ----- puts (same keys, same bytes: overwrites)
  for (int64_t size : sizes) {
    SizeData& d = data[size];
    const int64_t n = static_cast<int64_t>(d.blocks.size());
    const size_t actual = d.blocks[0].size();
    auto block_of = [&](int t, int64_t i, int64_t threads) { return (t * n / threads + i) % n; };
    for (int64_t threads : thread_counts) {
      bool ok = run("put", "store", size, actual, threads, 1, put_cap, [&](int t, int64_t i) {
        const int64_t j = block_of(t, i, threads);
        return clients[t].store->Put(d.keys[j], d.blocks[j]);
      });
      ok = ok && run("put", "redis", size, actual, threads, 1, put_cap, [&](int t, int64_t i) {
        const int64_t j = block_of(t, i, threads);
        return clients[t].redis->Set(KeyBytes(d.keys[j]), d.blocks[j]);
      });
      if (!ok) return 1;
    }
  }

  // ----- tables
  auto find = [&](const std::string& op, const std::string& system, int64_t size, int64_t threads) -> const Point* {
    auto a = results[op].find(system);
    if (a == results[op].end()) return nullptr;
    auto b = a->second.find(size);
    if (b == a->second.end()) return nullptr;
    auto c = b->second.find(threads);
    return c == b->second.end() ? nullptr : &c->second;
  };
  auto cell = [&](const std::string& op, const std::string& system, int64_t size, int64_t threads) -> std::string {
    const Point* p = find(op, system, size, threads);
    return p == nullptr ? "-" : absl::StrFormat("%.2f (%.0f / %.0f)", p->gbps, p->p50_us, p->p99_us);
  };
  auto ratio = [&](const std::string& op, const std::string& a, const std::string& b, int64_t size,
                   int64_t threads) -> std::string {
    const Point* pa = find(op, a, size, threads);
    const Point* pb = find(op, b, size, threads);
    return pa == nullptr || pb == nullptr ? "-" : absl::StrFormat("%.2f", pa->gbps / pb->gbps);
  };
  std::cout << "Gets: GB/s (p50 / p99 latency of one call, us). store: GetRemote, one block per call; store, "
               "batched: GetRemoteBatchInto of n blocks per call into reusable buffers; store, streamed: "
               "GetRemoteBatchInto of n blocks per call, leased in pipelined rounds\n\n"
               "| block | threads | memcpy | UCX | store | store, batched (n) | store, streamed (n) | Redis "
               "| store / UCX | batched / UCX | streamed / UCX | store / Redis | batched / Redis | streamed / Redis |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (int64_t size : sizes) {
    for (int64_t threads : thread_counts) {
      std::cout << absl::StrFormat(
          "| %s | %d | %s | %s | %s | %s (%d) | %s (%d) | %s | %s | %s | %s | %s | %s | %s |\n", SizeName(size),
          threads, cell("get", "memcpy", size, threads), cell("get", "ucx", size, threads),
          cell("get", "store", size, threads), cell("get", "store-batch", size, threads), batch_of[size][threads],
          cell("get", "store-stream", size, threads), stream_of[size][threads], cell("get", "redis", size, threads),
          ratio("get", "store", "ucx", size, threads), ratio("get", "store-batch", "ucx", size, threads),
          ratio("get", "store-stream", "ucx", size, threads), ratio("get", "store", "redis", size, threads),
          ratio("get", "store-batch", "redis", size, threads), ratio("get", "store-stream", "redis", size, threads));
    }
  }
  std::cout << "\nPuts: GB/s (p50 / p99 latency, us)\n\n"
               "| block | threads | store | Redis | store / Redis |\n|---|---:|---:|---:|---:|\n";
  for (int64_t size : sizes) {
    for (int64_t threads : thread_counts) {
      std::cout << absl::StrFormat("| %s | %d | %s | %s | %s |\n", SizeName(size), threads,
                                   cell("put", "store", size, threads), cell("put", "redis", size, threads),
                                   ratio("put", "store", "redis", size, threads));
    }
  }
  // The targets, at 1 MiB gets.
  const int64_t mib = 1 << 20;
  std::cout << "\nTargets at 1 MiB gets: store >= 60% of raw UCX and >= 5x Redis\n";
  for (const char* system : {"store", "store-batch", "store-stream"}) {
    for (int64_t threads : thread_counts) {
      const Point* s = find("get", system, mib, threads);
      const Point* u = find("get", "ucx", mib, threads);
      const Point* r = find("get", "redis", mib, threads);
      if (s == nullptr || u == nullptr) continue;
      std::cout << absl::StrFormat("  %-12s %d thread(s): %.2f GB/s = %.0f%% of UCX (%s)", system, threads, s->gbps,
                                   100 * s->gbps / u->gbps, s->gbps >= 0.6 * u->gbps ? "met" : "missed");
      if (r != nullptr) {
        std::cout << absl::StrFormat(", %.1fx Redis (%s)", s->gbps / r->gbps,
                                     s->gbps >= 5 * r->gbps ? "met" : "missed");
      }
      std::cout << "\n";
    }
  }
  if (!flags["json"].empty()) {
    nlohmann::json out = {{"memcpy_gbps", memcpy_bw / 1e9}, {"ucx_error_mode", flags["ucx"]},
                          {"region", flags["region"]}, {"redis", redis_note},
                          {"rpc_p50_us", rpc->p50_us}, {"rpc_p99_us", rpc->p99_us},
                          {"crc32c", std::string(cachestore::Crc32cImplementation())},
                          {"hardware_threads", std::thread::hardware_concurrency()},
                          {"seconds_per_run", seconds}, {"runs_per_point", reps},
                          {"stream_mib", stream_mib}, {"lease_round_mib", round_mib},
                          {"rows", rows}};
    std::ofstream(flags["json"]) << out.dump(1) << "\n";
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  clients.clear();
  redis.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"sizes", "65536,262144,1048576,4194304,16777216"},
                                              {"threads", "1,2,4"},
                                              {"ucx", "none"},
                                              {"region", "ucx"},
                                              {"systems", "memcpy,ucx,store,store-batch,store-stream,redis"},
                                              {"batch", "8"},
                                              {"stream-mib", "64"},
                                              {"lease-round-mib", "16"},
                                              {"streaming-copy-mib", ""},
                                              {"release-delay-ms", ""},
                                              {"ops", "get,put"},
                                              {"seconds", "0.25"},
                                              {"reps", "3"},
                                              {"working-set-mib", "64"},
                                              {"redis-server", "/usr/bin/redis-server"},
                                              {"redis", "on"},
                                              {"json", ""}};
  if (!vc::bench::ParseFlags(argc, argv, &flags)) return 2;
  return vc::Run(flags);
}
