// The Redis baseline in a build without hiredis: every entry point says so.
#include "benchmarks/redis_baseline.h"

namespace vc::bench {
namespace {

absl::Status NoHiredis() {
  return absl::UnimplementedError("built without hiredis (install libhiredis-dev and reconfigure)");
}

}  // namespace

struct RedisConnection::Impl {};

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(const std::string&, const std::string&) {
  return NoHiredis();
}

RedisServer::~RedisServer() = default;

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const std::string&) { return NoHiredis(); }

RedisConnection::~RedisConnection() = default;

absl::Status RedisConnection::Set(absl::string_view, absl::string_view) { return NoHiredis(); }

absl::StatusOr<size_t> RedisConnection::Get(absl::string_view) { return NoHiredis(); }

}  // namespace vc::bench
