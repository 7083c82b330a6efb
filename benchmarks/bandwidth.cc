#include "benchmarks/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace vc::bench {

double MeasureMemcpyBandwidth(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    std::swap(a, b);
  }
  return static_cast<double>(bytes) / best;
}

}  // namespace vc::bench
