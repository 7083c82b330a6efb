#include "worker/compression/highest_scores.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace vc {

void HighestScores(const float* scores, int64_t n, int64_t keep, std::vector<float>* scratch, int32_t* out) {
  const auto at = [scores](int64_t i) { return std::isnan(scores[i]) ? -INFINITY : scores[i]; };
  scratch->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*scratch)[i] = at(i);
  // The keep-th highest, then the indices above it and as many at it as fit, earliest first.
  std::nth_element(scratch->begin(), scratch->begin() + (keep - 1), scratch->end(), std::greater<float>());
  const float threshold = (*scratch)[keep - 1];
  int64_t ties = keep;
  for (int64_t i = 0; i < n; ++i) ties -= at(i) > threshold;
  int64_t taken = 0;
  for (int64_t i = 0; i < n && taken < keep; ++i) {
    if (at(i) > threshold || (at(i) == threshold && ties-- > 0)) out[taken++] = static_cast<int32_t>(i);
  }
}

}  // namespace vc
