// Engine tests of a store that hangs: a lookup or a read is a call to another server, which may take
// its whole timeout, and it must hold up only the request that made it.
#ifndef VC_TESTS_TESTING_HELD_STORE_H_
#define VC_TESTS_TESTING_HELD_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/memory_prefix_store.h"
#include "worker/engines/engine.h"

namespace vc::testing {

struct HeldStoreRun {
  absl::Status step = absl::OkStatus();  // the first failed Step, if any
  bool idle = false;                     // the engine ran until it was idle
  absl::Status first_status = absl::UnknownError("not ended"), second_status = absl::UnknownError("not ended");
  std::vector<int32_t> first_tokens, second_tokens;
  bool first_ended_while_held = false;  // the first request ended while the second's call hung
};

// Runs `first` on `engine` (with a MemoryPrefixStore) until it is admitted, then sets `hold` (the
// store's hold_lookups or hold_reads) and submits `second`, and steps the engine until it is idle.
// `hold` is cleared once the first request has ended, or after 10 s (so that an engine that waits
// for the store on its own thread fails the test rather than hanging it).
inline HeldStoreRun RunWithStoreHeld(Engine& engine, std::atomic<bool>& hold, EngineRequest first,
                                     EngineRequest second) {
  HeldStoreRun run;
  std::atomic<bool> first_done{false}, released{false};
  engine.Submit(std::move(first), [&](absl::Status st, EngineResult r) {
    run.first_status = st;
    run.first_tokens = std::move(r.tokens);
    run.first_ended_while_held = !released;
    first_done = true;
  });
  run.step = engine.Step();  // admits it: nothing else is in flight
  hold = true;
  std::thread releaser([&] {
    for (int i = 0; i < 10000 && !first_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    released = true;
    hold = false;
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

// What such a run must show: both requests ended well with the tokens they should have, the first
// while the second's call to the store hung.
inline void ExpectOnlyTheSecondWaited(const HeldStoreRun& run, const std::vector<int32_t>& want_first,
                                      const std::vector<int32_t>& want_second) {
  ASSERT_TRUE(run.step.ok()) << run.step;
  ASSERT_TRUE(run.idle);
  ASSERT_TRUE(run.first_status.ok()) << run.first_status;
  ASSERT_TRUE(run.second_status.ok()) << run.second_status;
  EXPECT_TRUE(run.first_ended_while_held) << "the batch waited for another request's call to the store";
  EXPECT_EQ(run.first_tokens, want_first);
  EXPECT_EQ(run.second_tokens, want_second);
}

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_HELD_STORE_H_
