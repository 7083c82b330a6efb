// An OpenAI-compatible HTTP front end (`--http-listen` of the worker and the router), speaking to
// the process's own Inference service over an in-process gRPC channel, so that HTTP and gRPC
// clients get the same checks, limits, tenants and output.
//
//   POST /v1/completions, POST /v1/chat/completions   plain JSON or server-sent events ("stream")
//   GET  /v1/models, GET /v1/models/{id}               the served model
//   GET  /health                                       200 while serving, 503 otherwise
//
// Plain HTTP, or HTTPS with a certificate and key (the worker's and router's --tls-cert and
// --tls-key, which serve gRPC over TLS too).
// "Authorization: Bearer <token>" is passed on as the gRPC call's, so tokens map to tenants as
// they do there. Errors come in OpenAI's shape with the status of the gRPC code (openai_api.h).
// A client that disconnects cancels its request: while no token is due, a streamed answer sends
// an SSE comment and a plain one a space (JSON may begin with one) every second, so a gone client
// is noticed within about two seconds. An error after the answer began ends a stream with an
// error event; a plain answer's connection is closed before its end, so the client sees it failed.
#ifndef VC_SERVICES_HTTP_HTTP_SERVER_H_
#define VC_SERVICES_HTTP_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace vc::http {

struct HttpServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0: any free one
  int max_connections = 256;           // served at once, each on a thread of its own
  size_t max_body_bytes = size_t{32} << 20;
  // Whether the process serves now (GET /health); null: always.
  std::function<bool()> healthy;
  // PEM files of a certificate (chain) and its key: HTTPS. Both empty: plain HTTP.
  std::string tls_cert_file, tls_key_file;
};

// Thread-safe.
class HttpServer {
 public:
  // Serves `inference` (a channel to an Inference service). kInvalidArgument for a malformed
  // address or a certificate and key that cannot be loaded; kUnavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                          std::shared_ptr<grpc::Channel> inference);
  // Stops listening and cancels the requests in flight; returns once their threads have ended.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vc::http

#endif  // VC_SERVICES_HTTP_HTTP_SERVER_H_
