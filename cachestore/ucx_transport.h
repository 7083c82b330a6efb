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
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace vc::cachestore {

enum class UcxErrorMode { kNone, kPeer };

// absl::InvalidArgumentError for anything but "none" and "peer".
absl::StatusOr<UcxErrorMode> ParseUcxErrorMode(absl::string_view name);

// The network interfaces UCX may use to serve a process that listens on `host` (an address or a
// name, as in HOST:PORT): empty for a wildcard ("0.0.0.0", "::", "*", ""), where UCX uses every
// interface; else the name of the interface that holds the address, so that UCX's TCP transport
// listens there only (UCX_NET_DEVICES). kInvalidArgument when no interface of this host holds it.
absl::StatusOr<std::string> UcxNetDevicesFor(absl::string_view host);

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
  // `net_devices` (UcxNetDevicesFor) names the network interfaces UCX listens and reads on; empty:
  // every one.
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Create(const char* region, size_t bytes, UcxErrorMode mode,
                                                                 const std::string& net_devices = "");
  // Allocates `bytes` through UCX (shared memory where the host allows) and registers them. The
  // server owns the region, which lives as long as the server. kUnavailable as for Create.
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Allocate(size_t bytes, UcxErrorMode mode,
                                                                   const std::string& net_devices = "");
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
  static absl::StatusOr<std::unique_ptr<UcxRegionServer>> Start(const void* params, UcxErrorMode mode,
                                                                const std::string& net_devices);
  std::unique_ptr<Impl> impl_;
  std::string address_, rkey_;
  uint64_t base_ = 0;
  size_t bytes_ = 0;
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

// Reads remote regions. Thread-safe (operations are serialized on one worker).
//
// The endpoint and unpacked keys of a server are made on first use and cached. A server's are
// forgotten after a Get from it fails (an endpoint UCX has marked failed stays failed; the next
// read connects anew) and once it has not been read from for `idle` (a restarted store has a new
// address, and the keys of its old one would keep the old shared-memory segment attached).
// Forgetting releases the keys; the endpoint is closed in error mode kPeer, and in kNone left to
// the reader's destruction (closing one to a peer that no longer answers can wait for it there).
class UcxReader {
 public:
  struct Options {
    UcxErrorMode mode = UcxErrorMode::kNone;
    // How long a Get may wait for its peer, in error mode kPeer: past it the endpoint is closed,
    // which ends the get (kDeadlineExceeded). In kNone a get to a peer that stops answering (over
    // TCP, from another host) waits for it: across hosts, use kPeer.
    absl::Duration get_timeout = absl::Seconds(10);
    absl::Duration idle = absl::Minutes(1);
  };
  static absl::StatusOr<std::unique_ptr<UcxReader>> Create(UcxErrorMode mode) { return Create(Options{mode}); }
  static absl::StatusOr<std::unique_ptr<UcxReader>> Create(const Options& options);
  ~UcxReader();

  // Copies `size` bytes at remote address `remote` of the server at `worker_address` (whose
  // region has packed key `rkey`) into `dest`. kUnavailable when the peer is unreachable,
  // kDeadlineExceeded as Options::get_timeout says.
  absl::Status Get(const std::string& worker_address, const std::string& rkey, uint64_t remote, void* dest,
                   size_t size);

  // The same `size` bytes, mapped into this process, for a caller that copies them itself (and can
  // checksum them on the way, which Get cannot): calls use(p) with p pointing at the server's
  // region at `remote`, when the region is shared memory on this host (ucp_rkey_ptr), and returns
  // OK. kUnimplemented otherwise, and always in error mode kPeer, whose point is that UCX reports a
  // dead peer; read with Get then. The mapping is UCX's attachment of the server's segment, held
  // with the server's keys, and valid while `use` runs (the keys are not forgotten meanwhile). It
  // stays readable after the server is gone (it then holds what the server last wrote). The bytes
  // are the server's live memory, which the server may change at any time; `use` must copy and
  // check them as Get's bytes are checked, never keep the pointer.
  absl::Status WithMapping(const std::string& worker_address, const std::string& rkey, uint64_t remote, size_t size,
                           absl::FunctionRef<void(const char*)> use);

  // Servers whose endpoint and keys are cached now.
  size_t cached_peers();

 private:
  struct Impl;
  struct Target;
  UcxReader() = default;
  // The endpoint and unpacked rkey for a server and key, made on first use and cached; forgets
  // the other servers idle past Options::idle.
  absl::StatusOr<Target> Find(const std::string& worker_address, const std::string& rkey)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mapping_mu_, mu_);
  // Releases the keys (and in kPeer closes the endpoint) of the server at `worker_address`.
  void Forget(const std::string& worker_address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mapping_mu_, mu_);
  std::unique_ptr<Impl> impl_;
  // Held shared while a mapping is in use, exclusively while keys are made or released; taken
  // before mu_.
  absl::Mutex mapping_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;  // serializes the UCX worker
};

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_UCX_TRANSPORT_H_
