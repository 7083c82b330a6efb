// The full-KV baseline engine: continuous batching over a paged cache that holds the full KV of
// every sequence in flight in the worker's own memory. It is what the VeriCache engine is compared
// with, and the worker's `mode=full` path. Its output equals sequential full-KV decoding
// (GenerateFull) token for token, greedy or sampled, whatever the batch around a sequence.
//
// Each Step runs one forward pass over every sequence in flight (chunked prefill, as in Sarathi):
// a sequence still in its prompt contributes its next prefill_chunk prompt tokens, a decoding one
// its last token. The pass that computes a prompt's last position yields its first token, so long
// prompts never stall the decoding sequences beside them for more than one chunk per step.
//
// Admission reserves KV for the whole request (prompt + max_tokens) at once, so a sequence never
// runs out of memory mid-generation: queued requests wait, first come first served, until the pool
// can hold the one at the head of the queue.
//
// With a PrefixStore and fetch_prefix (the "fetch the full prefix, then decode" baseline that
// LMCache-style systems use), admission looks the prompt's blocks up in the store and reads the
// stored prefix into the sequence's blocks before any compute; the rest of the prompt is
// prefilled. A read that fails is recomputed, which gives the same bits (the kernels are
// batch-invariant). Blocks the store lacked are published once the prompt is computed, and those
// its output completed when it ends (publish_outputs). Without
// fetch_prefix (the "recompute" baseline) the store is neither read nor written.
#ifndef VC_WORKER_ENGINES_FULL_ENGINE_H_
#define VC_WORKER_ENGINES_FULL_ENGINE_H_

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engines/engine.h"
#include "worker/engines/requests.h"
#include "worker/prefixes/prefix_lookups.h"
#include "worker/prefixes/prefix_store.h"
#include "worker/runtime/kv_cache.h"
#include "worker/runtime/model.h"

namespace vc {

struct FullEngineOptions {
  int block_size = 16;
  // Blocks of the worker's KV memory: the full KV of every sequence in flight lives here.
  // Required > 0.
  int64_t kv_blocks = 0;
  int max_batch = 16;  // sequences in flight
  // Sequences of one tenant in flight (EngineRequest::tenant); 0: max_batch. Below max_batch, one
  // tenant's requests leave the rest of the batch to the others'.
  int max_batch_per_tenant = 0;
  // With a PrefixStore: read stored prefixes instead of computing them (and publish the blocks
  // the store lacked). False leaves the store alone and recomputes every prompt.
  bool fetch_prefix = true;
  // With fetch_prefix: when a request ends (at EOS, max_tokens, a cancel or its deadline), publish
  // the full blocks its output completed too (EngineOptions::publish_outputs).
  bool publish_outputs = true;
};

// Not thread-safe: one thread calls Submit, Cancel and Step (or Generate).
class FullKvEngine final : public Engine {
 public:
  // kInvalidArgument for options out of range (kv_blocks, block_size, max_batch < 1). `model` and
  // `prefixes` (optional) must outlive the engine.
  static absl::StatusOr<std::unique_ptr<FullKvEngine>> Create(const Model& model, const FullEngineOptions& options,
                                                              PrefixStore* prefixes = nullptr);
  ~FullKvEngine() override;

  // Engine (engine.h). The stats filled in are prompt_tokens, emitted, the prefix counters,
  // bytes_fetched and the timings (queue, prefill, first token, total). `request.prefilled`, if
  // set, supplies the K/V of positions [0, prompt.size() - 1); only the last prompt token is then
  // computed. A Step admits queued requests in order while max_batch and the pool allow (one
  // waiting for room is passed by 8 later ones that fit, at most), then runs one batched pass over
  // every sequence whose stored prefix, if it reads one, has arrived; with `may_wait` it may wait
  // for the first to arrive when no other sequence can run. Generate returns the first error a
  // request ended with.
  RequestId Submit(EngineRequest request, DoneCallback on_done) override;
  void Cancel(RequestId id) override;
  absl::Status Step(bool may_wait = true) override;
  bool Idle() const override { return requests_.Idle(); }
  size_t queued() const override { return requests_.pending.size(); }
  size_t active() const override { return requests_.active.size(); }
  absl::StatusOr<std::vector<EngineResult>> Generate(absl::Span<const EngineRequest> requests) override;

  // Free blocks of the KV pool (all of them when idle).
  int64_t free_blocks() const { return cache_.free_blocks(); }

 private:
  struct Sequence;
  FullKvEngine(const Model& model, const FullEngineOptions& options, PrefixStore* prefixes);
  // Blocks a request reserves at admission: its prompt plus max_tokens positions.
  int64_t BlocksFor(const EngineRequest& r) const;
  // Why a queued request cannot run (OK when it can).
  absl::Status Check(const EngineRequest& r) const;
  // Reserves the sequence's KV and brings in what need not be computed: the request's own
  // prefilled K/V, or a stored prefix.
  void Admit(Sequence& s);
  // Whether the store has answered the lookup of s's prompt (true at once when s does not use the
  // store), which the first call starts (off this thread); `wait`: waits for the answer.
  bool LookupDone(Sequence& s, bool wait);
  // Starts reading the stored prefix that s's lookup found into its sequence (off this thread).
  void FetchPrefix(Sequence& s);
  // Once s.read is done: commits what it brought, or counts it as to be recomputed.
  void LandRead(Sequence& s);
  // Frees the blocks of sequences that left while their reads were under way, once those landed.
  void ReleaseReadsLanded();
  absl::Status Pass();
  // After the pass that completed the prompt of `s`: shares the blocks the store lacked.
  void PromptDone(Sequence& s);
  // At the end of `s`: publishes the full blocks of its tokens past the prompt's own
  // (options_.publish_outputs).
  void ShareOutput(Sequence& s);
  // Whether `s` reads its prompt's prefix from the PrefixStore (and so shares its blocks).
  bool UsesStore(const Sequence& s) const;
  // Frees what a sequence holds in the pool as it leaves the batch.
  void Leave(Sequence& s);

  // Constant after construction.
  const Model& model_;
  PrefixStore* const prefixes_;
  const FullEngineOptions options_;

  PagedKvCache cache_;
  // Reads still writing into the blocks of sequences that left (cancelled, past their deadline).
  struct Reading {
    SeqId seq;
    std::future<absl::Status> read;
  };
  std::vector<Reading> reading_;
  std::unique_ptr<PrefixLookups> lookups_;  // with a PrefixStore and fetch_prefix
  RequestQueue<Sequence> requests_;
};

}  // namespace vc

#endif  // VC_WORKER_ENGINES_FULL_ENGINE_H_
