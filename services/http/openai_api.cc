#include "services/http/openai_api.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace vc::http {

namespace v1 = vericache::v1;
using json = nlohmann::ordered_json;

namespace {

constexpr int kMaxJsonDepth = 32;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
}

// The field, or null when absent (OpenAI's clients send null for "not given").
const json* Get(const json& body, const char* field) {
  auto it = body.find(field);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<bool> GetBool(const json& body, const char* field, bool otherwise) {
  const json* v = Get(body, field);
  if (v == nullptr) return otherwise;
  if (!v->is_boolean()) return Bad(field, "must be a boolean");
  return v->get<bool>();
}

absl::StatusOr<double> GetNumber(const json& body, const char* field, double otherwise, double lo, double hi) {
  const json* v = Get(body, field);
  if (v == nullptr) return otherwise;
  if (!v->is_number()) return Bad(field, "must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) return Bad(field, absl::StrCat("must be from ", lo, " to ", hi));
  return d;
}

// An integer field within [lo, hi]; `otherwise` when absent.
absl::StatusOr<int64_t> GetInt(const json& body, const char* field, int64_t otherwise, int64_t lo, int64_t hi) {
  const json* v = Get(body, field);
  if (v == nullptr) return otherwise;
  if (!v->is_number_integer()) return Bad(field, "must be an integer");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi) : v->get<int64_t>() > hi) {
    return Bad(field, absl::StrCat("must be at most ", hi));
  }
  const int64_t i = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  if (i < lo) return Bad(field, absl::StrCat("must be at least ", lo));
  return i;
}

// Fields whose only value served is "not asked for".
absl::Status RefuseUnserved(const json& body) {
  if (const json* n = Get(body, "n"); n != nullptr && *n != 1) return Bad("n", "must be 1: one choice per request");
  if (const json* b = Get(body, "best_of"); b != nullptr && *b != 1) return Bad("best_of", "is not supported");
  if (const json* e = Get(body, "echo"); e != nullptr && *e != false) return Bad("echo", "is not supported");
  if (const json* l = Get(body, "logprobs"); l != nullptr && *l != false && *l != 0) {
    return Bad("logprobs", "is not supported");
  }
  if (const json* l = Get(body, "top_logprobs"); l != nullptr && *l != 0) return Bad("top_logprobs", "is not supported");
  if (const json* l = Get(body, "logit_bias"); l != nullptr && !(l->is_object() && l->empty())) {
    return Bad("logit_bias", "is not supported");
  }
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    if (const json* p = Get(body, penalty); p != nullptr && *p != 0) {
      return Bad(penalty, "is not supported: output is exactly the model's distribution");
    }
  }
  if (const json* r = Get(body, "repetition_penalty"); r != nullptr && *r != 1) {
    return Bad("repetition_penalty", "is not supported: output is exactly the model's distribution");
  }
  if (const json* s = Get(body, "suffix"); s != nullptr && *s != "") return Bad("suffix", "is not supported");
  if (const json* f = Get(body, "response_format"); f != nullptr) {
    if (!f->is_object() || f->value("type", "") != "text") return Bad("response_format", "other than text is not supported");
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const json& body, uint64_t random_seed, v1::GenerateRequest* g) {
  v1::Sampling* s = g->mutable_sampling();
  VC_ASSIGN_OR_RETURN(const double temperature, GetNumber(body, "temperature", 1.0, 0.0, 100.0));
  s->set_temperature(static_cast<float>(temperature));
  VC_ASSIGN_OR_RETURN(const double top_p, GetNumber(body, "top_p", 1.0, 0.0, 1.0));
  if (top_p == 0.0) return Bad("top_p", "must be above 0");
  s->set_top_p(static_cast<float>(top_p));
  // vLLM's extra field: -1 or 0 for no cut.
  VC_ASSIGN_OR_RETURN(const int64_t top_k, GetInt(body, "top_k", 0, -1, int64_t{1} << 30));
  s->set_top_k(top_k > 0 ? static_cast<uint32_t>(top_k) : 0);
  const json* seed = Get(body, "seed");
  if (seed != nullptr && !seed->is_number_integer()) return Bad("seed", "must be an integer");
  s->set_seed(seed == nullptr                ? random_seed
              : seed->is_number_unsigned()   ? seed->get<uint64_t>()
                                             : static_cast<uint64_t>(seed->get<int64_t>()));
  if (const json* stop = Get(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      g->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& one : *stop) {
        if (!one.is_string()) return Bad("stop", "must be a string or an array of strings");
        g->add_stop(one.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or an array of strings");
    }
  }
  VC_ASSIGN_OR_RETURN(const bool ignore_eos, GetBool(body, "ignore_eos", false));
  g->set_ignore_eos(ignore_eos);
  return absl::OkStatus();
}

// A completion's prompt: a string, token ids, or a list holding one of either.
absl::Status ParsePrompt(const json& body, v1::GenerateRequest* g) {
  const json* p = Get(body, "prompt");
  if (p == nullptr) return Bad("prompt", "is required");
  const json* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  if (one->is_string()) {
    if (one->get_ref<const std::string&>().empty()) return Bad("prompt", "is empty");
    g->set_text(one->get<std::string>());
    return absl::OkStatus();
  }
  if (one->is_array()) {
    if (one->empty()) return Bad("prompt", "is empty");
    for (const json& id : *one) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return Bad("prompt", "must be a string, token ids, or a list of one of them (one prompt per request)");
      }
      g->mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
    return absl::OkStatus();
  }
  return Bad("prompt", "must be a string, token ids, or a list of one of them (one prompt per request)");
}

// A chat's messages for the template: each content a string (text parts joined by newlines, as
// templates that take strings are given them), or null.
absl::Status ParseMessages(const json& body, v1::ChatPrompt* chat) {
  const json* messages = Get(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return Bad("messages", "must be a non-empty array");
  }
  json out = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(where, "must be an object");
    if (!m.contains("role") || !m["role"].is_string()) return Bad(where, "needs a string 'role'");
    json copy = m;
    if (auto c = m.find("content"); c != m.end() && c->is_array()) {
      std::string text;
      for (const json& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
          return Bad(absl::StrCat(where, ".content"), "parts other than text are not supported");
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      copy["content"] = text;
    } else if (c != m.end() && !c->is_string() && !c->is_null()) {
      return Bad(absl::StrCat(where, ".content"), "must be a string, an array of text parts, or null");
    }
    out.push_back(std::move(copy));
  }
  chat->set_messages_json(out.dump());
  const json* tool_choice = Get(body, "tool_choice");
  if (tool_choice != nullptr && *tool_choice != "auto" && *tool_choice != "none") {
    return Bad("tool_choice", "other than auto or none is not supported");
  }
  if (const json* tools = Get(body, "tools"); tools != nullptr && (tool_choice == nullptr || *tool_choice != "none")) {
    if (!tools->is_array()) return Bad("tools", "must be an array");
    if (!tools->empty()) chat->set_tools_json(tools->dump());
  }
  VC_ASSIGN_OR_RETURN(const bool generation_prompt, GetBool(body, "add_generation_prompt", true));
  chat->set_add_generation_prompt(generation_prompt);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ApiRequest> ParseRequest(Endpoint endpoint, absl::string_view body, uint64_t random_seed) {
  if (absl::Status s = CheckJsonText(body, kMaxJsonDepth); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the request body: ", s.message()));
  }
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body is not a JSON object");
  ApiRequest r;
  r.endpoint = endpoint;
  if (const json* m = Get(j, "model"); m != nullptr) {
    if (!m->is_string()) return Bad("model", "must be a string");
    r.model = m->get<std::string>();
  }
  VC_ASSIGN_OR_RETURN(r.stream, GetBool(j, "stream", false));
  if (const json* o = Get(j, "stream_options"); o != nullptr) {
    if (!o->is_object()) return Bad("stream_options", "must be an object");
    VC_ASSIGN_OR_RETURN(r.include_usage, GetBool(*o, "include_usage", false));
  }
  VC_RETURN_IF_ERROR(RefuseUnserved(j));
  VC_RETURN_IF_ERROR(ParseSampling(j, random_seed, &r.generate));
  const int64_t max = int64_t{1} << 30;
  if (endpoint == Endpoint::kCompletions) {
    VC_RETURN_IF_ERROR(ParsePrompt(j, &r.generate));
    VC_ASSIGN_OR_RETURN(const int64_t max_tokens, GetInt(j, "max_tokens", 16, 1, max));
    r.generate.set_max_tokens(static_cast<uint32_t>(max_tokens));
  } else {
    VC_RETURN_IF_ERROR(ParseMessages(j, r.generate.mutable_chat()));
    // 0: up to the end of the context.
    VC_ASSIGN_OR_RETURN(int64_t max_tokens, GetInt(j, "max_tokens", 0, 1, max));
    VC_ASSIGN_OR_RETURN(max_tokens, GetInt(j, "max_completion_tokens", max_tokens, 1, max));
    r.generate.set_max_tokens(static_cast<uint32_t>(max_tokens));
  }
  return r;
}

std::string FinishReason(v1::FinishReason r) { return r == v1::FINISH_REASON_LENGTH ? "length" : "stop"; }

json Usage(const v1::GenerateStats& s) {
  // Positions that were not computed: the full KV's from the store, or the compressed KV's (from
  // the worker's prefix cache or the store's compressed variant) that drafting began from.
  const uint32_t reused = std::min(s.prompt_tokens(), std::max(s.prefix_store_tokens(), s.prefix_compressed_tokens() +
                                                                                         s.prefix_compressed_store_tokens()));
  json usage = json::object();
  usage["prompt_tokens"] = s.prompt_tokens();
  usage["completion_tokens"] = s.generated_tokens();
  usage["total_tokens"] = s.prompt_tokens() + s.generated_tokens();
  usage["prompt_tokens_details"] = {{"cached_tokens", reused}};
  json vc = json::object();
  vc["mode"] = s.mode() == v1::MODE_FULL ? "full" : "vericache";
  vc["prefix_store_tokens"] = s.prefix_store_tokens();
  vc["prefix_compressed_tokens"] = s.prefix_compressed_tokens();
  vc["prefix_compressed_store_tokens"] = s.prefix_compressed_store_tokens();
  vc["recomputed_tokens"] = s.recomputed_tokens();
  vc["drafted_tokens"] = s.drafted_tokens();
  vc["accepted_drafts"] = s.accepted_drafts();
  vc["verify_passes"] = s.verify_passes();
  vc["plain_verify_passes"] = s.plain_verify_passes();
  vc["queue_micros"] = s.queue_micros();
  vc["time_to_first_token_micros"] = s.time_to_first_token_micros();
  vc["total_micros"] = s.total_micros();
  vc["prefill_micros"] = s.prefill_micros();
  vc["draft_micros"] = s.draft_micros();
  vc["verify_micros"] = s.verify_micros();
  vc["fetch_wait_micros"] = s.fetch_wait_micros();
  usage["vericache"] = std::move(vc);
  return usage;
}

namespace {

json Header(Endpoint e, const AnswerHeader& h, bool chunk) {
  json j = json::object();
  j["id"] = h.id;
  j["object"] = e == Endpoint::kCompletions ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
  j["created"] = h.created;
  j["model"] = h.model;
  return j;
}

}  // namespace

json Answer(Endpoint e, const AnswerHeader& h, const std::string& text, const v1::GenerateStats& stats) {
  json j = Header(e, h, false);
  json choice = json::object();
  choice["index"] = 0;
  if (e == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = FinishReason(stats.finish_reason());
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = Usage(stats);
  return j;
}

json Chunk(Endpoint e, const AnswerHeader& h, const std::string& text, bool first, const std::string& finish_reason) {
  json j = Header(e, h, true);
  json choice = json::object();
  choice["index"] = 0;
  if (e == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = std::move(delta);
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  j["choices"] = json::array({std::move(choice)});
  return j;
}

json UsageChunk(Endpoint e, const AnswerHeader& h, const v1::GenerateStats& stats) {
  json j = Header(e, h, true);
  j["choices"] = json::array();
  j["usage"] = Usage(stats);
  return j;
}

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    case grpc::StatusCode::CANCELLED:
      return 499;
    default:
      return 500;
  }
}

json ErrorBody(int status, absl::string_view message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status < 500  ? "invalid_request_error"
                                     : "server_error";
  json e = json::object();
  e["message"] = std::string(message);
  e["type"] = type;
  e["param"] = nullptr;
  e["code"] = status;
  return json{{"error", std::move(e)}};
}

std::string JsonText(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace vc::http
