// libFuzzer target: compressor specs (--compressor, and what GetModelInfo reports) for a small
// model's layout. A spec that builds a cache must describe itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "worker/compression/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // a spec is a line
  const absl::string_view spec(reinterpret_cast<const char*>(data), size);
  (void)vc::ParseCompressorSpec(spec);
  vc::KvLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 16;
  layout.block_size = 16;
  layout.dtype = vc::DType::kBF16;
  const auto cache = vc::MakeCompressedKvCache(spec, layout, /*num_heads=*/4);
  if (cache.ok() && (*cache)->spec().empty()) std::abort();
  return 0;
}
