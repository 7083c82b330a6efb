#include "services/router_service.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/memory.h"
#include "common/status_macros.h"
#include "services/call_metadata.h"
#include "services/inference_client.h"
#include "services/servers.h"

namespace vc {

using vericache::v1::GenerateRequest;
using vericache::v1::GenerateResponse;

namespace {

// Whether a worker of `m` gives the output workers of the pinned model give: the same checkpoint,
// and the same numerics of the kernels that run it where both report theirs (a worker older than
// the numerics field reports none, and is taken as before: an upgrade must not shut it out).
bool SameOutput(const vericache::v1::ModelInfo& m, const vericache::v1::ModelInfo& pinned) {
  return m.fingerprint_hex() == pinned.fingerprint_hex() &&
         (m.numerics().empty() || pinned.numerics().empty() || m.numerics() == pinned.numerics());
}

// SplitMix64's finalizer: a 64-bit mix with full avalanche, the same in every process (unlike
// absl::Hash, which is seeded per process), so rendezvous orders agree across router replicas.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over bytes, then mixed: stable across processes.
uint64_t HashBytes(uint64_t seed, absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL ^ Mix(seed);
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix(h);
}

// Adds the counts of `from` to `to` (same type): integers summed, uptime the larger, strings kept
// when `to` has none; repeated messages matched by their first string field (a tenant, a shard's
// target), appended when `to` has no such element.
void AddCounts(const google::protobuf::Message& from, google::protobuf::Message* to) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = from.GetDescriptor();
  const google::protobuf::Reflection* rf = from.GetReflection();
  const google::protobuf::Reflection* rt = to->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
      for (int j = 0; j < rf->FieldSize(from, f); ++j) {
        const google::protobuf::Message& e = rf->GetRepeatedMessage(from, f, j);
        const FieldDescriptor* key = nullptr;
        for (int k = 0; k < e.GetDescriptor()->field_count() && key == nullptr; ++k) {
          const FieldDescriptor* c = e.GetDescriptor()->field(k);
          if (c->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !c->is_repeated()) key = c;
        }
        google::protobuf::Message* match = nullptr;
        for (int k = 0; k < rt->FieldSize(*to, f) && match == nullptr && key != nullptr; ++k) {
          google::protobuf::Message* t = rt->MutableRepeatedMessage(to, f, k);
          if (t->GetReflection()->GetString(*t, key) == e.GetReflection()->GetString(e, key)) match = t;
        }
        if (match != nullptr) {
          AddCounts(e, match);
        } else {
          rt->AddMessage(to, f)->CopyFrom(e);
        }
      }
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT32: rt->SetUInt32(to, f, rt->GetUInt32(*to, f) + rf->GetUInt32(from, f)); break;
      case FieldDescriptor::CPPTYPE_UINT64:
        rt->SetUInt64(to, f,
                      f->name() == "uptime_micros" ? std::max(rt->GetUInt64(*to, f), rf->GetUInt64(from, f))
                                                   : rt->GetUInt64(*to, f) + rf->GetUInt64(from, f));
        break;
      case FieldDescriptor::CPPTYPE_INT32: rt->SetInt32(to, f, rt->GetInt32(*to, f) + rf->GetInt32(from, f)); break;
      case FieldDescriptor::CPPTYPE_INT64: rt->SetInt64(to, f, rt->GetInt64(*to, f) + rf->GetInt64(from, f)); break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (rf->HasField(from, f)) AddCounts(rf->GetMessage(from, f), rt->MutableMessage(to, f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (rt->GetString(*to, f).empty()) rt->SetString(to, f, rf->GetString(from, f));
        break;
      default: break;  // no such fields in the stats messages
    }
  }
}

// The call's authorization metadata into *auth, to pass on to the workers as it came (empty when
// there is none). gRPC takes a header value with bytes other than printable ASCII from a raw HTTP/2
// peer, but aborts a process that sends one on, so such a value is refused here.
grpc::Status Authorization(const grpc::ServerContext& ctx, std::string* auth) {
  auth->clear();
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return grpc::Status::OK;
  for (const char c : it->second) {
    if (c < 0x20 || c > 0x7e) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("the authorization header holds a byte other than printable ASCII (",
                                       static_cast<int>(static_cast<uint8_t>(c)), ")"));
    }
  }
  auth->assign(it->second.data(), it->second.size());
  return grpc::Status::OK;
}

}  // namespace

uint64_t AffinityTable::Get(uint64_t block) {
  uint64_t mask = ~uint64_t{0};
  return LongestRun({&block, 1}, &mask) == 1 ? mask : 0;
}

int AffinityTable::LongestRun(absl::Span<const uint64_t> blocks, uint64_t* mask) {
  int run = 0;
  for (uint64_t b : blocks) {
    auto it = current_.find(b);
    const bool older = it == current_.end();
    if (older && (it = previous_.find(b)) == previous_.end()) break;
    const uint64_t m = it->second & *mask;
    if (m == 0) break;
    // A block of the run from the previous generation moves to this one; the table rolls only
    // after the whole run, so none of it is dropped on the way.
    if (older) {
      current_[b] = it->second;
      previous_.erase(it);
    }
    *mask = m;
    ++run;
  }
  Roll();
  return run;
}

void AffinityTable::Add(uint64_t block, uint64_t workers) {
  uint64_t& slot = current_[block];
  if (auto it = previous_.find(block); it != previous_.end()) {
    slot |= it->second;
    previous_.erase(it);
  }
  slot |= workers;
  Roll();
}

void AffinityTable::Forget(uint64_t workers) {
  for (auto* m : {&current_, &previous_}) {
    for (auto it = m->begin(); it != m->end();) {
      it->second &= ~workers;
      if (it->second == 0) {
        m->erase(it++);
      } else {
        ++it;
      }
    }
  }
}

void AffinityTable::Roll() {
  if (static_cast<int64_t>(current_.size()) < half_) return;
  previous_ = std::move(current_);
  current_ = {};
}

std::vector<uint64_t> PromptBlockHashes(const GenerateRequest& req, uint64_t seed, int ids_block_tokens,
                                        int text_block_bytes) {
  std::vector<uint64_t> out;
  absl::string_view bytes;
  size_t block = 0;
  if (req.has_token_ids()) {
    const auto& ids = req.token_ids().ids();
    bytes = absl::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
    block = static_cast<size_t>(std::max(1, ids_block_tokens)) * sizeof(int32_t);
    seed = Mix(seed ^ 1);
  } else {
    // A conversation by its messages' JSON: one that extends another begins with its bytes, but
    // for the array's closing bracket.
    bytes = req.has_chat() ? absl::string_view(req.chat().messages_json()) : absl::string_view(req.text());
    block = static_cast<size_t>(std::max(1, text_block_bytes));
    seed = Mix(seed ^ 2);
  }
  uint64_t h = seed;
  for (size_t at = 0; at + block <= bytes.size(); at += block) {
    h = HashBytes(h, bytes.substr(at, block));
    out.push_back(h);
  }
  return out;
}

struct RouterService::Upstream {
  std::string target;
  uint64_t target_hash = 0;  // for rendezvous orders
  int slot = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<vericache::v1::Inference::Stub> stub;
  std::atomic<int> in_flight{0};
  std::atomic<uint64_t> routed{0}, failures{0};
  std::atomic<uint64_t> busy{0};  // calls it refused as full (RESOURCE_EXHAUSTED): not failures
  std::atomic<bool> serving{false};
  std::atomic<bool> removed{false};
  std::atomic<bool> takes_generated_ids{false};  // from its ModelInfo: it can take a call moved mid-stream
  std::atomic<uint64_t> downs{0};  // times a call found it down (UNAVAILABLE)
  bool model_checked = false;  // under mu_: its model was compared with the router's since it last failed
  std::string state = "not checked yet";  // under mu_
};

RouterService::RouterService(RouterServiceOptions options, bool from_dns)
    : options_(std::move(options)), from_dns_(from_dns), table_(options_.affinity_blocks) {}

absl::StatusOr<std::unique_ptr<RouterService>> RouterService::Create(RouterServiceOptions options) {
  if (options.policy != "prefix" && options.policy != "least-loaded" && options.policy != "round-robin") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown routing policy '", options.policy, "' (prefix, least-loaded or round-robin)"));
  }
  if (options.workers.empty()) return absl::InvalidArgumentError("the router has no workers");
  VC_ASSIGN_OR_RETURN(const bool from_dns, CheckTargets(options.workers, "worker"));
  if (options.balance_slack < 1 || options.affinity_blocks < 2 || options.ids_block_tokens < 1 ||
      options.text_block_bytes < 1 || options.health_interval_ms < 1 || options.refresh_interval_ms < 1 ||
      options.worker_timeout_ms < 1 || options.client_write_timeout_ms < 1) {
    return absl::InvalidArgumentError("router sizes and intervals must be positive");
  }
  if (options.worker_keepalive_ms < 0) return absl::InvalidArgumentError("the workers' keepalive is negative");
  // The affinity table grows with traffic up to its size: about 40 bytes a block, in two hash maps.
  VC_RETURN_IF_ERROR(CheckFitsInMemory(static_cast<uint64_t>(options.affinity_blocks) * 40,
                                       "--affinity-blocks at about 40 bytes each"));
  absl::StatusOr<std::vector<std::string>> targets =
      ResolveTargets(options.workers, options.dns_server, 0, absl::ZeroDuration(), "workers");
  // Worker pods that are not ready yet have no records: the router starts without them and looks
  // again at every check until some are listed.
  if (!targets.ok() && !absl::IsNotFound(targets.status()) && !absl::IsUnavailable(targets.status())) {
    return targets.status();
  }
  if (targets.ok() && !from_dns) {
    std::vector<std::string> distinct = *targets;
    std::sort(distinct.begin(), distinct.end());
    if (auto twice = std::adjacent_find(distinct.begin(), distinct.end()); twice != distinct.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the worker ", *twice, " is listed twice"));
    }
    if (distinct.size() > static_cast<size_t>(kMaxRouterWorkers)) {
      return absl::InvalidArgumentError(absl::StrCat("--workers lists ", distinct.size(),
                                                     " workers; a router routes to at most ", kMaxRouterWorkers));
    }
  }
  std::unique_ptr<RouterService> r(new RouterService(std::move(options), from_dns));
  r->watchdog_ =
      std::make_unique<WriteWatchdog<grpc::ServerContext>>(absl::Milliseconds(r->options_.client_write_timeout_ms));
  if (targets.ok()) r->SetWorkers(*targets);
  r->checker_ = std::thread([p = r.get()] { p->CheckLoop(); });
  return r;
}

RouterService::~RouterService() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (checker_.joinable()) checker_.join();
}

void RouterService::SetWorkers(const std::vector<std::string>& targets) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (std::find(targets.begin(), targets.end(), (*it)->target) != targets.end()) {
      ++it;
      continue;
    }
    // Calls in flight hold their own reference; the slot's memories go with it.
    (*it)->removed = true;
    (*it)->serving = false;
    const uint64_t bit = uint64_t{1} << (*it)->slot;
    table_.Forget(bit);
    free_slots_ |= bit;
    it = workers_.erase(it);
  }
  for (const std::string& t : targets) {
    const bool known =
        std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) { return w->target == t; });
    if (known || free_slots_ == 0) continue;  // past kMaxRouterWorkers: left out
    auto w = std::make_shared<Upstream>();
    w->target = t;
    w->slot = __builtin_ctzll(free_slots_);
    free_slots_ &= ~(uint64_t{1} << w->slot);
    w->target_hash = HashBytes(0, t);
    w->channel = InferenceChannel(t, options_.worker_tls_root_certs_pem, options_.worker_keepalive_ms);
    w->stub = vericache::v1::Inference::NewStub(w->channel);
    workers_.push_back(std::move(w));
  }
}

RouterService::Probe RouterService::Check(const std::shared_ptr<Upstream>& w) {
  Probe p;
  p.w = w;
  p.downs = w->downs.load();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options_.worker_timeout_ms);
  const absl::StatusOr<int> health = ServingStatus(*w->channel, deadline);
  p.health = health.status();
  p.healthy = health.ok() && *health == 1;
  {
    std::lock_guard<std::mutex> l(mu_);
    p.asked_model = p.healthy && !w->model_checked;
  }
  if (p.asked_model) {
    grpc::ClientContext mctx;
    mctx.set_deadline(absl::ToChronoTime(deadline));
    if (!options_.worker_token.empty()) mctx.AddMetadata("authorization", "Bearer " + options_.worker_token);
    p.model_status = w->stub->GetModelInfo(&mctx, vericache::v1::GetModelInfoRequest(), &p.info);
  }
  return p;
}

void RouterService::Apply(const std::vector<Probe>& probes) {
  bool changed = false;
  std::lock_guard<std::mutex> l(mu_);
  // The pinned model is given up once no worker has served it for options_.repin_after_ms and
  // another (of the checkpoint the options name, if they name one) answers: after a rollout the
  // new workers' checkpoint, or numerics, is taken, where a router pinned for good would refuse
  // them all. (The wait keeps a short outage of the pinned workers from handing the fleet to a
  // canary.)
  const absl::Duration now = SteadyClock()->Now();
  if (absl::c_any_of(workers_, [](const auto& w) { return w->serving && !w->removed; })) model_last_served_ = now;
  const auto answered = [&](const Probe& p) {
    return p.asked_model && p.model_status.ok() &&
           (options_.model_fingerprint_hex.empty() || p.info.fingerprint_hex() == options_.model_fingerprint_hex);
  };
  if (model_ != nullptr && now - model_last_served_ >= absl::Milliseconds(options_.repin_after_ms)) {
    const bool another =
        absl::c_any_of(probes, [&](const Probe& p) { return p.healthy && answered(p) && !SameOutput(p.info, *model_); });
    if (another) {
      model_.reset();
      for (const auto& w : workers_) w->model_checked = false;
    }
  }
  if (model_ == nullptr) {
    // The checkpoint the options name, or else the one most of the workers that answered serve;
    // then the numerics most of its workers report, none (workers older than the field) only when
    // none of them reports any: pinned, an empty one would let every numerics in for good. The
    // first listed of a tie wins, each time.
    absl::flat_hash_map<std::string, int> checkpoints;
    absl::flat_hash_map<std::pair<std::string, std::string>, int> numerics;  // (checkpoint, numerics)
    for (const Probe& p : probes) {
      if (!answered(p)) continue;
      ++checkpoints[p.info.fingerprint_hex()];
      ++numerics[{p.info.fingerprint_hex(), p.info.numerics()}];
    }
    const Probe* checkpoint = nullptr;
    for (const Probe& p : probes) {
      if (answered(p) && (checkpoint == nullptr || checkpoints[p.info.fingerprint_hex()] >
                                                       checkpoints[checkpoint->info.fingerprint_hex()])) {
        checkpoint = &p;
      }
    }
    const Probe* pin = nullptr;
    const auto rank = [&](const Probe& p) {
      return std::make_pair(!p.info.numerics().empty(), numerics[{p.info.fingerprint_hex(), p.info.numerics()}]);
    };
    for (const Probe& p : probes) {
      if (checkpoint != nullptr && answered(p) && p.info.fingerprint_hex() == checkpoint->info.fingerprint_hex() &&
          (pin == nullptr || rank(p) > rank(*pin))) {
        pin = &p;
      }
    }
    if (pin != nullptr) model_ = std::make_unique<vericache::v1::ModelInfo>(pin->info);
  }
  for (const Probe& p : probes) {
    Upstream& w = *p.w;
    // A call that found the worker down since this probe began outweighs the probe.
    const bool found_down = w.downs.load() != p.downs;
    bool serving = p.healthy && !found_down;
    if (!p.health.ok()) {
      w.state = absl::StrCat("unreachable: ", p.health.message());
      w.model_checked = false;  // it may come back with another model
    } else if (!p.healthy) {
      w.state = "not serving";
      w.model_checked = false;  // it may serve again after a restart, with another model
    } else if (p.asked_model && !p.model_status.ok()) {
      w.state = absl::StrCat("model query failed: ", p.model_status.error_code() == grpc::StatusCode::UNIMPLEMENTED
                                                         ? "it serves no workers' Inference API (is it a store?)"
                                                         : p.model_status.error_message());
    } else if (p.asked_model && model_ != nullptr) {
      if (p.info.fingerprint_hex() != model_->fingerprint_hex()) {
        w.state = absl::StrCat("serves another model: checkpoint ", p.info.fingerprint_hex().substr(0, 16),
                               ", the router's workers serve ", model_->fingerprint_hex().substr(0, 16));
      } else if (!SameOutput(p.info, *model_)) {
        w.state = absl::StrCat("computes with other kernels: numerics \"", p.info.numerics(),
                               "\", the router's workers' \"", model_->numerics(),
                               "\" (its output would differ from theirs)");
      } else {
        w.model_checked = true;
        w.takes_generated_ids = p.info.takes_generated_ids();
      }
    } else if (p.asked_model) {
      w.state = absl::StrCat("serves another model than --model-fingerprint: checkpoint ",
                             p.info.fingerprint_hex().substr(0, 16));
    }
    serving = serving && w.model_checked && !w.removed;
    if (serving) w.state = "serving";
    if (p.healthy && found_down) {
      w.state = "a call found it down; checked again next round";
      w.model_checked = false;  // it may have restarted at the same address with another model
    }
    if (!p.health.ok() && w.serving) ++w.failures;
    changed |= w.serving != serving;
    w.serving = serving;
    // A call may find it down between the look above and this store (calls mark it without mu_):
    // their mark stands.
    if (serving && w.downs.load() != p.downs) w.serving = false;
  }
  if (changed) changed_.notify_all();
  if (on_serving_count_) on_serving_count_(ServingCount());
}

int RouterService::ServingCount() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const auto& w) { return w->serving.load(); }));
}

void RouterService::OnServingCount(std::function<void(int)> f) {
  std::lock_guard<std::mutex> l(mu_);
  on_serving_count_ = std::move(f);
  on_serving_count_(ServingCount());
}

void RouterService::CheckLoop() {
  // On the steady clock: a step of the wall clock neither delays a lookup nor brings one early.
  absl::Duration next_refresh = SteadyClock()->Now() + absl::Milliseconds(options_.refresh_interval_ms);
  while (true) {
    std::vector<std::shared_ptr<Upstream>> ws;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      ws = workers_;
    }
    // All at once, so that one slow worker does not hold up the others' checks.
    std::vector<Probe> probes(ws.size());
    std::vector<std::thread> checks;
    for (size_t i = 0; i < ws.size(); ++i) checks.emplace_back([this, &probes, &ws, i] { probes[i] = Check(ws[i]); });
    for (auto& t : checks) t.join();
    Apply(probes);
    if (from_dns_ && (SteadyClock()->Now() >= next_refresh || ws.empty())) {
      absl::StatusOr<std::vector<std::string>> targets =
          ResolveTargets(options_.workers, options_.dns_server, 0, absl::ZeroDuration(), "workers");
      if (targets.ok()) SetWorkers(*targets);  // otherwise the last list stands
      next_refresh = SteadyClock()->Now() + absl::Milliseconds(options_.refresh_interval_ms);
    }
    std::unique_lock<std::mutex> l(mu_);
    changed_.wait_for(l, std::chrono::milliseconds(options_.health_interval_ms), [&] { return stop_; });
    if (stop_) return;
  }
}

bool RouterService::WaitServing(int n, absl::Duration timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return changed_.wait_for(l, absl::ToChronoNanoseconds(timeout), [&] { return ServingCount() >= n; });
}

int RouterService::BlockTokens() const {
  return model_ != nullptr && model_->prefix_block_tokens() > 0 ? static_cast<int>(model_->prefix_block_tokens())
                                                                 : options_.ids_block_tokens;
}

std::vector<std::shared_ptr<RouterService::Upstream>> RouterService::ServingWorkers() const {
  std::vector<std::shared_ptr<Upstream>> out;
  for (const auto& w : workers_) {
    if (w->serving) out.push_back(w);
  }
  return out;
}

std::vector<std::shared_ptr<RouterService::Upstream>> RouterService::Choose(const std::vector<uint64_t>& blocks) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::shared_ptr<Upstream>> order = ServingWorkers();
  if (order.empty()) return order;
  const uint64_t turn = round_robin_++;
  std::rotate(order.begin(), order.begin() + static_cast<int64_t>(turn % order.size()), order.end());
  if (options_.policy == "round-robin") return order;
  // Each worker's calls in flight, read once: other calls change them while these are ordered, and
  // a sort whose comparisons disagree with each other is undefined (it can run off the array).
  struct Candidate {
    std::shared_ptr<Upstream> w;
    int load;
    uint64_t rank;  // rendezvous order keyed by the prompt
  };
  std::vector<Candidate> c;
  for (const auto& w : order) {
    c.push_back({w, w->in_flight.load(), blocks.empty() ? 0 : Mix(blocks.back() ^ w->target_hash)});
  }
  const auto back = [&] {
    for (size_t i = 0; i < c.size(); ++i) order[i] = c[i].w;
    return order;
  };
  if (options_.policy == "least-loaded" || blocks.empty()) {
    std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.load < b.load; });
    return back();
  }
  // By calls in flight, ties in a rendezvous order keyed by the prompt (its last full block: the
  // same order on every router replica, different for different prompts).
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.load != b.load ? a.load < b.load : a.rank > b.rank;
  });
  // The workers that served the longest run of the prompt's leading blocks go first, when that run
  // is at least half the prompt's blocks (a shorter one, such as a shared system prompt, saves too
  // little to pile its prompts onto the workers that have it).
  uint64_t mask = 0;
  for (const Candidate& x : c) mask |= uint64_t{1} << x.w->slot;
  const int depth = table_.LongestRun(blocks, &mask);
  if (2 * static_cast<size_t>(depth) < blocks.size()) return back();
  std::stable_partition(c.begin(), c.end(), [&](const Candidate& x) { return (mask >> x.w->slot & 1) != 0; });
  // Unless it is busier than the least busy worker by the slack.
  int least = c.front().load;
  for (const Candidate& x : c) least = std::min(least, x.load);
  if (c.front().load < least + options_.balance_slack) {
    prefix_routed_++;
    prefix_blocks_ += depth;
    return back();
  }
  auto pick = std::find_if(c.begin(), c.end(),
                           [&](const Candidate& x) { return x.load < least + options_.balance_slack; });
  if (pick != c.end()) std::rotate(c.begin(), pick, pick + 1);
  spills_++;
  return back();
}

void RouterService::Remember(const std::vector<uint64_t>& blocks, const Upstream& w) {
  if (blocks.empty() || options_.policy != "prefix") return;
  std::lock_guard<std::mutex> l(mu_);
  if (w.removed) return;
  for (uint64_t b : blocks) table_.Add(b, uint64_t{1} << w.slot);
}

grpc::Status RouterService::Generate(grpc::ServerContext* ctx, const GenerateRequest* req,
                                     grpc::ServerWriter<GenerateResponse>* writer) {
  std::string auth;
  if (grpc::Status s = Authorization(*ctx, &auth); !s.ok()) return s;
  int block_tokens;
  {
    std::lock_guard<std::mutex> l(mu_);
    block_tokens = BlockTokens();
  }
  const std::vector<uint64_t> blocks =
      PromptBlockHashes(*req, HashBytes(0, auth), block_tokens, options_.text_block_bytes);
  const std::vector<std::shared_ptr<Upstream>> order = Choose(blocks);
  if (order.empty()) {
    unrouted_++;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the router has no serving worker");
  }
  in_flight_++;
  struct Done {
    std::atomic<int>* n;
    ~Done() { (*n)--; }
  } done{&in_flight_};
  // The request as the current worker gets it: after a failure mid-stream, with the tokens sent so
  // far as generated_ids (see GenerateRequest).
  GenerateRequest resumed;
  const GenerateRequest* current = req;
  // Whether a worker can take a request: any serving one, or, for one with generated_ids (after a
  // failure mid-stream, or from the client), one that takes them (an older one would send the
  // whole output again).
  const auto can_take = [](const Upstream& u, bool with_generated_ids) {
    return u.serving && (!with_generated_ids || u.takes_generated_ids);
  };
  grpc::Status last(grpc::StatusCode::UNAVAILABLE, "no serving worker takes generated_ids");
  bool after_refusal = false;  // the last worker tried refused the call
  bool told_admitted = false;  // the client has the initial metadata saying the call was queued
  for (size_t i = 0; i < order.size(); ++i) {
    Upstream& w = *order[i];
    if (!can_take(w, current->generated_ids_size() > 0)) continue;
    if (after_refusal) retries_++;
    // Tokens the client has from earlier workers of this call.
    const int forwarded = current->generated_ids_size() - req->generated_ids_size();
    w.in_flight++;
    std::unique_ptr<grpc::ClientContext> call = grpc::ClientContext::FromServerContext(*ctx);
    if (!auth.empty()) call->AddMetadata("authorization", auth);
    std::unique_ptr<grpc::ClientReader<GenerateResponse>> reader = w.stub->Generate(call.get(), *current);
    // The worker queued the call: so has the router (see the proto), once.
    reader->WaitForInitialMetadata();
    if (!told_admitted && call->GetServerInitialMetadata().count(kAdmittedKey) > 0) {
      told_admitted = true;
      ctx->AddInitialMetadata(kAdmittedKey, "1");
      writer->SendInitialMetadata();
    }
    GenerateResponse r;
    std::vector<int32_t> tokens;  // sent by this worker
    bool sent = false, client_gone = false, ended = false;
    while (reader->Read(&r)) {
      if (!sent) {
        sent = true;
        Remember(blocks, w);
      }
      tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
      if (r.has_stats()) {
        ended = true;  // the output is whole, whatever the status says
        r.mutable_stats()->set_generated_tokens(r.stats().generated_tokens() + static_cast<uint32_t>(forwarded));
      }
      if (!watchdog_->Write(ctx, [&] { return writer->Write(r); })) {
        client_gone = true;
        call->TryCancel();
        break;
      }
    }
    grpc::Status s = reader->Finish();
    w.in_flight--;
    // All of max_tokens came, and only the stats did not: the output is whole too.
    if (!ended && current->max_tokens() > 0 &&
        current->generated_ids_size() + tokens.size() >= current->max_tokens()) {
      ended = true;
    }
    // The client has the whole output (the stats come last): a connection that breaks after them
    // fails nothing, where an error would have the client generate it all again.
    if (ended && !client_gone && !s.ok()) s = grpc::Status::OK;
    const bool ours = !client_gone && !ctx->IsCancelled();
    // Refused: down or draining, full, or not serving what the request asks for (another
    // compressor, MODE_FULL): another worker may take it.
    const bool refused = !sent && ours &&
                         (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                          s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                          s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    // A worker that failed after sending tokens (its connection broke, or it answered no keepalive
    // ping) hands the rest to the next one, which picks up after those tokens with the same
    // output. Not once the output has ended: its stats came, or it reached max_tokens (one that
    // ended with the end of sequence just before the failure ends at once on the next worker).
    // (A worker whose drain time ran out ends its calls with UNAVAILABLE too; one that cancels a
    // call because the router reads too slowly says CANCELLED, and that call ends there.)
    const bool failed = ours && !ended && !tokens.empty() && s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                        (current->max_tokens() == 0 ||
                         current->generated_ids_size() + tokens.size() < current->max_tokens()) &&
                        std::any_of(order.begin() + static_cast<int64_t>(i) + 1, order.end(),
                                    [&](const auto& next) { return can_take(*next, true); });
    if (!refused && !failed) {
      routed_++;
      w.routed++;
      if (client_gone) return grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
      return s;
    }
    // A refusal for what the call asks (FAILED_PRECONDITION) is no fault of the worker's.
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      w.busy++;
    } else if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      w.failures++;
    }
    // Down or draining: no more calls until a health check says it serves again (one that began
    // after this: see Apply).
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      w.downs++;
      w.serving = false;
    }
    last = grpc::Status(s.error_code(), absl::StrCat("worker ", w.target, ": ", s.error_message()));
    if (failed) {
      if (current == req) resumed = *req;
      for (int32_t t : tokens) resumed.add_generated_ids(t);
      current = &resumed;
      failovers_++;
    }
    after_refusal = refused;
  }
  unrouted_++;
  // The client has the output's first tokens from a worker that failed: the call failed as that
  // worker did (UNAVAILABLE), whatever the others answered when asked for the rest.
  if (const int sent = current->generated_ids_size() - req->generated_ids_size(); sent > 0) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("the call's worker failed after ", sent,
                                     " tokens, and no worker could take the rest; the last one tried said: ",
                                     last.error_message()));
  }
  return grpc::Status(last.error_code(),
                      absl::StrCat("no worker could take the call; the last one tried said: ", last.error_message()));
}

grpc::Status RouterService::ForwardTo(const grpc::ServerContext& ctx, std::string* auth,
                                      std::vector<std::shared_ptr<Upstream>>* workers) {
  if (grpc::Status s = Authorization(ctx, auth); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> l(mu_);
    *workers = ServingWorkers();
  }
  if (workers->empty()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the router has no serving worker");
  return grpc::Status::OK;
}

std::unique_ptr<grpc::ClientContext> RouterService::ForwardedCall(const grpc::ServerContext& ctx,
                                                                  const std::string& auth) const {
  std::unique_ptr<grpc::ClientContext> call = grpc::ClientContext::FromServerContext(ctx);
  if (!auth.empty()) call->AddMetadata("authorization", auth);
  const auto limit = absl::ToChronoTime(absl::Now() + absl::Milliseconds(options_.worker_timeout_ms));
  if (call->deadline() > limit) call->set_deadline(limit);
  return call;
}

// Asked of a serving worker with the caller's token, so that the worker's clients are the ones
// told (the router's own copy was fetched with its token); a worker that cannot answer passes the
// call to the next.
grpc::Status RouterService::GetModelInfo(grpc::ServerContext* ctx, const vericache::v1::GetModelInfoRequest* req,
                                         vericache::v1::ModelInfo* info) {
  std::string auth;
  std::vector<std::shared_ptr<Upstream>> ws;
  if (grpc::Status s = ForwardTo(*ctx, &auth, &ws); !s.ok()) return s;
  grpc::Status last;
  for (const auto& w : ws) {
    last = w->stub->GetModelInfo(ForwardedCall(*ctx, auth).get(), *req, info);
    if (last.ok()) return last;
    last = grpc::Status(last.error_code(), absl::StrCat("worker ", w->target, ": ", last.error_message()));
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
        last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return last;
    }
  }
  return last;
}

grpc::Status RouterService::GetStats(grpc::ServerContext* ctx, const vericache::v1::GetStatsRequest* req,
                                     vericache::v1::WorkerStats* stats) {
  std::string auth;
  std::vector<std::shared_ptr<Upstream>> ws;
  if (grpc::Status s = ForwardTo(*ctx, &auth, &ws); !s.ok()) return s;
  for (const auto& w : ws) {
    vericache::v1::WorkerStats one;
    const grpc::Status s = w->stub->GetStats(ForwardedCall(*ctx, auth).get(), *req, &one);
    if (!s.ok()) return grpc::Status(s.error_code(), absl::StrCat("worker ", w->target, ": ", s.error_message()));
    AddCounts(one, stats);
  }
  return grpc::Status::OK;
}

void RouterService::CurrentStats(vericache::v1::RouterStats* s) {
  s->set_uptime_micros(absl::ToInt64Microseconds(SteadyClock()->Now() - started_));
  s->set_requests_in_flight(static_cast<uint32_t>(std::max(0, in_flight_.load())));
  s->set_requests_routed(routed_);
  s->set_requests_unrouted(unrouted_);
  s->set_prefix_routed(prefix_routed_);
  s->set_prefix_blocks_matched(prefix_blocks_);
  s->set_load_spills(spills_);
  s->set_retries(retries_);
  s->set_failovers(failovers_);
  std::lock_guard<std::mutex> l(mu_);
  s->set_affinity_blocks(table_.size());
  for (const auto& w : workers_) {
    vericache::v1::RouterWorkerStats* ws = s->add_workers();
    ws->set_target(w->target);
    ws->set_serving(w->serving ? 1 : 0);
    ws->set_requests_in_flight(static_cast<uint32_t>(std::max(0, w->in_flight.load())));
    ws->set_requests_routed(w->routed);
    ws->set_failures(w->failures);
    ws->set_busy(w->busy);
    ws->set_state(w->state);
  }
}

}  // namespace vc
