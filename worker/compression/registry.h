// The compression methods beyond KIVI and StreamingLLM: build-time selectors (SnapKV) and caches
// with their own layout (H2O, Quest). MakeCompressedKvCache dispatches here.
#ifndef VC_WORKER_COMPRESSION_REGISTRY_H_
#define VC_WORKER_COMPRESSION_REGISTRY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/compression/compressed_cache.h"
#include "worker/compression/token_list_cache.h"

namespace vc {

// True for methods that choose prompt positions at build time (and so compose with kivi).
bool IsPromptSelectorMethod(absl::string_view name);

// The selector for `m`; kInvalidArgument for bad parameters.
absl::StatusOr<std::unique_ptr<PromptSelector>> MakePromptSelector(const MethodSpec& m, const KvLayout& layout);

// A cache for a method with its own layout; nullptr (not an error) when `m.name` is none of them.
absl::StatusOr<std::unique_ptr<CompressedKvCache>> MakeOtherCompressedKvCache(const MethodSpec& m,
                                                                              const KvLayout& layout, int num_heads);

// The names MakeOtherCompressedKvCache and MakePromptSelector know, for error messages.
std::string KnownOtherMethods();

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_REGISTRY_H_
