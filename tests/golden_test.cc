// The shipped test model against the PyTorch reference written by models/train.py.
#include <cmath>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc {
namespace {

const std::string kModelDir = std::string(VC_SOURCE_DIR) + "/models/vc-code-4m";

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

class GoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load(kModelDir);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* GoldenTest::model_ = nullptr;

// Relative error is measured against the largest magnitude in each logits row.
constexpr double kMaxRelativeError = 2e-4;

TEST_F(GoldenTest, LogitsMatchPyTorch) {
  const auto ref = ReadJson(kModelDir + "/reference/logits.json");
  const std::vector<int32_t> ids = ref["input_ids"].get<std::vector<int32_t>>();
  PagedKvCache cache(model_->kv_layout(16), static_cast<int64_t>(ids.size()) / 16 + 1);
  SequenceChunk ch{cache.NewSequence(), ids};
  std::vector<float> logits;
  ASSERT_TRUE(model_->Forward({&ch, 1}, cache, LogitsFor::kAllRows, &logits).ok());
  const int v = model_->config().vocab_size;
  const auto positions = ref["positions"].get<std::vector<int>>();
  double worst = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const auto want = ref["logits"][i].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int>(want.size()), v);
    double scale = 0, err = 0;
    for (int t = 0; t < v; ++t) {
      scale = std::max(scale, std::fabs(want[t]));
      err = std::max(err, std::fabs(want[t] - logits[static_cast<size_t>(positions[i]) * v + t]));
    }
    worst = std::max(worst, err / scale);
    EXPECT_LE(err / scale, kMaxRelativeError) << "position " << positions[i];
  }
  std::cout << "worst relative logits error: " << worst << " over " << positions.size() << " positions\n";
}

TEST_F(GoldenTest, GreedyContinuationsMatchPyTorch) {
  const auto ref = ReadJson(kModelDir + "/reference/greedy.json");
  GenerateOptions o;
  o.max_tokens = ref["steps"].get<int>();
  o.stop_at_eos = false;
  for (const auto& c : ref["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    auto r = GenerateFull(*model_, prompt, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens, c["continuation_ids"].get<std::vector<int32_t>>())
        << "prompt of " << prompt.size() << " tokens: got '" << model_->tokenizer().Decode(r->tokens) << "'";
  }
}

}  // namespace
}  // namespace vc
