// Conversations in engine tests: a turn cut short by a cancel, and the next turn's prompt.
#ifndef VC_TESTS_TESTING_NEXT_TURN_H_
#define VC_TESTS_TESTING_NEXT_TURN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/requests.h"

namespace vc::testing {

// Runs a request of `prompt` alone on `engine` (VeriCacheEngine or FullKvEngine) until it has sent
// at least `sent` tokens, cancels it, and runs the engine until it is idle. Returns the tokens it
// sent; a test failure is recorded if it did not send that many or did not end cancelled.
template <typename Engine>
std::vector<int32_t> SendThenCancel(Engine& engine, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                    size_t sent) {
  std::vector<int32_t> out;
  absl::Status ended = absl::UnknownError("not ended");
  EngineRequest r = MakeRequest(prompt, o);
  r.on_tokens = [&](absl::Span<const int32_t> t) { out.insert(out.end(), t.begin(), t.end()); };
  const RequestId id = engine.Submit(std::move(r), [&](absl::Status s, EngineResult) { ended = s; });
  for (int i = 0; i < 4000 && out.size() < sent; ++i) EXPECT_TRUE(engine.Step().ok());
  EXPECT_GE(out.size(), sent);
  engine.Cancel(id);
  for (int i = 0; i < 100 && !engine.Idle(); ++i) EXPECT_TRUE(engine.Step().ok());
  EXPECT_TRUE(engine.Idle());
  EXPECT_TRUE(absl::IsCancelled(ended)) << ended;
  return out;
}

// The next turn's prompt: the last turn's prompt, what it sent, and `more` tokens of new text.
inline std::vector<int32_t> NextTurn(const std::vector<int32_t>& prompt, const std::vector<int32_t>& sent, int more) {
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), sent.begin(), sent.end());
  for (int j = 0; j < more; ++j) next.push_back((j * 29 + 3) % 256);
  return next;
}

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_NEXT_TURN_H_
