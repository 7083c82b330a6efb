// libFuzzer target: the store's block format (cachestore/block_format.h) on untrusted bytes, as a
// store receives them in a put and a worker in a read. A block that passes its checks must be as
// big as its header says.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "cachestore/block_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)vc::cachestore::DecodeBlockHeader(bytes);
  const auto verified = vc::cachestore::VerifyBlock(bytes);
  if (verified.ok() && vc::cachestore::BlockBytes(verified->layout) != size) std::abort();
  return 0;
}
