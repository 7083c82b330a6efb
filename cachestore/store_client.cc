#include "cachestore/store_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cachestore/block_format.h"
#include "cachestore/crc32c.h"
#include "common/status_macros.h"
#include "common/text_checks.h"
#include "grpcpp/grpcpp.h"

namespace vc::cachestore {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

std::string KeyBytes(const BlockKey& k) { return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32); }

// Where a batch of `keys` blocks is cut into rounds: a round ends once its buffers (dest[i],
// when given) reach round_bytes (0: never) or it holds the service's limit of keys.
std::vector<size_t> RoundEnds(size_t keys, absl::Span<const absl::Span<char>> dest, size_t round_bytes) {
  std::vector<size_t> ends;
  size_t bytes = 0, in_round = 0;
  for (size_t i = 0; i < keys; ++i) {
    if (!dest.empty()) bytes += dest[i].size();
    ++in_round;
    const bool full = round_bytes > 0 && bytes >= round_bytes;
    if (full || in_round == static_cast<size_t>(kMaxKeysPerLeaseCall) || i + 1 == keys) {
      ends.push_back(i + 1);
      bytes = 0;
      in_round = 0;
    }
  }
  return ends;
}

// One unary call in flight on the callback API: what it sends, what comes back, and when.
template <typename Request, typename Response>
struct AsyncCall {
  grpc::ClientContext ctx;
  Request req;
  Response resp;
  grpc::Status status;
  absl::Notification done;
};

std::string FingerprintBytes(const std::array<uint8_t, 32>& fp) {
  return std::string(reinterpret_cast<const char*>(fp.data()), fp.size());
}

}  // namespace

struct StoreClient::ReleaseCall
    : AsyncCall<vericache::v1::ReleaseLeasesRequest, vericache::v1::ReleaseLeasesResponse> {};

struct StoreClient::LeaseCall : AsyncCall<vericache::v1::LeaseBlocksRequest, vericache::v1::LeaseBlocksResponse> {
  absl::Duration sent;  // by the client's clock, before the call went out

  // Once answered: whether the store leases at all. One without a UCX data plane (or one that
  // predates LeaseBlocks) answers FAILED_PRECONDITION or UNIMPLEMENTED, and serves blocks inline.
  bool StoreLeases() const {
    return status.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
           status.error_code() != grpc::StatusCode::UNIMPLEMENTED;
  }
};

StoreClient::~StoreClient() {
  // The flush thread stops first; the leases still waiting for a LeaseBlocks call go back now.
  {
    absl::MutexLock l(&pending_mu_);
    stopping_ = true;
  }
  if (flusher_.joinable()) flusher_.join();
  std::vector<uint64_t> waiting;
  {
    absl::MutexLock l(&pending_mu_);
    waiting.swap(pending_ids_);
  }
  if (!waiting.empty()) (void)SendReleases(waiting);
  // Releases are small and usually answered within a millisecond; give them a moment, then
  // cancel the rest (cancelled calls complete promptly) and wait for every callback.
  const auto none_in_flight = [](ReleaseTracker* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu) {
    return t->in_flight.empty();
  };
  std::vector<std::shared_ptr<ReleaseCall>> pending;
  {
    absl::MutexLock l(&releases_->mu);
    if (!releases_->mu.AwaitWithTimeout(absl::Condition(+none_in_flight, releases_.get()), absl::Milliseconds(500))) {
      for (auto& [c, call] : releases_->in_flight) pending.push_back(call);
    }
  }
  if (!pending.empty()) {
    // Not under the lock: a cancellation may run the call's callback on this thread.
    for (const auto& call : pending) call->ctx.TryCancel();
    pending.clear();
    absl::MutexLock l(&releases_->mu);
    releases_->mu.Await(absl::Condition(+none_in_flight, releases_.get()));
  }
  // The answered calls go here, before the stub: the channel dies with this client, on this thread.
  DropAnsweredReleases();
}

void StoreClient::DropAnsweredReleases() {
  std::vector<std::shared_ptr<ReleaseCall>> answered;
  {
    absl::MutexLock l(&releases_->mu);
    answered.swap(releases_->answered);
  }
}

absl::Status CheckRemoteLocation(const vericache::v1::RemoteBlock& r) {
  if (!r.has_location_crc32c() ||
      r.location_crc32c() == LocationCrc32c(r.worker_address(), r.rkey(), r.address(), r.size_bytes())) {
    return absl::OkStatus();
  }
  return absl::DataLossError("the store's UCX location of a leased block fails its checksum (not read)");
}

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Create(const StoreClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("store target is empty");
  // The token goes into a header, where gRPC aborts the process on control bytes.
  if (!options.token.empty()) VC_RETURN_IF_ERROR(CheckBearerToken(options.token, "the store token"));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxStoreMessageBytes);
  args.SetMaxSendMessageSize(kMaxStoreMessageBytes);
  // Reconnect quickly after a store restart (gRPC's default backoff grows to minutes). The minimum
  // backoff is left alone: gRPC also uses it as the connect timeout, and at 100 ms a busy host
  // fails connections whose handshake is merely slow.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->options_ = options;
  if (c->options_.clock == nullptr) c->options_.clock = SteadyClock();
  c->stub_ = vericache::v1::CacheStore::NewStub(grpc::CreateCustomChannel(options.target, creds, args));
  c->options_.max_pending_releases = std::min<size_t>(options.max_pending_releases, kMaxKeysPerLeaseCall);
  if (options.release_delay_ms > 0) c->flusher_ = std::thread([p = c.get()] { p->FlushLoop(); });
  return c;
}

void StoreClient::Prepare(grpc::ClientContext* ctx) const {
  ctx->AddMetadata("authorization", "Bearer " + options_.token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms));
}

absl::StatusOr<std::pair<uint32_t, uint32_t>> StoreClient::Lookup(absl::Span<const BlockKey> keys, bool use) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::LookupRequest req;
  for (const BlockKey& k : keys) req.add_keys(KeyBytes(k));
  req.set_count_as_use(use);
  vericache::v1::LookupResponse resp;
  absl::Status s = FromGrpc(stub_->Lookup(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::make_pair(resp.cached_blocks(), resp.ram_blocks());
}

absl::Status StoreClient::Put(const BlockKey& key, absl::string_view block) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::PutRequest req;
  req.set_key(KeyBytes(key));
  req.set_block(std::string(block));
  vericache::v1::PutResponse resp;
  return FromGrpc(stub_->Put(&ctx, req, &resp));
}

absl::StatusOr<std::string> StoreClient::Get(const BlockKey& key, const std::array<uint8_t, 32>* fp) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::GetRequest req;
  req.set_key(KeyBytes(key));
  if (fp != nullptr) req.set_expect_fingerprint(FingerprintBytes(*fp));
  vericache::v1::GetResponse resp;
  absl::Status s = FromGrpc(stub_->Get(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::move(*resp.mutable_block());
}

absl::StatusOr<std::string> StoreClient::GetRemote(const BlockKey& key, UcxReader* reader,
                                                   const std::array<uint8_t, 32>* fp) {
  return std::move(GetRemoteBatch(absl::MakeConstSpan(&key, 1), reader, fp)[0]);
}

absl::Duration StoreClient::LeaseTrustWindow(absl::Duration lease_ttl) {
  return lease_ttl - std::max(lease_ttl / 5, absl::Seconds(1));
}

struct StoreClient::Sink {
  // A buffer of at least `size` bytes for block i of the batch, or why there is none.
  absl::FunctionRef<absl::StatusOr<char*>(size_t i, size_t size)> buffer;
  // Takes block i as it came inline; its size, or why it cannot be taken.
  absl::FunctionRef<absl::StatusOr<size_t>(size_t i, std::string block)> take;
  // Whether blocks copied from a mapped region go to their buffers by non-temporal stores.
  bool streaming = false;
};

std::vector<absl::StatusOr<std::string>> StoreClient::GetRemoteBatch(absl::Span<const BlockKey> keys,
                                                                     UcxReader* reader,
                                                                     const std::array<uint8_t, 32>* fp) {
  std::vector<std::string> blocks(keys.size());
  const auto buffer = [&](size_t i, size_t size) -> absl::StatusOr<char*> {
    // The size comes from the store's lease; no block it can hold is larger than a Put carries.
    if (size > static_cast<size_t>(kMaxStoreMessageBytes)) {
      return absl::OutOfRangeError(absl::StrCat("the store leased a block of ", size, " bytes; at most ",
                                                kMaxStoreMessageBytes, " are possible"));
    }
    blocks[i].resize(size);
    return blocks[i].data();
  };
  const auto take = [&](size_t i, std::string block) -> absl::StatusOr<size_t> {
    blocks[i] = std::move(block);
    return blocks[i].size();
  };
  std::vector<absl::StatusOr<size_t>> sizes =
      ReadBatch(keys, RoundEnds(keys.size(), {}, 0), reader, fp, Sink{buffer, take});
  std::vector<absl::StatusOr<std::string>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sizes[i].ok()) {
      out.emplace_back(std::move(blocks[i]));
    } else {
      out.emplace_back(sizes[i].status());
    }
  }
  return out;
}

std::vector<absl::StatusOr<size_t>> StoreClient::GetRemoteBatchInto(absl::Span<const BlockKey> keys,
                                                                    absl::Span<const absl::Span<char>> dest,
                                                                    UcxReader* reader,
                                                                    const std::array<uint8_t, 32>* fp) {
  if (dest.size() != keys.size()) {
    return std::vector<absl::StatusOr<size_t>>(
        keys.size(), absl::InvalidArgumentError(absl::StrCat(dest.size(), " buffers for ", keys.size(), " keys")));
  }
  const auto too_small = [&](size_t i, size_t size) {
    return absl::OutOfRangeError(absl::StrCat("block of ", size, " bytes, buffer of ", dest[i].size()));
  };
  const auto buffer = [&](size_t i, size_t size) -> absl::StatusOr<char*> {
    if (size > dest[i].size()) return too_small(i, size);
    return dest[i].data();
  };
  const auto take = [&](size_t i, std::string block) -> absl::StatusOr<size_t> {
    if (block.size() > dest[i].size()) return too_small(i, block.size());
    std::memcpy(dest[i].data(), block.data(), block.size());
    return block.size();
  };
  // Rounds of about lease_round_bytes of buffers: a block is at most its buffer, so a round moves
  // at most that much (more only when one buffer alone is larger).
  size_t total_bytes = 0;
  for (const absl::Span<char>& d : dest) total_bytes += d.size();
  return ReadBatch(keys, RoundEnds(keys.size(), dest, options_.lease_round_bytes), reader, fp,
                   Sink{buffer, take, total_bytes >= options_.streaming_copy_bytes});
}

std::vector<absl::StatusOr<size_t>> StoreClient::ReadBatch(absl::Span<const BlockKey> keys,
                                                           const std::vector<size_t>& ends, UcxReader* reader,
                                                           const std::array<uint8_t, 32>* fp, const Sink& sink) {
  std::vector<absl::StatusOr<size_t>> out(keys.size(), absl::UnknownError("not read"));
  if (keys.empty()) return out;
  // Round r + 1's LeaseBlocks call goes out as soon as round r's is answered, and is in flight
  // while round r is read. Every call sent is waited for below, whatever any round's outcome, so
  // none is left in flight (or points into freed memory) when this returns.
  std::unique_ptr<LeaseCall> next = SendLease(keys.subspan(0, ends[0]), fp);
  for (size_t r = 0, first = 0; r < ends.size(); first = ends[r], ++r) {
    std::unique_ptr<LeaseCall> lease = std::move(next);
    if (lease != nullptr) {
      lease->done.WaitForNotification();
      SettleCarriedReleases(*lease);
    }
    // A store that leases nothing is not offered the rounds after this one.
    const bool leasing = lease != nullptr && lease->StoreLeases();
    if (leasing && r + 1 < ends.size()) next = SendLease(keys.subspan(ends[r], ends[r + 1] - ends[r]), fp);
    ReadRound(keys.subspan(first, ends[r] - first), first, reader, fp, sink, lease.get(), out.data() + first);
  }
  return out;
}

std::unique_ptr<StoreClient::LeaseCall> StoreClient::SendLease(absl::Span<const BlockKey> keys,
                                                               const std::array<uint8_t, 32>* fp) {
  auto call = std::make_unique<LeaseCall>();
  LeaseCall* c = call.get();
  for (const BlockKey& k : keys) c->req.add_keys(KeyBytes(k));
  if (fp != nullptr) c->req.set_expect_fingerprint(FingerprintBytes(*fp));
  {
    // The leases this client is done with ride along (at most max_pending_releases of them).
    absl::MutexLock l(&pending_mu_);
    c->req.mutable_release_lease_ids()->Add(pending_ids_.begin(), pending_ids_.end());
    pending_ids_.clear();
  }
  Prepare(&c->ctx);
  lease_calls_.fetch_add(1, std::memory_order_relaxed);
  // Read before the call goes out: the store grants every lease after this moment.
  c->sent = options_.clock->Now();
  stub_->async()->LeaseBlocks(&c->ctx, &c->req, &c->resp, [c](grpc::Status st) {
    c->status = std::move(st);
    c->done.Notify();
  });
  return call;
}

void StoreClient::ReadRound(absl::Span<const BlockKey> keys, size_t first, UcxReader* reader,
                            const std::array<uint8_t, 32>* fp, const Sink& sink, const LeaseCall* lease,
                            absl::StatusOr<size_t>* out) {
  const size_t n = keys.size();
  std::vector<size_t> inline_keys;
  if (lease == nullptr || !lease->StoreLeases()) {
    // No UCX data plane (or a store that predates LeaseBlocks): every block comes inline.
    for (size_t i = 0; i < n; ++i) inline_keys.push_back(i);
    GetInline(keys, first, inline_keys, fp, sink, out);
    return;
  }
  const grpc::Status& st = lease->status;
  const vericache::v1::LeaseBlocksResponse& resp = lease->resp;
  if (st.ok() && resp.blocks_size() != static_cast<int>(n)) {
    std::vector<uint64_t> granted;
    for (const vericache::v1::LeasedBlock& b : resp.blocks()) {
      if (b.has_remote()) granted.push_back(b.remote().lease_id());
    }
    if (!granted.empty()) (void)SendReleases(granted);
    for (size_t i = 0; i < n; ++i) {
      out[i] = absl::InternalError(absl::StrCat("LeaseBlocks answered ", resp.blocks_size(), " outcomes for ", n, " keys"));
    }
    return;
  }
  if (!st.ok()) {
    for (size_t i = 0; i < n; ++i) out[i] = FromGrpc(st);
    return;
  }
  const absl::Duration sent = lease->sent;
  const absl::Duration trusted_until = sent + LeaseTrustWindow(absl::Milliseconds(resp.lease_ttl_ms()));

  // Read every leased block. A read that finished past the trust window counts only if the
  // release finds its lease live (`confirm`, by its index in the release call). A block read from
  // a mapped region is checked as it is copied (`checked`); one read with Get is checked in its
  // buffer (`unchecked`) once it counts.
  std::vector<uint64_t> lease_ids;
  std::vector<int> confirm(n, -1);
  std::vector<absl::Status> checked(n);
  std::vector<char*> unchecked(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const vericache::v1::LeasedBlock& b = resp.blocks(static_cast<int>(i));
    const auto code = static_cast<absl::StatusCode>(b.status_code());
    if (code == absl::StatusCode::kResourceExhausted) {
      inline_keys.push_back(i);  // RAM cannot take it now, or this tenant's leases are at their cap
      continue;
    }
    if (code != absl::StatusCode::kOk || !b.has_remote()) {
      out[i] = code != absl::StatusCode::kOk ? absl::Status(code, b.status_message())
                                             : absl::InternalError("LeaseBlocks granted a lease without a location");
      continue;
    }
    const vericache::v1::RemoteBlock& r = b.remote();
    lease_ids.push_back(r.lease_id());
    if (absl::Status where = CheckRemoteLocation(r); !where.ok()) {
      out[i] = where;
      continue;
    }
    const size_t size = r.size_bytes();
    absl::StatusOr<char*> dest = sink.buffer(first + i, size);
    if (!dest.ok()) {
      out[i] = dest.status();
      continue;
    }
    const absl::Status mapped = reader->WithMapping(r.worker_address(), r.rkey(), r.address(), size, [&](const char* p) {
      checked[i] = CopyAndVerifyBlock(p, size, *dest, nullptr, sink.streaming).status();
    });
    if (absl::IsUnimplemented(mapped)) {
      const absl::Status read = reader->Get(r.worker_address(), r.rkey(), r.address(), *dest, size);
      if (!read.ok()) {
        out[i] = read;
        continue;
      }
      unchecked[i] = *dest;
    } else if (!mapped.ok()) {
      out[i] = mapped;
      continue;
    }
    if (options_.clock->Now() >= trusted_until) confirm[i] = static_cast<int>(lease_ids.size() - 1);
    out[i] = size;
  }
  // When a read needs the release's answer, the round's leases go back at once in one call, which
  // is waited for below; otherwise they ride on a later LeaseBlocks call.
  std::shared_ptr<ReleaseCall> release;
  if (!lease_ids.empty()) {
    const bool need_answer = std::any_of(confirm.begin(), confirm.end(), [](int c) { return c >= 0; });
    if (need_answer || options_.release_delay_ms <= 0) {
      release = SendReleases(lease_ids);
    } else {
      DeferReleases(lease_ids);
    }
  }
  if (!inline_keys.empty()) GetInline(keys, first, inline_keys, fp, sink, out);

  for (size_t i = 0; i < n; ++i) {
    if (!out[i].ok()) continue;
    if (confirm[i] >= 0) {
      // Past the trust window the slot may have been reused during the read: only a lease the
      // store still held at the release vouches for the bytes.
      release->done.WaitForNotification();
      if (!release->status.ok()) {
        out[i] = FromGrpc(release->status);
        continue;
      }
      if (confirm[i] >= release->resp.was_live_size() || !release->resp.was_live(confirm[i])) {
        out[i] = absl::AbortedError("the block's lease may have expired before its read finished; the bytes were discarded");
        continue;
      }
    }
    absl::Status check = checked[i];
    if (unchecked[i] != nullptr) {
      check = VerifyBlock(absl::string_view(unchecked[i], *out[i])).status();
    }
    if (!check.ok()) {
      (void)Delete(keys[i]);
      out[i] = absl::DataLossError(
          absl::StrCat("block failed its checks after the read and was deleted: ", check.message()));
    }
  }
}

void StoreClient::GetInline(absl::Span<const BlockKey> keys, size_t first, const std::vector<size_t>& which,
                            const std::array<uint8_t, 32>* fp, const Sink& sink, absl::StatusOr<size_t>* out) {
  using GetCall = AsyncCall<vericache::v1::GetRequest, vericache::v1::GetResponse>;
  std::vector<std::unique_ptr<GetCall>> gets(which.size());
  for (size_t j = 0; j < which.size(); ++j) {
    GetCall* c = (gets[j] = std::make_unique<GetCall>()).get();
    Prepare(&c->ctx);
    c->req.set_key(KeyBytes(keys[which[j]]));
    if (fp != nullptr) c->req.set_expect_fingerprint(FingerprintBytes(*fp));
    stub_->async()->Get(&c->ctx, &c->req, &c->resp, [c](grpc::Status st) {
      c->status = std::move(st);
      c->done.Notify();
    });
  }
  for (size_t j = 0; j < which.size(); ++j) {
    GetCall& g = *gets[j];
    g.done.WaitForNotification();
    if (!g.status.ok()) {
      out[which[j]] = FromGrpc(g.status);
    } else if (absl::Status check = VerifyBlock(g.resp.block()).status(); !check.ok()) {
      // Checked here like every block read remotely: a short or damaged one must not reach a reader.
      out[which[j]] = absl::DataLossError(absl::StrCat("block served inline failed its checks: ", check.message()));
    } else {
      out[which[j]] = sink.take(first + which[j], std::move(*g.resp.mutable_block()));
    }
  }
}

std::shared_ptr<StoreClient::ReleaseCall> StoreClient::SendReleases(const std::vector<uint64_t>& lease_ids) {
  DropAnsweredReleases();
  auto call = std::make_shared<ReleaseCall>();
  ReleaseCall* c = call.get();
  Prepare(&c->ctx);
  for (uint64_t id : lease_ids) c->req.add_lease_ids(id);
  {
    absl::MutexLock l(&releases_->mu);
    releases_->in_flight.emplace(c, call);
  }
  stub_->async()->ReleaseLeases(&c->ctx, &c->req, &c->resp, [tracker = releases_, c](grpc::Status st) {
    c->status = std::move(st);
    // The last touch of `c`: once it is in `answered` and the lock is free, the client may drop it.
    absl::MutexLock l(&tracker->mu);
    c->done.Notify();
    auto it = tracker->in_flight.find(c);
    tracker->answered.push_back(std::move(it->second));
    tracker->in_flight.erase(it);
  });
  return call;
}

void StoreClient::DeferReleases(const std::vector<uint64_t>& lease_ids) {
  if (lease_ids.size() > options_.max_pending_releases) {
    (void)SendReleases(lease_ids);
    return;
  }
  std::vector<uint64_t> now;
  {
    absl::MutexLock l(&pending_mu_);
    if (pending_ids_.size() + lease_ids.size() > options_.max_pending_releases) now.swap(pending_ids_);
    if (pending_ids_.empty()) pending_since_ = SteadyClock()->Now();
    pending_ids_.insert(pending_ids_.end(), lease_ids.begin(), lease_ids.end());
  }
  if (!now.empty()) (void)SendReleases(now);
}

void StoreClient::SettleCarriedReleases(const LeaseCall& call) {
  const auto& carried = call.req.release_lease_ids();
  if (carried.empty() || (call.status.ok() && call.resp.has_released_leases())) return;
  // The store did not take them: the call failed (a call whose answer was lost may have ended
  // them; releasing again is harmless), or the store predates release_lease_ids.
  (void)SendReleases(std::vector<uint64_t>(carried.begin(), carried.end()));
}

void StoreClient::FlushLoop() {
  const absl::Duration delay = absl::Milliseconds(options_.release_delay_ms);
  const auto woken = [](StoreClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->pending_mu_) {
    return c->stopping_ || !c->pending_ids_.empty();
  };
  pending_mu_.Lock();
  while (true) {
    pending_mu_.Await(absl::Condition(+woken, this));
    if (stopping_) break;
    // Sleeps until the oldest waiting id is due, woken early only to stop. Ids taken by a
    // LeaseBlocks call meanwhile leave newer ones (or none), so the deadline is looked at again.
    const absl::Duration left = pending_since_ + delay - SteadyClock()->Now();
    if (left > absl::ZeroDuration()) {
      pending_mu_.AwaitWithTimeout(absl::Condition(&stopping_), left);
      continue;
    }
    std::vector<uint64_t> due;
    due.swap(pending_ids_);
    pending_mu_.Unlock();
    (void)SendReleases(due);
    pending_mu_.Lock();
  }
  pending_mu_.Unlock();
}

absl::Status StoreClient::Delete(const BlockKey& key) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::DeleteRequest req;
  req.set_key(KeyBytes(key));
  vericache::v1::DeleteResponse resp;
  return FromGrpc(stub_->Delete(&ctx, req, &resp));
}

absl::StatusOr<StoreStats> StoreClient::Stats() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  vericache::v1::StatsRequest req;
  vericache::v1::StatsResponse r;
  absl::Status s = FromGrpc(stub_->Stats(&ctx, req, &r));
  if (!s.ok()) return s;
  StoreStats out;
  out.ram_used_bytes = r.ram_used_bytes();
  out.ram_capacity_bytes = r.ram_capacity_bytes();
  out.ram_blocks = r.ram_blocks();
  out.ram_block_bytes = r.ram_block_bytes();
  out.disk_used_bytes = r.disk_used_bytes();
  out.disk_capacity_bytes = r.disk_capacity_bytes();
  out.disk_blocks = r.disk_blocks();
  out.disk_footprint_bytes = r.disk_footprint_bytes();
  out.hits_ram = r.hits_ram();
  out.hits_disk = r.hits_disk();
  out.misses = r.misses();
  out.corrupt_dropped = r.corrupt_blocks_dropped();
  out.puts = r.puts();
  out.ram_evictions = r.ram_evictions();
  out.disk_evictions = r.disk_evictions();
  out.disk_reserve_evictions = r.disk_reserve_evictions();
  out.disk_write_errors = r.disk_write_errors();
  out.disk_writes_failing_ms = r.disk_writes_failing_ms();
  out.disk_full = r.disk_full() != 0;
  return out;
}

}  // namespace vc::cachestore
