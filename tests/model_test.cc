// The forward pass: batch invariance (bitwise), cache handling, and bad inputs.
#include <cstring>
#include <optional>
#include <random>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "tests/testing/tiny_model.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/model.h"

namespace vc {
namespace {

struct ModelCase {
  testing::TinyModelSpec spec;
  std::string backend;
  std::optional<DType> kv_dtype;  // unset: the checkpoint's (bf16, or float32 for TiedF32)
};

class ModelTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    const kernels::Backend* backend = kernels::BackendByName(GetParam().backend);
    if (backend == nullptr) GTEST_SKIP() << "backend " << GetParam().backend << " not available here";
    const std::string dir = testing::TempDir("model_" + GetParam().spec.architecture);
    testing::WriteTinyModel(dir, GetParam().spec);
    ModelOptions o;
    o.backend = backend;
    o.kv_dtype = GetParam().kv_dtype;
    auto m = Model::Load(dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  std::vector<int32_t> Tokens(int n, uint64_t seed) const {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
    return t;
  }

  // Logits of every position of `tokens`, fed in passes of the given sizes (cycled).
  std::vector<float> Logits(const std::vector<int32_t>& tokens, const std::vector<int>& pass_sizes,
                            int block_size, uint64_t placement_seed) const {
    PagedKvCache cache(model_->kv_layout(block_size), 4096 / block_size + 8, placement_seed);
    const SeqId seq = cache.NewSequence();
    std::vector<float> all, logits;
    size_t at = 0, i = 0;
    while (at < tokens.size()) {
      const size_t len = std::min(tokens.size() - at, static_cast<size_t>(pass_sizes[i++ % pass_sizes.size()]));
      SequenceChunk ch{seq, absl::MakeConstSpan(tokens).subspan(at, len)};
      EXPECT_TRUE(model_->Forward({&ch, 1}, cache, LogitsFor::kAllRows, &logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
      at += len;
    }
    return all;
  }

  std::unique_ptr<Model> model_;
};

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST_P(ModelTest, LogitsBitwiseEqualAcrossPassSizesBlockSizesAndPlacement) {
  const auto tokens = Tokens(150, 3);
  const auto decode = Logits(tokens, {1}, 16, 0);
  for (int pass = 2; pass <= 17; ++pass) {
    EXPECT_TRUE(BitwiseEqual(decode, Logits(tokens, {pass}, 16, 0))) << "pass size " << pass;
  }
  for (int block : {8, 16, 32}) {
    EXPECT_TRUE(BitwiseEqual(decode, Logits(tokens, {1, 5, 17, 3}, block, 99))) << "block " << block;
  }
}

TEST_P(ModelTest, BatchedSequencesMatchSingleSequences) {
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < 5; ++b) prompts.push_back(Tokens(20 + 7 * b, 10 + b));
  std::vector<std::vector<float>> single;
  for (const auto& p : prompts) single.push_back(Logits(p, {64}, 16, 0));
  // All sequences in one pass, each with its own chunk.
  PagedKvCache cache(model_->kv_layout(16), 64, 5);
  std::vector<SequenceChunk> chunks;
  for (const auto& p : prompts) chunks.push_back({cache.NewSequence(), p});
  std::vector<float> logits;
  ASSERT_TRUE(model_->Forward(chunks, cache, LogitsFor::kAllRows, &logits).ok());
  const int v = model_->config().vocab_size;
  size_t row = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    std::vector<float> mine(logits.begin() + row * v, logits.begin() + (row + prompts[b].size()) * v);
    EXPECT_TRUE(BitwiseEqual(single[b], mine)) << "sequence " << b;
    row += prompts[b].size();
  }
}

TEST_P(ModelTest, BatchedDecodeStepsMatchSoloDecoding) {
  // b sequences of different lengths decode together, one token each per pass, for b = 1..8.
  std::vector<std::vector<int32_t>> seqs;
  for (int b = 0; b < 8; ++b) seqs.push_back(Tokens(12 + 5 * b, 40 + b));
  std::vector<std::vector<float>> solo;
  for (const auto& s : seqs) solo.push_back(Logits(s, {1}, 16, 0));
  const int v = model_->config().vocab_size;
  for (int b = 1; b <= 8; ++b) {
    PagedKvCache cache(model_->kv_layout(16), 64, 1000 + b);
    std::vector<SeqId> ids;
    for (int i = 0; i < b; ++i) ids.push_back(cache.NewSequence());
    std::vector<std::vector<float>> got(b);
    std::vector<float> logits;
    for (size_t step = 0;; ++step) {
      std::vector<SequenceChunk> chunks;
      std::vector<int> who;
      for (int i = 0; i < b; ++i) {
        if (step < seqs[i].size()) {
          chunks.push_back({ids[i], absl::MakeConstSpan(seqs[i]).subspan(step, 1)});
          who.push_back(i);
        }
      }
      if (chunks.empty()) break;
      ASSERT_TRUE(model_->Forward(chunks, cache, LogitsFor::kAllRows, &logits).ok());
      for (size_t c = 0; c < who.size(); ++c) {
        got[who[c]].insert(got[who[c]].end(), logits.begin() + c * v, logits.begin() + (c + 1) * v);
      }
    }
    for (int i = 0; i < b; ++i) EXPECT_TRUE(BitwiseEqual(solo[i], got[i])) << "batch " << b << " seq " << i;
  }
}

TEST_P(ModelTest, RejectsBadInputAndFullCacheLeavesNoTrace) {
  PagedKvCache cache(model_->kv_layout(16), 2);
  const SeqId a = cache.NewSequence(), b = cache.NewSequence();
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, 300};
  SequenceChunk ch{a, bad};
  EXPECT_EQ(model_->Forward({&ch, 1}, cache, LogitsFor::kLastRows, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  const auto t20 = Tokens(20, 1);
  SequenceChunk two[] = {{a, t20}, {b, t20}};  // needs 4 blocks, has 2
  EXPECT_EQ(model_->Forward(two, cache, LogitsFor::kLastRows, &logits).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_EQ(cache.Length(a), 0);
}

TEST_P(ModelTest, TruncateThenRedecodeIsExact) {
  // Rolled-back positions leave nothing behind: decoding after a truncate equals a clean run.
  const auto tokens = Tokens(40, 8);
  const auto clean = Logits(tokens, {1}, 8, 0);
  PagedKvCache cache(model_->kv_layout(8), 32, 4);
  const SeqId s = cache.NewSequence();
  std::vector<float> logits, got;
  SequenceChunk first{s, absl::MakeConstSpan(tokens).subspan(0, 30)};
  ASSERT_TRUE(model_->Forward({&first, 1}, cache, LogitsFor::kAllRows, &logits).ok());
  got.assign(logits.begin(), logits.begin() + 25 * model_->config().vocab_size);
  ASSERT_TRUE(cache.Truncate(s, 25).ok());
  SequenceChunk rest{s, absl::MakeConstSpan(tokens).subspan(25)};
  ASSERT_TRUE(model_->Forward({&rest, 1}, cache, LogitsFor::kAllRows, &logits).ok());
  got.insert(got.end(), logits.begin(), logits.end());
  EXPECT_TRUE(BitwiseEqual(clean, got));
}

TEST_P(ModelTest, GenerationIsReproducibleAndValidated) {
  const auto prompt = Tokens(30, 2);
  GenerateOptions o;
  o.max_tokens = 20;
  o.stop_at_eos = false;
  o.sampling = {0.8f, 50, 0.95f, 1234};
  auto a = GenerateFull(*model_, prompt, o);
  o.prefill_chunk = 7;
  o.block_size = 8;
  auto b = GenerateFull(*model_, prompt, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->tokens.size(), 20u);

  EXPECT_FALSE(GenerateFull(*model_, {}, o).ok());
  o.max_tokens = 5000;
  auto too_long = GenerateFull(*model_, prompt, o);
  EXPECT_NE(too_long.status().message().find("exceeds the model's context"), absl::string_view::npos);
}

testing::TinyModelSpec HeadDim32() {
  testing::TinyModelSpec s;
  s.hidden = 128;
  s.intermediate = 344;
  s.heads = 4;
  s.kv_heads = 1;
  s.seed = 4;
  return s;
}
testing::TinyModelSpec Qwen() {
  testing::TinyModelSpec s;
  s.architecture = "Qwen2ForCausalLM";
  s.dtype = DType::kF16;
  s.seed = 2;
  return s;
}
testing::TinyModelSpec TiedF32() {
  testing::TinyModelSpec s;
  s.architecture = "MistralForCausalLM";
  s.dtype = DType::kF32;
  s.tie_embeddings = true;
  s.attention_bias = true;
  s.heads = 4;
  s.kv_heads = 1;
  s.seed = 3;
  return s;
}

std::vector<ModelCase> Cases() {
  std::vector<ModelCase> out;
  for (const char* backend : {"reference", "avx2", "avx512vl", "avx512vl-novbmi", "avx512bf16"}) {
    for (const auto& spec : {testing::TinyModelSpec{}, HeadDim32(), Qwen(), TiedF32()}) out.push_back({spec, backend, std::nullopt});
    out.push_back({HeadDim32(), backend, DType::kF16});
    out.push_back({HeadDim32(), backend, DType::kF32});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Architectures, ModelTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  std::string name = info.param.backend + "_" + info.param.spec.architecture + "_d" +
                     std::to_string(info.param.spec.hidden / info.param.spec.heads) + "_kv" +
                     (info.param.kv_dtype ? std::string(DTypeName(*info.param.kv_dtype)) : std::string("auto")) + "_" +
                     std::to_string(info.index);
  for (char& c : name) c = c == '-' ? '_' : c;  // test names take letters, digits and '_'
  return name;
});

}  // namespace
}  // namespace vc
