#include "services/worker_service.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "services/stop_scanner.h"
#include "services/store_service.h"
#include "worker/compression/registry.h"

namespace vc {

namespace v1 = vericache::v1;

namespace {

// The engines' indices in the scheduler.
constexpr size_t kVeriCache = 0;
constexpr size_t kFull = 1;

// The answer to a request that needs text from a model served on token ids alone.
absl::Status NoText(const ModelConfig& c) {
  return absl::InvalidArgumentError(absl::StrCat(
      "this worker has no tokenizer for the model (its config names ",
      c.tokenizer.empty() ? std::string("none") : absl::StrCat("'", c.tokenizer, "'"),
      ", its folder no tokenizer.json; built in: vericache-byte): send token_ids, without stop sequences"));
}

constexpr int kMaxStops = 16;
// A conversation's JSON (messages and tools): as much as a context of text, and then some.
constexpr size_t kMaxChatBytes = size_t{16} << 20;
constexpr size_t kMaxStopBytes = 256;

// Seconds as whole microseconds for the stats messages (the engine times requests on the steady
// clock; anything not positive, should it come, is 0, not a wrapped unsigned count).
uint64_t Micros(double seconds) { return seconds > 0 ? static_cast<uint64_t>(seconds * 1e6) : 0; }

void FillStats(const EngineStats& s, v1::Mode mode, v1::GenerateStats* out) {
  out->set_prompt_tokens(static_cast<uint32_t>(s.prompt_tokens));
  out->set_generated_tokens(static_cast<uint32_t>(s.emitted));
  out->set_prefix_store_tokens(static_cast<uint32_t>(s.prefix_store_tokens));
  out->set_prefix_compressed_tokens(static_cast<uint32_t>(s.prefix_compressed_tokens));
  out->set_prefix_compressed_store_tokens(static_cast<uint32_t>(s.prefix_compressed_store_tokens));
  out->set_recomputed_tokens(static_cast<uint32_t>(s.recomputed_tokens));
  out->set_drafted_tokens(static_cast<uint32_t>(s.drafted));
  out->set_accepted_drafts(static_cast<uint32_t>(s.accepted_drafts));
  out->set_verify_passes(static_cast<uint32_t>(s.verifies));
  out->set_plain_verify_passes(static_cast<uint32_t>(s.plain_verifies));
  out->set_queue_micros(Micros(s.queue_seconds));
  out->set_time_to_first_token_micros(Micros(s.first_token_seconds));
  out->set_total_micros(Micros(s.total_seconds));
  out->set_mode(mode);
  out->set_prefill_micros(Micros(s.prefill_seconds));
  out->set_draft_micros(Micros(s.draft_seconds));
  out->set_verify_micros(Micros(s.verify_seconds));
  out->set_fetch_wait_micros(Micros(s.fetch_wait_seconds));
}

}  // namespace

WorkerService::WorkerService(const Model& model, const WorkerServiceOptions& options, PrefixStore* prefixes)
    : model_(model), options_(options), prefixes_(prefixes), started_(SteadyClock()->Now()) {}

WorkerService::~WorkerService() = default;

void WorkerService::StopAdmitting() { scheduler_->StopAdmitting(); }

bool WorkerService::WaitIdle(absl::Duration timeout) { return scheduler_->WaitIdle(timeout); }

absl::Duration WorkerService::StalledFor() const {
  const absl::Duration now = SteadyClock()->Now();
  const uint64_t passes = model_.forward_passes();
  absl::MutexLock l(&passes_mu_);
  if (passes != passes_seen_) {
    passes_seen_ = passes;
    passes_changed_ = now;
  }
  return std::min(scheduler_->StalledFor(), now - passes_changed_);
}

absl::StatusOr<std::unique_ptr<WorkerService>> WorkerService::Create(const Model& model, FullKvTier* tier,
                                                                    PrefixStore* prefixes,
                                                                    const WorkerServiceOptions& options) {
  if (options.engine.staging_blocks < 1) return absl::InvalidArgumentError("the worker needs staging blocks");
  if (options.max_requests < 1) return absl::InvalidArgumentError("max_requests must be at least 1");
  if (options.max_requests_per_tenant < 0) return absl::InvalidArgumentError("max_requests_per_tenant is negative");
  if (options.client_write_timeout_ms < 1) return absl::InvalidArgumentError("client_write_timeout_ms must be at least 1");
  if (options.max_batch_per_tenant < -1) return absl::InvalidArgumentError("max_batch_per_tenant is below -1");
  std::set<std::string> tenants;
  for (const auto& [token, tenant] : options.client_tokens) tenants.insert(tenant);
  const auto share = [&](int max_batch) {
    if (options.max_batch_per_tenant >= 0) return options.max_batch_per_tenant;
    return tenants.size() > 1 ? std::max(1, max_batch - std::max(1, max_batch / 8)) : 0;
  };
  std::unique_ptr<WorkerService> w(new WorkerService(model, options, prefixes));
  EngineOptions eo = options.engine;
  eo.max_batch_per_tenant = share(eo.max_batch);
  VC_ASSIGN_OR_RETURN(auto vericache, VeriCacheEngine::Create(model, tier, eo, prefixes));
  w->compressor_ = vericache->compressor_spec();
  w->vericache_ = vericache.get();
  w->tier_ = tier;
  std::unique_ptr<FullKvEngine> full;
  if (options.full_kv_blocks > 0) {
    FullEngineOptions fo;
    fo.block_size = options.engine.block_size;
    fo.kv_blocks = options.full_kv_blocks;
    fo.max_batch = options.full_max_batch;
    fo.max_batch_per_tenant = share(fo.max_batch);
    fo.publish_outputs = options.engine.publish_outputs;
    VC_ASSIGN_OR_RETURN(full, FullKvEngine::Create(model, fo, prefixes));
  }
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(std::move(vericache));
  if (full != nullptr) engines.push_back(std::move(full));
  w->has_full_ = engines.size() > kFull;
  w->scheduler_ = std::make_unique<Scheduler>(
      std::move(engines), SchedulerOptions{options.max_requests, options.max_requests_per_tenant, options.before_steps});
  w->watchdog_ = std::make_unique<WriteWatchdog<grpc::ServerContext>>(absl::Milliseconds(options.client_write_timeout_ms));
  return w;
}

absl::StatusOr<std::string> WorkerService::Authenticate(grpc::ServerContext* ctx) const {
  if (options_.client_tokens.empty()) return std::string();
  auto it = ctx->client_metadata().find("authorization");
  if (it != ctx->client_metadata().end()) {
    const std::string value(it->second.data(), it->second.size());
    if (absl::StartsWith(value, "Bearer ")) {
      const auto token = options_.client_tokens.find(value.substr(7));
      if (token != options_.client_tokens.end()) return token->second;
    }
  }
  return absl::UnauthenticatedError("a valid bearer token is required");
}

absl::StatusOr<EngineRequest> WorkerService::Parse(const v1::GenerateRequest& req) const {
  EngineRequest r;
  // A prompt that cannot fit the context is refused before it is copied or encoded (four bytes an
  // id: a large request would cost several times its size first).
  const int64_t ctx = model_.config().max_position_embeddings;
  // 0: what the prompt leaves of the context (at least one token is checked below).
  const int64_t max_tokens = req.max_tokens() > 0 ? req.max_tokens() : 1;
  if (req.max_tokens() > static_cast<uint64_t>(ctx)) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens ", req.max_tokens(), " exceeds the context of ", ctx));
  }
  switch (req.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (req.text().empty()) return absl::InvalidArgumentError("the prompt text is empty");
      if (!model_.tokenizer().handles_text()) return NoText(model_.config());
      VC_RETURN_IF_ERROR(CheckFitsContext(model_, model_.tokenizer().MinTokens(req.text().size()), max_tokens,
                                          /*at_least=*/true));
      r.prompt = model_.tokenizer().Encode(req.text());
      break;
    case v1::GenerateRequest::kChat: {
      if (options_.chat == nullptr) {
        // Another worker may have a template (a router moves on).
        return absl::FailedPreconditionError(
            "this worker has no chat template (its checkpoint has none; --chat-template FILE gives one)");
      }
      if (!model_.tokenizer().handles_text()) return NoText(model_.config());
      const v1::ChatPrompt& chat = req.chat();
      if (chat.messages_json().size() + chat.tools_json().size() > kMaxChatBytes) {
        return absl::InvalidArgumentError(absl::StrCat("the conversation has ", chat.messages_json().size() +
                                                       chat.tools_json().size(), " bytes; at most ", kMaxChatBytes));
      }
      VC_ASSIGN_OR_RETURN(const std::string text, options_.chat->Render(chat.messages_json(), chat.tools_json(),
                                                                        chat.add_generation_prompt()));
      if (text.empty()) return absl::InvalidArgumentError("the chat template rendered an empty prompt");
      VC_RETURN_IF_ERROR(
          CheckFitsContext(model_, model_.tokenizer().MinTokens(text.size()), max_tokens, /*at_least=*/true));
      r.prompt = model_.tokenizer().EncodeTemplated(text);
      if (r.prompt.empty()) return absl::InvalidArgumentError("the chat template rendered no tokens");
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      // Checked here, not on the prompt with generated_ids after it, which would pass.
      if (req.token_ids().ids().empty()) return absl::InvalidArgumentError("the prompt's token_ids are empty");
      VC_RETURN_IF_ERROR(CheckFitsContext(model_, req.token_ids().ids_size(), max_tokens));
      r.prompt.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
      break;
    default:
      return absl::InvalidArgumentError("the request has no prompt (text, token_ids or chat)");
  }
  const int64_t limit = req.max_tokens() > 0
                            ? static_cast<int64_t>(req.max_tokens())
                            : ctx - static_cast<int64_t>(r.prompt.size());
  if (limit < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt's ", r.prompt.size(), " tokens leave nothing of the context of ", ctx));
  }
  // The prompt and max_tokens checked against the context above cover them.
  const int resumed = req.generated_ids_size();
  if (resumed > 0 && resumed >= limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(resumed, " generated_ids leave nothing of max_tokens ", limit, " to generate"));
  }
  // Output ends at its first end of sequence: only the last of generated_ids may be one (and the
  // request then has nothing left to generate; Generate answers it so).
  if (!req.ignore_eos()) {
    for (int i = 0; i + 1 < resumed; ++i) {
      if (model_.tokenizer().IsEos(req.generated_ids(i))) {
        return absl::InvalidArgumentError("generated_ids go on past the end-of-sequence token");
      }
    }
  }
  r.prompt.insert(r.prompt.end(), req.generated_ids().begin(), req.generated_ids().end());
  r.resumed = resumed;
  r.options.max_tokens = static_cast<int>(limit) - resumed;
  r.options.sampling.temperature = req.sampling().temperature();
  r.options.sampling.top_k = static_cast<int>(std::min<uint32_t>(req.sampling().top_k(), 1u << 30));
  r.options.sampling.top_p = req.sampling().top_p() == 0.0f ? 1.0f : req.sampling().top_p();
  r.options.sampling.seed = req.sampling().seed();
  r.options.stop_at_eos = !req.ignore_eos();
  r.options.block_size = options_.engine.block_size;
  VC_RETURN_IF_ERROR(ValidateGenerate(model_, r.prompt, r.options));
  if (req.stop_size() > 0 && !model_.tokenizer().handles_text()) return NoText(model_.config());
  if (req.stop_size() > kMaxStops) {
    return absl::InvalidArgumentError(absl::StrCat(req.stop_size(), " stop sequences; at most ", kMaxStops));
  }
  for (const std::string& stop : req.stop()) {
    if (stop.empty() || stop.size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a stop sequence of ", stop.size(), " bytes; each must have 1 to ", kMaxStopBytes));
    }
  }
  if (!req.compressor().empty()) {
    absl::StatusOr<std::unique_ptr<CompressedKvCache>> c = MakeCompressedKvCache(
        req.compressor(), model_.kv_layout(options_.engine.block_size), model_.config().num_heads);
    if (!c.ok()) return c.status();
    // MODE_FULL does not draft: any valid spec will do.
    if (req.mode() != v1::MODE_FULL && (*c)->spec() != compressor_) {
      // Another worker may serve it (a router moves on): this worker's, not the request's, fault.
      return absl::FailedPreconditionError(
          absl::StrCat("this worker drafts with ", compressor_, ", not ", (*c)->spec()));
    }
  }
  return r;
}

grpc::Status WorkerService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::StatusOr<std::string> tenant = Authenticate(ctx);
  // Calls refused before admission are counted as invalid; those asking for what this worker
  // does not serve (another compressor, MODE_FULL: FAILED_PRECONDITION) as refused, as those past
  // its limits are: another worker may take them.
  const auto refuse = [&](const absl::Status& why) {
    if (absl::IsFailedPrecondition(why) && tenant.ok()) {
      scheduler_->CountRefused(*tenant);
    } else {
      invalid_++;
    }
    return ToGrpcStatus(why);
  };
  if (!tenant.ok()) return refuse(tenant.status());
  absl::StatusOr<EngineRequest> parsed = Parse(*req);
  if (!parsed.ok()) return refuse(parsed.status());
  parsed->tenant = *tenant;
  v1::Mode mode = req->mode() == v1::MODE_UNSPECIFIED ? v1::MODE_VERICACHE : req->mode();
  size_t engine = kVeriCache;
  if (mode == v1::MODE_FULL) {
    if (!has_full_) {
      return refuse(absl::FailedPreconditionError("this worker serves no MODE_FULL requests (--full-kv-mib 0)"));
    }
    engine = kFull;
  } else if (mode != v1::MODE_VERICACHE) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("unknown mode ", static_cast<int>(mode))));
  }
  // gRPC's "no deadline" is the end of time; absl saturates it to the infinite future.
  const auto deadline = ctx->deadline();
  if (deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    parsed->deadline = absl::FromChrono(deadline);
  }
  // Output that ended with the end of sequence, all of it sent before its worker failed: done.
  if (!req->ignore_eos() && req->generated_ids_size() > 0 &&
      model_.tokenizer().IsEos(req->generated_ids(req->generated_ids_size() - 1))) {
    EngineStats none;
    none.prompt_tokens = parsed->prompt_tokens();
    scheduler_->CountEnded(parsed->tenant, none);
    v1::GenerateResponse last;
    FillStats(none, mode, last.mutable_stats());
    last.mutable_stats()->set_finish_reason(v1::FINISH_REASON_EOS);
    watchdog_->Write(ctx, [&] { return writer->Write(last); });
    return grpc::Status::OK;
  }
  const std::vector<int32_t> context(parsed->prompt.end() - std::min<size_t>(parsed->prompt.size(), 8),
                                     parsed->prompt.end());
  auto stream = std::make_shared<RequestStream>();
  parsed->on_tokens = [stream](absl::Span<const int32_t> t) { stream->Push(t); };
  if (absl::Status q = scheduler_->Enqueue(*std::move(parsed), engine, stream); !q.ok()) return ToGrpcStatus(q);
  // Taken: the client learns it before the first token (see the proto).
  ctx->AddInitialMetadata(kAdmittedKey, "1");
  writer->SendInitialMetadata();

  std::vector<int32_t> tokens;
  bool writable = true;
  size_t sent = 0;
  int32_t last_sent = -1;
  // The prompt (with any generated_ids) as the decoders' context: the output's text is what it adds
  // to the prompt's.
  StopScanner stops(model_.tokenizer(), {req->stop().begin(), req->stop().end()}, context);
  while (true) {
    const bool done = stream->Take(absl::Milliseconds(20), &tokens);
    // Tokens held back at an end with an error stay unsent: a stop may begin in them, and a router
    // that moves the call on (generated_ids) would otherwise pass them on as output.
    StopScanner::Sendable out = stops.Take(tokens, done && stream->status().ok());
    // Once: a stop request is a cancel too. (A client that cancelled first has cancelled: a stop
    // found after that does not make the request end well.)
    if (stops.stopped() && !stream->cancel_requested()) stream->RequestStop();
    if (!out.tokens.empty() && writable) {
      v1::GenerateResponse resp;
      resp.mutable_token_ids()->Add(out.tokens.begin(), out.tokens.end());
      resp.set_text(std::move(out.text));
      writable = watchdog_->Write(ctx, [&] { return writer->Write(resp); });
      if (writable) {
        sent += out.tokens.size();
        last_sent = out.tokens.back();
      }
    }
    if (done) break;
    if (ctx->IsCancelled() || !writable) stream->RequestCancel();
  }
  const absl::Status status = stream->status();
  if (!status.ok()) {
    if (ctx->IsCancelled() && absl::IsCancelled(status)) return grpc::Status::CANCELLED;
    return ToGrpcStatus(status);
  }
  v1::GenerateResponse last;
  FillStats(stream->stats(), mode, last.mutable_stats());
  last.mutable_stats()->set_generated_tokens(static_cast<uint32_t>(sent));
  if (stops.stopped()) {
    last.mutable_stats()->set_finish_reason(v1::FINISH_REASON_STOP);
  } else if (!req->ignore_eos() && last_sent >= 0 && model_.tokenizer().IsEos(last_sent)) {
    last.mutable_stats()->set_finish_reason(v1::FINISH_REASON_EOS);
  } else {
    last.mutable_stats()->set_finish_reason(v1::FINISH_REASON_LENGTH);
  }
  watchdog_->Write(ctx, [&] { return writer->Write(last); });
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetModelInfo(grpc::ServerContext* ctx, const v1::GetModelInfoRequest*,
                                         v1::ModelInfo* resp) {
  if (absl::Status a = Authenticate(ctx).status(); !a.ok()) return ToGrpcStatus(a);
  const ModelConfig& c = model_.config();
  resp->set_architecture(c.architecture);
  resp->set_vocab_size(static_cast<uint32_t>(c.vocab_size));
  resp->set_max_context_tokens(static_cast<uint32_t>(c.max_position_embeddings));
  resp->set_num_layers(static_cast<uint32_t>(c.num_layers));
  // The built-in tokenizer by its name, a Hugging Face one as "tokenizer.json", none as served:
  // token ids only.
  resp->set_tokenizer(!model_.tokenizer().handles_text() ? "token-ids-only"
                      : c.tokenizer == "vericache-byte" ? c.tokenizer
                                                        : "tokenizer.json");
  resp->set_fingerprint_hex(options_.fingerprint_hex);
  resp->set_model_name(options_.model_name);
  resp->set_has_chat_template(options_.chat != nullptr);
  resp->set_numerics(options_.numerics);
  const KvLayout layout = model_.kv_layout(options_.engine.block_size);
  resp->set_kv_dtype(std::string(DTypeName(layout.dtype)));
  resp->set_kv_bytes_per_token(static_cast<uint64_t>(layout.bytes_per_token()));
  resp->set_compressor(compressor_);
  resp->set_prefix_block_tokens(prefixes_ != nullptr ? static_cast<uint32_t>(prefixes_->block_tokens()) : 0);
  resp->set_max_batch(static_cast<uint32_t>(options_.engine.max_batch));
  resp->set_default_mode(v1::MODE_VERICACHE);
  resp->set_takes_generated_ids(true);
  return grpc::Status::OK;
}

namespace {

// The counts WorkerStats and TenantStats share, from a scheduler's totals.
template <typename Proto, typename Totals>
void SetRequestCounts(const Totals& t, Proto* p) {
  p->set_requests_in_flight(static_cast<uint32_t>(t.in_flight));
  p->set_requests_ended(static_cast<uint64_t>(t.ended));
  p->set_requests_failed(static_cast<uint64_t>(t.failed));
  p->set_requests_refused(static_cast<uint64_t>(t.refused));
  p->set_prompt_tokens(static_cast<uint64_t>(t.sum.prompt_tokens));
  p->set_generated_tokens(static_cast<uint64_t>(t.sum.emitted));
  p->set_prefix_store_tokens(static_cast<uint64_t>(t.sum.prefix_store_tokens));
  p->set_prefix_compressed_tokens(static_cast<uint64_t>(t.sum.prefix_compressed_tokens));
  p->set_prefix_compressed_store_tokens(static_cast<uint64_t>(t.sum.prefix_compressed_store_tokens));
  p->set_recomputed_tokens(static_cast<uint64_t>(t.sum.recomputed_tokens));
  p->set_drafted_tokens(static_cast<uint64_t>(t.sum.drafted));
  p->set_accepted_drafts(static_cast<uint64_t>(t.sum.accepted_drafts));
  p->set_verify_passes(static_cast<uint64_t>(t.sum.verifies));
  p->set_plain_verify_passes(static_cast<uint64_t>(t.sum.plain_verifies));
}

// The counts StoreLinkStats and StoreShardStats share, from a prefix store's or one shard's.
template <typename Proto, typename Counts>
void SetStoreTraffic(const Counts& c, Proto* p) {
  p->set_lookups(static_cast<uint64_t>(c.lookups));
  p->set_lookup_failures(static_cast<uint64_t>(c.lookup_failures));
  p->set_lookups_skipped(static_cast<uint64_t>(c.lookups_skipped));
  p->set_blocks_read(static_cast<uint64_t>(c.blocks_read));
  p->set_read_failures(static_cast<uint64_t>(c.read_failures));
  p->set_bytes_read(static_cast<uint64_t>(c.bytes_read));
  p->set_blocks_published(static_cast<uint64_t>(c.blocks_published));
  p->set_publish_failures(static_cast<uint64_t>(c.publish_failures));
  p->set_publish_dropped(static_cast<uint64_t>(c.publish_dropped));
}

}  // namespace

grpc::Status WorkerService::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*, v1::WorkerStats* resp) {
  absl::StatusOr<std::string> tenant = Authenticate(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  // The counts cover every tenant's requests: for the default tenant's tokens (operators) only.
  if (!tenant->empty()) {
    return ToGrpcStatus(absl::PermissionDeniedError("worker stats are for tokens of the default tenant"));
  }
  CurrentStats(resp);
  return grpc::Status::OK;
}

void WorkerService::CurrentStats(v1::WorkerStats* resp) const {
  const Scheduler::Snapshot snapshot = scheduler_->totals();
  const Scheduler::Totals& t = snapshot.all;
  resp->set_uptime_micros(static_cast<uint64_t>(absl::ToInt64Microseconds(SteadyClock()->Now() - started_)));
  SetRequestCounts(t, resp);
  resp->set_requests_invalid(static_cast<uint64_t>(invalid_.load()));
  for (const auto& [name, tt] : snapshot.tenants) {
    v1::TenantStats* x = resp->add_tenants();
    x->set_tenant(name);
    SetRequestCounts(tt, x);
  }
  v1::WorkerMemory* m = resp->mutable_memory();
  m->set_host_kv_used_bytes(static_cast<uint64_t>(tier_->reserved_bytes()));
  m->set_host_kv_capacity_bytes(static_cast<uint64_t>(tier_->capacity_bytes()));
  m->set_compressed_kv_used_bytes(static_cast<uint64_t>(vericache_->compressed_reserved_bytes()));
  m->set_compressed_kv_capacity_bytes(static_cast<uint64_t>(options_.engine.compressed_bytes));
  m->set_prefix_cache_used_bytes(static_cast<uint64_t>(vericache_->cached_prefix_bytes()));
  m->set_prefix_cache_capacity_bytes(static_cast<uint64_t>(options_.engine.prefix_cache_bytes));
  if (prefixes_ != nullptr) {
    const StorePrefixStats p = prefixes_->stats();
    v1::StoreLinkStats* o = resp->mutable_store();
    SetStoreTraffic(p, o);
    o->set_blocks_hit(static_cast<uint64_t>(p.blocks_hit));
    for (const StoreShardStats& sh : p.shards) {
      v1::StoreShardStats* x = o->add_shards();
      x->set_target(sh.target);
      SetStoreTraffic(sh, x);
    }
  }
}

}  // namespace vc
