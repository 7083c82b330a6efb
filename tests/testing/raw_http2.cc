#include "tests/testing/raw_http2.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace vc::testing {

RawGrpcCall::RawGrpcCall(int port, const std::string& path,
                         const std::vector<std::pair<std::string, std::string>>& headers, const std::string& message,
                         bool zero_window) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to port " << port;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;  // Pump then reports no answer
    return;
  }
  // HPACK literals without indexing, new names, no Huffman coding (all lengths here are < 127).
  std::string block;
  const auto header = [&](const std::string& name, const std::string& value) {
    block += '\0';
    block += static_cast<char>(name.size()), block += name;
    block += static_cast<char>(value.size()), block += value;
  };
  header(":method", "POST");
  header(":scheme", "http");
  header(":path", path);
  header(":authority", "127.0.0.1");
  header("content-type", "application/grpc");
  header("te", "trailers");
  for (const auto& [name, value] : headers) header(name, value);
  std::string body(1, '\0');  // not compressed
  for (int shift = 24; shift >= 0; shift -= 8) body += static_cast<char>(message.size() >> shift);
  body += message;
  const std::string settings = zero_window ? std::string("\0\x04\0\0\0\0", 6) : "";  // INITIAL_WINDOW_SIZE 0
  Send(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + Frame(0x4, 0, 0, settings) + Frame(0x1, 0x4, 1, block) +
       Frame(0x0, 0x1, 1, body));
}

RawGrpcCall::~RawGrpcCall() {
  if (fd_ >= 0) close(fd_);
}

bool RawGrpcCall::Pump(std::chrono::milliseconds timeout, bool until_answered) {
  if (fd_ < 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!(until_answered && answered_) && !closed_ && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) {
      closed_ = answered_ = true;
      break;
    }
    in_.append(buf, static_cast<size_t>(n));
    while (in_.size() >= 9) {
      const size_t len = (size_t{Byte(0)} << 16) | (size_t{Byte(1)} << 8) | Byte(2);
      if (in_.size() < 9 + len) break;
      const uint8_t type = Byte(3), flags = Byte(4);
      const uint32_t stream =
          (uint32_t{Byte(5)} << 24) | (uint32_t{Byte(6)} << 16) | (uint32_t{Byte(7)} << 8) | Byte(8);
      if (stream == 1 && (type == 0x1 || type == 0x3)) answered_ = true;  // HEADERS, RST_STREAM
      if (type == 0x7) answered_ = true;                                   // GOAWAY
      if (type == 0x4 && (flags & 0x1) == 0) Send(Frame(0x4, 0x1, 0, ""));  // SETTINGS: ack
      if (type == 0x6 && (flags & 0x1) == 0) Send(Frame(0x6, 0x1, 0, in_.substr(9, len)));  // PING: ack
      in_.erase(0, 9 + len);
    }
  }
  return answered_;
}

std::string RawGrpcCall::Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  f += static_cast<char>(payload.size() >> 16), f += static_cast<char>(payload.size() >> 8);
  f += static_cast<char>(payload.size()), f += static_cast<char>(type), f += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>(stream >> shift);
  return f + payload;
}

void RawGrpcCall::Send(const std::string& bytes) {
  if (fd_ >= 0) (void)send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

}  // namespace vc::testing
