// The CPU device (device.h): host memory, and a thread per stream that runs its queue in order;
// and what both devices share.
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/device.h"

namespace vc::device {
namespace {

// An event: a count of Records, and of those whose work has run.
class CpuEvent final : public Event {
 public:
  absl::Status Synchronize() override {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t target = recorded_;
    cv_.wait(l, [&] { return reached_ >= target; });
    return status_;
  }
  bool Done() override {
    std::lock_guard<std::mutex> l(mu_);
    return reached_ >= recorded_;
  }
  // A new point to reach; its number.
  uint64_t Mark() {
    std::lock_guard<std::mutex> l(mu_);
    return ++recorded_;
  }
  // The stream has run the work before point `n`; `status` is that stream's first error.
  void Reach(uint64_t n, const absl::Status& status) {
    std::lock_guard<std::mutex> l(mu_);
    if (n > reached_) reached_ = n;
    if (status_.ok()) status_ = status;
    cv_.notify_all();
  }
  // Blocks until point `n` is reached.
  void WaitFor(uint64_t n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return reached_ >= n; });
  }
  uint64_t recorded() {
    std::lock_guard<std::mutex> l(mu_);
    return recorded_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0;  // guarded by mu_
  uint64_t reached_ = 0;   // guarded by mu_
  absl::Status status_;    // guarded by mu_
};

class CpuStream final : public Stream {
 public:
  CpuStream() : thread_([this] { Run(); }) {}
  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }

  absl::Status CopyAsync(const Buffer& dst, size_t dst_offset, const Buffer& src, size_t src_offset,
                         size_t bytes) override {
    VC_RETURN_IF_ERROR(CheckCopyRange(dst, dst_offset, src, src_offset, bytes));
    char* to = static_cast<char*>(dst.data()) + dst_offset;
    const char* from = static_cast<const char*>(src.data()) + src_offset;
    return Queue([to, from, bytes] {
      std::memmove(to, from, bytes);
      return absl::OkStatus();
    });
  }

  absl::Status HostAsync(std::function<absl::Status()> fn) override { return Queue(std::move(fn)); }

  absl::Status Record(Event& event) override {
    auto* e = static_cast<CpuEvent*>(&event);
    const uint64_t n = e->Mark();
    return Queue([this, e, n] {
      e->Reach(n, FirstError());
      return absl::OkStatus();
    });
  }

  absl::Status Wait(Event& event) override {
    auto* e = static_cast<CpuEvent*>(&event);
    const uint64_t n = e->recorded();
    return Queue([e, n] {
      e->WaitFor(n);
      return absl::OkStatus();
    });
  }

  absl::Status Synchronize() override {
    CpuEvent done;
    VC_RETURN_IF_ERROR(Record(done));
    return done.Synchronize();
  }

 private:
  absl::Status Queue(std::function<absl::Status()> fn) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(fn));
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::Status FirstError() {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }

  void Run() {
    while (true) {
      std::function<absl::Status()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, with everything run
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status s = fn();
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(mu_);
        if (error_.ok()) error_ = std::move(s);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<absl::Status()>> queue_;  // guarded by mu_
  absl::Status error_;                               // guarded by mu_: the first failed item's
  bool stopping_ = false;                            // guarded by mu_
  std::thread thread_;                               // last: starts once the rest is built
};

class CpuDevice final : public Device {
 public:
  absl::string_view name() const override { return "cpu"; }

  absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryKind kind) override {
    void* p = bytes == 0 ? nullptr : std::calloc(1, bytes);
    if (bytes > 0 && p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return Buffer(p, bytes, kind, [](void* q) { std::free(q); });
  }

  absl::StatusOr<std::unique_ptr<Stream>> NewStream() override { return std::make_unique<CpuStream>(); }
  absl::StatusOr<std::unique_ptr<Event>> NewEvent() override { return std::make_unique<CpuEvent>(); }
};

}  // namespace

absl::Status CheckCopyRange(const Buffer& dst, size_t dst_offset, const Buffer& src, size_t src_offset, size_t bytes) {
  if (dst_offset > dst.bytes() || bytes > dst.bytes() - dst_offset || src_offset > src.bytes() ||
      bytes > src.bytes() - src_offset) {
    return absl::OutOfRangeError(absl::StrCat("a copy of ", bytes, " bytes from offset ", src_offset, " of ",
                                              src.bytes(), " to offset ", dst_offset, " of ", dst.bytes()));
  }
  return absl::OkStatus();
}

std::unique_ptr<Device> NewCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace vc::device
