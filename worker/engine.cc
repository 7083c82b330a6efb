#include "worker/engine.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/draft_window.h"
#include "worker/lossy_decoder.h"

namespace vc {

struct VeriCacheEngine::Sequence {
  size_t index = 0;
  const EngineRequest* request = nullptr;
  TierKey key = 0;
  SeqId cseq = -1;  // in the compressed cache
  SeqId sseq = -1;  // in staging, while a fetch or verify needs it
  std::vector<int32_t> tokens;  // prompt + emitted; positions [0, size - 1) are in both caches
  int generated = 0;
  int k = -1;  // current window; -1 between windows
  std::vector<int32_t> drafts;
  std::shared_ptr<FetchHandle> fetch;
  absl::Time fetch_start;
  DraftWindow window{0, 1};
  EngineResult result;
  bool done = false;
  int64_t v() const { return static_cast<int64_t>(tokens.size()); }
};

VeriCacheEngine::VeriCacheEngine(const Model& model, FullKvTier* tier, const EngineOptions& options)
    : model_(model), tier_(tier), options_(options) {}

absl::StatusOr<std::unique_ptr<VeriCacheEngine>> VeriCacheEngine::Create(const Model& model, FullKvTier* tier,
                                                                         const EngineOptions& options) {
  if (options.block_size < 1 || options.max_batch < 1 || options.max_draft_window < 1 ||
      options.draft_window < 0 || options.staging_blocks < 0) {
    return absl::InvalidArgumentError("engine options out of range");
  }
  VC_ASSIGN_OR_RETURN(auto probe, MakeCompressedKvCache(options.compressor, model.kv_layout(options.block_size),
                                                        model.config().num_heads));
  std::unique_ptr<VeriCacheEngine> e(new VeriCacheEngine(model, tier, options));
  e->spec_ = probe->spec();
  e->max_rollback_ = probe->MaxRollback();
  if (e->max_rollback_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat("compressor ", e->spec_, " cannot roll back a single draft"));
  }
  return e;
}

absl::Status VeriCacheEngine::Admit(Sequence& s) {
  const absl::Time t0 = absl::Now();
  const int64_t n = s.v() - 1;  // the last prompt token is fed by the first draft step
  const PrefilledKv& pre = s.request->prefilled;
  if (pre.cache != nullptr) {
    if (pre.cache->Length(pre.seq) < n) {
      return absl::InvalidArgumentError(absl::StrCat("prefilled KV holds ", pre.cache->Length(pre.seq),
                                                     " positions, the prompt needs ", n));
    }
    if (compressed_->needs() == CompressorNeeds::kPromptQueries) {
      return absl::FailedPreconditionError(absl::StrCat(spec_, " needs prompt queries: prefill the prompt instead"));
    }
    VC_RETURN_IF_ERROR(tier_->Append(s.key, *pre.cache, pre.seq, 0, n));
    s.cseq = compressed_->NewSequence();
    VC_RETURN_IF_ERROR(compressed_->BuildFrom(s.cseq, *pre.cache, pre.seq, n, nullptr));
    s.result.stats.prefill_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    return absl::OkStatus();
  }
  const SeqId tmp = staging_->NewSequence();
  absl::Status st = staging_->Reserve(tmp, n + 1);
  if (!st.ok()) {
    staging_->FreeSequence(tmp);
    return st;
  }
  s.cseq = compressed_->NewSequence();
  VC_RETURN_IF_ERROR(PrefillAndCompress(model_, s.tokens, n, std::max(1, s.request->options.prefill_chunk), *staging_,
                                        tmp, *compressed_, s.cseq));
  VC_RETURN_IF_ERROR(tier_->Append(s.key, *staging_, tmp, 0, n));
  staging_->FreeSequence(tmp);
  s.result.stats.prefill_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return absl::OkStatus();
}

absl::Status VeriCacheEngine::StartWindow(Sequence& s) {
  if (s.k < 0) {
    const int remaining = s.request->options.max_tokens - s.generated;
    s.k = s.window.Choose(costs_, static_cast<double>((s.v() - 1) * model_.kv_layout(options_.block_size).bytes_per_token()),
                          remaining);
    s.drafts.clear();
  }
  if (s.fetch == nullptr) {
    // Staging for the fetched prefix plus the k + 1 positions the verify pass appends.
    const SeqId sseq = staging_->NewSequence();
    absl::Status st = staging_->Reserve(sseq, s.v() + s.k);
    if (!st.ok()) {
      staging_->FreeSequence(sseq);
      return st;  // retried on a later iteration, once a verify frees blocks
    }
    s.sseq = sseq;
    s.fetch_start = absl::Now();
    s.fetch = tier_->Fetch(s.key, s.v() - 1, staging_.get(), sseq);
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
  const absl::Time t0 = absl::Now();
  VC_RETURN_IF_ERROR(model_.Forward(chunks, *compressed_, LogitsFor::kLastRows, &logits));
  const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
  costs_.ObserveDraftStep(dt);
  const int vocab = model_.config().vocab_size;
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& s = *drafting[i];
    const int64_t position = s.v() + static_cast<int64_t>(s.drafts.size());
    s.drafts.push_back(SampleToken(absl::MakeConstSpan(logits).subspan(i * vocab, vocab),
                                   s.request->options.sampling, position));
    s.result.stats.draft_seconds += dt / drafting.size();
    s.result.stats.drafted++;
  }
  return absl::OkStatus();
}

absl::Status VeriCacheEngine::Verify(std::vector<Sequence*>& ready) {
  std::vector<std::vector<int32_t>> feeds(ready.size());
  std::vector<SequenceChunk> chunks;
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence& s = *ready[i];
    VC_RETURN_IF_ERROR(s.fetch->Wait());
    staging_->Commit(s.sseq, s.v() - 1);
    feeds[i].push_back(s.tokens.back());
    feeds[i].insert(feeds[i].end(), s.drafts.begin(), s.drafts.end());
    chunks.push_back({s.sseq, feeds[i]});
  }
  std::vector<float> logits;
  const absl::Time t0 = absl::Now();
  VC_RETURN_IF_ERROR(model_.Forward(chunks, *staging_, LogitsFor::kAllRows, &logits));
  const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
  int rows_total = 0;
  for (auto& f : feeds) rows_total += static_cast<int>(f.size());
  // Batched passes: a draft step and a verify pass each cost the whole batch this much time.
  costs_.ObserveVerify(rows_total / static_cast<int>(ready.size()), dt);

  const int vocab = model_.config().vocab_size;
  const int layers = model_.config().num_layers;
  int64_t row = 0;
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence& s = *ready[i];
    const GenerateOptions& o = s.request->options;
    const int64_t v = s.v();
    const int k = static_cast<int>(s.drafts.size());
    // Accept the longest prefix of drafts the full-KV targets agree with, then the target's own.
    int accepted = 0;
    int32_t next = -1;
    for (int j = 0; j <= k; ++j) {
      const int32_t target = SampleToken(absl::MakeConstSpan(logits).subspan((row + j) * vocab, vocab), o.sampling, v + j);
      if (j < k && s.drafts[j] == target) {
        ++accepted;
        continue;
      }
      next = target;
      break;
    }
    row += k + 1;
    std::vector<int32_t> emit(s.drafts.begin(), s.drafts.begin() + accepted);
    emit.push_back(next);
    EngineStats& st = s.result.stats;
    st.verify_seconds += dt / ready.size();
    st.verifies++;
    st.accepted_drafts += accepted;
    st.bytes_fetched += s.fetch->bytes();
    s.window.Observe(k, accepted);
    for (int32_t t : emit) {
      s.tokens.push_back(t);
      s.result.tokens.push_back(t);
      s.generated++;
      st.emitted++;
      if ((o.stop_at_eos && t == model_.tokenizer().eos()) || s.generated >= o.max_tokens) {
        s.done = true;
        break;
      }
    }
    if (!s.done) {
      // Positions [v - 1, v - 1 + accepted + 1) were fed with verified tokens: their K/V is exact.
      const int64_t keep_end = v + accepted;
      VC_RETURN_IF_ERROR(tier_->Append(s.key, *staging_, s.sseq, v - 1, keep_end));
      VC_RETURN_IF_ERROR(compressed_->Truncate(s.cseq, v - 1));
      VC_RETURN_IF_ERROR(compressed_->Reserve(s.cseq, keep_end));
      for (int l = 0; l < layers; ++l) {
        for (int64_t p = v - 1; p < keep_end; ++p) {
          compressed_->Write(l, s.cseq, p, staging_->K(l, s.sseq, p), staging_->V(l, s.sseq, p));
        }
      }
      compressed_->Commit(s.cseq, keep_end);
    }
    staging_->FreeSequence(s.sseq);
    s.sseq = -1;
    s.fetch.reset();
    s.k = -1;
    s.drafts.clear();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EngineResult>> VeriCacheEngine::Generate(absl::Span<const EngineRequest> requests) {
  const KvLayout layout = model_.kv_layout(options_.block_size);
  const int max_k = static_cast<int>(std::min<int64_t>(options_.max_draft_window, max_rollback_));
  int64_t need_blocks = 0, biggest = 0;
  for (const EngineRequest& r : requests) {
    VC_RETURN_IF_ERROR(ValidateGenerate(model_, r.prompt, r.options));
    const int64_t blocks = (static_cast<int64_t>(r.prompt.size()) + r.options.max_tokens + max_k + 1) /
                               options_.block_size + 1;
    need_blocks += blocks;
    biggest = std::max(biggest, blocks);
  }
  VC_ASSIGN_OR_RETURN(compressed_, MakeCompressedKvCache(options_.compressor, layout, model_.config().num_heads));
  costs_ = DraftCostModel();
  const int64_t staging_blocks = options_.staging_blocks > 0 ? options_.staging_blocks : need_blocks;
  if (staging_blocks < biggest) {
    return absl::ResourceExhaustedError(absl::StrCat("staging holds ", staging_blocks, " blocks; a sequence needs ", biggest));
  }
  staging_ = std::make_unique<PagedKvCache>(layout, staging_blocks);

  std::vector<Sequence> seqs(requests.size());
  std::deque<Sequence*> pending;
  for (size_t i = 0; i < requests.size(); ++i) {
    Sequence& s = seqs[i];
    s.index = i;
    s.request = &requests[i];
    s.key = next_key_++;
    s.tokens = requests[i].prompt;
    s.window = DraftWindow(options_.draft_window, max_k);
    pending.push_back(&s);
  }
  std::vector<Sequence*> active;
  auto retire = [&](Sequence& s) {
    s.result.stats.compressed_bytes = compressed_->Bytes(s.cseq);
    compressed_->FreeSequence(s.cseq);
    tier_->Erase(s.key);
  };
  while (!pending.empty() || !active.empty()) {
    while (!pending.empty() && static_cast<int>(active.size()) < options_.max_batch) {
      absl::Status st = Admit(*pending.front());
      if (absl::IsResourceExhausted(st) && !active.empty()) break;  // wait for staging to free up
      VC_RETURN_IF_ERROR(st);
      active.push_back(pending.front());
      pending.pop_front();
    }
    std::vector<Sequence*> drafting, ready, waiting;
    for (Sequence* s : active) {
      absl::Status st = StartWindow(*s);
      if (!st.ok() && !absl::IsResourceExhausted(st)) return st;
      if (static_cast<int>(s->drafts.size()) < s->k) {
        drafting.push_back(s);
      } else if (s->fetch != nullptr && s->fetch->Done()) {
        ready.push_back(s);
      } else if (s->fetch != nullptr) {
        waiting.push_back(s);
      }
    }
    if (!ready.empty()) {
      for (Sequence* s : ready) {
        costs_.ObserveFetch(static_cast<double>(s->fetch->bytes()),
                            absl::ToDoubleSeconds(s->fetch->finished_at() - s->fetch_start));
      }
      VC_RETURN_IF_ERROR(Verify(ready));
    } else if (!drafting.empty()) {
      VC_RETURN_IF_ERROR(DraftStep(drafting));
    } else if (!waiting.empty()) {
      const absl::Time t0 = absl::Now();
      VC_RETURN_IF_ERROR(waiting.front()->fetch->Wait());
      waiting.front()->result.stats.fetch_wait_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
    } else {
      return absl::ResourceExhaustedError("staging memory cannot hold any sequence's full KV");
    }
    for (auto it = active.begin(); it != active.end();) {
      if ((*it)->done) {
        retire(**it);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::vector<EngineResult> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.result));
  return out;
}

}  // namespace vc
