// Conversations in engine tests: a turn cut short by a cancel, and the next turn.
#ifndef VC_TESTS_TESTING_NEXT_TURN_H_
#define VC_TESTS_TESTING_NEXT_TURN_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/engines/engine.h"

namespace vc::testing {

// Runs a request of `prompt` alone on `engine` until it has sent at least `sent` tokens, cancels it,
// and runs the engine until it is idle. Returns the tokens it sent; a test failure is recorded if
// it did not send that many or did not end cancelled.
inline std::vector<int32_t> SendThenCancel(Engine& engine, const std::vector<int32_t>& prompt, const GenerateOptions& o,
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

// A conversation's next turn after a cancelled one: SendThenCancel(`sent`), then a request of
// `next` (the prompt, what was sent, and `more` tokens of new text) for `next_tokens` tokens.
struct NextTurnRun {
  std::vector<int32_t> sent;  // by the cancelled turn
  std::vector<int32_t> next;  // the next turn's prompt
  GenerateOptions options;    // the next turn's
  EngineResult result;        // of the next turn
};
inline NextTurnRun CancelThenNextTurn(Engine& engine, const std::vector<int32_t>& prompt, GenerateOptions o, size_t sent,
                               int more, int next_tokens) {
  NextTurnRun run;
  run.sent = SendThenCancel(engine, prompt, o, sent);
  run.next = prompt;
  run.next.insert(run.next.end(), run.sent.begin(), run.sent.end());
  for (int j = 0; j < more; ++j) run.next.push_back((j * 29 + 3) % 256);
  o.max_tokens = next_tokens;
  run.options = o;
  auto got = engine.Generate({MakeRequest(run.next, o)});
  EXPECT_TRUE(got.ok()) << got.status();
  if (got.ok()) run.result = std::move((*got)[0]);
  return run;
}

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_NEXT_TURN_H_
