// A Redis baseline for the store benchmark: a redis-server child process on a unix socket with
// persistence off, and plain hiredis connections to it. A build without hiredis keeps the same
// interface; Start then returns kUnimplemented and the benchmark leaves Redis out.
#ifndef VC_BENCHMARKS_REDIS_BASELINE_H_
#define VC_BENCHMARKS_REDIS_BASELINE_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc::bench {

// A redis-server process this benchmark owns. Not thread-safe (connections are).
class RedisServer {
 public:
  // Runs `binary` listening only on a unix socket in `dir` (no TCP port, no RDB snapshots, no
  // append-only file) and waits until it answers. kUnimplemented when built without hiredis;
  // kUnavailable when the server does not come up within a few seconds (the message says why).
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(const std::string& binary, const std::string& dir);
  // Stops the server (SIGTERM) and reaps it.
  ~RedisServer();

  const std::string& socket_path() const { return socket_; }
  const std::string& version() const { return version_; }  // as INFO reports it

 private:
  RedisServer() = default;
  pid_t pid_ = -1;
  std::string socket_, version_;
};

// One client connection. Not thread-safe: one per client thread.
class RedisConnection {
 public:
  // kUnavailable when the socket does not answer.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Connect(const std::string& socket_path);
  ~RedisConnection();

  absl::Status Set(absl::string_view key, absl::string_view value);
  // Fetches the value and returns its size (the reply is received whole, then dropped);
  // kNotFound when the key is absent.
  absl::StatusOr<size_t> Get(absl::string_view key);

 private:
  struct Impl;
  RedisConnection() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vc::bench

#endif  // VC_BENCHMARKS_REDIS_BASELINE_H_
