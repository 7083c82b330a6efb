// The memory bandwidth of this machine, measured in the same run as a benchmark.
#ifndef VC_BENCHMARKS_BANDWIDTH_H_
#define VC_BENCHMARKS_BANDWIDTH_H_

#include <cstddef>

namespace vc::bench {

// Bytes per second of memcpy between two `bytes`-sized buffers (best of `reps`), counting the
// bytes copied once.
double MeasureMemcpyBandwidth(size_t bytes = size_t{256} << 20, int reps = 5);

}  // namespace vc::bench

#endif  // VC_BENCHMARKS_BANDWIDTH_H_
