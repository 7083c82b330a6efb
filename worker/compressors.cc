#include "worker/compressors.h"

namespace vc {

bool IsPromptSelectorMethod(absl::string_view) { return false; }

absl::StatusOr<std::unique_ptr<PromptSelector>> MakePromptSelector(const MethodSpec& m, const KvLayout&) {
  return absl::InvalidArgumentError("no prompt selector named '" + m.name + "'");
}

absl::StatusOr<std::unique_ptr<CompressedKvCache>> MakeOtherCompressedKvCache(const MethodSpec&, const KvLayout&,
                                                                              int) {
  return std::unique_ptr<CompressedKvCache>();
}

std::string KnownOtherMethods() { return ""; }

}  // namespace vc
