#include "benchmarks/redis_baseline.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace vc::bench {
namespace {

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextFree>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

absl::StatusOr<ContextPtr> ConnectUnix(const std::string& path) {
  ContextPtr c(redisConnectUnixWithTimeout(path.c_str(), timeval{2, 0}));
  if (c == nullptr) return absl::UnavailableError("redis: cannot allocate a context");
  if (c->err != 0) return absl::UnavailableError(absl::StrCat("redis at ", path, ": ", c->errstr));
  return c;
}

// The reply to a command, or kUnavailable for a broken connection or an error reply.
absl::StatusOr<ReplyPtr> Command(redisContext* c, const std::vector<absl::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (absl::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  ReplyPtr r(static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (r == nullptr) return absl::UnavailableError(absl::StrCat("redis ", args[0], ": ", c->errstr));
  if (r->type == REDIS_REPLY_ERROR) return absl::UnavailableError(absl::StrCat("redis ", args[0], ": ", r->str));
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(const std::string& binary, const std::string& dir) {
  std::unique_ptr<RedisServer> s(new RedisServer());
  s->socket_ = dir + "/redis.sock";
  const std::string log = dir + "/redis.log";
  // Everything exec needs is built before fork: the child only execs.
  const std::vector<std::string> args = {binary,        "--port",       "0",     "--unixsocket", s->socket_,
                                         "--unixsocketperm", "700",     "--save", "",          "--appendonly",
                                         "no",          "--dir",        dir,     "--logfile",  log,
                                         "--daemonize", "no"};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError("redis: fork failed");
  if (pid == 0) {
    execv(argv[0], argv.data());
    _exit(127);
  }
  s->pid_ = pid;
  for (int i = 0; i < 100; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      s->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("redis: ", binary, " exited at start (status ", status,
                                                 "; see ", log, ")"));
    }
    if (absl::StatusOr<ContextPtr> c = ConnectUnix(s->socket_); c.ok()) {
      absl::StatusOr<ReplyPtr> info = Command(c->get(), {"INFO", "server"});
      if (!info.ok()) return info.status();
      absl::string_view text((*info)->str, (*info)->len);
      const size_t at = text.find("redis_version:");
      if (at != absl::string_view::npos) {
        text.remove_prefix(at + 14);
        s->version_ = std::string(text.substr(0, text.find('\r')));
      }
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("redis: no answer on ", s->socket_, " after 5 s (see ", log, ")"));
}

RedisServer::~RedisServer() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
}

struct RedisConnection::Impl {
  ContextPtr ctx;
};

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const std::string& socket_path) {
  absl::StatusOr<ContextPtr> c = ConnectUnix(socket_path);
  if (!c.ok()) return c.status();
  std::unique_ptr<RedisConnection> conn(new RedisConnection());
  conn->impl_ = std::make_unique<Impl>();
  conn->impl_->ctx = std::move(*c);
  return conn;
}

RedisConnection::~RedisConnection() = default;

absl::Status RedisConnection::Set(absl::string_view key, absl::string_view value) {
  return Command(impl_->ctx.get(), {"SET", key, value}).status();
}

absl::StatusOr<size_t> RedisConnection::Get(absl::string_view key) {
  absl::StatusOr<ReplyPtr> r = Command(impl_->ctx.get(), {"GET", key});
  if (!r.ok()) return r.status();
  if ((*r)->type == REDIS_REPLY_NIL) return absl::NotFoundError("redis GET: no such key");
  return static_cast<size_t>((*r)->len);
}

}  // namespace vc::bench
