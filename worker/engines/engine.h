// One continuous-batching engine: requests are submitted at any time, and each Step runs one round
// of batched passes over the requests in flight. Both engines implement it:
//   VeriCacheEngine  drafts from compressed KV and verifies against the full KV (vericache_engine.h)
//   FullKvEngine     decodes from the full KV held in worker memory (full_engine.h)
// Each gives the output of sequential full-KV decoding (GenerateFull) token for token, greedy or
// sampled, whatever the batch around a request.
//
// Not thread-safe: one thread calls Submit, Cancel and Step (or Generate). The Scheduler
// (scheduler.h) is that thread for a worker.
#ifndef VC_WORKER_ENGINES_ENGINE_H_
#define VC_WORKER_ENGINES_ENGINE_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engines/requests.h"

namespace vc {

class Engine {
 public:
  virtual ~Engine() = default;

  // Queues a request, checked (ValidateGenerate, and what the engine can hold) when a Step looks
  // at it. `on_done` is called once, on the thread that runs Step, with how it ended.
  virtual RequestId Submit(EngineRequest request, DoneCallback on_done) = 0;
  // Ends a request with kCancelled at the next Step; no-op for an unknown or finished id.
  virtual void Cancel(RequestId id) = 0;
  // One scheduling step: ends cancelled and expired requests, admits queued ones while there is
  // room, and runs one round of batched passes. An error is the engine's own (a failed pass);
  // every request in flight has been ended with it. `may_wait`: with nothing of its own to run,
  // the step may wait a while (for a fetch, or the store's answer about a queued request); a
  // caller that drives other work on the same thread passes false while that work is in flight.
  virtual absl::Status Step(bool may_wait = true) = 0;
  // No request queued or in flight.
  virtual bool Idle() const = 0;
  virtual size_t queued() const = 0;
  virtual size_t active() const = 0;

  // Generates for every request and returns their results in request order: kInvalidArgument for
  // a bad request, kResourceExhausted for one the engine can never hold, both before anything
  // runs. Only when no Submit-ted request is in flight.
  virtual absl::StatusOr<std::vector<EngineResult>> Generate(absl::Span<const EngineRequest> requests) = 0;
};

}  // namespace vc

#endif  // VC_WORKER_ENGINES_ENGINE_H_
