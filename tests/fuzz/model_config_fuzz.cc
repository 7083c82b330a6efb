// libFuzzer target: a checkpoint's config.json (worker/runtime/model_config.h).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "worker/runtime/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)vc::ParseModelConfig(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
