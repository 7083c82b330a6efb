// A link of fixed bandwidth shared by every transfer that crosses it: each transfer takes its
// turn, bytes / rate long, after the ones before it. Benchmarks use it to make a loopback or
// memcpy copy stand for a PCIe or network link. Thread-safe.
#ifndef VC_WORKER_PREFIXES_LINK_PACER_H_
#define VC_WORKER_PREFIXES_LINK_PACER_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace vc {

class LinkPacer {
 public:
  // bytes_per_second <= 0: an unpaced link (Transfer returns at once).
  explicit LinkPacer(double bytes_per_second) : bytes_per_second_(bytes_per_second) {}

  // Call after moving `bytes` that began at `start`: sleeps until the link would have carried
  // them, behind every transfer already booked.
  void Transfer(int64_t bytes, std::chrono::steady_clock::time_point start) {
    if (bytes_per_second_ <= 0 || bytes <= 0) return;
    std::chrono::steady_clock::time_point done;
    {
      absl::MutexLock l(&mu_);
      const auto begin = std::max(start, free_at_);
      done = begin + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(bytes / bytes_per_second_));
      free_at_ = done;
    }
    std::this_thread::sleep_until(done);
  }

 private:
  const double bytes_per_second_;
  absl::Mutex mu_;
  std::chrono::steady_clock::time_point free_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vc

#endif  // VC_WORKER_PREFIXES_LINK_PACER_H_
