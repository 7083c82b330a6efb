#include "worker/compression/registry.h"

#include "common/status_macros.h"
#include "worker/compression/h2o_cache.h"
#include "worker/compression/quest_cache.h"
#include "worker/compression/snapkv.h"

namespace vc {

bool IsPromptSelectorMethod(absl::string_view name) { return name == "snapkv"; }

absl::StatusOr<std::unique_ptr<PromptSelector>> MakePromptSelector(const MethodSpec& m, const KvLayout&) {
  if (m.name == "snapkv") {
    VC_ASSIGN_OR_RETURN(SnapKvParams p, ParseSnapKvParams(m));
    return std::unique_ptr<PromptSelector>(std::make_unique<SnapKvSelector>(p));
  }
  return absl::InvalidArgumentError("no prompt selector named '" + m.name + "'");
}

absl::StatusOr<std::unique_ptr<CompressedKvCache>> MakeOtherCompressedKvCache(const MethodSpec& m,
                                                                              const KvLayout& layout, int num_heads) {
  if (m.name == "h2o") {
    VC_ASSIGN_OR_RETURN(H2oParams p, ParseH2oParams(m));
    return std::unique_ptr<CompressedKvCache>(std::make_unique<H2oCache>(layout, num_heads, p));
  }
  if (m.name == "quest") {
    VC_ASSIGN_OR_RETURN(QuestParams p, ParseQuestParams(m));
    return std::unique_ptr<CompressedKvCache>(std::make_unique<QuestCache>(layout, p));
  }
  return std::unique_ptr<CompressedKvCache>();
}

std::string KnownOtherMethods() { return "snapkv, h2o, quest"; }

}  // namespace vc
