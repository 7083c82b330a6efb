#include "cachestore/ucx_transport.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace vc::cachestore {
namespace {

absl::Status UcxError(absl::string_view what, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(s)));
}

struct ContextFree {
  void operator()(ucp_context_h c) const { ucp_cleanup(c); }
};
struct WorkerFree {
  void operator()(ucp_worker_h w) const { ucp_worker_destroy(w); }
};
using ContextPtr = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextFree>;
using WorkerPtr = std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerFree>;

absl::Status MakeContextAndWorker(ContextPtr* ctx, WorkerPtr* worker, const std::string& net_devices = "") {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("ucp_config_read", s);
  if (!net_devices.empty()) {
    s = ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return UcxError(absl::StrCat("UCX_NET_DEVICES=", net_devices), s);
    }
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_RMA;
  ucp_context_h c = nullptr;
  s = ucp_init(&p, config, &c);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("ucp_init", s);
  ctx->reset(c);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // each worker is driven by one thread at a time
  ucp_worker_h w = nullptr;
  s = ucp_worker_create(c, &wp, &w);
  if (s != UCS_OK) return UcxError("ucp_worker_create", s);
  worker->reset(w);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UcxErrorMode> ParseUcxErrorMode(absl::string_view name) {
  if (name == "none") return UcxErrorMode::kNone;
  if (name == "peer") return UcxErrorMode::kPeer;
  return absl::InvalidArgumentError(absl::StrCat("UCX error mode '", name, "' (use none or peer)"));
}

struct UcxRegionServer::Impl {
  ContextPtr ctx;
  WorkerPtr worker;
  ucp_mem_h memh = nullptr;
  ~Impl() {
    if (memh != nullptr) ucp_mem_unmap(ctx.get(), memh);
    worker.reset();
    ctx.reset();
  }
};

absl::StatusOr<std::string> UcxNetDevicesFor(absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "*") return std::string();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string name(host);
  if (const int e = getaddrinfo(name.c_str(), nullptr, &hints, &found); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat("listen host '", name, "': ", gai_strerror(e)));
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    freeaddrinfo(found);
    return absl::UnavailableError("cannot list the network interfaces");
  }
  std::string device;
  for (const addrinfo* a = found; a != nullptr && device.empty(); a = a->ai_next) {
    for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != a->ai_family) continue;
      const bool same =
          a->ai_family == AF_INET
              ? reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr ==
                    reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr
              : a->ai_family == AF_INET6 &&
                    std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr,
                                &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, 16) == 0;
      if (same) {
        device = i->ifa_name;
        break;
      }
    }
  }
  freeifaddrs(interfaces);
  freeaddrinfo(found);
  if (device.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no network interface of this host holds '", name, "'"));
  }
  return device;
}

absl::StatusOr<std::unique_ptr<UcxRegionServer>> UcxRegionServer::Create(const char* region, size_t bytes,
                                                                          UcxErrorMode mode,
                                                                          const std::string& net_devices) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<char*>(region);
  mp.length = bytes;
  return Start(&mp, mode, net_devices);
}

absl::StatusOr<std::unique_ptr<UcxRegionServer>> UcxRegionServer::Allocate(size_t bytes, UcxErrorMode mode,
                                                                            const std::string& net_devices) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;  // UCX_MEM_ALLOC_METHODS order: System V, POSIX shared memory, then private
  return Start(&mp, mode, net_devices);
}

absl::StatusOr<std::unique_ptr<UcxRegionServer>> UcxRegionServer::Start(const void* params, UcxErrorMode,
                                                                         const std::string& net_devices) {
  std::unique_ptr<UcxRegionServer> s(new UcxRegionServer());
  s->impl_ = std::make_unique<Impl>();
  absl::Status st = MakeContextAndWorker(&s->impl_->ctx, &s->impl_->worker, net_devices);
  if (!st.ok()) return st;
  ucs_status_t us =
      ucp_mem_map(s->impl_->ctx.get(), static_cast<const ucp_mem_map_params_t*>(params), &s->impl_->memh);
  if (us != UCS_OK) return UcxError("ucp_mem_map", us);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  us = ucp_mem_query(s->impl_->memh, &attr);
  if (us != UCS_OK) return UcxError("ucp_mem_query", us);
  void* rkey = nullptr;
  size_t rkey_size = 0;
  us = ucp_rkey_pack(s->impl_->ctx.get(), s->impl_->memh, &rkey, &rkey_size);
  if (us != UCS_OK) return UcxError("ucp_rkey_pack", us);
  s->rkey_.assign(static_cast<const char*>(rkey), rkey_size);
  ucp_rkey_buffer_release(rkey);
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  us = ucp_worker_get_address(s->impl_->worker.get(), &addr, &addr_len);
  if (us != UCS_OK) return UcxError("ucp_worker_get_address", us);
  s->address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(s->impl_->worker.get(), addr);
  s->base_ = reinterpret_cast<uint64_t>(attr.address);
  s->bytes_ = attr.length;
  // Transports without hardware RMA (TCP) need the target's worker progressed to serve gets.
  UcxRegionServer* self = s.get();
  // Poll while there is work; back off to millisecond sleeps when idle so an idle store costs
  // no CPU (a get arriving then waits at most a millisecond for its first progress call).
  s->progress_ = std::thread([self] {
    int idle = 0;
    while (!self->stop_.load(std::memory_order_relaxed)) {
      if (ucp_worker_progress(self->impl_->worker.get()) != 0) {
        idle = 0;
      } else if (++idle > 1000) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } else {
        std::this_thread::yield();
      }
    }
  });
  return s;
}

UcxRegionServer::~UcxRegionServer() {
  stop_ = true;
  if (progress_.joinable()) progress_.join();
}

struct UcxReader::Impl {
  Options options;
  ContextPtr ctx;
  WorkerPtr worker;
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::map<std::string, ucp_rkey_h> rkeys;
    absl::Duration last_used;  // SteadyClock() time
  };
  std::map<std::string, Peer> peers;

  // Closes `ep`, waiting for the close to complete; with `force`, outstanding operations end
  // with UCS_ERR_CANCELED at once (valid in error mode peer only).
  void Close(ucp_ep_h ep, bool force) {
    ucp_request_param_t rp{};
    if (force) {
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(req)) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker.get());
      ucp_request_free(req);
    }
  }
  // Releases a peer's keys, then closes its endpoint: always with `close_in_none`, else only in
  // error mode peer, where the close cannot wait on a peer that no longer answers.
  void Release(Peer& p, bool close_in_none = false) {
    for (auto& [k, r] : p.rkeys) ucp_rkey_destroy(r);
    p.rkeys.clear();
    const bool peer_mode = options.mode == UcxErrorMode::kPeer;
    if (peer_mode || close_in_none) Close(p.ep, /*force=*/peer_mode);
  }
  ~Impl() {
    for (auto& [addr, p] : peers) Release(p, /*close_in_none=*/true);
    worker.reset();  // destroys the endpoints forgotten in error mode none too
    ctx.reset();
  }
};

absl::StatusOr<std::unique_ptr<UcxReader>> UcxReader::Create(const Options& options) {
  std::unique_ptr<UcxReader> r(new UcxReader());
  r->impl_ = std::make_unique<Impl>();
  r->impl_->options = options;
  absl::Status st = MakeContextAndWorker(&r->impl_->ctx, &r->impl_->worker);
  if (!st.ok()) return st;
  return r;
}

UcxReader::~UcxReader() = default;

struct UcxReader::Target {
  ucp_ep_h ep;
  ucp_rkey_h rkey;
};

void UcxReader::Forget(const std::string& worker_address) {
  auto it = impl_->peers.find(worker_address);
  if (it == impl_->peers.end()) return;
  impl_->Release(it->second);
  impl_->peers.erase(it);
}

size_t UcxReader::cached_peers() {
  absl::MutexLock l(&mu_);
  return impl_->peers.size();
}

absl::StatusOr<UcxReader::Target> UcxReader::Find(const std::string& worker_address, const std::string& rkey) {
  Impl& im = *impl_;
  const absl::Duration now = SteadyClock()->Now();
  for (auto it = im.peers.begin(); it != im.peers.end();) {
    if (it->first != worker_address && now - it->second.last_used > im.options.idle) {
      im.Release(it->second);
      it = im.peers.erase(it);
    } else {
      ++it;
    }
  }
  auto peer = im.peers.find(worker_address);
  if (peer == im.peers.end()) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    ep.err_mode = im.options.mode == UcxErrorMode::kPeer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h h = nullptr;
    ucs_status_t s = ucp_ep_create(im.worker.get(), &ep, &h);
    if (s != UCS_OK) return UcxError("ucp_ep_create", s);
    peer = im.peers.emplace(worker_address, Impl::Peer{h, {}, now}).first;
  }
  peer->second.last_used = now;
  auto rk = peer->second.rkeys.find(rkey);
  if (rk == peer->second.rkeys.end()) {
    ucp_rkey_h h = nullptr;
    ucs_status_t s = ucp_ep_rkey_unpack(peer->second.ep, rkey.data(), &h);
    if (s != UCS_OK) return UcxError("ucp_ep_rkey_unpack", s);
    rk = peer->second.rkeys.emplace(rkey, h).first;
  }
  return Target{peer->second.ep, rk->second};
}

absl::Status UcxReader::Get(const std::string& worker_address, const std::string& rkey, uint64_t remote, void* dest,
                            size_t size) {
  absl::WriterMutexLock ml(&mapping_mu_);
  absl::MutexLock l(&mu_);
  absl::StatusOr<Target> t = Find(worker_address, rkey);
  if (!t.ok()) return t.status();
  ucp_request_param_t rp{};
  ucs_status_ptr_t req = ucp_get_nbx(t->ep, dest, size, remote, t->rkey, &rp);
  if (UCS_PTR_IS_ERR(req)) {
    Forget(worker_address);
    return UcxError("ucp_get_nbx", UCS_PTR_STATUS(req));
  }
  if (req == nullptr) return absl::OkStatus();  // completed in place
  const bool timed = impl_->options.mode == UcxErrorMode::kPeer;
  const absl::Duration deadline = SteadyClock()->Now() + impl_->options.get_timeout;
  bool expired = false;
  ucs_status_t s;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    ucp_worker_progress(impl_->worker.get());
    if (timed && !expired && SteadyClock()->Now() >= deadline) {
      // Closing the endpoint by force ends the get, with UCS_ERR_CANCELED.
      expired = true;
      Forget(worker_address);
    }
  }
  ucp_request_free(req);
  if (expired) {
    return absl::DeadlineExceededError(absl::StrCat("UCX get of ", size, " bytes: no answer from the store within ",
                                                    absl::FormatDuration(impl_->options.get_timeout)));
  }
  if (s != UCS_OK) {
    Forget(worker_address);
    return UcxError("get", s);
  }
  return absl::OkStatus();
}

absl::Status UcxReader::WithMapping(const std::string& worker_address, const std::string& rkey, uint64_t remote,
                                    size_t size, absl::FunctionRef<void(const char*)> use) {
  if (impl_->options.mode == UcxErrorMode::kPeer) {
    return absl::UnimplementedError("error mode peer reads through UCX only");
  }
  // Cached keys are used under the shared lock, which keeps them from being forgotten meanwhile;
  // missing ones are made under the exclusive lock, and then used as cached ones.
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) {
      absl::WriterMutexLock ml(&mapping_mu_);
      absl::MutexLock l(&mu_);
      absl::StatusOr<Target> t = Find(worker_address, rkey);
      if (!t.ok()) return t.status();
    }
    absl::ReaderMutexLock ml(&mapping_mu_);
    void* first = nullptr;
    {
      absl::MutexLock l(&mu_);
      auto peer = impl_->peers.find(worker_address);
      if (peer == impl_->peers.end()) continue;
      auto rk = peer->second.rkeys.find(rkey);
      if (rk == peer->second.rkeys.end()) continue;
      peer->second.last_used = SteadyClock()->Now();
      // Both ends of the range must map, and contiguously (one segment).
      ucs_status_t s = ucp_rkey_ptr(rk->second, remote, &first);
      if (s != UCS_OK) return absl::UnimplementedError(absl::StrCat("ucp_rkey_ptr: ", ucs_status_string(s)));
      if (size > 0) {
        void* last = nullptr;
        s = ucp_rkey_ptr(rk->second, remote + size - 1, &last);
        if (s != UCS_OK) return absl::UnimplementedError(absl::StrCat("ucp_rkey_ptr: ", ucs_status_string(s)));
        if (static_cast<char*>(last) != static_cast<char*>(first) + (size - 1)) {
          return absl::UnimplementedError("the range is not mapped contiguously");
        }
      }
    }
    use(static_cast<const char*>(first));
    return absl::OkStatus();
  }
  return absl::UnavailableError("the store's keys were released while being mapped, twice");
}

}  // namespace vc::cachestore
