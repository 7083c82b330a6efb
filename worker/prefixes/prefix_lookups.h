// Store lookups off the engine's thread. A lookup asks the cache store how much of a prompt's
// prefix it holds: a gRPC call that takes up to the store's timeout when the store does not answer.
// Made on the thread that steps the batch, each one would hold up every sequence in flight; here
// one thread makes them, in the order they are asked, and an engine admits a request once its
// lookup has come back.
#ifndef VC_WORKER_PREFIXES_PREFIX_LOOKUPS_H_
#define VC_WORKER_PREFIXES_PREFIX_LOOKUPS_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/prefixes/prefix_store.h"

namespace vc {

class PrefixLookups {
 public:
  // One prompt's lookup: how many leading `names` (its full blocks) and `cnames` (their compressed
  // variants; none when empty) the store holds. The counts are set before done() turns true.
  class Lookup {
   public:
    std::vector<PrefixName> names, cnames;
    int hit = 0, chit = 0;
    absl::Duration answered;  // SteadyClock() time of the answer
    bool done() const { return done_.HasBeenNotified(); }
    // Waits up to `timeout` for the answer; whether it came.
    bool WaitFor(absl::Duration timeout) const { return done_.WaitForNotificationWithTimeout(timeout); }

   private:
    friend class PrefixLookups;
    absl::Notification done_;
  };

  // `store` must outlive this. Full blocks are looked up as about to be read (read_follows).
  explicit PrefixLookups(PrefixStore* store);
  // Waits for the lookup in progress; the others are not made (nobody waits for them any more).
  ~PrefixLookups();

  // Queues a lookup. Dropping every reference to it before it starts skips it. When no other
  // lookup is queued or under way, waits up to kGrace for the answer: a store that answers at once
  // (within a cluster, a fraction of a millisecond) has the request admitted in the same step, not
  // a batch pass later.
  std::shared_ptr<const Lookup> Start(std::vector<PrefixName> names, std::vector<PrefixName> cnames);
  static constexpr absl::Duration kGrace = absl::Milliseconds(5);
  // The longest an engine with nothing else to run waits for an answer in one step: its caller's
  // loop then comes round (new requests, cancels) and steps it again.
  static constexpr absl::Duration kIdleWait = absl::Milliseconds(50);
  // How long an engine that may not wait, and has nothing to run but sequences waiting on the
  // store, pauses in a step: its caller's loop does not spin while everything waits on the store.
  static constexpr absl::Duration kPoll = absl::Milliseconds(1);

  // Whether an answer is too old to admit a request on: other workers, and this one, publish
  // blocks all the time. An engine asks again for a request that waited this long after it.
  static bool Stale(const Lookup& lookup);
  static constexpr absl::Duration kFreshFor = absl::Seconds(1);

 private:
  void Loop();

  PrefixStore* const store_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Lookup>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a lookup is under way
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace vc

#endif  // VC_WORKER_PREFIXES_PREFIX_LOOKUPS_H_
