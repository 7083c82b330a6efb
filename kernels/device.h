// Memory, streams and events of the machine the kernels run on: the device interface the GPU
// worker's engine is written against, so that one engine schedules work for the CPU and for CUDA.
//
// A Stream runs the work queued on it in order, asynchronously to the host: copies between
// buffers and host functions (the CPU device's kernels). An Event marks a point of a stream; another
// stream can wait for it (a copy stream swapping full KV in while the compute stream drafts, and
// the verify pass waiting for the copy). The CPU device runs each stream on a thread of its own, so
// the CPU tests exercise the same ordering, overlap and lifetimes as a GPU run.
//
// Buffers: device memory (the GPU's, or host memory for the CPU device) and pinned host memory
// (what a device copies from without staging). A buffer must outlive the work queued on it:
// synchronize the streams that use it before it goes.
#ifndef VC_KERNELS_DEVICE_H_
#define VC_KERNELS_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc::device {

enum class MemoryKind { kDevice, kPinnedHost };

// Memory of one kind, freed when the Buffer goes. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, MemoryKind kind, std::function<void(void*)> free)
      : data_(data), bytes_(bytes), kind_(kind), free_(std::move(free)) {}
  ~Buffer() { Reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      bytes_ = o.bytes_;
      kind_ = o.kind_;
      free_ = std::move(o.free_);
      o.data_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Device memory is only for kernels and copies to read; pinned host memory the host reads too.
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }

 private:
  void Reset() {
    if (data_ != nullptr && free_) free_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kDevice;
  std::function<void(void*)> free_;
};

// OK when `bytes` from `src` + src_offset fit, and fit `dst` + dst_offset; kOutOfRange otherwise.
absl::Status CheckCopyRange(const Buffer& dst, size_t dst_offset, const Buffer& src, size_t src_offset, size_t bytes);

class Stream;

// A point in a stream's work. Thread-safe.
class Event {
 public:
  virtual ~Event() = default;
  // Waits on the host until the work before the event's last Record has run (at once if never
  // recorded). The first error of that work, or OK.
  virtual absl::Status Synchronize() = 0;
  // Whether that work has run, without waiting.
  virtual bool Done() = 0;
};

// An in-order queue of work. Thread-safe: calls from several threads queue in the order they
// take the stream's lock. A failed item (a copy out of bounds, a host function's error) is kept as
// the stream's error, and later items still run.
class Stream {
 public:
  virtual ~Stream() = default;  // waits for the queued work

  // Queues a copy of `bytes` from `src` + src_offset to `dst` + dst_offset. kOutOfRange at once
  // when either range passes its buffer.
  virtual absl::Status CopyAsync(const Buffer& dst, size_t dst_offset, const Buffer& src, size_t src_offset,
                                 size_t bytes) = 0;
  // Queues a host function (on the CPU device: a kernel). Its error becomes the stream's.
  virtual absl::Status HostAsync(std::function<absl::Status()> fn) = 0;
  // Marks the current end of the queue: `event` is done once the work queued so far has run.
  virtual absl::Status Record(Event& event) = 0;
  // Work queued after this waits until `event` is done (as last recorded when this is called).
  virtual absl::Status Wait(Event& event) = 0;
  // Waits on the host for the work queued so far; the stream's first error, or OK.
  virtual absl::Status Synchronize() = 0;
};

// Thread-safe.
class Device {
 public:
  virtual ~Device() = default;
  virtual absl::string_view name() const = 0;  // "cpu", "cuda:0"
  // `bytes` of memory of `kind` (zeroed on the CPU device). kResourceExhausted when it cannot be had.
  virtual absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryKind kind) = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> NewStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> NewEvent() = 0;
};

// The CPU device: host memory for both kinds, a thread per stream.
std::unique_ptr<Device> NewCpuDevice();
// CUDA device `ordinal`. kUnavailable when built without CUDA or no driver is present (the CUDA
// runtime's error), kNotFound when there is no such device.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal);

}  // namespace vc::device

#endif  // VC_KERNELS_DEVICE_H_
