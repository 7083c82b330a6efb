#include "worker/runtime/sampler.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace vc {
namespace {

TEST(Philox, KnownAnswers) {
  // Known-answer vectors of Philox4x32-10 (Random123).
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(logits, SamplingParams{}, 7), 1);
}

TEST(Sampler, PureFunctionOfLogitsSeedAndPosition) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 0.7f) * 2;
  SamplingParams p{1.0f, 0, 1.0f, 42};
  std::vector<int32_t> a, b;
  for (int pos = 0; pos < 200; ++pos) a.push_back(SampleToken(logits, p, pos));
  for (int pos = 0; pos < 200; ++pos) b.push_back(SampleToken(logits, p, pos));
  EXPECT_EQ(a, b);
  // Not constant across positions, and another seed gives another sequence.
  EXPECT_NE(std::count(a.begin(), a.end(), a[0]), 200);
  p.seed = 43;
  std::vector<int32_t> c;
  for (int pos = 0; pos < 200; ++pos) c.push_back(SampleToken(logits, p, pos));
  EXPECT_NE(a, c);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p{1.0f, 0, 1.0f, 9};
  int counts[3] = {0, 0, 0};
  const int n = 20000;
  for (int pos = 0; pos < n; ++pos) counts[SampleToken(logits, p, pos)]++;
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.02);
}

TEST(Sampler, TopKAndTopPFilter) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams k1{1.0f, 1, 1.0f, 3};
  SamplingParams k2{1.0f, 2, 1.0f, 3};
  SamplingParams p7{1.0f, 0, 0.7f, 3};  // keeps {0, 1}: 0.5 < 0.7 <= 0.8
  for (int pos = 0; pos < 500; ++pos) {
    EXPECT_EQ(SampleToken(logits, k1, pos), 0);
    EXPECT_LT(SampleToken(logits, k2, pos), 2);
    EXPECT_LT(SampleToken(logits, p7, pos), 2);
  }
}

TEST(Sampler, RejectsBadParams) {
  EXPECT_FALSE(ValidateSamplingParams({-1.0f, 0, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({NAN, 0, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, -2, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0, 0.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0, 1.5f, 0}).ok());
  EXPECT_TRUE(ValidateSamplingParams({0.7f, 40, 0.9f, 0}).ok());
}

}  // namespace
}  // namespace vc
