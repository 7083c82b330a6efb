// What the protobuf library logs, rate-limited. A server parses every request before its handler
// can check the caller's token, and protobuf logs a line for each string field that is not UTF-8:
// unauthenticated callers could fill the log (one fuzzing run wrote 10,589 lines). With this
// installed, protobuf's messages go to stderr at most one a window, with a count of those left out.
#ifndef VC_SERVICES_PROTOBUF_LOG_H_
#define VC_SERVICES_PROTOBUF_LOG_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace vc {

// Counts the messages it is given and says which to write: the first of each `window`, then none
// until the window has passed (the next one written says how many were left out). Thread-safe.
class LogRateLimit {
 public:
  explicit LogRateLimit(absl::Duration window) : window_(window) {}
  // The line to write for `message` at `now` (SteadyClock time), or empty to write nothing.
  std::string Take(const std::string& message, absl::Duration now);

 private:
  const absl::Duration window_;
  absl::Mutex mu_;
  absl::Duration next_ ABSL_GUARDED_BY(mu_) = -absl::InfiniteDuration();
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Routes protobuf's log through a LogRateLimit of 10 s to stderr, once per process (later calls do
// nothing). Every server calls it as it starts.
void RateLimitProtobufLog();

}  // namespace vc

#endif  // VC_SERVICES_PROTOBUF_LOG_H_
