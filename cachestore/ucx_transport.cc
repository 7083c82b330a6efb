#include "cachestore/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

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

absl::Status MakeContextAndWorker(ContextPtr* ctx, WorkerPtr* worker) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("ucp_config_read", s);
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

absl::StatusOr<std::unique_ptr<UcxRegionServer>> UcxRegionServer::Create(const char* region, size_t bytes,
                                                                          UcxErrorMode mode) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<char*>(region);
  mp.length = bytes;
  return Start(&mp, mode);
}

absl::StatusOr<std::unique_ptr<UcxRegionServer>> UcxRegionServer::Allocate(size_t bytes, UcxErrorMode mode) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;  // UCX_MEM_ALLOC_METHODS order: System V, POSIX shared memory, then private
  return Start(&mp, mode);
}

absl::StatusOr<std::unique_ptr<UcxRegionServer>> UcxRegionServer::Start(const void* params, UcxErrorMode) {
  std::unique_ptr<UcxRegionServer> s(new UcxRegionServer());
  s->impl_ = std::make_unique<Impl>();
  absl::Status st = MakeContextAndWorker(&s->impl_->ctx, &s->impl_->worker);
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
  UcxErrorMode mode = UcxErrorMode::kNone;
  ContextPtr ctx;
  WorkerPtr worker;
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::map<std::string, ucp_rkey_h> rkeys;
  };
  std::map<std::string, Peer> peers;
  ~Impl() {
    for (auto& [addr, p] : peers) {
      for (auto& [k, r] : p.rkeys) ucp_rkey_destroy(r);
      ucp_request_param_t rp{};
      ucs_status_ptr_t req = ucp_ep_close_nbx(p.ep, &rp);
      if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker.get());
        ucp_request_free(req);
      }
    }
    worker.reset();
    ctx.reset();
  }
};

absl::StatusOr<std::unique_ptr<UcxReader>> UcxReader::Create(UcxErrorMode mode) {
  std::unique_ptr<UcxReader> r(new UcxReader());
  r->impl_ = std::make_unique<Impl>();
  r->impl_->mode = mode;
  absl::Status st = MakeContextAndWorker(&r->impl_->ctx, &r->impl_->worker);
  if (!st.ok()) return st;
  return r;
}

UcxReader::~UcxReader() = default;

struct UcxReader::Target {
  ucp_ep_h ep;
  ucp_rkey_h rkey;
};

absl::StatusOr<UcxReader::Target> UcxReader::Find(const std::string& worker_address, const std::string& rkey) {
  Impl& im = *impl_;
  auto peer = im.peers.find(worker_address);
  if (peer == im.peers.end()) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    ep.err_mode = im.mode == UcxErrorMode::kPeer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h h = nullptr;
    ucs_status_t s = ucp_ep_create(im.worker.get(), &ep, &h);
    if (s != UCS_OK) return UcxError("ucp_ep_create", s);
    peer = im.peers.emplace(worker_address, Impl::Peer{h, {}}).first;
  }
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
  absl::MutexLock l(&mu_);
  absl::StatusOr<Target> t = Find(worker_address, rkey);
  if (!t.ok()) return t.status();
  ucp_request_param_t rp{};
  ucs_status_ptr_t req = ucp_get_nbx(t->ep, dest, size, remote, t->rkey, &rp);
  if (UCS_PTR_IS_ERR(req)) return UcxError("ucp_get_nbx", UCS_PTR_STATUS(req));
  if (req == nullptr) return absl::OkStatus();  // completed in place
  ucs_status_t s;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) ucp_worker_progress(impl_->worker.get());
  ucp_request_free(req);
  if (s != UCS_OK) return UcxError("get", s);
  return absl::OkStatus();
}

absl::StatusOr<const char*> UcxReader::Map(const std::string& worker_address, const std::string& rkey,
                                           uint64_t remote, size_t size) {
  if (impl_->mode == UcxErrorMode::kPeer) {
    return absl::UnimplementedError("error mode peer reads through UCX only");
  }
  absl::MutexLock l(&mu_);
  absl::StatusOr<Target> t = Find(worker_address, rkey);
  if (!t.ok()) return t.status();
  // Both ends of the range must map, and contiguously (one segment).
  void* first = nullptr;
  ucs_status_t s = ucp_rkey_ptr(t->rkey, remote, &first);
  if (s != UCS_OK) return absl::UnimplementedError(absl::StrCat("ucp_rkey_ptr: ", ucs_status_string(s)));
  if (size > 0) {
    void* last = nullptr;
    s = ucp_rkey_ptr(t->rkey, remote + size - 1, &last);
    if (s != UCS_OK) return absl::UnimplementedError(absl::StrCat("ucp_rkey_ptr: ", ucs_status_string(s)));
    if (static_cast<char*>(last) != static_cast<char*>(first) + (size - 1)) {
      return absl::UnimplementedError("the range is not mapped contiguously");
    }
  }
  return static_cast<const char*>(first);
}

}  // namespace vc::cachestore
