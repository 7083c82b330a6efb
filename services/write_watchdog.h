// Bounds how long a streaming handler may stay blocked writing to a client that stopped reading.
// gRPC's flow control blocks ServerWriter::Write once the client's window is full, for good if the
// client keeps the call open without reading; a handler thread would be held forever. A write that
// has not returned within the timeout gets its call cancelled, which makes the write return false
// and the handler end the request.
#ifndef VC_SERVICES_WRITE_WATCHDOG_H_
#define VC_SERVICES_WRITE_WATCHDOG_H_

#include <algorithm>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace vc {

// Call is anything with TryCancel() that may be called from another thread while a write blocks
// (grpc::ServerContext). Thread-safe.
template <typename Call>
class WriteWatchdog {
 public:
  explicit WriteWatchdog(absl::Duration timeout)
      : timeout_(timeout), thread_([this] { Loop(); }) {}
  ~WriteWatchdog() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Runs write() (a blocking write on `call`); cancels `call` if it has not returned within the
  // timeout. Returns what write() returned.
  bool Write(Call* call, absl::FunctionRef<bool()> write) {
    {
      absl::MutexLock l(&mu_);
      writing_[call] = SteadyClock()->Now();
    }
    const bool ok = write();
    absl::MutexLock l(&mu_);  // once erased, the watchdog no longer touches `call`
    writing_.erase(call);
    return ok;
  }

 private:
  void Loop() {
    const absl::Duration period = std::max(absl::Milliseconds(1), std::min(timeout_ / 4, absl::Milliseconds(250)));
    absl::MutexLock l(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) {
      const absl::Duration now = SteadyClock()->Now();  // a wall-clock step must not cut or spare calls
      for (auto& [call, since] : writing_) {
        if (now - since < timeout_) continue;
        call->TryCancel();
        since = absl::InfiniteDuration();  // cancelled once
      }
    }
  }

  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::map<Call*, absl::Duration> writing_ ABSL_GUARDED_BY(mu_);  // calls in a write, since when (steady)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace vc

#endif  // VC_SERVICES_WRITE_WATCHDOG_H_
