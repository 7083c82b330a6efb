// The VeriCache engine: sequences draft from a compressed KV cache held in the worker, the full KV
// is fetched from a FullKvTier while they draft, and one multi-token pass over the full KV verifies
// each draft window. Only verified tokens are emitted: the output equals sequential full-KV
// decoding (GenerateFull) token for token, greedy or sampled.
//
// One engine thread runs the loop below; the tier's thread moves the full KV meanwhile.
//   admit:  a prompt the store holds none of is prefilled on staging memory a chunk a step, one
//           prompt at a time (the others wait their turn, passed by requests the store serves);
//           then its KV is appended to the tier, its compressed copy built, its staging freed
//   draft:  every drafting sequence advances one token in one batched pass over compressed KV;
//           when a sequence starts a window it reserves staging blocks and starts its fetch
//   verify: sequences whose drafts are done and whose fetch has landed are verified together in
//           one batched pass over their full KV; accept the longest matching prefix plus the
//           target's own next token; append the exact K/V of accepted positions to the tier and,
//           compressed, to the compressed cache in place of the drafted entries
//
// With a PrefixStore (the remote-prefix scene), admission looks the prompt's blocks up in the
// store and in the engine's own cache of compressed prefixes. When both have a prefix, the
// sequence forks the compressed copy, runs the rest of its prompt through it (approximately) and
// starts drafting at once; the store's blocks stream in behind, and the first verify pass computes
// the exact K/V of the rest of the prompt together with the drafts. When only the store has it
// (or its blocks would arrive before a draft could be made), the first window has no drafts: its
// verify pass computes the rest of the prompt from the fetched prefix, and the compressed copy is
// built from that. A rest longer than a prefill chunk is computed a chunk a step (one prompt at a
// time) before that pass, so it does not hold up the batch. Blocks the store lacked are published
// once computed. A read that fails (store down, block evicted or corrupt) leaves nothing of the
// prefix trusted: the whole prompt is computed here the same way, so the output never depends on
// the store.
//
// Requests arrive through Submit and the caller drives Step (continuous batching: sequences join
// and leave between passes), or all at once through Generate.
#ifndef VC_WORKER_ENGINES_VERICACHE_ENGINE_H_
#define VC_WORKER_ENGINES_VERICACHE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/compression/compressed_cache.h"
#include "worker/engines/draft_window.h"
#include "worker/engines/engine.h"
#include "worker/engines/requests.h"
#include "worker/prefixes/full_kv_tier.h"
#include "worker/prefixes/prefix_lookups.h"
#include "worker/prefixes/prefix_store.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc {

struct EngineOptions {
  std::string compressor = "kivi:bits=4,group=32,residual=32";
  int draft_window = 0;       // fixed k when > 0; 0 adapts per sequence
  int max_draft_window = 16;  // the adaptive window's cap (a larger fixed k raises it); both capped
                              // by the compressor's MaxRollback
  int block_size = 16;
  // Staging blocks for full KV being prefilled or verified. 0: Generate sizes it for every
  // sequence of the call at once; Submit needs it set.
  int64_t staging_blocks = 0;
  int max_batch = 16;  // sequences in flight
  // Sequences of one tenant in flight (EngineRequest::tenant); 0: max_batch. Below max_batch, one
  // tenant's requests leave the rest of the batch to the others'.
  int max_batch_per_tenant = 0;
  // Keep a sequence's full KV in staging between windows while no other sequence needs the room
  // (its next verify then needs no fetch). False stages it only from fetch to verify: the worker
  // holds compressed KV alone in between (the long-context scene with offloaded full KV).
  bool keep_staged = true;
  // Bytes of compressed prefixes kept for reuse by later requests (with a PrefixStore).
  int64_t prefix_cache_bytes = int64_t{256} << 20;
  // Bytes of the compressed KV that the sequences in flight draft from. Each reserves, when
  // admitted, the most its compressor can hold for its prompt and max_tokens (BytesBound); a
  // request waits while that is taken, and one that needs more than all of it is refused. 0: no
  // limit.
  int64_t compressed_bytes = 0;
  // With a PrefixStore and a compressor that has a block form: publish each prefix's compressed
  // variant too, and admit a prompt whose prefix the store holds in compressed form, but this
  // engine does not, by reading that variant and drafting at once. Off by default: the read runs
  // on the scheduling thread and shares the link with the full blocks, which the first verify
  // pass needs anyway (docs/benchmarks.md: it lengthened time to first token on a slow link).
  bool stored_compressed_prefixes = false;
  // With a PrefixStore: when a request ends, publish the full blocks its output completed too
  // (prompt and output, as one prefix), so that the next turn of a conversation, whose prompt
  // extends this one, finds them in the store. A request cancelled (a stop sequence included) or
  // past its deadline publishes what its exact K/V covers, fetched back from the tier when staging
  // no longer holds it and has the room.
  bool publish_outputs = true;
  // Tests and benchmarks: every sequence takes these windows in turn (each capped) instead of
  // choosing; {0} decodes plainly throughout.
  std::vector<int> window_pattern;
};

// Not thread-safe: one thread calls Submit, Cancel and Step (or Generate).
class VeriCacheEngine final : public Engine {
 public:
  // `model`, `tier` and `prefixes` (optional) must outlive the engine.
  static absl::StatusOr<std::unique_ptr<VeriCacheEngine>> Create(const Model& model, FullKvTier* tier,
                                                                 const EngineOptions& options,
                                                                 PrefixStore* prefixes = nullptr);
  ~VeriCacheEngine() override;

  // Engine (engine.h). Submit needs staging_blocks > 0. A Step runs the batched verify pass of the
  // sequences ready for one and the batched draft step of those drafting; with neither and
  // `may_wait`, it waits for a fetch, or (up to PrefixLookups::kIdleWait) for the store's answer
  // about a queued request. Generate's kResourceExhausted: staging cannot hold one sequence.
  RequestId Submit(EngineRequest request, DoneCallback on_done) override;
  void Cancel(RequestId id) override;
  absl::Status Step(bool may_wait = true) override;
  bool Idle() const override { return requests_.Idle(); }
  size_t queued() const override { return requests_.pending.size(); }
  size_t active() const override { return requests_.active.size(); }
  absl::StatusOr<std::vector<EngineResult>> Generate(absl::Span<const EngineRequest> requests) override;
  // Checks `requests` as Generate does and, with staging_blocks 0, allocates staging for all of
  // them (each prompt, its output and one draft window) unless what is allocated already holds
  // them; returns the blocks the largest one needs. Generate calls it; a caller that times
  // Generate calls it first to keep the allocation out of the timing.
  absl::StatusOr<int64_t> SizeStaging(absl::Span<const EngineRequest> requests);

  const std::string& compressor_spec() const { return spec_; }
  // Compressed prefixes held for reuse, and their bytes.
  size_t cached_prefixes() const { return prefix_index_.size(); }
  // The bytes of compressed prefixes held for reuse, and of compressed KV reserved by the
  // sequences in flight (EngineOptions::compressed_bytes): gauges any thread may read.
  int64_t cached_prefix_bytes() const { return prefix_bytes_.load(std::memory_order_relaxed); }
  int64_t compressed_reserved_bytes() const { return compressed_reserved_.load(std::memory_order_relaxed); }

 private:
  struct Sequence;
  struct CachedPrefix {
    SeqId seq = -1;
    int64_t length = 0;
    int64_t bytes = 0;
    std::list<PrefixName>::iterator lru;
    std::vector<PrefixName> names;  // of its blocks
  };
  VeriCacheEngine(const Model& model, FullKvTier* tier, const EngineOptions& options, PrefixStore* prefixes);
  absl::Status Admit(Sequence& s);
  absl::Status AdmitWithPrefix(Sequence& s, bool* admitted);
  // Prefills the next chunk of a prompt admitted with nothing stored (s.prefilling()); after the
  // last, builds its compressed cache, writes its full KV to the tier, shares its prefix and frees
  // its staging.
  absl::Status PrefillChunk(Sequence& s);
  absl::Status DraftStep(std::vector<Sequence*>& drafting);
  // `staging_for_all`: staging holds every active sequence at once, so a resident one keeps its
  // full KV until its pass (else it is costed as fetching: another sequence may take the room).
  absl::Status StartWindow(Sequence& s, bool staging_for_all);
  // Positions a request's sequence can reach: its prompt and every output token.
  static int64_t MaxPositions(const EngineRequest& r);
  // The compressed KV a request's sequence reserves: the most its cache can hold.
  int64_t CompressedBound(const EngineRequest& r) const;
  // Staging blocks a verify pass of a request's sequence needs at most: its prompt and every
  // output token (windows never pass max_tokens), and one more position.
  int64_t VerifyBlocks(const EngineRequest& r) const;
  // Staging blocks a request's sequence is given when staging is sized for it: its prompt,
  // output and one draft window.
  int64_t StagingBlocks(const EngineRequest& r) const;
  // Lands the fetches of the sequences `ready` for a pass (a failed one: ForgetPrefix), and takes out
  // those whose prompt has more than a prefill chunk left to compute; returns the first of them.
  Sequence* LandReady(std::vector<Sequence*>& ready);
  // Computes the next prefill chunk of the prompt of `s` (resident) exactly, into staging and the
  // tier: a long rest of a prompt is not one verify pass that holds up the batch.
  absl::Status PromptChunk(Sequence& s);
  absl::Status Verify(std::vector<Sequence*>& ready);
  // Forgets the prefix [0, full_len) of `s` that the store (through the tier) failed to deliver:
  // prompt chunks and the verify pass compute it again.
  void ForgetPrefix(Sequence& s);
  // Replaces the compressed cache of `s` with positions [0, length) of its exact K/V in staging.
  absl::Status Rebuild(Sequence& s, int64_t length);
  // Writes positions [from, to) of the exact K/V of `s` in staging to its compressed cache, which
  // holds [0, from), and commits them.
  absl::Status AppendExact(Sequence& s, int64_t from, int64_t to);
  // Frees the staging of `s`, if it holds any.
  void DropStaging(Sequence& s);
  // Brings the tier and the compressed cache of a lagging `s` (plain decoding skipped their
  // upkeep) up to full_len, from its exact K/V in staging.
  absl::Status CatchUp(Sequence& s);
  // CatchUp; on an error, ends `s` with it and returns false.
  bool CatchUpOrEnd(Sequence& s);
  // CatchUpOrEnd, then DropStaging: the tier must hold what staging did before it goes.
  void GiveUpStaging(Sequence& s);
  // Whether a prompt's K/V may stay staged after admission with the upkeep deferred (lag_from 0):
  // staging is kept between windows, and the compressor builds its cache without prompt queries.
  bool DefersUpkeep() const {
    return options_.keep_staged && compressed_->needs() != CompressorNeeds::kPromptQueries;
  }
  // Frees the staging of one resident sequence other than `except` (one mid-window first);
  // false when there is none.
  bool EvictResident(const Sequence* except);
  // staging_->Reserve, evicting resident sequences (not `except`) while it runs out of room, when
  // the free blocks and all theirs would make room enough (else it evicts none and fails).
  absl::Status ReserveStaging(SeqId seq, int64_t length, const Sequence* except);
  // Publishes the blocks of `s` from `from` on and caches its compressed prefix, from exact K/V
  // of `seq` in staging.
  void SharePrefix(Sequence& s, int from, SeqId seq);
  // At the end of `s`: publishes the full blocks of its tokens [0, end) past the prompt's own
  // (options_.publish_outputs), from exact K/V of `seq` in staging.
  void ShareOutput(Sequence& s, int64_t end, SeqId seq);
  // ShareOutput for a sequence cancelled or past its deadline, of what the tier holds exact
  // ([0, full_len)): from staging when it is there or on its way, else the positions past the
  // prompt's blocks fetched back into staging when staging has the room without taking another
  // sequence's (not a prefix attached from the store: what is shared lies past it). Waits for the
  // fetch, a copy from host memory.
  void ShareOutputCutShort(Sequence& s);
  // Waits for s.fetch, which writes (up to) [0, full_len) into `seq` of staging; when it succeeded,
  // commits those positions there, counts its bytes and returns true.
  bool LandFetch(Sequence& s, SeqId seq);
  // Whether `s` is admitted through the PrefixStore (and so shares its blocks).
  bool UsesStore(const Sequence& s) const;
  // Whether admitting `s` prefills its prompt (the store holds none of it, or there is no store),
  // once its lookup is done.
  bool NeedsPrefill(const Sequence& s) const;
  // Whether the store has answered the lookup of s's prompt (true at once without a store), which
  // the first call starts (off this thread); `wait`: waits for the answer.
  bool LookupDone(Sequence& s, bool wait);
  void CachePrefix(absl::Span<const PrefixName> names, SeqId staging_seq);
  void Release(Sequence& s);

  const Model& model_;
  FullKvTier* const tier_;
  PrefixStore* const prefixes_;
  const EngineOptions options_;
  std::unique_ptr<PrefixLookups> lookups_;  // with a PrefixStore
  std::string spec_;
  int64_t max_rollback_ = 0;
  int max_k_ = 1;
  int64_t bytes_per_token_ = 0;  // full K/V of one position
  uint64_t next_key_ = 1;
  std::unique_ptr<CompressedKvCache> compressed_;
  std::unique_ptr<PagedKvCache> staging_;
  DraftCostModel costs_;
  bool verified_since_draft_ = true;  // the next draft step is the first since a verify pass
  RequestQueue<Sequence> requests_;
  // Compressed prefixes by the name of their last block; front of the list = most recent.
  absl::flat_hash_map<PrefixName, CachedPrefix> prefix_index_;
  // Every block of a cached prefix, to the prefix_index_ key of one that holds it (the latest
  // cached): a prompt that shares only the first blocks of a cached prefix drafts from it cut back.
  absl::flat_hash_map<PrefixName, PrefixName> prefix_blocks_;
  std::list<PrefixName> prefix_lru_;
  std::atomic<int64_t> prefix_bytes_ = 0;
  std::atomic<int64_t> compressed_reserved_ = 0;
};

}  // namespace vc

#endif  // VC_WORKER_ENGINES_VERICACHE_ENGINE_H_
