// libFuzzer target: a checkpoint's tokenizer.json (worker/runtime/hf_tokenizer.h); the input up to
// its first NUL is tokenizer.json, the rest tokenizer_config.json. A tokenizer that builds encodes
// and decodes a short text.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/runtime/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 << 10) return 0;
  const absl::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const absl::string_view json = all.substr(0, nul);
  const absl::string_view config = nul == absl::string_view::npos ? absl::string_view() : all.substr(nul + 1);
  const auto tokenizer = vc::ParseHfTokenizer(json, config);
  if (!tokenizer.ok()) return 0;
  const std::vector<int32_t> ids = (*tokenizer)->Encode("def f(x):\n  return x  # é 😀", /*add_special_tokens=*/true);
  (void)(*tokenizer)->Decode(ids);
  return 0;
}
