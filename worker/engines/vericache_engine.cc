#include "worker/engines/vericache_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "worker/compression/lossy_decoder.h"
#include "worker/compression/query_recorder.h"
#include "worker/compression/registry.h"
#include "worker/engines/draft_window.h"

namespace vc {

struct VeriCacheEngine::Sequence : QueuedRequest {
  TierKey key = 0;
  SeqId cseq = -1;  // in the compressed cache
  SeqId sseq = -1;  // in staging, while a fetch or verify needs it, or while resident
  // Staging still holds the exact K/V of [0, full_len) from the last verify pass: the next
  // verify needs no fetch. Given up whenever another sequence needs the room.
  bool resident() const { return sseq >= 0 && fetch == nullptr; }
  // prompt + emitted. Positions [0, full_len) have exact K/V in the tier; the compressed cache
  // holds [0, size - 1), approximately beyond full_len until the next verify.
  std::vector<int32_t> tokens;
  int64_t full_len = 0;
  // Plain decoding (windows of no drafts while resident) skips the upkeep of the tier and the
  // compressed cache: [lag_from, full_len) is exact in staging alone, and CatchUp brings both up
  // to date in bulk before drafting resumes or staging is given up. -1: nothing lags.
  int64_t lag_from = -1;
  bool lagging() const { return lag_from >= 0; }
  std::vector<PrefixName> names;  // of the prompt's full blocks, with a PrefixStore
  int publish_from = -1;          // blocks [publish_from, names.size()) to share after a verify
  // The compressed variants' names (empty when the compressor has none) and those to share.
  std::vector<PrefixName> cnames;
  int cpublish_from = -1;
  std::shared_ptr<const PrefixLookups::Lookup> lookup;  // of names and cnames, once started
  // The compressed cache holds positions of the prompt computed from compressed KV (drafting began
  // from a shorter compressed prefix): the first verify pass rebuilds it from the exact K/V.
  bool approximate_prompt = false;
  int generated = 0;
  int k = -1;  // current window; -1 between windows
  // The sequence's shares of the current window's steps, and whether it fetched for it.
  double window_seconds = 0;
  bool window_fetched = false;
  int first_window = -1;  // >= 0: the first window's size, chosen at admission
  std::vector<int32_t> drafts;
  std::shared_ptr<FetchHandle> fetch;
  absl::Duration fetch_start;  // SteadyClock() time
  DraftWindow window{0, 1};
  // A prompt with nothing stored is prefilled into staging (`pseq`) a chunk a step, so that the
  // batch in flight streams on meanwhile: [0, prefilled) of its [0, v() - 1) are done. `recorder`
  // keeps the last queries for a compressor that chooses by them.
  SeqId pseq = -1;
  int64_t prefilled = 0;
  std::unique_ptr<QueryRecorder> recorder;
  int64_t creserved = 0;  // of the engine's compressed-KV bytes, from admission to Release
  bool prefilling() const { return pseq >= 0; }
  // Staging holds a prompt whose rest is being computed a chunk a step (PromptChunk): given up,
  // it would be fetched again, its stored prefix included, for every chunk.
  bool computing_prompt() const { return sseq >= 0 && v() - 1 - full_len > request.options.prefill_chunk; }
  int64_t v() const { return static_cast<int64_t>(tokens.size()); }

  // After a failed admission and Release: back to the state Submit left, to be admitted again.
  void ResetAdmission() {
    result.stats = EngineStats{};
    result.stats.prompt_tokens = request.prompt_tokens();
    full_len = 0;
    lag_from = -1;
    publish_from = -1;
    cpublish_from = -1;
    // names, cnames and their lookup stay: asked again once the answer is stale
    // (PrefixLookups::Stale), not at every try of a request that waits for room.
    first_window = -1;
    approximate_prompt = false;
  }
};

VeriCacheEngine::VeriCacheEngine(const Model& model, FullKvTier* tier, const EngineOptions& options,
                                 PrefixStore* prefixes)
    : model_(model),
      tier_(tier),
      prefixes_(prefixes),
      options_(options),
      lookups_(prefixes != nullptr ? std::make_unique<PrefixLookups>(prefixes) : nullptr) {}

VeriCacheEngine::~VeriCacheEngine() {
  // Fetches in flight write into staging: let them land before it goes.
  for (auto& s : requests_.active) {
    if (s->fetch != nullptr) s->fetch->Wait().IgnoreError();
  }
}

absl::StatusOr<std::unique_ptr<VeriCacheEngine>> VeriCacheEngine::Create(const Model& model, FullKvTier* tier,
                                                                         const EngineOptions& options,
                                                                         PrefixStore* prefixes) {
  if (options.block_size < 1 || options.max_batch < 1 || options.max_batch_per_tenant < 0 || options.max_draft_window < 1 ||
      options.draft_window < 0 || options.staging_blocks < 0 || options.prefix_cache_bytes < 0 ||
      options.compressed_bytes < 0) {
    return absl::InvalidArgumentError("engine options out of range");
  }
  const KvLayout layout = model.kv_layout(options.block_size);
  std::unique_ptr<VeriCacheEngine> e(new VeriCacheEngine(model, tier, options, prefixes));
  VC_ASSIGN_OR_RETURN(e->compressed_, MakeCompressedKvCache(options.compressor, layout, model.config().num_heads));
  e->spec_ = e->compressed_->spec();
  e->max_rollback_ = e->compressed_->MaxRollback();
  if (e->max_rollback_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat("compressor ", e->spec_, " cannot roll back a single draft"));
  }
  // A fixed window past the adaptive one's cap raises it: asked for, it is what runs.
  const int cap = options.draft_window > 0 ? std::max(options.max_draft_window, options.draft_window)
                                           : options.max_draft_window;
  e->max_k_ = static_cast<int>(std::min<int64_t>(cap, e->max_rollback_));
  e->bytes_per_token_ = layout.bytes_per_token();
  if (options.staging_blocks > 0) e->staging_ = std::make_unique<PagedKvCache>(layout, options.staging_blocks);
  return e;
}

RequestId VeriCacheEngine::Submit(EngineRequest request, DoneCallback on_done) {
  Sequence& s = requests_.Add(std::move(request), std::move(on_done));
  s.key = next_key_++;
  s.tokens = s.request.prompt;
  s.window = DraftWindow(options_.draft_window, max_k_, options_.window_pattern);
  return s.id;
}

void VeriCacheEngine::Cancel(RequestId id) { requests_.Cancel(id); }

void VeriCacheEngine::Release(Sequence& s) {
  if (s.fetch != nullptr) s.fetch->Wait().IgnoreError();  // it writes into staging
  s.fetch.reset();
  DropStaging(s);
  s.recorder.reset();
  if (s.pseq >= 0) staging_->FreeSequence(s.pseq);
  s.pseq = -1;
  s.prefilled = 0;
  if (s.cseq >= 0) {
    EngineStats& st = s.result.stats;
    st.compressed_bytes = compressed_->Bytes(s.cseq);
    st.compressed_peak_bytes = std::max(st.compressed_peak_bytes, st.compressed_bytes);
    compressed_->FreeSequence(s.cseq);
  }
  s.cseq = -1;
  compressed_reserved_ -= s.creserved;
  s.creserved = 0;
  tier_->Erase(s.key);
}

void VeriCacheEngine::CachePrefix(absl::Span<const PrefixName> names, SeqId staging_seq) {
  if (names.empty() || options_.prefix_cache_bytes == 0 || compressed_->needs() == CompressorNeeds::kPromptQueries) {
    return;
  }
  auto it = prefix_index_.find(names.back());
  if (it != prefix_index_.end()) {
    prefix_lru_.splice(prefix_lru_.begin(), prefix_lru_, it->second.lru);
    return;
  }
  const int64_t length = static_cast<int64_t>(names.size()) * prefixes_->block_tokens();
  const SeqId seq = compressed_->NewSequence();
  if (!compressed_->BuildFrom(seq, *staging_, staging_seq, length, nullptr).ok()) {
    compressed_->FreeSequence(seq);
    return;
  }
  CachedPrefix c{seq, length, compressed_->Bytes(seq), {}, {names.begin(), names.end()}};
  prefix_lru_.push_front(names.back());
  c.lru = prefix_lru_.begin();
  prefix_bytes_ += c.bytes;
  for (const PrefixName& b : names) prefix_blocks_[b] = names.back();
  prefix_index_[names.back()] = std::move(c);
  while (prefix_bytes_ > options_.prefix_cache_bytes && !prefix_lru_.empty()) {
    auto victim = prefix_index_.find(prefix_lru_.back());
    prefix_bytes_ -= victim->second.bytes;
    compressed_->FreeSequence(victim->second.seq);
    for (const PrefixName& b : victim->second.names) {
      auto it = prefix_blocks_.find(b);
      if (it != prefix_blocks_.end() && it->second == victim->first) prefix_blocks_.erase(it);
    }
    prefix_index_.erase(victim);
    prefix_lru_.pop_back();
  }
}

void VeriCacheEngine::SharePrefix(Sequence& s, int from, SeqId seq) {
  const int to = static_cast<int>(s.names.size());
  if (from < to) {
    prefixes_->Publish(s.names, from, to, *staging_, seq);
    s.result.stats.published_blocks += to - from;
  }
  // cnames, when there are any, name the same blocks as names.
  if (!s.cnames.empty() && s.cpublish_from >= 0 && s.cpublish_from < to) {
    prefixes_->PublishCompressed(s.cnames, s.cpublish_from, to, *compressed_, *staging_, seq);
  }
  s.cpublish_from = -1;
  CachePrefix(s.names, seq);
}

bool VeriCacheEngine::NeedsPrefill(const Sequence& s) const {
  if (s.request.prefilled.cache != nullptr) return false;
  return !UsesStore(s) || s.lookup == nullptr || s.lookup->hit == 0;  // (LookupDone came back true)
}

bool VeriCacheEngine::UsesStore(const Sequence& s) const {
  return prefixes_ != nullptr && compressed_->needs() != CompressorNeeds::kPromptQueries &&
         s.request.prefilled.cache == nullptr;
}

bool VeriCacheEngine::LookupDone(Sequence& s, bool wait) {
  if (!UsesStore(s)) return true;
  if (s.lookup != nullptr && PrefixLookups::Stale(*s.lookup)) s.lookup.reset();  // waited long since
  if (s.lookup == nullptr) {
    const auto prompt = absl::MakeConstSpan(s.tokens).first(static_cast<size_t>(s.v() - 1));
    s.names = prefixes_->Names(s.request.tenant, prompt);
    if (options_.stored_compressed_prefixes && !s.names.empty()) {
      s.cnames = prefixes_->CompressedNames(s.request.tenant, prompt, compressed_->block_format());
    }
    s.lookup = lookups_->Start(s.names, s.cnames);
  }
  if (wait) s.lookup->WaitFor(PrefixLookups::kIdleWait);
  return s.lookup->done();
}

void VeriCacheEngine::ShareOutput(Sequence& s, int64_t end, SeqId seq) {
  if (!UsesStore(s) || !options_.publish_outputs) return;
  s.result.stats.published_blocks +=
      PublishBlocksPast(*prefixes_, s.request.tenant, absl::MakeConstSpan(s.tokens).first(static_cast<size_t>(end)),
                        static_cast<int>(s.names.size()), *staging_, seq);
}

void VeriCacheEngine::ShareOutputCutShort(Sequence& s) {
  if (!UsesStore(s) || !options_.publish_outputs) return;
  // Nothing to share unless its output completed a block past the prompt's.
  if (s.full_len / prefixes_->block_tokens() <= static_cast<int64_t>(s.names.size())) return;
  if (s.fetch != nullptr) {
    // On its way into s.sseq for the next verify pass.
    const bool landed = LandFetch(s, s.sseq);
    s.fetch.reset();
    if (!landed) return;
  }
  if (s.sseq >= 0) return ShareOutput(s, s.full_len, s.sseq);
  const SeqId tmp = staging_->NewSequence();
  if (staging_->Reserve(tmp, s.full_len).ok()) {
    // Only what it shares, past the prompt's blocks: not a stored prefix read again.
    s.fetch = tier_->Fetch(s.key, static_cast<int64_t>(s.names.size()) * prefixes_->block_tokens(), s.full_len,
                           staging_.get(), tmp);
    if (LandFetch(s, tmp)) ShareOutput(s, s.full_len, tmp);
    s.fetch.reset();
  }
  staging_->FreeSequence(tmp);
}

bool VeriCacheEngine::LandFetch(Sequence& s, SeqId seq) {
  if (!s.fetch->Wait().ok()) return false;
  staging_->Commit(seq, s.full_len);
  s.result.stats.bytes_fetched += s.fetch->bytes();
  return true;
}

absl::Status VeriCacheEngine::AdmitWithPrefix(Sequence& s, bool* admitted) {
  *admitted = false;
  const int64_t n = s.v() - 1;
  const int bt = prefixes_->block_tokens();
  if (s.names.empty()) return absl::OkStatus();
  if (options_.stored_compressed_prefixes) s.cpublish_from = 0;
  const int hit = s.lookup->hit;  // LookupDone(s) came back true
  if (hit == 0) return absl::OkStatus();  // the cold path prefills and then publishes
  const int64_t p = int64_t{hit} * bt;
  VC_RETURN_IF_ERROR(tier_->AttachPrefix(s.key, p, [this, names = std::vector<PrefixName>(s.names.begin(),
                                                                                           s.names.begin() + hit)](
                                                         const PagedDest& dest) { return prefixes_->Read(names, dest); }));
  EngineStats& st = s.result.stats;
  st.prefix_store_tokens = p;
  s.full_len = p;
  s.publish_from = hit;
  int local = static_cast<int>(s.names.size());
  while (local > 0 && !prefix_index_.contains(s.names[local - 1])) --local;
  if (!costs_.fetch_timed()) {
    // No fetch timed here yet: the store's reads so far (other requests', other engines') stand
    // for the link.
    const StorePrefixStats store = prefixes_->stats();
    costs_.ObserveFetch(static_cast<double>(store.timed_read_bytes), store.read_seconds);
  }
  const double fetch_seconds = costs_.fetch(static_cast<double>(p * bytes_per_token_));
  // Drafting first pays when the full prefix takes longer to arrive than bringing a compressed
  // copy of `have` positions up to date and drafting once (assumed, until a fetch or a store read
  // is timed).
  auto worth_drafting = [&](int64_t have) {
    return !(fetch_seconds > 0 && fetch_seconds < static_cast<double>(n - have + 1) * costs_.draft_step());
  };
  // A cached prefix that shares more leading blocks with the prompt than any whole one (the
  // prompt diverges inside it: an edit in the middle of a file) is forked and cut back to them,
  // where the compressor can cut (KIVI: whole quantized groups).
  SeqId cut = -1;
  int shared = static_cast<int>(s.names.size());
  while (shared > local && !prefix_blocks_.contains(s.names[shared - 1])) --shared;
  if (shared > local && worth_drafting(int64_t{shared} * bt)) {
    // (Eviction takes a prefix's blocks out of prefix_blocks_ with it, so the entry is there.)
    auto c = prefix_index_.find(prefix_blocks_.at(s.names[shared - 1]));
    const SeqId f = compressed_->Fork(c->second.seq);
    if (compressed_->block_codec() != nullptr && compressed_->block_codec()->CutTo(f, int64_t{shared} * bt).ok()) {
      prefix_lru_.splice(prefix_lru_.begin(), prefix_lru_, c->second.lru);
      cut = f;
      local = shared;
    } else {
      compressed_->FreeSequence(f);
    }
  }
  // The store's compressed variant of the prefix: read when it reaches further than the copy here
  // (a worker that never saw the prefix drafts at once instead of waiting for the full blocks).
  SeqId stored = -1;
  int64_t stored_len = 0;
  if (!s.cnames.empty()) {
    const int chit = s.lookup->chit;  // read only where drafting pays
    s.cpublish_from = chit;
    if (chit > local && worth_drafting(int64_t{chit} * bt)) {
      stored = compressed_->NewSequence();
      const absl::Status read = prefixes_->ReadCompressed(absl::MakeConstSpan(s.cnames).first(chit), *compressed_, stored);
      if (read.ok()) {
        stored_len = int64_t{chit} * bt;
      } else {
        compressed_->FreeSequence(stored);
        stored = -1;
        if (absl::IsDataLoss(read)) s.cpublish_from = 0;  // the reader deleted a bad block: share ours
      }
    }
  }
  // A stored copy was read only where drafting from it pays; a local one is checked here.
  const int64_t have = stored >= 0 ? stored_len : int64_t{local} * bt;
  if (stored < 0 && (have == 0 || !worth_drafting(have))) {
    // No compressed copy, or the full prefix arrives before the copy could be brought up to date
    // and draft: the first window has no drafts. Its verify pass computes the rest of the prompt
    // exactly from the fetched prefix, and the compressed copy is built from that. (A stored copy
    // is only read when drafting from it pays.)
    s.cseq = compressed_->NewSequence();
    s.first_window = 0;
  } else {
    // Draft at once from the compressed prefix; the first verify pass computes the rest exactly.
    if (stored >= 0) {
      s.cseq = stored;
      st.prefix_compressed_store_tokens = stored_len;
    } else if (cut >= 0) {
      s.cseq = cut;
      cut = -1;
      st.prefix_compressed_tokens = have;
    } else {
      CachedPrefix& c = prefix_index_[s.names[local - 1]];
      prefix_lru_.splice(prefix_lru_.begin(), prefix_lru_, c.lru);
      s.cseq = compressed_->Fork(c.seq);
      st.prefix_compressed_tokens = c.length;
    }
    if (cut >= 0) {  // the store's compressed copy reached further
      compressed_->FreeSequence(cut);
      cut = -1;
    }
    VC_RETURN_IF_ERROR(model_.Prefill(absl::MakeConstSpan(s.tokens).subspan(have, n - have), s.cseq,
                                      s.request.options.prefill_chunk, *compressed_, nullptr));
    s.approximate_prompt = have < n;
  }
  if (cut >= 0) compressed_->FreeSequence(cut);  // not drafted from
  *admitted = true;
  return absl::OkStatus();
}

absl::Status VeriCacheEngine::Admit(Sequence& s) {
  const absl::Duration t0 = SteadyClock()->Now();
  EngineStats& st = s.result.stats;
  st.queue_seconds = absl::ToDoubleSeconds(t0 - s.submitted);
  // Room for the most compressed KV the sequence can hold, and in the tier for every position it
  // can reach, its prefix's too (recomputed and held here if the store fails to deliver it), so no
  // later append fails for it. Taken: the request waits for a sequence to end.
  const int64_t need = CompressedBound(s.request);
  st.compressed_reserved_bytes = need;
  if (options_.compressed_bytes > 0) {
    if (compressed_reserved_ + need > options_.compressed_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the sequence needs ", need, " bytes of compressed KV; ",
                                                       options_.compressed_bytes - compressed_reserved_, " of ",
                                                       options_.compressed_bytes, " are free"));
    }
    s.creserved = need;
    compressed_reserved_ += need;
  }
  VC_RETURN_IF_ERROR(tier_->Reserve(s.key, MaxPositions(s.request)));
  const int64_t n = s.v() - 1;  // the last prompt token is fed by the first draft step
  const PrefilledKv& pre = s.request.prefilled;
  if (pre.cache != nullptr) {
    if (pre.cache->Length(pre.seq) < n) {
      return absl::InvalidArgumentError(absl::StrCat("prefilled KV holds ", pre.cache->Length(pre.seq),
                                                     " positions, the prompt needs ", n));
    }
    if (compressed_->needs() == CompressorNeeds::kPromptQueries && pre.queries == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          spec_, " needs prompt queries: hand them in with the prefilled KV, or prefill the prompt instead"));
    }
    s.cseq = compressed_->NewSequence();
    if (DefersUpkeep()) {
      // Staged at once where staging has free room (no other sequence's taken for it): the first
      // windows decode plainly from it, and the tier and the compressed cache are written only
      // once they are needed (CatchUp from 0).
      const SeqId seq = staging_->NewSequence();
      if (staging_->Reserve(seq, n + 1).ok()) {
        pre.cache->CopyTo(pre.seq, 0, n, *staging_, seq);
        staging_->Commit(seq, n);
        s.sseq = seq;
        s.full_len = n;
        s.lag_from = 0;
        st.prefill_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
        return absl::OkStatus();
      }
      staging_->FreeSequence(seq);
    }
    VC_RETURN_IF_ERROR(tier_->Append(s.key, *pre.cache, pre.seq, 0, n));
    VC_RETURN_IF_ERROR(compressed_->BuildFrom(s.cseq, *pre.cache, pre.seq, n, pre.queries));
    s.full_len = n;
    st.prefill_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
    return absl::OkStatus();
  }
  if (UsesStore(s)) {
    bool admitted = false;
    VC_RETURN_IF_ERROR(AdmitWithPrefix(s, &admitted));
    if (admitted) {
      st.prefill_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
      return absl::OkStatus();
    }
  }
  const SeqId tmp = staging_->NewSequence();
  absl::Status reserved = ReserveStaging(tmp, n + 1, nullptr);
  if (!reserved.ok()) {
    staging_->FreeSequence(tmp);
    return reserved;
  }
  s.cseq = compressed_->NewSequence();
  s.pseq = tmp;
  s.prefilled = 0;
  const int64_t window = std::min(n, compressed_->prompt_query_window());
  if (window > 0) s.recorder = std::make_unique<QueryRecorder>(*staging_, tmp, n, window, model_.config().num_layers);
  st.prefill_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
  return absl::OkStatus();  // PrefillChunk goes on with it, a chunk a step
}

absl::Status VeriCacheEngine::PrefillChunk(Sequence& s) {
  const absl::Duration t0 = SteadyClock()->Now();
  const int64_t n = s.v() - 1;
  const int64_t end = std::min<int64_t>(n, s.prefilled + s.request.options.prefill_chunk);
  if (end > s.prefilled) {
    AttentionCache& cache = s.recorder != nullptr ? static_cast<AttentionCache&>(*s.recorder) : *staging_;
    VC_RETURN_IF_ERROR(model_.Prefill(
        absl::MakeConstSpan(s.tokens).subspan(static_cast<size_t>(s.prefilled), static_cast<size_t>(end - s.prefilled)),
        s.pseq, s.request.options.prefill_chunk, cache, nullptr));
    s.prefilled = end;
  }
  absl::Status status;
  if (end == n && s.recorder == nullptr && DefersUpkeep()) {
    // The prompt's K/V stays staged for the first windows, which decode plainly from it; the tier
    // and the compressed cache are written only once they are needed (CatchUp from 0).
    if (prefixes_ != nullptr) SharePrefix(s, 0, s.pseq);
    s.sseq = s.pseq;
    s.pseq = -1;
    s.full_len = n;
    s.lag_from = 0;
  } else if (end == n) {
    PromptQueries queries;
    if (s.recorder != nullptr) {
      absl::StatusOr<PromptQueries> taken = s.recorder->Take();
      if (taken.ok()) queries = *std::move(taken);
      status = taken.status();
    }
    if (status.ok()) status = compressed_->BuildFrom(s.cseq, *staging_, s.pseq, n, RecordedQueries(queries));
    if (status.ok()) status = tier_->Append(s.key, *staging_, s.pseq, 0, n);
    if (status.ok() && prefixes_ != nullptr) SharePrefix(s, 0, s.pseq);
    s.recorder.reset();
    staging_->FreeSequence(s.pseq);
    s.pseq = -1;
    s.full_len = n;
  }
  s.result.stats.prefill_seconds += absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
  return status;
}

void VeriCacheEngine::DropStaging(Sequence& s) {
  if (s.sseq >= 0) staging_->FreeSequence(s.sseq);
  s.sseq = -1;
}

absl::Status VeriCacheEngine::CatchUp(Sequence& s) {
  if (!s.lagging()) return absl::OkStatus();
  const absl::Duration t0 = SteadyClock()->Now();
  VC_RETURN_IF_ERROR(tier_->Append(s.key, *staging_, s.sseq, s.lag_from, s.full_len));
  // A draft step whose logits overflowed left its fed position in the compressed cache.
  const int64_t held = compressed_->Length(s.cseq);
  if (held < s.lag_from) {
    return absl::InternalError(absl::StrCat("the compressed cache holds ", held, " positions, not the ", s.lag_from,
                                            " its upkeep stopped at"));
  }
  if (s.lag_from == 0) {
    VC_RETURN_IF_ERROR(compressed_->BuildFrom(s.cseq, *staging_, s.sseq, s.full_len, nullptr));
  } else {
    if (held > s.lag_from) VC_RETURN_IF_ERROR(compressed_->Truncate(s.cseq, s.lag_from));
    VC_RETURN_IF_ERROR(AppendExact(s, s.lag_from, s.full_len));
  }
  const double dt = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
  costs_.ObserveCatchUp(static_cast<double>(s.full_len - s.lag_from), dt);
  s.lag_from = -1;
  s.result.stats.catch_ups++;
  s.result.stats.catch_up_seconds += dt;
  return absl::OkStatus();
}

bool VeriCacheEngine::CatchUpOrEnd(Sequence& s) {
  absl::Status st = CatchUp(s);
  if (st.ok()) return true;
  s.failed = std::move(st);
  s.done = true;
  return false;
}

void VeriCacheEngine::GiveUpStaging(Sequence& s) {
  CatchUpOrEnd(s);
  DropStaging(s);
}

bool VeriCacheEngine::EvictResident(const Sequence* except) {
  Sequence* victim = nullptr;
  for (auto& sp : requests_.active) {
    Sequence* o = sp.get();
    if (o == except || !o->resident() || o->computing_prompt()) continue;
    victim = o;
    if (static_cast<int>(o->drafts.size()) < o->k) break;  // mid-window: it needs no staging for a while
  }
  if (victim == nullptr) return false;
  GiveUpStaging(*victim);
  return true;
}

absl::Status VeriCacheEngine::ReserveStaging(SeqId seq, int64_t length, const Sequence* except) {
  // Residents give their staging up only when that makes room enough: a request left waiting
  // would otherwise cost every resident its staged KV at every step it is tried.
  const int64_t block = staging_->layout().block_size;
  const int64_t need = (length + block - 1) / block - static_cast<int64_t>(staging_->BlockTable(seq).size());
  int64_t could_free = staging_->free_blocks();
  for (const auto& sp : requests_.active) {
    if (sp.get() != except && sp->resident() && !sp->computing_prompt()) {
      could_free += static_cast<int64_t>(staging_->BlockTable(sp->sseq).size());
    }
  }
  if (need > could_free) return staging_->Reserve(seq, length);  // fails, or fits after all
  while (true) {
    absl::Status st = staging_->Reserve(seq, length);
    if (!absl::IsResourceExhausted(st) || !EvictResident(except)) return st;
  }
}

absl::Status VeriCacheEngine::StartWindow(Sequence& s, bool staging_for_all) {
  if (s.k < 0 && s.first_window >= 0) {
    s.k = s.first_window;
    s.first_window = -1;
    s.drafts.clear();
  } else if (s.k < 0) {
    const int remaining = s.request.options.max_tokens - s.generated;
    const int64_t fetch_bytes = s.resident() && staging_for_all ? 0 : (s.v() - 1) * bytes_per_token_;
    s.k = s.window.Choose(costs_, static_cast<double>(fetch_bytes), remaining,
                          s.lagging() ? static_cast<double>(s.full_len - s.lag_from) : 0.0);
    s.drafts.clear();
  }
  // Drafts come from the compressed cache: it must hold every exact position first.
  if (s.k > 0 && !CatchUpOrEnd(s)) return absl::OkStatus();
  if (s.resident()) {
    // Room for the positions the verify pass appends; without it, give the staging up and fetch
    // again later.
    absl::Status st = ReserveStaging(s.sseq, s.v() + s.k, &s);
    if (st.ok() || !absl::IsResourceExhausted(st)) return st;
    GiveUpStaging(s);
    if (s.done) return absl::OkStatus();
  }
  if (s.fetch == nullptr) {
    // Staging is held from the fetch to the verify, so the fetch starts just in time: when the
    // drafts still to come take about as long as it will (at once before any fetch was timed).
    const double fetch_seconds =
        costs_.fetch(static_cast<double>(s.full_len * bytes_per_token_));
    const int to_draft = s.k - static_cast<int>(s.drafts.size());
    if (fetch_seconds > 0 && to_draft > 1 + static_cast<int>(fetch_seconds / std::max(costs_.draft_step(), 1e-6))) {
      return absl::OkStatus();
    }
    // Staging for the fetched prefix plus the positions the verify pass appends.
    const SeqId sseq = staging_->NewSequence();
    absl::Status st = ReserveStaging(sseq, s.v() + s.k, &s);
    if (!st.ok()) {
      staging_->FreeSequence(sseq);
      return st;  // retried on a later iteration, once a verify frees blocks
    }
    s.sseq = sseq;
    s.fetch_start = SteadyClock()->Now();
    s.fetch = tier_->Fetch(s.key, 0, s.full_len, staging_.get(), sseq);
    s.window_fetched = true;
  }
  return absl::OkStatus();
}

absl::Status VeriCacheEngine::DraftStep(std::vector<Sequence*>& drafting) {
  std::vector<SequenceChunk> chunks;
  std::vector<int32_t> feed(drafting.size());
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& s = *drafting[i];
    feed[i] = s.drafts.empty() ? s.tokens.back() : s.drafts.back();
    chunks.push_back({s.cseq, {&feed[i], 1}});
  }
  std::vector<float> logits;
  std::vector<bool> finite;
  const absl::Duration t0 = SteadyClock()->Now();
  VC_RETURN_IF_ERROR(model_.Forward(chunks, *compressed_, LogitsFor::kLastRows, &logits, &finite));
  const double dt = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
  // Timed as a window's first step only when it is every drafting sequence's first: with windows
  // out of step, a step after a verify pass is also later steps' (their windows pay it more than
  // once), and it goes into the later steps' average.
  const bool first = verified_since_draft_ && std::all_of(drafting.begin(), drafting.end(), [](const Sequence* s) {
                       return s->drafts.empty();
                     });
  // Each sequence's share of the batched step: the plain passes it would take instead are shared
  // too, so shares compare the modes whatever the batch (whole-pass times made a verify pass of
  // one drafting sequence look cheaper than a plain pass of the whole batch).
  costs_.ObserveDraftStep(dt / static_cast<double>(drafting.size()), first);
  verified_since_draft_ = false;
  const int vocab = model_.config().vocab_size;
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& s = *drafting[i];
    s.result.stats.draft_seconds += dt / drafting.size();
    s.window_seconds += dt / drafting.size();
    if (!finite[i]) {
      // Drafts are guesses: one the compressed KV made overflow ends the window, and the verify
      // pass decides from the full KV.
      s.k = static_cast<int>(s.drafts.size());
      continue;
    }
    const int64_t position = s.v() + static_cast<int64_t>(s.drafts.size());
    s.drafts.push_back(SampleToken(absl::MakeConstSpan(logits).subspan(i * vocab, vocab),
                                   s.request.options.sampling, position));
    s.result.stats.drafted++;
  }
  return absl::OkStatus();
}

absl::Status VeriCacheEngine::Rebuild(Sequence& s, int64_t length) {
  // A KIVI copy of the prompt's prefix (cached by SharePrefix) with the rest appended quantizes
  // every group from the same K/V as BuildFrom would, so it is the same cache, without
  // quantizing the prefix again.
  const auto it = s.names.empty() || compressed_->block_codec() == nullptr ? prefix_index_.end()
                                                                          : prefix_index_.find(s.names.back());
  if (it == prefix_index_.end() || it->second.length > length) {
    return compressed_->BuildFrom(s.cseq, *staging_, s.sseq, length, nullptr);
  }
  compressed_->FreeSequence(s.cseq);
  s.cseq = compressed_->Fork(it->second.seq);
  return AppendExact(s, it->second.length, length);
}

absl::Status VeriCacheEngine::AppendExact(Sequence& s, int64_t from, int64_t to) {
  VC_RETURN_IF_ERROR(compressed_->Reserve(s.cseq, to));
  staging_->CopyTo(s.sseq, from, to, *compressed_, s.cseq);
  compressed_->Commit(s.cseq, to);
  return absl::OkStatus();
}

void VeriCacheEngine::ForgetPrefix(Sequence& s) {
  // The store could not deliver the prefix: nothing of [0, full_len) is exact any more. Prompt
  // chunks and the verify pass compute it here again (in the room the sequence reserved for it in
  // the tier at admission); the kernels are batch-invariant, so these K/V are bitwise the ones the
  // store would have served.
  staging_->Commit(s.sseq, 0);
  tier_->Clear(s.key);
  s.full_len = 0;
  // The positions the store was to deliver now count as recomputed (prompt positions by where
  // their K/V came from: at a later window, full_len also held positions computed here before).
  s.result.stats.recomputed_tokens += s.result.stats.prefix_store_tokens;
  s.result.stats.prefix_store_tokens = 0;
  // The store's copy may be gone (a corrupt block is deleted): the next pass shares the prompt's
  // blocks again, also when they were shared after an earlier pass (a read at a later window failed).
  s.publish_from = 0;
}

absl::Status VeriCacheEngine::PromptChunk(Sequence& s) {
  const absl::Duration t0 = SteadyClock()->Now();
  const int64_t end = s.full_len + s.request.options.prefill_chunk;
  VC_RETURN_IF_ERROR(model_.Prefill(absl::MakeConstSpan(s.tokens).subspan(s.full_len, end - s.full_len), s.sseq,
                                    s.request.options.prefill_chunk, *staging_, nullptr));
  VC_RETURN_IF_ERROR(tier_->Append(s.key, *staging_, s.sseq, s.full_len, end));
  s.full_len = end;
  s.result.stats.prefill_seconds += absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
  return absl::OkStatus();
}

VeriCacheEngine::Sequence* VeriCacheEngine::LandReady(std::vector<Sequence*>& ready) {
  Sequence* chunked = nullptr;
  for (auto it = ready.begin(); it != ready.end();) {
    Sequence& s = **it;
    if (!s.resident() && !LandFetch(s, s.sseq)) ForgetPrefix(s);
    s.fetch.reset();  // resident until its pass
    if (!s.computing_prompt()) {
      ++it;
      continue;
    }
    // One at a time; another (a second failed read) keeps its staging and comes back.
    if (chunked == nullptr) chunked = &s;
    it = ready.erase(it);
  }
  return chunked;
}

absl::Status VeriCacheEngine::Verify(std::vector<Sequence*>& ready) {
  std::vector<std::vector<int32_t>> feeds(ready.size());
  std::vector<SequenceChunk> chunks;
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence& s = *ready[i];
    // Staging holds [0, full_len) (LandReady). The prompt positions not yet exact (after a store
    // prefix), the last verified token, drafts.
    feeds[i].assign(s.tokens.begin() + s.full_len, s.tokens.end());
    feeds[i].insert(feeds[i].end(), s.drafts.begin(), s.drafts.end());
    chunks.push_back({s.sseq, feeds[i]});
  }
  std::vector<float> logits;
  std::vector<bool> finite;
  const absl::Duration t0 = SteadyClock()->Now();
  VC_RETURN_IF_ERROR(model_.Forward(chunks, *staging_, LogitsFor::kAllRows, &logits, &finite));
  const double dt = absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
  int rows_total = 0;
  for (auto& f : feeds) rows_total += static_cast<int>(f.size());
  // Each sequence's share of the batched pass (as for draft steps).
  costs_.ObserveVerify(rows_total / static_cast<int>(ready.size()), dt / static_cast<double>(ready.size()));
  verified_since_draft_ = true;

  const int vocab = model_.config().vocab_size;
  // Every sequence's tokens go out first; the bookkeeping after (the tier, the compressed cache,
  // prefixes shared) does not hold back the later sequences' tokens. (Should the bookkeeping fail,
  // Step ends every request of the batch with that error, after the verified tokens sent.)
  std::vector<int64_t> verified(ready.size());  // v before the pass
  std::vector<int> accepted_drafts(ready.size());
  std::vector<bool> overflowed(ready.size());  // the logits of its last row were not finite
  int64_t row = 0;
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence& s = *ready[i];
    const GenerateOptions& o = s.request.options;
    const int64_t v = s.v();
    verified[i] = v;
    const int k = static_cast<int>(s.drafts.size());
    const int64_t first = row + (v - 1 - s.full_len);  // the row that predicts position v
    // Accept the longest prefix of drafts the full-KV targets agree with, then the target's own.
    // Only the rows sampled from are checked: a rejected draft's row, or a prompt row, that
    // overflows cannot change the output (decoding without drafts would never compute it).
    int accepted = 0;
    int32_t next = -1;
    for (int j = 0; j <= k; ++j) {
      if (!finite[first + j]) break;
      const int32_t target =
          SampleToken(absl::MakeConstSpan(logits).subspan((first + j) * vocab, vocab), o.sampling, v + j);
      if (j < k && s.drafts[j] == target) {
        ++accepted;
        continue;
      }
      next = target;
      break;
    }
    row += static_cast<int64_t>(feeds[i].size());
    std::vector<int32_t> emit(s.drafts.begin(), s.drafts.begin() + accepted);
    if (next >= 0) emit.push_back(next);
    EngineStats& st = s.result.stats;
    st.verify_seconds += dt / ready.size();
    st.verifies++;
    if (k > 0) s.window.Observe(k, accepted);
    // A window that computed no prompt positions and fetched nothing: its realized rate.
    if (!s.window_fetched && static_cast<int>(feeds[i].size()) == k + 1) {
      s.window.ObserveWindow(k, static_cast<int>(emit.size()), s.window_seconds + dt / ready.size());
    }
    s.window_seconds = 0;
    s.window_fetched = false;
    size_t emitted = 0;
    for (int32_t t : emit) {
      s.tokens.push_back(t);
      s.result.tokens.push_back(t);
      s.generated++;
      st.emitted++;
      ++emitted;
      if ((o.stop_at_eos && model_.tokenizer().IsEos(t)) || s.generated >= o.max_tokens) {
        s.done = true;
        break;
      }
    }
    // Accepted drafts past the end of the output (an end of sequence among them) are never sent.
    st.accepted_drafts += std::min<int64_t>(accepted, static_cast<int64_t>(emitted));
    overflowed[i] = next < 0;
    if (next < 0 && !s.done) {
      // The row of the next token overflowed: the sequence ends there with the error decoding
      // gives, after the tokens decoding would have given before it.
      s.failed = NonFiniteLogits();
      s.done = true;
    }
    if (st.verifies == 1) st.first_token_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - s.submitted);
    if (s.request.on_tokens) s.request.on_tokens(absl::MakeConstSpan(emit).first(emitted));
    accepted_drafts[i] = accepted;
  }
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence& s = *ready[i];
    const int64_t v = verified[i];
    const int accepted = accepted_drafts[i];
    // A sequence whose last row overflowed is done, and shares nothing: that row's K/V may not be
    // finite.
    if (s.publish_from >= 0 && !overflowed[i]) {
      SharePrefix(s, s.publish_from, s.sseq);  // the pass made the whole prompt exact
      s.publish_from = -1;
    }
    // Staging holds exact K/V for [0, v + accepted): the prompt, the tokens verified before and
    // this pass's accepted drafts (the last emitted token has none yet).
    if (s.done && !overflowed[i]) ShareOutput(s, std::min<int64_t>(v + accepted, s.v()), s.sseq);
    const bool rebuild = s.full_len < v - 1 || s.approximate_prompt || compressed_->Length(s.cseq) < v - 1;
    // Plain decoding: one token from staged full KV, with no drafts to repair.
    const bool plain = s.drafts.empty() && options_.keep_staged && (s.lagging() || !rebuild);
    if (plain) s.result.stats.plain_verifies++;
    if (!s.done) {
      // Positions [full_len, v + accepted) were fed with verified tokens: their K/V is exact.
      const int64_t keep_end = v + accepted;
      if (plain) {
        // The new position stays in staging alone, as in a full-KV decoder; the tier and the
        // compressed cache catch up in bulk (CatchUp) when they are needed.
        if (!s.lagging()) s.lag_from = s.full_len;
      } else {
        VC_RETURN_IF_ERROR(tier_->Append(s.key, *staging_, s.sseq, s.full_len, keep_end));
        if (rebuild) {
          // The compressed cache ran ahead of the exact K/V by more than a draft window (the rest
          // of a prompt after a stored prefix; also where the store held all of it), or was never
          // filled: rebuild it from the exact K/V.
          VC_RETURN_IF_ERROR(Rebuild(s, keep_end));
          s.approximate_prompt = false;
        } else {
          VC_RETURN_IF_ERROR(compressed_->Truncate(s.cseq, v - 1));
          VC_RETURN_IF_ERROR(AppendExact(s, v - 1, keep_end));
        }
      }
      s.full_len = keep_end;
    }
    if (s.done || !options_.keep_staged) {
      DropStaging(s);
    } else {
      // Keep the exact K/V staged for the next window (rejected drafts' K/V go); with the fetch
      // gone below, the sequence is resident.
      VC_RETURN_IF_ERROR(staging_->Truncate(s.sseq, s.full_len));
    }
    s.fetch.reset();
    s.k = -1;
    s.drafts.clear();
  }
  return absl::OkStatus();
}

absl::Status VeriCacheEngine::Step(bool may_wait) {
  if (staging_ == nullptr) return absl::FailedPreconditionError("the engine has no staging memory (staging_blocks)");
  std::vector<RequestQueue<Sequence>::Ended> ended = requests_.TakeEnded(
      absl::Now(),
      [&](const Sequence& s) {
        VC_RETURN_IF_ERROR(ValidateGenerate(model_, s.request.prompt, s.request.options));
        VC_RETURN_IF_ERROR(tier_->CanHold(MaxPositions(s.request)));
        if (const int64_t need = CompressedBound(s.request);
            options_.compressed_bytes > 0 && need > options_.compressed_bytes) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "a prompt of ", s.request.prompt.size(), " tokens plus max_tokens ", s.request.options.max_tokens,
              " needs up to ", need, " bytes of compressed KV (", spec_, "); the worker has ",
              options_.compressed_bytes));
        }
        // Refused before it starts if staging could never hold its full KV for a verify pass.
        const int64_t blocks = VerifyBlocks(s.request);
        if (blocks > staging_->num_blocks()) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "a prompt of ", s.request.prompt.size(), " tokens plus max_tokens ", s.request.options.max_tokens,
              " needs ", blocks, " staging blocks to verify; staging holds ", staging_->num_blocks()));
        }
        return absl::OkStatus();
      },
      [&](Sequence& s) {
        // Cancelled (a stop sequence is a cancel) or past its deadline: what the tier holds of it
        // is exact and may be the start of the next turn.
        ShareOutputCutShort(s);
        Release(s);
      });
  RequestQueue<Sequence>::TellAll(ended);
  auto& active = requests_.active;
  // A request that does not fit yet (its memory is taken by the batch) waits; a step tries 4 such
  // at most, since each try may ask the store for its prefix.
  bool prefilling_now =
      std::any_of(active.begin(), active.end(), [](const auto& sp) { return sp->prefilling(); });
  requests_.AdmitInOrder(static_cast<size_t>(options_.max_batch), /*max_waiting_tried=*/4, [&](Sequence& s) {
    // Nothing in flight to hold up: wait a while for the store's answer rather than step idly.
    if (!LookupDone(s, /*wait=*/may_wait && active.empty())) return Admission::kWait;
    // One prompt at a time is prefilled (each holds staging for all of it until it is done): the
    // first comes soonest, and the others' staging is not taken while they wait their turn.
    if (prefilling_now && NeedsPrefill(s)) return Admission::kLater;
    absl::Status st = Admit(s);
    if (st.ok() && s.prefilling()) prefilling_now = true;
    if (st.ok()) return Admission::kAdmitted;
    Release(s);
    if (absl::IsResourceExhausted(st) && !active.empty()) {  // wait for staging or the tier to free up
      s.ResetAdmission();
      return Admission::kWait;
    }
    RequestQueue<Sequence>::Tell(s, std::move(st));
    return Admission::kRefused;
  }, static_cast<size_t>(options_.max_batch_per_tenant));

  // A chunk of the prompt being prefilled (one at a time, see the admission above): a long prompt
  // holds up the batch in flight a chunk a step, not all of its prefill at once. A failed chunk
  // ends its sequence alone.
  bool prefilling = false;
  for (auto& sp : active) {
    if (!sp->prefilling()) continue;
    if (absl::Status st = PrefillChunk(*sp); !st.ok()) {
      sp->failed = std::move(st);
      sp->done = true;
    }
    prefilling = sp->prefilling();
    break;
  }

  std::vector<Sequence*> order;
  for (auto& sp : active) {
    if (!sp->prefilling() && !sp->done) order.push_back(sp.get());
  }
  // Sequences still waiting for their first token claim staging first (time to first token), but
  // after one streaming already whose prefix must be computed again (a failed read): it would
  // otherwise wait behind every new prompt for the one prompt pass a step.
  std::stable_partition(order.begin(), order.end(), [](const Sequence* s) { return s->generated == 0; });
  std::stable_partition(order.begin(), order.end(),
                        [](const Sequence* s) { return s->generated > 0 && s->v() - s->full_len > 1; });
  std::vector<Sequence*> drafting, ready, waiting, stuck;
  absl::Status status;
  int64_t blocks_for_all = 0;
  for (auto& sp : active) blocks_for_all += StagingBlocks(sp->request);
  for (Sequence* s : order) {
    absl::Status st = StartWindow(*s, blocks_for_all <= staging_->num_blocks());
    if (!st.ok() && !absl::IsResourceExhausted(st)) {
      status = st;
      break;
    }
  }
  // Sorted only once every window has started: a later sequence's reservation may have taken an
  // earlier one's kept staging. One pass at a time computes the rest of a prompt (after a stored
  // prefix): the first token of the earliest such sequence is not held back by the others', and
  // on average each comes sooner.
  bool prompt_pass = false;
  for (Sequence* s : order) {
    if (!status.ok()) break;
    if (s->done) continue;  // its staging could not be given up cleanly (CatchUp failed)
    if (static_cast<int>(s->drafts.size()) < s->k) {
      drafting.push_back(s);
    } else if (s->resident() || (s->fetch != nullptr && s->fetch->Done())) {
      if (s->v() - s->full_len > 1) {
        if (prompt_pass) continue;  // ready at the next step
        prompt_pass = true;
      }
      ready.push_back(s);
    } else if (s->fetch != nullptr) {
      waiting.push_back(s);
    } else {
      stuck.push_back(s);  // its drafts are done but staging had no room for its full KV
    }
  }
  if (status.ok()) {
    // The ready verify, then the others' draft step: every sequence moves on each step (one whose
    // window is 0 is ready at every step).
    for (Sequence* s : ready) {
      if (s->fetch == nullptr) continue;  // resident
      costs_.ObserveFetch(static_cast<double>(s->fetch->bytes()),
                          absl::ToDoubleSeconds(s->fetch->finished_at() - s->fetch_start));
    }
    // A prompt whose rest (after a stored prefix, or all of it after a failed read) is longer than
    // a chunk has a chunk of it computed this step, ahead of its verify pass.
    Sequence* chunked = LandReady(ready);
    if (chunked != nullptr) {
      if (absl::Status st = PromptChunk(*chunked); !st.ok()) {  // ends its sequence alone
        chunked->failed = std::move(st);
        chunked->done = true;
      }
    }
    if (status.ok() && !ready.empty()) status = Verify(ready);
    if (status.ok() && !drafting.empty()) status = DraftStep(drafting);
    if (ready.empty() && chunked == nullptr && drafting.empty() && !prefilling) {
      if (!waiting.empty() && may_wait) {
        const absl::Duration t0 = SteadyClock()->Now();
        // A while at most, as for a lookup: a caller with other work (new requests, the other
        // engine's) comes back to it. Verify looks at the outcome.
        waiting.front()->fetch->WaitFor(PrefixLookups::kIdleWait);
        waiting.front()->result.stats.fetch_wait_seconds += absl::ToDoubleSeconds(SteadyClock()->Now() - t0);
      } else if (!waiting.empty()) {
        // Not to hold up the caller's other work, and not to come straight back either (its other
        // work may be waiting on a store too): a moment.
        absl::SleepFor(PrefixLookups::kPoll);
      } else if (!stuck.empty() && !EvictResident(nullptr)) {
        // (An eviction makes room for the stuck ones at the next step.) Nothing holds staging
        // now, so this one can never fit: end it alone.
        Sequence& s = *stuck.front();
        s.failed = absl::ResourceExhaustedError(absl::StrCat(
            "staging memory (", staging_->num_blocks(), " blocks) cannot hold this sequence's full KV"));
        s.done = true;  // leaves the batch below
      }
    }
  }
  for (auto& sp : active) {
    if (sp->cseq < 0) continue;
    int64_t& peak = sp->result.stats.compressed_peak_bytes;
    peak = std::max(peak, compressed_->Bytes(sp->cseq));
  }
  ended = requests_.TakeFinished(status, [&](Sequence& s) { Release(s); });
  RequestQueue<Sequence>::TellAll(ended);
  return status;
}

int64_t VeriCacheEngine::MaxPositions(const EngineRequest& r) {
  return static_cast<int64_t>(r.prompt.size()) + r.options.max_tokens;
}

int64_t VeriCacheEngine::CompressedBound(const EngineRequest& r) const {
  // Every path builds the compressed cache from the whole prompt but its last token, or more.
  return compressed_->BytesBound(static_cast<int64_t>(r.prompt.size()) - 1, MaxPositions(r));
}

int64_t VeriCacheEngine::VerifyBlocks(const EngineRequest& r) const {
  return (MaxPositions(r) + 1 + options_.block_size - 1) / options_.block_size;
}

int64_t VeriCacheEngine::StagingBlocks(const EngineRequest& r) const {
  return (MaxPositions(r) + max_k_ + 1) / options_.block_size + 1;
}

absl::StatusOr<int64_t> VeriCacheEngine::SizeStaging(absl::Span<const EngineRequest> requests) {
  if (!Idle()) return absl::FailedPreconditionError("staging sized while submitted requests are in flight");
  int64_t need_blocks = 0, biggest = 0;
  for (const EngineRequest& r : requests) {
    VC_RETURN_IF_ERROR(ValidateGenerate(model_, r.prompt, r.options));
    const int64_t blocks = StagingBlocks(r);
    need_blocks += blocks;
    biggest = std::max(biggest, blocks);
  }
  if (options_.staging_blocks == 0 && (staging_ == nullptr || staging_->num_blocks() < need_blocks)) {
    staging_ = std::make_unique<PagedKvCache>(model_.kv_layout(options_.block_size), need_blocks);
  }
  return biggest;
}

absl::StatusOr<std::vector<EngineResult>> VeriCacheEngine::Generate(absl::Span<const EngineRequest> requests) {
  if (!Idle()) return absl::FailedPreconditionError("Generate while submitted requests are in flight");
  VC_ASSIGN_OR_RETURN(const int64_t biggest, SizeStaging(requests));
  costs_ = DraftCostModel();
  verified_since_draft_ = true;
  if (staging_->num_blocks() < biggest) {
    return absl::ResourceExhaustedError(
        absl::StrCat("staging holds ", staging_->num_blocks(), " blocks; a sequence needs ", biggest));
  }
  return RunToCompletion(*this, requests);
}

}  // namespace vc
