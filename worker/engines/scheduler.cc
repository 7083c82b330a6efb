#include "worker/engines/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace vc {
namespace {

// The counts a worker's stats report, of one request's stats.
void Add(const EngineStats& s, EngineStats* sum) {
  sum->prompt_tokens += s.prompt_tokens;
  sum->emitted += s.emitted;
  sum->prefix_store_tokens += s.prefix_store_tokens;
  sum->prefix_compressed_tokens += s.prefix_compressed_tokens;
  sum->prefix_compressed_store_tokens += s.prefix_compressed_store_tokens;
  sum->recomputed_tokens += s.recomputed_tokens;
  sum->drafted += s.drafted;
  sum->accepted_drafts += s.accepted_drafts;
  sum->verifies += s.verifies;
  sum->plain_verifies += s.plain_verifies;
}

absl::Status ShuttingDown() { return absl::UnavailableError("the worker is shutting down"); }

}  // namespace

void RequestStream::Push(absl::Span<const int32_t> tokens) {
  absl::MutexLock l(&mu_);
  chunks_.emplace_back(tokens.begin(), tokens.end());
}

void RequestStream::Done(absl::Status status, EngineResult result) {
  absl::MutexLock l(&mu_);
  if (done_) return;
  status_ = std::move(status);
  result_ = std::move(result);
  done_ = true;
}

bool RequestStream::Take(absl::Duration timeout, std::vector<int32_t>* tokens) {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](RequestStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                             return s->done_ || !s->chunks_.empty();
                           },
                           this),
                       timeout);
  tokens->clear();
  for (auto& c : chunks_) tokens->insert(tokens->end(), c.begin(), c.end());
  chunks_.clear();
  return done_;
}

absl::Status RequestStream::status() const {
  absl::MutexLock l(&mu_);
  return status_;
}

EngineStats RequestStream::stats() const {
  absl::MutexLock l(&mu_);
  return result_.stats;
}

Scheduler::Scheduler(std::vector<std::unique_ptr<Engine>> engines, SchedulerOptions options)
    : engines_(std::move(engines)), options_(std::move(options)), turned_(SteadyClock()->Now()) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
  for (Item& it : inbox_) it.stream->Done(ShuttingDown(), {});
  engines_.clear();  // before the state their requests' callbacks count in
}

Scheduler::Snapshot Scheduler::totals() const {
  absl::MutexLock l(&mu_);
  return {totals_, tenants_};
}

void Scheduler::StopAdmitting() {
  absl::MutexLock l(&mu_);
  draining_ = true;
}

absl::Duration Scheduler::StalledFor() const {
  absl::MutexLock l(&mu_);
  return totals_.in_flight == 0 ? absl::ZeroDuration() : SteadyClock()->Now() - turned_;
}

bool Scheduler::WaitIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &Scheduler::IdleLocked), timeout);
}

void Scheduler::CountRefused(const std::string& tenant) {
  absl::MutexLock l(&mu_);
  totals_.refused++;
  tenants_[tenant].refused++;
}

void Scheduler::CountEnded(const std::string& tenant, const EngineStats& stats) {
  absl::MutexLock l(&mu_);
  for (Totals* t : {&totals_, &tenants_[tenant]}) {
    t->ended++;
    Add(stats, &t->sum);
  }
}

absl::Status Scheduler::Enqueue(EngineRequest request, size_t engine, std::shared_ptr<RequestStream> stream) {
  if (engine >= engines_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no engine ", engine, "; the worker runs ", engines_.size()));
  }
  absl::MutexLock l(&mu_);
  if (stop_) return ShuttingDown();
  Totals& tenant = tenants_[request.tenant];
  absl::Status refused;
  if (draining_) {
    refused = absl::UnavailableError("the worker is draining before it stops: send the request to another worker");
  } else if (totals_.in_flight >= options_.max_requests) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("the worker holds ", totals_.in_flight, " requests, its limit; retry later"));
  } else if (options_.max_requests_per_tenant > 0 && tenant.in_flight >= options_.max_requests_per_tenant) {
    refused = absl::ResourceExhaustedError(absl::StrCat("the worker holds ", tenant.in_flight, " requests of tenant '",
                                                        request.tenant, "', its limit per tenant; retry later"));
  }
  if (!refused.ok()) {
    totals_.refused++;
    tenant.refused++;
    return refused;
  }
  // An idle loop is waiting for work, not stalled: its time runs from the first request.
  if (totals_.in_flight == 0) turned_ = SteadyClock()->Now();
  totals_.in_flight++;
  tenant.in_flight++;
  inbox_.push_back({std::move(request), engine, std::move(stream)});
  return absl::OkStatus();
}

bool Scheduler::AllIdle() const {
  return std::all_of(engines_.begin(), engines_.end(), [](const auto& e) { return e->Idle(); });
}

void Scheduler::Ended(const std::string& tenant, const absl::Status& status, const EngineStats& stats) {
  absl::MutexLock l(&mu_);
  for (Totals* t : {&totals_, &tenants_.at(tenant)}) {
    t->in_flight--;
    (status.ok() ? t->ended : t->failed)++;
    Add(stats, &t->sum);
  }
}

void Scheduler::Loop() {
  std::vector<Live> live;
  while (true) {
    std::vector<Item> items;
    {
      absl::MutexLock l(&mu_);
      if (AllIdle()) {
        mu_.Await(absl::Condition(
            +[](Scheduler* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || !s->inbox_.empty(); }, this));
      }
      if (stop_) break;
      items.swap(inbox_);
      turned_ = SteadyClock()->Now();
    }
    for (Item& it : items) {
      std::shared_ptr<RequestStream> stream = it.stream;
      std::string tenant = it.request.tenant;
      const RequestId id = engines_[it.engine]->Submit(
          std::move(it.request), [this, stream, tenant = std::move(tenant)](absl::Status st, EngineResult r) {
            // A request cancelled because it reached a stop sequence has ended well.
            if (absl::IsCancelled(st) && stream->stop_requested()) st = absl::OkStatus();
            Ended(tenant, st, r.stats);
            stream->Done(std::move(st), std::move(r));
          });
      live.push_back({it.engine, id, std::move(stream)});
    }
    for (Live& x : live) {
      if (!x.cancel_sent && x.stream->cancel_requested()) {
        engines_[x.engine]->Cancel(x.id);
        x.cancel_sent = true;
      }
    }
    if (options_.before_steps) options_.before_steps();
    for (const auto& e : engines_) {
      if (e->Idle()) continue;
      // An engine with nothing of its own to run waits for the store only while the others have
      // nothing to do either (nothing in flight, nothing waiting to be admitted): one engine's
      // wait must not hold up another's batch.
      const bool others_quiet =
          std::all_of(engines_.begin(), engines_.end(), [&](const auto& o) { return o == e || o->Idle(); });
      e->Step(others_quiet).IgnoreError();  // a failed pass has ended its requests with the error
    }
    // A stream held by the scheduler alone has ended and its caller has gone.
    std::erase_if(live, [](const Live& x) { return x.stream.use_count() == 1; });
  }
  // Shutting down: the engines end what they hold when they go; end it here first so that callers
  // see kUnavailable rather than an engine error.
  for (Live& x : live) x.stream->Done(ShuttingDown(), {});
}

}  // namespace vc
