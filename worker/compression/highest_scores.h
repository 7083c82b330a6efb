// Query-aware selection: which of a row of scores to keep (Quest's pages, H2O's heavy hitters,
// SnapKV's pooled prompt positions, KIVI's key groups under a query budget).
#ifndef VC_WORKER_COMPRESSION_HIGHEST_SCORES_H_
#define VC_WORKER_COMPRESSION_HIGHEST_SCORES_H_

#include <cstdint>
#include <vector>

namespace vc {

// The indices of the `keep` (in [1, n]) highest of scores[0, n), NaN lowest, ties to the lower
// index, in increasing order, into out [keep]. `scratch` is reused between calls.
void HighestScores(const float* scores, int64_t n, int64_t keep, std::vector<float>* scratch, int32_t* out);

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_HIGHEST_SCORES_H_
