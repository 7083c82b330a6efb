// Each reference kernel against a case computed by hand.
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace vc::kernels {
namespace {

const Backend& K() { return ReferenceBackend(); }

TEST(ReferenceKernels, MatMulF32AndBF16) {
  // x [2, 3], w [2, 3]: y = x * w^T.
  const float x[] = {1, 2, 3, -1, 0.5f, 2};
  const float w[] = {1, 0, -1, 0.5f, 0.25f, 2};
  float y[4];
  K().MatMul(x, 2, WeightView{w, DType::kF32, 2, 3}, y);
  EXPECT_FLOAT_EQ(y[0], 1 - 3);
  EXPECT_FLOAT_EQ(y[1], 0.5f + 0.5f + 6);
  EXPECT_FLOAT_EQ(y[2], -1 - 2);
  EXPECT_FLOAT_EQ(y[3], -0.5f + 0.125f + 4);
  uint16_t wb[6];
  for (int i = 0; i < 6; ++i) wb[i] = F32ToBF16(w[i]);  // all exactly representable
  float yb[4];
  K().MatMul(x, 2, WeightView{wb, DType::kBF16, 2, 3}, yb);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], yb[i]);
  uint16_t wh[6];
  for (int i = 0; i < 6; ++i) wh[i] = F32ToF16(w[i]);
  K().MatMul(x, 2, WeightView{wh, DType::kF16, 2, 3}, yb);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], yb[i]);
}

TEST(ReferenceKernels, RmsNorm) {
  const float x[] = {3, 4};  // mean square 12.5
  const float w[] = {1, 2};
  float y[2];
  K().RmsNorm(x, 1, 2, w, 0.0f, y);
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5f), 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 / std::sqrt(12.5f), 1e-6);
}

TEST(ReferenceKernels, RopeRotatesHalves) {
  // head_dim 4: pairs (x0, x2) and (x1, x3). Rotate pair 0 by 90 degrees, pair 1 by 0.
  float x[] = {1, 2, 3, 4};
  const float c[] = {0, 1}, s[] = {1, 0};
  K().Rope(x, 1, 1, 4, c, s);
  EXPECT_FLOAT_EQ(x[0], -3);  // a*cos - b*sin = 1*0 - 3*1
  EXPECT_FLOAT_EQ(x[2], 1);   // b*cos + a*sin = 3*0 + 1*1
  EXPECT_FLOAT_EQ(x[1], 2);
  EXPECT_FLOAT_EQ(x[3], 4);
}

TEST(ReferenceKernels, SwiGlu) {
  const float g[] = {0, 1, -2}, u[] = {5, 2, 3};
  float out[3];
  K().SwiGlu(g, u, 3, out);
  EXPECT_FLOAT_EQ(out[0], 0);
  EXPECT_NEAR(out[1], 1 / (1 + std::exp(-1.0f)) * 2, 1e-6);
  EXPECT_NEAR(out[2], -2 / (1 + std::exp(2.0f)) * 3, 1e-6);
}

TEST(ReferenceKernels, PagedAttentionOverScatteredBlocks) {
  // One KV head, head_dim 2, block size 1, three blocks placed in reverse order.
  // Logical positions 0, 1 -> physical blocks 2, 0.
  std::vector<float> k(3 * 2), v(3 * 2);
  k[2 * 2 + 0] = 1;  // pos 0: k = (1, 0), v = (1, 2)
  v[2 * 2 + 0] = 1;
  v[2 * 2 + 1] = 2;
  k[0 * 2 + 1] = 1;  // pos 1: k = (0, 1), v = (3, -1)
  v[0 * 2 + 0] = 3;
  v[0 * 2 + 1] = -1;
  const int32_t table[] = {2, 0};
  PagedKvLayer kv{k.data(), v.data(), 2, 1, 1, 2};
  // Two query heads share the KV head. q0 = (ln 3, 0): scores (ln 3, 0) -> weights (3/4, 1/4).
  const float q[] = {std::log(3.0f), 0, 0, 0};
  AttentionRow rows[] = {{table, 2}};
  float out[4];
  K().PagedAttention(q, 1, 2, rows, kv, 1.0f, out);
  EXPECT_NEAR(out[0], 0.75f * 1 + 0.25f * 3, 1e-6);
  EXPECT_NEAR(out[1], 0.75f * 2 - 0.25f * 1, 1e-6);
  EXPECT_NEAR(out[2], 0.5f * 1 + 0.5f * 3, 1e-6);  // zero query: uniform
  EXPECT_NEAR(out[3], 0.5f * 2 - 0.5f * 1, 1e-6);
  // kv_len 1 sees only position 0.
  rows[0].kv_len = 1;
  K().PagedAttention(q, 1, 2, rows, kv, 1.0f, out);
  EXPECT_FLOAT_EQ(out[0], 1);
  EXPECT_FLOAT_EQ(out[1], 2);
}

TEST(DType, Conversions) {
  EXPECT_EQ(BF16ToF32(F32ToBF16(1.5f)), 1.5f);
  EXPECT_EQ(F32ToBF16(1.0f + 1.0f / 256), F32ToBF16(1.0f));  // halfway rounds to even
  EXPECT_EQ(F16ToF32(F32ToF16(-2.75f)), -2.75f);
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_FALSE(ParseDType("I64").ok());
}

TEST(KernelThreads, VcThreadsIsACountOrANamedError) {
  const char* before = std::getenv("VC_THREADS");
  const std::string saved = before != nullptr ? before : "";
  for (const char* bad : {"abc", "", "0", "-5", "1025", "99999999", "3000000000", "2x"}) {
    setenv("VC_THREADS", bad, 1);
    absl::StatusOr<int> n = KernelThreadsFromEnv();
    EXPECT_FALSE(n.ok()) << bad;
    if (n.ok()) continue;
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(n.status().message().find("VC_THREADS"), absl::string_view::npos) << n.status();
  }
  setenv("VC_THREADS", "3", 1);
  EXPECT_EQ(KernelThreadsFromEnv().value_or(-1), 3);
  setenv("VC_THREADS", "1024", 1);
  EXPECT_EQ(KernelThreadsFromEnv().value_or(-1), 1024);
  unsetenv("VC_THREADS");
  EXPECT_EQ(KernelThreadsFromEnv().value_or(-1), UsableCores());
  if (before != nullptr) setenv("VC_THREADS", saved.c_str(), 1);
}

// VC_KERNELS names kernels this machine has, or a worker stops at startup naming those it has.
TEST(KernelsFromEnv, VcKernelsNamesAnAvailableBackendOrANamedError) {
  const char* before = std::getenv("VC_KERNELS");
  const std::string saved = before != nullptr ? before : "";
  for (const char* bad : {"bogus", "AVX2", "reference "}) {
    setenv("VC_KERNELS", bad, 1);
    const absl::Status st = CheckKernelsFromEnv();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("names no kernels available here (available: "), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("reference"), absl::string_view::npos) << st;
  }
  for (const char* good : {"reference", ""}) {
    setenv("VC_KERNELS", good, 1);
    EXPECT_TRUE(CheckKernelsFromEnv().ok()) << good;
  }
  unsetenv("VC_KERNELS");
  EXPECT_TRUE(CheckKernelsFromEnv().ok());
  if (before != nullptr) setenv("VC_KERNELS", saved.c_str(), 1);
}

// Unset, VC_THREADS means the cores the process may use: its affinity mask, or its cgroup's CPU
// quota where that is less (a container limited to 4 CPUs on a 64-core node runs 4 threads).
TEST(KernelThreads, TheDefaultIsTheCoresAProcessMayUse) {
  EXPECT_EQ(CoresOfCpuMax("400000 100000"), 4);
  EXPECT_EQ(CoresOfCpuMax("150000 100000"), 2);  // 1.5 CPUs: two threads, each busy part of the time
  EXPECT_EQ(CoresOfCpuMax("50000 100000\n"), 1);
  EXPECT_EQ(CoresOfCpuMax("max 100000"), 0);  // no limit
  EXPECT_EQ(CoresOfCpuMax("-1 100000"), 0);   // cgroup v1's "no limit", as read
  EXPECT_EQ(CoresOfCpuMax(""), 0);
  EXPECT_EQ(CoresOfCpuMax("400000"), 0);
  EXPECT_EQ(CoresOfCpuMax("400000 0"), 0);
  EXPECT_EQ(CoresOfCpuMax("999999999999 1"), kMaxKernelThreads);
  EXPECT_EQ(CoresOfCpuMax("9223372036854775807 100000"), kMaxKernelThreads);
  const int usable = UsableCores();
  EXPECT_GE(usable, 1);
  EXPECT_LE(usable, std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace vc::kernels
