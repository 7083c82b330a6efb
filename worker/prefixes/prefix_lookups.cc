#include "worker/prefixes/prefix_lookups.h"

#include <algorithm>
#include <utility>

#include "common/clock.h"

namespace vc {

PrefixLookups::PrefixLookups(PrefixStore* store) : store_(store), thread_([this] { Loop(); }) {}

PrefixLookups::~PrefixLookups() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::shared_ptr<const PrefixLookups::Lookup> PrefixLookups::Start(std::vector<PrefixName> names,
                                                                  std::vector<PrefixName> cnames) {
  auto lookup = std::make_shared<Lookup>();
  lookup->names = std::move(names);
  lookup->cnames = std::move(cnames);
  bool idle;
  {
    absl::MutexLock l(&mu_);
    idle = !busy_ && queue_.empty();
    queue_.push_back(lookup);
  }
  if (idle) lookup->done_.WaitForNotificationWithTimeout(kGrace);
  return lookup;
}

bool PrefixLookups::Stale(const Lookup& lookup) {
  return lookup.done() && SteadyClock()->Now() - lookup.answered > kFreshFor;
}

void PrefixLookups::Loop() {
  for (;;) {
    std::shared_ptr<Lookup> lookup;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](PrefixLookups* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->queue_.empty(); },
          this));
      if (stop_) return;
      lookup = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    // The only reference left is this one: its request is gone (cancelled, or refused).
    if (lookup.use_count() > 1) {
      const int n = static_cast<int>(lookup->names.size());
      lookup->hit = std::clamp(store_->Lookup(lookup->names, /*read_follows=*/true), 0, n);
      if (lookup->hit > 0 && !lookup->cnames.empty()) {
        const int c = static_cast<int>(lookup->cnames.size());
        lookup->chit = std::clamp(store_->Lookup(lookup->cnames, /*read_follows=*/false), 0, c);
      }
    }
    lookup->answered = SteadyClock()->Now();
    {
      absl::MutexLock l(&mu_);
      busy_ = false;
    }
    lookup->done_.Notify();
  }
}

}  // namespace vc
