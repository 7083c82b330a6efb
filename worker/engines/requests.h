// What the continuous-batching engines (VeriCacheEngine, FullKvEngine) take and give back, and the
// request bookkeeping they share: ids, the queue and the batch in flight, cancellation, deadlines,
// and telling a request how it ended.
#ifndef VC_WORKER_ENGINES_REQUESTS_H_
#define VC_WORKER_ENGINES_REQUESTS_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/kv_cache.h"

namespace vc {

struct PromptQueries;  // worker/compressed_cache.h

struct EngineStats {
  int64_t prompt_tokens = 0;
  int64_t drafted = 0;
  int64_t accepted_drafts = 0;  // accepted and emitted (none past the end of the output)
  int64_t verifies = 0;
  // Verify passes that decoded one token from staged full KV without the upkeep of the tier or
  // the compressed cache (plain decoding), and the bulk catch-ups of that upkeep.
  int64_t plain_verifies = 0;
  int64_t catch_ups = 0;
  double catch_up_seconds = 0;
  int64_t emitted = 0;
  int64_t bytes_fetched = 0;
  int64_t compressed_bytes = 0;  // held for the sequence at its end
  int64_t compressed_peak_bytes = 0;      // the most held for it at the end of a step
  int64_t compressed_reserved_bytes = 0;  // reserved for it at admission (its compressor's bound)
  // The remote-prefix scene: prompt positions whose full KV came from the store, whose
  // compressed KV came from the engine's prefix cache, and that were recomputed because a store
  // read failed; blocks this sequence published.
  int64_t prefix_store_tokens = 0;
  int64_t prefix_compressed_tokens = 0;
  int64_t prefix_compressed_store_tokens = 0;  // compressed KV read from the store's variant
  int64_t recomputed_tokens = 0;
  int64_t published_blocks = 0;
  double queue_seconds = 0;        // submit to admission
  double first_token_seconds = 0;  // submit to the first verified token
  double total_seconds = 0;        // submit to the end
  double prefill_seconds = 0;
  double draft_seconds = 0;   // this sequence's share of batched draft passes
  double verify_seconds = 0;  // its share of batched verify passes
  double fetch_wait_seconds = 0;
  double acceptance_rate() const { return drafted ? double(accepted_drafts) / drafted : 0.0; }
  double tokens_per_verify() const { return verifies ? double(emitted) / verifies : 0.0; }
};

// Full KV computed elsewhere for positions [0, prompt.size() - 1) of a request (a benchmark's
// shared prefill). Must stay valid until the request ends.
struct PrefilledKv {
  const PagedKvCache* cache = nullptr;
  SeqId seq = 0;
  // The queries of the prefill's last positions (ending at prompt.size() - 1), for compressors
  // that choose what to keep from them (SnapKV); may be null for the others. Read at admission.
  const PromptQueries* queries = nullptr;
};

struct EngineRequest {
  std::vector<int32_t> prompt;
  GenerateOptions options;  // max_tokens, sampling, stop_at_eos, prefill_chunk
  PrefilledKv prefilled;    // optional: skips the prefill compute
  // Whose prefixes the request may use and share (PrefixStore::Names): set from the authenticated
  // caller, never from what the request says. Empty: the worker's default tenant.
  std::string tenant;
  absl::Time deadline = absl::InfiniteFuture();
  // Optional: verified tokens as they are emitted, on the thread that runs Step.
  std::function<void(absl::Span<const int32_t>)> on_tokens;
  // The last `resumed` tokens of the prompt are output an earlier worker generated (the service's
  // generated_ids): not counted in the stats' prompt_tokens.
  int64_t resumed = 0;
  // The prompt's tokens as the stats count them.
  int64_t prompt_tokens() const { return static_cast<int64_t>(prompt.size()) - resumed; }
};

inline EngineRequest MakeRequest(std::vector<int32_t> prompt, const GenerateOptions& options,
                                 PrefilledKv prefilled = {}) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.options = options;
  r.prefilled = prefilled;
  return r;
}

struct EngineResult {
  std::vector<int32_t> tokens;
  EngineStats stats;
};

using RequestId = int64_t;
// Called once per request, on the thread that runs Step: OK with every token, or why it ended
// (kInvalidArgument, kCancelled, kDeadlineExceeded, kResourceExhausted, or an engine error), with
// the tokens emitted until then.
using DoneCallback = std::function<void(absl::Status, EngineResult)>;

// What an engine keeps of every request; its sequence type derives from this.
struct QueuedRequest {
  RequestId id = 0;
  EngineRequest request;
  DoneCallback on_done;
  absl::Duration submitted;  // SteadyClock() time
  EngineResult result;
  bool cancelled = false;
  bool checked = false;  // passed the engine's check while queued
  bool done = false;     // generated what it was asked for, or ended early with `failed`
  absl::Status failed;   // why it ended early, reported when it is taken out as done
  int passed = 0;        // requests admitted ahead of this one while it waited for room
};

// What an engine makes of a queued request it tries to admit (RequestQueue::AdmitInOrder).
enum class Admission {
  kAdmitted,  // it joins the batch
  kWait,      // it does not fit yet and stays queued
  kLater,     // its turn has not come (it waits for another's): it stays queued, and requests that
              // pass it meanwhile count for nothing
  kRefused,   // it is taken out; the engine has told it why
};

// Submitted requests (`pending`, in order) and the batch in flight (`active`) of sequences of type
// Seq (derived from QueuedRequest). Requests that end are taken out and handed back, so their
// callbacks run after the walk over the queues: a callback may submit or cancel.
template <typename Seq>
class RequestQueue {
 public:
  struct Ended {
    std::unique_ptr<Seq> seq;
    absl::Status why;
  };

  // Queues a request and returns its sequence for the engine to fill in.
  Seq& Add(EngineRequest request, DoneCallback on_done) {
    auto s = std::make_unique<Seq>();
    s->id = next_id_++;
    s->request = std::move(request);
    s->on_done = std::move(on_done);
    s->submitted = SteadyClock()->Now();
    s->result.stats.prompt_tokens = s->request.prompt_tokens();
    pending.push_back(std::move(s));
    return *pending.back();
  }

  void Cancel(RequestId id) {
    for (auto& s : pending) s->cancelled |= s->id == id;
    for (auto& s : active) s->cancelled |= s->id == id;
  }

  // Takes out the queued requests that were cancelled, are past their deadline, or fail `check`
  // (const Seq& -> absl::Status, run once per request), and the requests in flight that were
  // cancelled or are past their deadline; `leave(Seq&)` runs on each of the latter as it goes.
  template <typename Check, typename Leave>
  std::vector<Ended> TakeEnded(absl::Time now, Check check, Leave leave) {
    std::vector<Ended> ended;
    for (auto it = pending.begin(); it != pending.end();) {
      Seq& s = **it;
      absl::Status why = s.cancelled                ? absl::CancelledError("request cancelled")
                         : now > s.request.deadline ? absl::DeadlineExceededError("deadline passed while queued")
                         : s.checked                ? absl::OkStatus()
                                                    : check(s);
      if (why.ok()) {
        s.checked = true;
        ++it;
        continue;
      }
      ended.push_back({std::move(*it), std::move(why)});
      it = pending.erase(it);
    }
    for (auto it = active.begin(); it != active.end();) {
      Seq& s = **it;
      if (!s.cancelled && now <= s.request.deadline) {
        ++it;
        continue;
      }
      leave(s);
      ended.push_back({std::move(*it), s.cancelled ? absl::CancelledError("request cancelled")
                                                   : absl::DeadlineExceededError("deadline passed while generating")});
      it = active.erase(it);
    }
    return ended;
  }

  // Takes out every request in flight that is done (reported as its `failed`, OK unless it ended
  // early), or all of them with `error`; `leave` runs on each.
  template <typename Leave>
  std::vector<Ended> TakeFinished(const absl::Status& error, Leave leave) {
    std::vector<Ended> ended;
    for (auto it = active.begin(); it != active.end();) {
      if (error.ok() && !(*it)->done) {
        ++it;
        continue;
      }
      leave(**it);
      absl::Status why = error.ok() ? (*it)->failed : error;
      ended.push_back({std::move(*it), std::move(why)});
      it = active.erase(it);
    }
    return ended;
  }

  // Tells a request how it ended: its total time, then its callback (once).
  static void Tell(QueuedRequest& s, absl::Status status) {
    s.result.stats.total_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - s.submitted);
    if (s.on_done) s.on_done(std::move(status), std::move(s.result));
    s.on_done = nullptr;
  }
  static void TellAll(std::vector<Ended>& ended) {
    for (Ended& e : ended) Tell(*e.seq, std::move(e.why));
    ended.clear();
  }

  // Admits queued requests in order while fewer than `max_active` are in flight, by
  // try_admit(Seq&) -> Admission. One that has to wait does not hold up later ones that fit: they
  // pass it, kMaxPasses of them in all (across calls) at most; then nothing passes it until it is
  // admitted. At most `max_waiting_tried` waiting requests are tried per call. One told kLater is
  // passed freely and not counted as tried. With `max_active_per_tenant` (0: none), a request of a
  // tenant with that many in flight is not tried (as if told kLater), so that one tenant's long
  // requests leave room in the batch for the others'.
  template <typename TryAdmit>
  void AdmitInOrder(size_t max_active, int max_waiting_tried, TryAdmit try_admit, size_t max_active_per_tenant = 0) {
    constexpr int kMaxPasses = 8;
    int waiting_tried = 0;
    int budget = kMaxPasses;  // admissions that may still pass the requests waiting before i
    std::vector<const Seq*> later;  // told kLater in this call, or over its tenant's share
    std::map<std::string, size_t> in_flight;  // by tenant, with max_active_per_tenant only
    if (max_active_per_tenant > 0) {
      for (const auto& a : active) in_flight[a->request.tenant]++;
    }
    for (size_t i = 0; i < pending.size() && active.size() < max_active;) {
      if (i > later.size() && budget <= 0) break;
      Seq& s = *pending[i];
      const bool over_share = max_active_per_tenant > 0 && in_flight[s.request.tenant] >= max_active_per_tenant;
      const Admission a = over_share ? Admission::kLater : try_admit(s);
      if (a == Admission::kLater) {
        later.push_back(&s);
        ++i;
        continue;
      }
      if (a == Admission::kWait) {
        budget = std::min(budget, kMaxPasses - s.passed);
        if (budget <= 0 || ++waiting_tried >= max_waiting_tried) break;
        ++i;
        continue;
      }
      std::unique_ptr<Seq> owned = std::move(pending[i]);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      if (a == Admission::kRefused) continue;
      bool passed = false;  // a request that was waiting for room
      for (size_t j = 0; j < i; ++j) {
        if (std::find(later.begin(), later.end(), pending[j].get()) != later.end()) continue;
        pending[j]->passed++;
        passed = true;
      }
      if (passed) --budget;
      if (max_active_per_tenant > 0) in_flight[owned->request.tenant]++;
      active.push_back(std::move(owned));
    }
  }

  bool Idle() const { return pending.empty() && active.empty(); }

  std::deque<std::unique_ptr<Seq>> pending;
  std::vector<std::unique_ptr<Seq>> active;

 private:
  RequestId next_id_ = 1;
};

// Submits every request to `engine` (a VeriCacheEngine or a FullKvEngine) and steps it until it
// is idle. Returns the results in request order, or the first error a request ended with, or the
// engine's own (the requests still queued then end with kCancelled).
template <typename Engine>
absl::StatusOr<std::vector<EngineResult>> RunToCompletion(Engine& engine, absl::Span<const EngineRequest> requests) {
  std::vector<EngineResult> out(requests.size());
  absl::Status first_error;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    ids.push_back(engine.Submit(requests[i], [&out, &first_error, i](absl::Status st, EngineResult r) {
      if (!st.ok() && first_error.ok()) first_error = st;
      out[i] = std::move(r);
    }));
  }
  while (!engine.Idle()) {
    absl::Status st = engine.Step();
    if (!st.ok()) {
      for (int64_t id : ids) engine.Cancel(id);
      while (!engine.Idle()) engine.Step().IgnoreError();
      return st;
    }
  }
  if (!first_error.ok()) return first_error;
  return out;
}

}  // namespace vc

#endif  // VC_WORKER_ENGINES_REQUESTS_H_
