#include "worker/compression/compressed_cache.h"

#include "absl/strings/str_cat.h"

namespace vc {

absl::Status CheckDraftWindow(const CompressedKvCache& cache, int k) {
  if (k <= cache.MaxRollback()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("a draft window of ", k, ": ", cache.spec(), " rolls back at most ", cache.MaxRollback(), " drafts"));
}

}  // namespace vc
