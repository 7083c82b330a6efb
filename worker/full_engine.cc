#include "worker/full_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/full_decoder.h"
#include "worker/sampler.h"

namespace vc {

struct FullKvEngine::Sequence {
  RequestId id = 0;
  EngineRequest request;
  DoneCallback on_done;
  absl::Time submitted;
  absl::Time admitted;
  bool checked = false;  // passed Check while queued
  SeqId seq = -1;        // in cache_, once admitted
  // prompt + emitted. Positions [0, cache_.Length(seq)) have their K/V; a decoding sequence
  // lacks only the last token's, which the next pass feeds.
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  std::vector<PrefixName> names;  // of the prompt's full blocks, with a PrefixStore
  int publish_from = -1;          // blocks [publish_from, names.size()) to publish; -1: none
  int generated = 0;
  EngineResult result;
  bool done = false;
  bool cancelled = false;
};

FullKvEngine::FullKvEngine(const Model& model, const FullEngineOptions& options, PrefixStore* prefixes)
    : model_(model),
      prefixes_(prefixes),
      options_(options),
      cache_(model.kv_layout(options.block_size), options.kv_blocks) {}

FullKvEngine::~FullKvEngine() = default;

absl::StatusOr<std::unique_ptr<FullKvEngine>> FullKvEngine::Create(const Model& model, const FullEngineOptions& options,
                                                                   PrefixStore* prefixes) {
  if (options.block_size < 1 || options.max_batch < 1 || options.kv_blocks < 1) {
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

FullKvEngine::RequestId FullKvEngine::Submit(EngineRequest request, DoneCallback on_done) {
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->request = std::move(request);
  s->on_done = std::move(on_done);
  s->submitted = absl::Now();
  s->tokens = s->request.prompt;
  s->prompt_len = static_cast<int64_t>(s->tokens.size());
  s->result.stats.prompt_tokens = s->prompt_len;
  pending_.push_back(std::move(s));
  return pending_.back()->id;
}

void FullKvEngine::Cancel(RequestId id) {
  for (auto& s : pending_) {
    if (s->id == id) s->cancelled = true;
  }
  for (auto& s : active_) {
    if (s->id == id) s->cancelled = true;
  }
}

void FullKvEngine::Finish(Sequence& s, absl::Status status) {
  if (s.seq >= 0) cache_.FreeSequence(s.seq);
  s.seq = -1;
  s.result.stats.total_seconds = absl::ToDoubleSeconds(absl::Now() - s.submitted);
  if (s.on_done) s.on_done(std::move(status), std::move(s.result));
  s.on_done = nullptr;
}

void FullKvEngine::FetchPrefix(Sequence& s) {
  const int64_t n = s.prompt_len - 1;  // the last prompt token is always computed: it yields logits
  s.names = prefixes_->Names(absl::MakeConstSpan(s.tokens).first(static_cast<size_t>(n)));
  if (s.names.empty()) return;
  s.publish_from = 0;
  const int hit = std::clamp(prefixes_->Lookup(s.names), 0, static_cast<int>(s.names.size()));
  if (hit == 0) return;
  const int64_t p = int64_t{hit} * prefixes_->block_tokens();
  EngineStats& st = s.result.stats;
  absl::Status read = prefixes_->Read(absl::MakeConstSpan(s.names).first(hit), PagedDest::Of(cache_, s.seq));
  if (!read.ok()) {
    // Whatever the read left in the blocks is overwritten by the prefill, which starts at 0.
    st.recomputed_tokens = p;
    return;
  }
  cache_.Commit(s.seq, p);
  st.prefix_store_tokens = p;
  st.bytes_fetched = p * cache_.layout().bytes_per_token();
  s.publish_from = hit;
}

void FullKvEngine::Admit(Sequence& s) {
  s.admitted = absl::Now();
  s.result.stats.queue_seconds = absl::ToDoubleSeconds(s.admitted - s.submitted);
  s.seq = cache_.NewSequence();
  // The caller checked free_blocks(): the whole request fits, so no pass can run out of room.
  (void)cache_.Reserve(s.seq, BlocksFor(s.request) * options_.block_size);
  const PrefilledKv& pre = s.request.prefilled;
  if (pre.cache != nullptr) {
    const int64_t n = s.prompt_len - 1;
    for (int l = 0; l < cache_.layout().num_layers; ++l) {
      for (int64_t p = 0; p < n; ++p) cache_.Write(l, s.seq, p, pre.cache->K(l, pre.seq, p), pre.cache->V(l, pre.seq, p));
    }
    cache_.Commit(s.seq, n);
  } else if (prefixes_ != nullptr && options_.fetch_prefix) {
    FetchPrefix(s);
  }
}

void FullKvEngine::PromptDone(Sequence& s) {
  s.result.stats.prefill_seconds = absl::ToDoubleSeconds(absl::Now() - s.admitted);
  const int to = static_cast<int>(s.names.size());
  if (s.publish_from >= 0 && s.publish_from < to) {
    prefixes_->Publish(s.names, s.publish_from, to, cache_, s.seq);
    s.result.stats.published_blocks += to - s.publish_from;
  }
  s.publish_from = -1;
}

absl::Status FullKvEngine::Pass() {
  std::vector<SequenceChunk> chunks;
  std::vector<bool> prefilling;
  for (auto& sp : active_) {
    Sequence& s = *sp;
    const int64_t len = cache_.Length(s.seq);
    const bool in_prompt = len < s.prompt_len;
    const int64_t end = in_prompt ? std::min<int64_t>(len + s.request.options.prefill_chunk, s.prompt_len)
                                  : static_cast<int64_t>(s.tokens.size());
    chunks.push_back({s.seq, absl::MakeConstSpan(s.tokens).subspan(static_cast<size_t>(len), static_cast<size_t>(end - len))});
    prefilling.push_back(in_prompt);
  }
  std::vector<float> logits;
  VC_RETURN_IF_ERROR(model_.Forward(chunks, cache_, LogitsFor::kLastRows, &logits));

  const int vocab = model_.config().vocab_size;
  const int32_t eos = model_.tokenizer().eos();
  for (size_t i = 0; i < active_.size(); ++i) {
    Sequence& s = *active_[i];
    const int64_t position = cache_.Length(s.seq);
    if (position < static_cast<int64_t>(s.tokens.size())) continue;  // more of the prompt to go
    if (prefilling[i]) PromptDone(s);
    const GenerateOptions& o = s.request.options;
    const int32_t t = SampleToken(absl::MakeConstSpan(logits).subspan(i * vocab, vocab), o.sampling, position);
    s.tokens.push_back(t);
    s.result.tokens.push_back(t);
    s.generated++;
    s.result.stats.emitted++;
    if (s.generated == 1) s.result.stats.first_token_seconds = absl::ToDoubleSeconds(absl::Now() - s.submitted);
    if (s.request.on_tokens) s.request.on_tokens({&t, 1});
    if ((o.stop_at_eos && t == eos) || s.generated >= o.max_tokens) s.done = true;
  }
  return absl::OkStatus();
}

absl::Status FullKvEngine::Step() {
  // Requests that end are set aside and told only at the end of the step, so a callback that
  // submits or cancels does not disturb the queues being walked.
  std::vector<std::pair<std::unique_ptr<Sequence>, absl::Status>> ended;
  auto finish_ended = [&] {
    for (auto& [s, status] : ended) Finish(*s, std::move(status));
    ended.clear();
  };
  const absl::Time now = absl::Now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    Sequence& s = **it;
    absl::Status why = s.cancelled                  ? absl::CancelledError("request cancelled")
                       : now > s.request.deadline   ? absl::DeadlineExceededError("deadline passed while queued")
                       : s.checked                  ? absl::OkStatus()
                                                    : Check(s.request);
    if (why.ok()) {
      s.checked = true;
      ++it;
      continue;
    }
    ended.emplace_back(std::move(*it), std::move(why));
    it = pending_.erase(it);
  }
  for (auto it = active_.begin(); it != active_.end();) {
    Sequence& s = **it;
    if (!s.cancelled && now <= s.request.deadline) {
      ++it;
      continue;
    }
    absl::Status why = s.cancelled ? absl::CancelledError("request cancelled")
                                   : absl::DeadlineExceededError("deadline passed while generating");
    cache_.FreeSequence(s.seq);  // now, so that admission below can use the blocks
    s.seq = -1;
    ended.emplace_back(std::move(*it), std::move(why));
    it = active_.erase(it);
  }
  // First come, first served: the head of the queue waits for room rather than being overtaken.
  while (!pending_.empty() && static_cast<int>(active_.size()) < options_.max_batch &&
         cache_.free_blocks() >= BlocksFor(pending_.front()->request)) {
    Admit(*pending_.front());
    active_.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }

  if (!active_.empty()) {
    absl::Status status = Pass();
    if (!status.ok()) {
      for (auto& s : active_) ended.emplace_back(std::move(s), status);
      active_.clear();
      finish_ended();
      return status;
    }
  }
  for (auto it = active_.begin(); it != active_.end();) {
    if ((*it)->done) {
      ended.emplace_back(std::move(*it), absl::OkStatus());
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  finish_ended();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EngineResult>> FullKvEngine::Generate(absl::Span<const EngineRequest> requests) {
  if (!Idle()) return absl::FailedPreconditionError("Generate while submitted requests are in flight");
  for (const EngineRequest& r : requests) VC_RETURN_IF_ERROR(Check(r));
  return RunToCompletion(*this, requests);
}

}  // namespace vc
