#include "common/clock.h"

#include <chrono>

namespace vc {
namespace {

class SteadyClockImpl final : public Clock {
 public:
  absl::Duration Now() const override {
    return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
};

}  // namespace

const Clock* SteadyClock() {
  static const SteadyClockImpl* clock = new SteadyClockImpl();
  return clock;
}

absl::Duration ManualClock::Now() const { return absl::Nanoseconds(nanos_.load(std::memory_order_acquire)); }

void ManualClock::Advance(absl::Duration d) {
  if (d > absl::ZeroDuration()) nanos_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel);
}

}  // namespace vc
