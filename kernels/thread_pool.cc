#include "kernels/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"

namespace vc::kernels {
namespace {

// job_state_ packs (generation << 32) | (closed << 31) | active workers.
constexpr uint64_t kClosed = uint64_t{1} << 31;
constexpr uint64_t kActiveMask = kClosed - 1;
inline uint64_t Generation(uint64_t s) { return s >> 32; }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i) {
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "kernel thread pool: %d of %d threads started (%s); running with those\n", i, num_threads,
                   e.what());
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(wake_mu_);
    stop_.store(true);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunShare() {
  // Chunks are claimed dynamically, so a thread that is late or descheduled delays nothing.
  while (true) {
    const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int threads = num_threads();
  if (threads == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  fn_ = &fn;
  n_ = n;
  chunk_ = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  next_.store(0, std::memory_order_relaxed);
  const uint64_t gen = Generation(job_state_.load()) + 1;
  {
    std::lock_guard<std::mutex> l(wake_mu_);
    job_state_.store(gen << 32, std::memory_order_release);
  }
  wake_cv_.notify_all();
  RunShare();
  // Close the job to workers that have not joined yet, then wait for those that did.
  job_state_.fetch_or(kClosed, std::memory_order_acq_rel);
  for (int spins = 0; (job_state_.load(std::memory_order_acquire) & kActiveMask) != 0; ++spins) {
    if (spins > 64) std::this_thread::yield();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    // Spin briefly for the next job (kernels run many short jobs per token), then sleep.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    while (Generation(job_state_.load(std::memory_order_acquire)) == seen && !stop_.load() &&
           std::chrono::steady_clock::now() < spin_until) {
    }
    {
      std::unique_lock<std::mutex> l(wake_mu_);
      wake_cv_.wait(l, [&] { return stop_.load() || Generation(job_state_.load()) != seen; });
    }
    if (stop_.load()) return;
    uint64_t s = job_state_.load(std::memory_order_acquire);
    seen = Generation(s);
    // Join unless the job is already closed (or over and replaced by the next one).
    bool joined = false;
    while ((s & kClosed) == 0 && Generation(s) == seen) {
      if (job_state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    RunShare();
    job_state_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

int CoresOfCpuMax(absl::string_view cpu_max) {
  const std::vector<absl::string_view> parts = absl::StrSplit(cpu_max, ' ', absl::SkipWhitespace());
  int64_t quota = 0, period = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &quota) || !absl::SimpleAtoi(parts[1], &period) || quota <= 0 ||
      period <= 0) {
    return 0;
  }
  return static_cast<int>(std::min<int64_t>(quota / period + (quota % period != 0), kMaxKernelThreads));
}

namespace {

// A cgroup file's text, or "" when there is none.
std::string CgroupFile(const char* path) { return ReadFileLimited(path, 4096, "cgroup file").value_or(""); }

}  // namespace

int UsableCores() {
  int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) cores = CPU_COUNT(&set);
  int quota = CoresOfCpuMax(CgroupFile("/sys/fs/cgroup/cpu.max"));
  if (quota == 0) {
    quota = CoresOfCpuMax(absl::StrCat(CgroupFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), " ",
                                       CgroupFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us")));
  }
  return quota > 0 ? std::min(cores, quota) : cores;
}

absl::StatusOr<int> KernelThreadsFromEnv() {
  const char* env = std::getenv("VC_THREADS");
  if (env == nullptr) return UsableCores();
  int n = 0;
  if (!absl::SimpleAtoi(env, &n) || n < 1 || n > kMaxKernelThreads) {
    return absl::InvalidArgumentError(absl::StrCat("VC_THREADS='", absl::CHexEscape(env),
                                                   "': expected a thread count from 1 to ", kMaxKernelThreads,
                                                   " (unset: the cores it may use, ", UsableCores(), ")"));
  }
  return n;
}

namespace {
std::unique_ptr<ThreadPool>& PoolSlot() {
  static std::unique_ptr<ThreadPool>* slot = [] {
    const absl::StatusOr<int> n = KernelThreadsFromEnv();
    const int threads = n.ok() ? *n : UsableCores();
    if (!n.ok()) std::fprintf(stderr, "%s; using %d\n", std::string(n.status().message()).c_str(), threads);
    return new std::unique_ptr<ThreadPool>(new ThreadPool(threads));
  }();
  return *slot;
}
}  // namespace

ThreadPool& KernelThreadPool() { return *PoolSlot(); }

void SetKernelThreadCount(int num_threads) {
  PoolSlot() = std::make_unique<ThreadPool>(std::max(1, num_threads));
}

}  // namespace vc::kernels
