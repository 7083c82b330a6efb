// A gRPC call written as raw HTTP/2 frames, for tests of what gRPC's own clients cannot send.
#ifndef VC_TESTS_TESTING_RAW_HTTP2_H_
#define VC_TESTS_TESTING_RAW_HTTP2_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vc::testing {

// One gRPC call written as raw HTTP/2 frames on its own connection to 127.0.0.1:port, with header
// values sent as given (gRPC's clients refuse some values, such as control bytes, that a raw peer
// can send). With `zero_window` the client grants no flow-control window to the call's stream, so
// nothing the server writes on it gets through: a client that never reads. A connection that
// cannot be made fails the test.
class RawGrpcCall {
 public:
  RawGrpcCall(int port, const std::string& path, const std::vector<std::pair<std::string, std::string>>& headers,
              const std::string& message, bool zero_window = false);
  ~RawGrpcCall();
  RawGrpcCall(const RawGrpcCall&) = delete;
  RawGrpcCall& operator=(const RawGrpcCall&) = delete;

  // Reads frames for up to `timeout` (acknowledging the server's SETTINGS and PINGs, as a client
  // that keeps its connection must), or until the server has answered the call when
  // `until_answered`: whether it has (HEADERS or RST_STREAM on the call's stream, GOAWAY, or the
  // connection closed). False when the connection was never made.
  bool Pump(std::chrono::milliseconds timeout, bool until_answered);

 private:
  static std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload);
  uint8_t Byte(size_t i) const { return static_cast<uint8_t>(in_[i]); }
  void Send(const std::string& bytes);

  int fd_ = -1;
  std::string in_;
  bool answered_ = false, closed_ = false;
};

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_RAW_HTTP2_H_
