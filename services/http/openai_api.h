// OpenAI's HTTP API (completions and chat completions) in terms of the Inference service: requests
// as GenerateRequests, answers and stream chunks from GenerateResponses, gRPC errors in OpenAI's
// error shape. Pure functions: no I/O (http_server.h serves them).
#ifndef VC_SERVICES_HTTP_OPENAI_API_H_
#define VC_SERVICES_HTTP_OPENAI_API_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "vericache/v1/inference.pb.h"

namespace vc::http {

enum class Endpoint { kCompletions, kChatCompletions };

// A request as the Inference service takes it, and what the answer must look like.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  vericache::v1::GenerateRequest generate;
  std::string model;  // as the client named it; empty when it did not
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses the body of POST /v1/completions or /v1/chat/completions. Defaults as OpenAI's:
// temperature 1 and a seed drawn from `random_seed` when the request gives none; max_tokens 16
// for completions, up to the end of the context for chat. kInvalidArgument naming the field for
// malformed JSON, a field of the wrong type or range, and what is not served: n above 1, best_of,
// echo, logprobs, logit_bias, penalties, several prompts, non-text message parts.
absl::StatusOr<ApiRequest> ParseRequest(Endpoint endpoint, absl::string_view body, uint64_t random_seed);

// The answer's parts that do not change within one request.
struct AnswerHeader {
  std::string id;     // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// "stop" for the end-of-sequence token or a stop sequence, "length" for max_tokens or the context.
std::string FinishReason(vericache::v1::FinishReason r);

// OpenAI's usage object from a request's stats: prompt_tokens, completion_tokens, total_tokens,
// prompt_tokens_details.cached_tokens (prompt positions read from the cache store or the
// compressed prefix cache rather than computed), and the stats themselves as "vericache".
nlohmann::ordered_json Usage(const vericache::v1::GenerateStats& stats);

// The whole answer of a request that is not streamed.
nlohmann::ordered_json Answer(Endpoint endpoint, const AnswerHeader& h, const std::string& text,
                              const vericache::v1::GenerateStats& stats);

// One chunk of a streamed answer: `text` (a delta; the chat's first chunk names the role too),
// with `finish_reason` when not empty.
nlohmann::ordered_json Chunk(Endpoint endpoint, const AnswerHeader& h, const std::string& text, bool first,
                             const std::string& finish_reason);
// The stream's last chunk under include_usage: no choices, the usage.
nlohmann::ordered_json UsageChunk(Endpoint endpoint, const AnswerHeader& h, const vericache::v1::GenerateStats& stats);

// The HTTP status of a gRPC error: 400 INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE;
// 401 UNAUTHENTICATED; 403 PERMISSION_DENIED; 404 NOT_FOUND; 429 RESOURCE_EXHAUSTED;
// 503 UNAVAILABLE; 504 DEADLINE_EXCEEDED; 499 CANCELLED; 500 otherwise.
int HttpStatusOf(grpc::StatusCode code);
// OpenAI's error object: {"error": {"message", "type", "param", "code"}}, the type from the status.
nlohmann::ordered_json ErrorBody(int http_status, absl::string_view message);

// `j` as JSON text; bytes of its strings that are not UTF-8 become U+FFFD (never an exception).
std::string JsonText(const nlohmann::ordered_json& j);

}  // namespace vc::http

#endif  // VC_SERVICES_HTTP_OPENAI_API_H_
