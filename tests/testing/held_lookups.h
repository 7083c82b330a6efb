// Engine tests of a store whose lookups hang: a lookup is a call to another server, which may take
// its whole timeout, and it must hold up only the request that made it.
#ifndef VC_TESTS_TESTING_HELD_LOOKUPS_H_
#define VC_TESTS_TESTING_HELD_LOOKUPS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/memory_prefix_store.h"
#include "worker/requests.h"

namespace vc::testing {

struct HeldLookupRun {
  absl::Status step = absl::OkStatus();  // the first failed Step, if any
  bool idle = false;                     // the engine ran until it was idle
  absl::Status first_status = absl::UnknownError("not ended"), second_status = absl::UnknownError("not ended");
  std::vector<int32_t> first_tokens, second_tokens;
  bool first_ended_while_held = false;  // the first request ended while the second's lookup hung
};

// Runs `first` on `engine` (VeriCacheEngine or FullKvEngine, with `store` as its PrefixStore) until
// it is admitted, then holds the store's lookups and submits `second`, and steps the engine until it
// is idle. The lookups are let go once the first request has ended, or after 10 s (so that an
// engine that waits for a lookup on its own thread fails the test rather than hanging it).
template <typename Engine>
HeldLookupRun RunWithLookupsHeld(Engine& engine, MemoryPrefixStore& store, EngineRequest first, EngineRequest second) {
  HeldLookupRun run;
  std::atomic<bool> first_done{false}, released{false};
  engine.Submit(std::move(first), [&](absl::Status st, EngineResult r) {
    run.first_status = st;
    run.first_tokens = std::move(r.tokens);
    run.first_ended_while_held = !released;
    first_done = true;
  });
  run.step = engine.Step();  // admits it: nothing else is in flight
  store.hold_lookups = true;
  std::thread releaser([&] {
    for (int i = 0; i < 10000 && !first_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    released = true;
    store.hold_lookups = false;
  });
  engine.Submit(std::move(second), [&](absl::Status st, EngineResult r) {
    run.second_status = st;
    run.second_tokens = std::move(r.tokens);
  });
  for (int i = 0; i < 100000 && run.step.ok() && !engine.Idle(); ++i) run.step = engine.Step();
  run.idle = engine.Idle();
  first_done = true;  // lets the releaser go whatever happened
  releaser.join();
  return run;
}

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_HELD_LOOKUPS_H_
