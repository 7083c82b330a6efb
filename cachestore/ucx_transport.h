// The store's data plane over UCX: the RAM tier's region is registered once; clients read blocks
// from it with one-sided gets, addressed by the worker address and packed rkey that the control
// plane hands out. UCX picks the transport (RDMA, shared memory, CMA or TCP) from what the two
// sides share.
//
// The error-handling mode is a setting: kPeer makes UCX report a dead peer as an error on every
// outstanding operation (and, with UCX 1.13, restricts it to transports that support that, TCP
// on a single host); kNone allows shared memory and CMA, faster, but a peer's death can go
// unnoticed by pending operations.
#ifndef VC_CACHESTORE_UCX_TRANSPORT_H_
#define VC_CACHESTORE_UCX_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace vc::cachestore {

enum class UcxErrorMode { kNone, kPeer };

// absl::InvalidArgumentError for anything but "none" and "peer".
absl::StatusOr<UcxErrorMode> ParseUcxErrorMode(absl::string_view name);

// Serves one memory region for remote reads. Thread-safe; a progress thread runs while it lives.
class UcxRegionServer {
 public:
  // Registers [region, region + bytes). The region must outlive the server.
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Create(const char* region, size_t bytes, UcxErrorMode mode);
  ~UcxRegionServer();

  // What a client needs to read the region: the worker address, the packed rkey, and the
  // region's base address (remote addresses are base + offset).
  const std::string& worker_address() const { return address_; }
  const std::string& rkey() const { return rkey_; }
  uint64_t base() const { return base_; }

 private:
  struct Impl;
  UcxRegionServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string address_, rkey_;
  uint64_t base_ = 0;
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

// Reads remote regions. Thread-safe (operations are serialized on one worker).
class UcxReader {
 public:
  static absl::StatusOr<std::unique_ptr<UcxReader>> Create(UcxErrorMode mode);
  ~UcxReader();

  // Copies `size` bytes at remote address `remote` of the server at `worker_address` (whose
  // region has packed key `rkey`) into `dest`. kUnavailable when the peer is unreachable.
  absl::Status Get(const std::string& worker_address, const std::string& rkey, uint64_t remote, void* dest,
                   size_t size);

 private:
  struct Impl;
  UcxReader() = default;
  std::unique_ptr<Impl> impl_;
  absl::Mutex mu_;
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_UCX_TRANSPORT_H_
