#include "worker/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vc {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  // Values are printed to float precision (9 digits), so 1.0000001 is not shown as 1.
  if (!std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature ", p.temperature, " is not a finite float"));
  }
  if (p.temperature < 0.0f) {
    return absl::InvalidArgumentError(absl::StrFormat("temperature %.9g must be >= 0", p.temperature));
  }
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k ", p.top_k, " must be >= 0"));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p %.9g must be in (0, 1]", p.top_p));
  }
  return absl::OkStatus();
}

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kM0} * c[0];
    const uint64_t p1 = uint64_t{kM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

double PositionUniform(uint64_t seed, int64_t position) {
  const uint64_t p = static_cast<uint64_t>(position);
  auto r = Philox4x32({static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), 0, 0},
                      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (uint64_t{r[0]} << 21) ^ r[1];  // 53 random bits
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params, int64_t position) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (params.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  // Candidates ordered by logit, descending, ties by id: a fixed order for every cumulative sum.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (params.top_k > 0) keep = std::min(keep, static_cast<size_t>(params.top_k));
  const double inv_t = 1.0 / params.temperature;
  const double top = logits[order[0]] * inv_t;
  std::vector<double> w(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    w[i] = std::exp(logits[order[i]] * inv_t - top);
    total += w[i];
  }
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += w[i];
      if (mass >= params.top_p * total) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = std::accumulate(w.begin(), w.begin() + static_cast<ptrdiff_t>(keep), 0.0);
  }
  const double u = PositionUniform(params.seed, position) * total;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace vc
