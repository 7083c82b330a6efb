// The scheduler of a worker: one thread that owns its engines and steps them while any request is
// in flight. Callers (the gRPC handlers) queue requests from any thread, each with a RequestStream
// that carries its verified tokens back and its cancellation in; the scheduler admits what is
// queued between rounds of engine steps, forwards cancellations, and counts what ended, in all
// and per tenant.
//
// Limits: at most max_requests queued or in flight, and max_requests_per_tenant of one tenant;
// beyond them a request is refused (kResourceExhausted). StopAdmitting drains: new requests are
// refused (kUnavailable) while those admitted run to their end.
#ifndef VC_WORKER_ENGINES_SCHEDULER_H_
#define VC_WORKER_ENGINES_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/engines/engine.h"
#include "worker/engines/requests.h"

namespace vc {

// What one request's caller and the scheduler share. Thread-safe.
class RequestStream {
 public:
  // The scheduler's side: tokens as they are verified, then the end.
  void Push(absl::Span<const int32_t> tokens);
  // The first end counts: at shutdown the scheduler ends a request (kUnavailable) before its
  // engine does, and the caller must not see the engine's status instead.
  void Done(absl::Status status, EngineResult result);

  // The caller's side. Waits up to `timeout` for tokens or the end; takes the tokens. True once
  // done and drained.
  bool Take(absl::Duration timeout, std::vector<int32_t>* tokens);
  absl::Status status() const;
  EngineStats stats() const;
  void RequestCancel() { cancel_.store(true); }
  bool cancel_requested() const { return cancel_.load(); }
  // Ends the request because its output reached a stop sequence: a cancel that ends it well (its
  // status is OK).
  void RequestStop() {
    stopped_.store(true);
    cancel_.store(true);
  }
  bool stop_requested() const { return stopped_.load(); }

 private:
  mutable absl::Mutex mu_;
  std::deque<std::vector<int32_t>> chunks_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  EngineResult result_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancel_{false};
  std::atomic<bool> stopped_{false};
};

struct SchedulerOptions {
  // Requests queued or in flight; beyond this a request is refused. At least 1.
  int max_requests = 256;
  // The same for one tenant's requests; 0: only max_requests.
  int max_requests_per_tenant = 0;
  // Tests only: called on the scheduler thread before each round of engine steps (a test stalls
  // the scheduler in it). Null: nothing.
  std::function<void()> before_steps;
};

// Thread-safe.
class Scheduler {
 public:
  // Takes the engines (not null), which Enqueue names by their index here, and starts the
  // scheduler thread.
  Scheduler(std::vector<std::unique_ptr<Engine>> engines, SchedulerOptions options);
  // Stops the thread; ends every request still queued or in flight with kUnavailable.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `request` for engines[engine], streaming into `stream`. kResourceExhausted at a limit,
  // kUnavailable while draining or shutting down, kInvalidArgument for an engine out of range; the
  // request is counted as refused then (but for the last two).
  absl::Status Enqueue(EngineRequest request, size_t engine, std::shared_ptr<RequestStream> stream);
  // Counts a request refused before it was queued.
  void CountRefused(const std::string& tenant);
  // Counts a request that ended without reaching an engine (a call resumed past its end of
  // sequence): ended, with `stats` summed.
  void CountEnded(const std::string& tenant, const EngineStats& stats);

  // Requests ended, failed and refused so far, with their stats summed, and those in flight: the
  // worker's and each tenant's.
  struct Totals {
    int64_t ended = 0, failed = 0, refused = 0, in_flight = 0;
    EngineStats sum;
  };
  struct Snapshot {
    Totals all;
    std::map<std::string, Totals> tenants;
  };
  Snapshot totals() const;

  // From now on, requests are refused with kUnavailable; those queued or in flight run on.
  void StopAdmitting();
  // How long since the loop last came round while requests are queued or in flight; zero when
  // there are none.
  absl::Duration StalledFor() const;
  // Whether no request is queued or in flight, waiting up to `timeout` for it.
  bool WaitIdle(absl::Duration timeout);

 private:
  struct Item {
    EngineRequest request;
    size_t engine;
    std::shared_ptr<RequestStream> stream;
  };
  struct Live {
    size_t engine;
    RequestId id;
    std::shared_ptr<RequestStream> stream;
    bool cancel_sent = false;
  };

  void Loop();
  // Runs on the scheduler thread only: the engines are its alone.
  bool AllIdle() const;
  void Ended(const std::string& tenant, const absl::Status& status, const EngineStats& stats);
  bool IdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return totals_.in_flight == 0; }

  // Set at construction; the engines are touched by the scheduler thread only.
  std::vector<std::unique_ptr<Engine>> engines_;
  const SchedulerOptions options_;

  mutable absl::Mutex mu_;
  absl::Duration turned_ ABSL_GUARDED_BY(mu_);  // SteadyClock() time the loop last came round
  std::vector<Item> inbox_ ABSL_GUARDED_BY(mu_);
  Totals totals_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Totals> tenants_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace vc

#endif  // VC_WORKER_ENGINES_SCHEDULER_H_
