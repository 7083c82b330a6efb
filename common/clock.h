// Monotonic time behind a small interface, so that timeouts and leases can be driven by a clock a
// test controls.
#ifndef VC_COMMON_CLOCK_H_
#define VC_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace vc {

// A monotonic clock. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // Time since an arbitrary origin fixed for the clock's life; never decreases.
  virtual absl::Duration Now() const = 0;
};

// The process's steady clock (std::chrono::steady_clock). Never null; never destroyed.
const Clock* SteadyClock();

// A clock that moves only when told to. Thread-safe. Starts at zero.
class ManualClock final : public Clock {
 public:
  absl::Duration Now() const override;
  // Moves the clock forward by `d` (a negative `d` is ignored: the clock is monotonic).
  void Advance(absl::Duration d);

 private:
  std::atomic<int64_t> nanos_{0};
};

}  // namespace vc

#endif  // VC_COMMON_CLOCK_H_
