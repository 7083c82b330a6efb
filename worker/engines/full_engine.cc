#include "worker/engines/full_engine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/sampler.h"

namespace vc {

struct FullKvEngine::Sequence : QueuedRequest {
  absl::Duration admitted;  // SteadyClock() time
  SeqId seq = -1;  // in cache_, once admitted
  // prompt + emitted. Positions [0, cache_.Length(seq)) have their K/V; a decoding sequence
  // lacks only the last token's, which the next pass feeds.
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  std::vector<PrefixName> names;  // of the prompt's full blocks, with a PrefixStore
  int publish_from = -1;          // blocks [publish_from, names.size()) to publish; -1: none
  std::shared_ptr<const PrefixLookups::Lookup> lookup;  // of names, once started
  // The stored prefix's blocks being read into seq (positions [0, read_blocks * block_tokens)),
  // off this thread: the sequence joins passes once the read has landed.
  std::future<absl::Status> read;
  int read_blocks = 0;
  int generated = 0;
};

FullKvEngine::FullKvEngine(const Model& model, const FullEngineOptions& options, PrefixStore* prefixes)
    : model_(model),
      prefixes_(prefixes),
      options_(options),
      cache_(model.kv_layout(options.block_size), options.kv_blocks),
      lookups_(prefixes != nullptr && options.fetch_prefix ? std::make_unique<PrefixLookups>(prefixes) : nullptr) {}

FullKvEngine::~FullKvEngine() = default;

absl::StatusOr<std::unique_ptr<FullKvEngine>> FullKvEngine::Create(const Model& model, const FullEngineOptions& options,
                                                                   PrefixStore* prefixes) {
  if (options.block_size < 1 || options.max_batch < 1 || options.kv_blocks < 1 || options.max_batch_per_tenant < 0) {
    return absl::InvalidArgumentError(absl::StrCat("full engine options out of range: block_size ", options.block_size,
                                                   ", max_batch ", options.max_batch, ", kv_blocks ",
                                                   options.kv_blocks, " must all be at least 1"));
  }
  return std::unique_ptr<FullKvEngine>(new FullKvEngine(model, options, prefixes));
}

int64_t FullKvEngine::BlocksFor(const EngineRequest& r) const {
  const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.options.max_tokens;
  return (positions + options_.block_size - 1) / options_.block_size;
}

absl::Status FullKvEngine::Check(const EngineRequest& r) const {
  VC_RETURN_IF_ERROR(ValidateGenerate(model_, r.prompt, r.options));
  const PrefilledKv& pre = r.prefilled;
  if (pre.cache != nullptr) {
    const KvLayout& have = pre.cache->layout();
    const KvLayout want = model_.kv_layout(options_.block_size);
    const int64_t n = static_cast<int64_t>(r.prompt.size()) - 1;
    if (have.num_layers != want.num_layers || have.num_kv_heads != want.num_kv_heads ||
        have.head_dim != want.head_dim) {
      return absl::InvalidArgumentError("prefilled KV has another model's layout");
    }
    if (pre.cache->Length(pre.seq) < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefilled KV holds ", pre.cache->Length(pre.seq), " positions, the prompt needs ", n));
    }
  }
  if (BlocksFor(r) > options_.kv_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat("a prompt of ", r.prompt.size(), " tokens plus max_tokens ",
                                                     r.options.max_tokens, " needs ", BlocksFor(r),
                                                     " KV blocks; the pool has ", options_.kv_blocks));
  }
  return absl::OkStatus();
}

RequestId FullKvEngine::Submit(EngineRequest request, DoneCallback on_done) {
  Sequence& s = requests_.Add(std::move(request), std::move(on_done));
  s.tokens = s.request.prompt;
  s.prompt_len = static_cast<int64_t>(s.tokens.size());
  return s.id;
}

void FullKvEngine::Cancel(RequestId id) { requests_.Cancel(id); }

void FullKvEngine::Leave(Sequence& s) {
  if (s.read.valid() && s.read.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    // It still writes into the sequence's blocks: they are freed once it has landed.
    reading_.push_back({s.seq, std::move(s.read)});
    s.seq = -1;
    return;
  }
  if (s.seq >= 0) cache_.FreeSequence(s.seq);
  s.seq = -1;
}

bool FullKvEngine::LookupDone(Sequence& s, bool wait) {
  if (!UsesStore(s)) return true;
  if (s.lookup != nullptr && PrefixLookups::Stale(*s.lookup)) s.lookup.reset();  // waited long since
  if (s.lookup == nullptr) {
    const int64_t n = s.prompt_len - 1;  // the last prompt token is always computed: it yields logits
    s.names = prefixes_->Names(s.request.tenant, absl::MakeConstSpan(s.tokens).first(static_cast<size_t>(n)));
    s.lookup = lookups_->Start(s.names, {});
  }
  if (wait) s.lookup->WaitFor(PrefixLookups::kIdleWait);
  return s.lookup->done();
}

void FullKvEngine::FetchPrefix(Sequence& s) {
  if (s.names.empty()) return;
  s.publish_from = 0;
  const int hit = s.lookup->hit;  // LookupDone(s) came back true
  if (hit == 0) return;
  // A read takes as long as the link does (or the store's timeout): on a thread of its own, so
  // that the batch in flight goes on meanwhile.
  s.read_blocks = hit;
  s.read = std::async(std::launch::async, [this, names = std::vector<PrefixName>(s.names.begin(), s.names.begin() + hit),
                                           dest = PagedDest::Of(cache_, s.seq)] { return prefixes_->Read(names, dest); });
  // One that lands at once (over shared memory, 8K tokens' blocks take a few milliseconds) joins
  // this step's pass rather than the next.
  if (s.read.wait_for(absl::ToChronoMilliseconds(PrefixLookups::kGrace)) == std::future_status::ready) LandRead(s);
}

void FullKvEngine::ReleaseReadsLanded() {
  std::erase_if(reading_, [&](Reading& r) {
    if (r.read.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    cache_.FreeSequence(r.seq);
    return true;
  });
}

void FullKvEngine::LandRead(Sequence& s) {
  const absl::Status read = s.read.get();
  const int64_t p = int64_t{s.read_blocks} * prefixes_->block_tokens();
  EngineStats& st = s.result.stats;
  if (!read.ok()) {
    // Whatever the read left in the blocks is overwritten by the prefill, which starts at 0.
    st.recomputed_tokens = p;
    return;
  }
  cache_.Commit(s.seq, p);
  st.prefix_store_tokens = p;
  st.bytes_fetched = p * cache_.layout().bytes_per_token();
  s.publish_from = s.read_blocks;
}

void FullKvEngine::Admit(Sequence& s) {
  s.admitted = SteadyClock()->Now();
  s.result.stats.queue_seconds = absl::ToDoubleSeconds(s.admitted - s.submitted);
  s.seq = cache_.NewSequence();
  // The caller checked free_blocks(): the whole request fits, so no pass can run out of room.
  (void)cache_.Reserve(s.seq, BlocksFor(s.request) * options_.block_size);
  const PrefilledKv& pre = s.request.prefilled;
  if (pre.cache != nullptr) {
    const int64_t n = s.prompt_len - 1;
    pre.cache->CopyTo(pre.seq, 0, n, cache_, s.seq);
    cache_.Commit(s.seq, n);
  } else if (UsesStore(s)) {
    FetchPrefix(s);
  }
}

void FullKvEngine::PromptDone(Sequence& s) {
  s.result.stats.prefill_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - s.admitted);
  const int to = static_cast<int>(s.names.size());
  if (s.publish_from >= 0 && s.publish_from < to) {
    prefixes_->Publish(s.names, s.publish_from, to, cache_, s.seq);
    s.result.stats.published_blocks += to - s.publish_from;
  }
  s.publish_from = -1;
}

bool FullKvEngine::UsesStore(const Sequence& s) const {
  return prefixes_ != nullptr && options_.fetch_prefix && s.request.prefilled.cache == nullptr;
}

void FullKvEngine::ShareOutput(Sequence& s) {
  if (!UsesStore(s) || !options_.publish_outputs) return;
  // Every token but the last has its K/V in the cache.
  const size_t end = static_cast<size_t>(cache_.Length(s.seq));
  s.result.stats.published_blocks +=
      PublishBlocksPast(*prefixes_, s.request.tenant, absl::MakeConstSpan(s.tokens).first(end),
                        static_cast<int>(s.names.size()), cache_, s.seq);
}

absl::Status FullKvEngine::Pass() {
  std::vector<Sequence*> ready;
  for (auto& sp : requests_.active) {
    if (!sp->read.valid()) ready.push_back(sp.get());
  }
  if (ready.empty()) return absl::OkStatus();
  std::vector<SequenceChunk> chunks;
  std::vector<bool> prefilling;
  for (Sequence* sp : ready) {
    Sequence& s = *sp;
    const int64_t len = cache_.Length(s.seq);
    const bool in_prompt = len < s.prompt_len;
    const int64_t end = in_prompt ? std::min<int64_t>(len + s.request.options.prefill_chunk, s.prompt_len)
                                  : static_cast<int64_t>(s.tokens.size());
    chunks.push_back({s.seq, absl::MakeConstSpan(s.tokens).subspan(static_cast<size_t>(len), static_cast<size_t>(end - len))});
    prefilling.push_back(in_prompt);
  }
  std::vector<float> logits;
  std::vector<bool> finite;
  VC_RETURN_IF_ERROR(model_.Forward(chunks, cache_, LogitsFor::kLastRows, &logits, &finite));

  const int vocab = model_.config().vocab_size;
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence& s = *ready[i];
    const int64_t position = cache_.Length(s.seq);
    if (position < static_cast<int64_t>(s.tokens.size())) continue;  // more of the prompt to go
    if (!finite[i]) {
      // Its logits overflowed float32: it alone ends, the batch goes on.
      s.failed = NonFiniteLogits();
      s.done = true;
      continue;
    }
    if (prefilling[i]) PromptDone(s);
    const GenerateOptions& o = s.request.options;
    const int32_t t = SampleToken(absl::MakeConstSpan(logits).subspan(i * vocab, vocab), o.sampling, position);
    s.tokens.push_back(t);
    s.result.tokens.push_back(t);
    s.generated++;
    s.result.stats.emitted++;
    if (s.generated == 1) s.result.stats.first_token_seconds = absl::ToDoubleSeconds(SteadyClock()->Now() - s.submitted);
    if (s.request.on_tokens) s.request.on_tokens({&t, 1});
    if ((o.stop_at_eos && model_.tokenizer().IsEos(t)) || s.generated >= o.max_tokens) {
      s.done = true;
      ShareOutput(s);
    }
  }
  return absl::OkStatus();
}

absl::Status FullKvEngine::Step(bool may_wait) {
  // Requests that end are told only at the end of the step; what they held is freed at once, so
  // that admission below can use it.
  std::vector<RequestQueue<Sequence>::Ended> ended = requests_.TakeEnded(
      absl::Now(), [&](const Sequence& s) { return Check(s.request); },
      [&](Sequence& s) {
        // Cancelled (a stop sequence is a cancel) or past its deadline: its K/V is exact and may be
        // the start of the next turn.
        if (s.generated > 0) ShareOutput(s);
        Leave(s);
      });
  auto& active = requests_.active;
  requests_.AdmitInOrder(static_cast<size_t>(options_.max_batch), INT_MAX, [&](Sequence& s) {
    if (cache_.free_blocks() < BlocksFor(s.request)) {
      s.lookup.reset();  // asked again once it fits: the store may have changed meanwhile
      return Admission::kWait;
    }
    // Nothing in flight to hold up: wait for the store's answer here rather than step idly.
    if (!LookupDone(s, /*wait=*/may_wait && active.empty())) return Admission::kWait;
    Admit(s);
    return Admission::kAdmitted;
  }, static_cast<size_t>(options_.max_batch_per_tenant));
  // Stored prefixes that have arrived join the pass. With nothing else to run, the first still
  // being read is waited for a while (without may_wait, a moment: see VeriCacheEngine::Step).
  const auto reading = [](const auto& sp) { return sp->read.valid(); };
  if (std::all_of(active.begin(), active.end(), reading) && !active.empty()) {
    active.front()->read.wait_for(
        absl::ToChronoMilliseconds(may_wait ? PrefixLookups::kIdleWait : PrefixLookups::kPoll));
  }
  for (auto& sp : active) {
    if (reading(sp) && sp->read.wait_for(std::chrono::seconds(0)) == std::future_status::ready) LandRead(*sp);
  }
  ReleaseReadsLanded();
  const absl::Status status = active.empty() ? absl::OkStatus() : Pass();
  for (auto& e : requests_.TakeFinished(status, [&](Sequence& s) { Leave(s); })) ended.push_back(std::move(e));
  RequestQueue<Sequence>::TellAll(ended);
  return status;
}

absl::StatusOr<std::vector<EngineResult>> FullKvEngine::Generate(absl::Span<const EngineRequest> requests) {
  if (!Idle()) return absl::FailedPreconditionError("Generate while submitted requests are in flight");
  for (const EngineRequest& r : requests) VC_RETURN_IF_ERROR(Check(r));
  return RunToCompletion(*this, requests);
}

}  // namespace vc
