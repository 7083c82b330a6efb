#include "cachestore/block_key.h"

#include <openssl/evp.h>

#include <cstring>
#include <memory>

namespace vc::cachestore {
namespace {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutField(std::string* out, absl::string_view f) {
  PutU32(out, static_cast<uint32_t>(f.size()));
  out->append(f.data(), f.size());
}

}  // namespace

std::string BlockKey::Hex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  std::array<uint8_t, 32> out{};
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  unsigned int len = 0;
  // EVP calls fail only on allocation failure; the digest is then all zeros, which no chain
  // produces in practice, and a block under it would fail its header check.
  if (ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1 &&
      EVP_DigestUpdate(ctx.get(), data.data(), data.size()) == 1) {
    EVP_DigestFinal_ex(ctx.get(), out.data(), &len);
  }
  return out;
}

std::vector<BlockKey> ChainBlockKeys(const KeyContext& c, absl::Span<const int32_t> tokens) {
  std::vector<BlockKey> keys;
  if (c.block_tokens <= 0) return keys;
  std::string prefix;
  PutField(&prefix, c.model_fingerprint);
  PutField(&prefix, c.layout);
  PutField(&prefix, c.tenant_salt);
  PutU32(&prefix, static_cast<uint32_t>(c.block_tokens));
  BlockKey prev;
  std::string msg;
  for (size_t b = 0; b + c.block_tokens <= tokens.size(); b += c.block_tokens) {
    msg.assign(reinterpret_cast<const char*>(prev.bytes.data()), prev.bytes.size());
    msg += prefix;
    for (int i = 0; i < c.block_tokens; ++i) PutU32(&msg, static_cast<uint32_t>(tokens[b + i]));
    BlockKey k;
    k.bytes = Sha256(msg);
    keys.push_back(k);
    prev = k;
  }
  return keys;
}

}  // namespace vc::cachestore
