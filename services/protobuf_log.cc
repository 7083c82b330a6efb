#include "services/protobuf_log.h"

#include <cstdio>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "google/protobuf/stubs/logging.h"

namespace vc {

std::string LogRateLimit::Take(const std::string& message, absl::Duration now) {
  absl::MutexLock l(&mu_);
  if (now < next_) {
    ++dropped_;
    return "";
  }
  next_ = now + window_;
  std::string line = message;
  if (dropped_ > 0) absl::StrAppend(&line, " (", dropped_, " more protobuf messages left out before this one)");
  dropped_ = 0;
  return line;
}

namespace {

LogRateLimit& Limit() {
  static LogRateLimit* const limit = new LogRateLimit(absl::Seconds(10));
  return *limit;
}

void Handler(google::protobuf::LogLevel level, const char* filename, int line, const std::string& message) {
  // A fatal message ends the process: it is always written.
  const std::string text = level == google::protobuf::LOGLEVEL_FATAL ? message : Limit().Take(message, SteadyClock()->Now());
  if (text.empty()) return;
  std::fprintf(stderr, "[libprotobuf %s:%d] %s\n", filename, line, text.c_str());
}

}  // namespace

void RateLimitProtobufLog() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&Handler); });
}

}  // namespace vc
