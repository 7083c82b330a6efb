// A fixed set of threads that run index ranges of one job at a time. Work is split into contiguous
// ranges of task indices; what a task computes never depends on which thread runs it, so kernels
// that parallelize over outputs stay bitwise reproducible whatever the thread count.
#ifndef VC_KERNELS_THREAD_POOL_H_
#define VC_KERNELS_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc::kernels {

// ParallelFor may be called from one thread at a time (calls are serialized by a mutex).
class ThreadPool {
 public:
  // `num_threads` counts the caller: 1 runs everything on the calling thread. Should the system
  // refuse a thread, the pool runs with those it has (a line on stderr says so).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), in parallel; returns when all are
  // done. Ranges are at least `grain` long (except the last); which thread runs which range is
  // decided at run time, so fn's result for a range must not depend on the thread.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunShare();

  std::mutex call_mu_;  // serializes ParallelFor calls
  std::vector<std::thread> workers_;
  // The current job, published by bumping generation_.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> job_state_{0};  // generation, closed bit, active workers
  std::atomic<bool> stop_{false};
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
};

// The most threads VC_THREADS may ask for.
inline constexpr int kMaxKernelThreads = 1024;

// The cores a cgroup v2 cpu.max line ("QUOTA PERIOD") allows, rounded up; 0 for no limit ("max
// PERIOD") or a line that is not one.
int CoresOfCpuMax(absl::string_view cpu_max);

// The cores this process may run on: the CPUs of its affinity mask, or fewer when the CPU quota
// under /sys/fs/cgroup (v2 cpu.max, or v1 cpu.cfs_quota_us over cpu.cfs_period_us; a container sees
// its own cgroup there) allows fewer. In a container with a CPU limit on a large machine, that is
// the limit, not the machine's cores.
int UsableCores();

// The thread count VC_THREADS asks for, or UsableCores() when it is unset; InvalidArgument, naming
// the variable, when it is not a whole number from 1 to kMaxKernelThreads.
absl::StatusOr<int> KernelThreadsFromEnv();

// The process-wide pool the kernels use, made on first use with KernelThreadsFromEnv() threads
// (UsableCores(), with a line on stderr, when VC_THREADS is bad).
ThreadPool& KernelThreadPool();

// Replaces the process-wide pool with one of `num_threads` threads. Must not race with running
// kernels (call it at startup, or between passes).
void SetKernelThreadCount(int num_threads);

}  // namespace vc::kernels

#endif  // VC_KERNELS_THREAD_POOL_H_
