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
//
// Where the region comes from matters. On a host without RDMA, xpmem or knem, UCX (1.13) can
// read only memory it allocated itself with one-sided copies (System V or POSIX shared memory,
// which a reader on the same host maps); gets from any other memory are emulated with messages
// that the server's progress thread answers through a shared-memory FIFO, correct but one to two
// orders of magnitude slower (benchmarks/results/store.md). Allocate gives the fast kind; the
// store keeps its RAM tier in such a region. Either way the packed rkey grants reads of the whole
// region, and a shared-memory segment can be attached by processes of the store's user.
class UcxRegionServer {
 public:
  // Registers [region, region + bytes), memory the caller owns. The region must outlive the
  // server. kUnavailable when UCX cannot start or register it (the message says why).
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Create(const char* region, size_t bytes, UcxErrorMode mode);
  // Allocates `bytes` through UCX (shared memory where the host allows) and registers them. The
  // server owns the region, which lives as long as the server. kUnavailable as for Create.
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Allocate(size_t bytes, UcxErrorMode mode);
  ~UcxRegionServer();

  // The region's first byte and its size.
  char* region() const { return reinterpret_cast<char*>(base_); }
  size_t region_bytes() const { return bytes_; }

  // What a client needs to read the region: the worker address, the packed rkey, and the
  // region's base address (remote addresses are base + offset).
  const std::string& worker_address() const { return address_; }
  const std::string& rkey() const { return rkey_; }
  uint64_t base() const { return base_; }

 private:
  struct Impl;
  UcxRegionServer() = default;
  // Maps the memory `params` describe, packs its rkey and starts the progress thread.
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Start(const void* params, UcxErrorMode mode);
  std::unique_ptr<Impl> impl_;
  std::string address_, rkey_;
  uint64_t base_ = 0;
  size_t bytes_ = 0;
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

  // The same `size` bytes, mapped into this process, for a caller that copies them itself (and can
  // checksum them on the way, which Get cannot): a pointer to the server's region at `remote`, when
  // the region is shared memory on this host (ucp_rkey_ptr). kUnimplemented otherwise, and always in
  // error mode kPeer, whose point is that UCX reports a dead peer; read with Get then. The mapping
  // is UCX's attachment of the server's segment, cached with the rkey for as long as this reader
  // lives: it stays readable after the server is gone (it then holds what the server last wrote).
  // The bytes are the server's live memory, which the server may change at any time; a reader must
  // copy and check them as Get's bytes are checked, never use them in place.
  absl::StatusOr<const char*> Map(const std::string& worker_address, const std::string& rkey, uint64_t remote,
                                  size_t size);

 private:
  struct Impl;
  struct Target;
  UcxReader() = default;
  // The endpoint and unpacked rkey for a server and key, made on first use and cached.
  absl::StatusOr<Target> Find(const std::string& worker_address, const std::string& rkey)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<Impl> impl_;
  absl::Mutex mu_;
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_UCX_TRANSPORT_H_
