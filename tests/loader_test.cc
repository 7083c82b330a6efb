// Loading checkpoints: the good path, and every kind of bad file giving a clear error.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/text_checks.h"
#include "gtest/gtest.h"
#include "tests/testing/tiny_model.h"
#include "worker/prefixes/store_prefixes.h"
#include "worker/runtime/model.h"
#include "worker/runtime/safetensors.h"

namespace vc {
namespace {

using testing::RawTensor;

std::map<std::string, RawTensor> TwoTensors() {
  return {{"a", RawTensor{DType::kF32, {2, 2}, {1, 2, 3, 4}}},
          {"b", RawTensor{DType::kBF16, {3}, {1, -1, 0.5f}}}};
}

std::string WriteRaw(const std::string& name, const std::string& bytes) {
  const std::string dir = testing::TempDir(name);
  testing::WriteFile(dir + "/x.safetensors", bytes);
  return dir + "/x.safetensors";
}

// Overwrites the header (keeping the data) with `header`, padded; returns the file bytes.
std::string WithHeader(const std::string& header, const std::string& data) {
  std::string h = header;
  while (h.size() % 8) h.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

TEST(Safetensors, ReadsTensors) {
  auto f = SafetensorsFile::Open(WriteRaw("st_ok", testing::SafetensorsBytes(TwoTensors())));
  ASSERT_TRUE(f.ok()) << f.status();
  auto a = (*f)->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[3], 4.0f);
  auto b = (*f)->Get("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(BF16ToF32(reinterpret_cast<const uint16_t*>(b->data)[1]), -1.0f);
  EXPECT_EQ((*f)->Get("c").status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, MisalignedTensorsAreReadAligned) {
  // One byte of an unknown dtype first, so "a"'s four-byte floats start at an odd address.
  const float a[4] = {1, 2, 3, 4};
  std::string data(1, '\x7f');
  data.append(reinterpret_cast<const char*>(a), sizeof(a));
  const std::string header =
      R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[1,17]}})";
  auto f = SafetensorsFile::Open(WriteRaw("st_misaligned", WithHeader(header, data)));
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = (*f)->Get("a");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % alignof(float), 0u);
  EXPECT_EQ(std::vector<float>(reinterpret_cast<const float*>(t->data), reinterpret_cast<const float*>(t->data) + 4),
            std::vector<float>({1, 2, 3, 4}));
}

// An odd-offset tensor no one reads costs nothing: the aligned copy is made when a tensor is asked
// for with the shape the config implies, not at Open. Here a 32 GiB BF16 tensor (a sparse file)
// would have been copied into memory at Open, and the allocation would have ended the process.
TEST(Safetensors, MisalignedTensorsAreCopiedOnlyWhenRead) {
  const uint64_t junk_bytes = uint64_t{1} << 35;
  const std::string header = absl::StrCat(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)",
      R"("junk":{"dtype":"BF16","shape":[)", junk_bytes / 2, R"(],"data_offsets":[5,)", 5 + junk_bytes, "]}}");
  const float one = 1.0f;
  std::string data(reinterpret_cast<const char*>(&one), 4);
  const std::string path = WriteRaw("st_sparse", WithHeader(header, data));
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(std::filesystem::file_size(path) + 1 + junk_bytes)), 0);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto a = (*f)->Get("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[0], 1.0f);
  // Asked for with another shape, it is refused before any copy.
  const std::vector<int64_t> want = {4};
  auto junk = (*f)->Get("junk", &want);
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument) << junk.status();
  EXPECT_NE(junk.status().message().find("the config implies [4]"), absl::string_view::npos) << junk.status();
}

TEST(Safetensors, MissingFile) {
  auto f = SafetensorsFile::Open("/nonexistent/x.safetensors");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, TruncatedFiles) {
  const std::string good = testing::SafetensorsBytes(TwoTensors());
  // Cut inside the length prefix, inside the header, and inside the data.
  for (size_t cut : {size_t{3}, size_t{20}, good.size() - 2}) {
    auto f = SafetensorsFile::Open(WriteRaw("st_trunc", good.substr(0, cut)));
    ASSERT_FALSE(f.ok()) << "cut at " << cut;
    EXPECT_TRUE(f.status().code() == absl::StatusCode::kDataLoss ||
                f.status().code() == absl::StatusCode::kInvalidArgument)
        << f.status();
    EXPECT_NE(f.status().message().find("x.safetensors"), absl::string_view::npos);
  }
}

TEST(Safetensors, HeaderThatLies) {
  const std::string data(16, '\0');
  struct Case {
    std::string header;
    std::string expect;
  };
  const Case cases[] = {
      {R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,32]}})", "outside"},
      {R"({"a":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", "needs 24 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[8,4]}})", "outside"},
      {R"({"a":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", "negative"},
      {R"({"a":{"dtype":"F32","shape":[2,2]}})", "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[4000000000000,4000000],"data_offsets":[0,16]}})", "too large"},
      {R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})", "JSON"},
      {R"([1,2,3])", "object"},
      // A parser builds a node per level: brackets alone could cost gigabytes.
      {std::string(100000, '[') + std::string(100000, ']'), "nests deeper"},
      // Two tensors over the same bytes.
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       "overlap"},
  };
  for (const Case& c : cases) {
    auto f = SafetensorsFile::Open(WriteRaw("st_lie", WithHeader(c.header, data)));
    ASSERT_FALSE(f.ok()) << c.header;
    EXPECT_NE(f.status().message().find(c.expect), absl::string_view::npos) << f.status();
  }
  // A header length larger than the file.
  std::string bytes = WithHeader(R"({})", data);
  uint64_t huge = 1 << 20;
  std::memcpy(bytes.data(), &huge, 8);
  EXPECT_EQ(SafetensorsFile::Open(WriteRaw("st_len", bytes)).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Safetensors, UnknownDtypeIsAClearErrorOnUse) {
  const std::string data(16, '\0');
  auto f = SafetensorsFile::Open(
      WriteRaw("st_dtype", WithHeader(R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", data)));
  ASSERT_TRUE(f.ok());
  auto a = (*f)->Get("a");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("I64"), absl::string_view::npos);
}

TEST(TensorStore, ShardedIndex) {
  const std::string dir = testing::TempDir("sharded");
  testing::WriteFile(dir + "/s1.safetensors",
                     testing::SafetensorsBytes({{"a", RawTensor{DType::kF32, {1}, {7}}}}));
  testing::WriteFile(dir + "/s2.safetensors",
                     testing::SafetensorsBytes({{"b", RawTensor{DType::kF32, {1}, {8}}}}));
  testing::WriteFile(dir + "/model.safetensors.index.json",
                     R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  auto s = TensorStore::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  auto b = (*s)->Get("b", {1});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<const float*>(b->data)[0], 8.0f);
  EXPECT_EQ((*s)->Get("b", {2}).status().code(), absl::StatusCode::kInvalidArgument);

  testing::WriteFile(dir + "/model.safetensors.index.json",
                     R"({"weight_map":{"a":"s1.safetensors","b":"missing.safetensors"}})");
  EXPECT_EQ(TensorStore::Open(dir).status().code(), absl::StatusCode::kNotFound);
  testing::WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"../etc/passwd"}})");
  EXPECT_EQ(TensorStore::Open(dir).status().code(), absl::StatusCode::kInvalidArgument);
  // A NUL would cut the name when the file is opened: s1.safetensors would be read for it.
  testing::WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors\u0000x"}})");
  EXPECT_EQ(TensorStore::Open(dir).status().code(), absl::StatusCode::kInvalidArgument);
  testing::WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"b":"s1.safetensors"}})");
  EXPECT_EQ(TensorStore::Open(dir).status().code(), absl::StatusCode::kNotFound);
  // A model.safetensors that cannot be looked at is reported as such, not as missing.
  std::filesystem::create_symlink("model.safetensors", dir + "/model.safetensors");
  const absl::Status loop = TensorStore::Open(dir).status();
  EXPECT_NE(loop.message().find("model.safetensors: cannot stat"), absl::string_view::npos) << loop;
}

TEST(ModelConfig, ParsesLlamaQwenAndScaling) {
  testing::TinyModelSpec spec;
  auto c = ParseModelConfig(testing::TinyConfig(spec).dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_FALSE(c->qkv_bias);
  spec.architecture = "Qwen2ForCausalLM";
  c = ParseModelConfig(testing::TinyConfig(spec).dump());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  auto j = testing::TinyConfig(testing::TinyModelSpec{});
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->rope_scaling.enabled);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  // "rope_type" over the older "type" when a config has both, as Hugging Face reads them.
  j["rope_scaling"]["type"] = "default";
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->rope_scaling.enabled);
  j["rope_scaling"].erase("rope_type");
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope_scaling.enabled);
  // EOS: one id, a list of them (Llama 3's configs), or none.
  j = testing::TinyConfig(testing::TinyModelSpec{});
  j["eos_token_id"] = 7;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>({7}));
  j["eos_token_id"] = {7, 3, 9};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>({7, 3, 9}));
  j["eos_token_id"] = nullptr;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(ModelConfig, BadConfigs) {
  auto with = [](const char* key, nlohmann::json value) {
    auto j = testing::TinyConfig(testing::TinyModelSpec{});
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return ParseModelConfig(j.dump()).status();
  };
  EXPECT_NE(with("architectures", {"GPT2LMHeadModel"}).message().find("unsupported architecture"),
            absl::string_view::npos);
  EXPECT_NE(with("hidden_size", nullptr).message().find("missing 'hidden_size'"), absl::string_view::npos);
  EXPECT_NE(with("num_key_value_heads", 3).message().find("multiple"), absl::string_view::npos);
  EXPECT_NE(with("vocab_size", "many").message().find("not an integer"), absl::string_view::npos);
  EXPECT_NE(with("rope_scaling", {{"type", "yarn"}}).message().find("yarn"), absl::string_view::npos);
  EXPECT_NE(with("sliding_window", 4096).message().find("sliding"), absl::string_view::npos);
  EXPECT_NE(with("num_hidden_layers", -1).message().find("outside"), absl::string_view::npos);
  EXPECT_NE(with("eos_token_id", 100000).message().find("outside"), absl::string_view::npos);
  EXPECT_NE(with("eos_token_id", {1, 100000}).message().find("holds 100000, outside"), absl::string_view::npos);
  EXPECT_NE(with("eos_token_id", {1, "two"}).message().find("not an integer"), absl::string_view::npos);
  EXPECT_NE(with("eos_token_id", std::vector<int>(65, 1)).message().find("at most 64"), absl::string_view::npos);
  {
    auto j = testing::TinyConfig(testing::TinyModelSpec{});
    j.erase("head_dim");
    j["hidden_size"] = 4;
    j["num_attention_heads"] = 8;
    j["num_key_value_heads"] = 8;
    EXPECT_NE(ParseModelConfig(j.dump()).status().message().find("head_dim is 0"), absl::string_view::npos);
  }
  EXPECT_NE(with("rope_theta", 0.5).message().find("'rope_theta' = 0.5 must be greater than 1"), absl::string_view::npos);
  EXPECT_NE(with("rms_norm_eps", 1e-300).message().find("is 0 in float32"), absl::string_view::npos);
  EXPECT_NE(with("rms_norm_eps", 1e300).message().find("not finite"), absl::string_view::npos);
  EXPECT_NE(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 1e-320}, {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}})
                .message()
                .find("outside"),
            absl::string_view::npos);
  // Llama 3's scaling has no defaults: one that would run plain RoPE for a missing factor is refused.
  EXPECT_NE(with("rope_scaling", {{"rope_type", "llama3"}}).message().find("rope_scaling (llama3) lacks 'factor'"),
            absl::string_view::npos);
  EXPECT_NE(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0}})
                .message()
                .find("lacks 'original_max_position_embeddings'"),
            absl::string_view::npos);
  EXPECT_NE(with("eos_token_id", {uint64_t{18446744073709551615u}}).message().find("holds 18446744073709551615,"),
            absl::string_view::npos);
  // An unsigned value past int64 is named as written, not as the negative number it would cast to.
  EXPECT_NE(with("hidden_size", uint64_t{18446744073709551615u}).message().find("= 18446744073709551615 is outside"),
            absl::string_view::npos);
  EXPECT_NE(ParseModelConfig(std::string(1000, '[')).status().message().find("nests deeper"), absl::string_view::npos);
  EXPECT_NE(ParseModelConfig(testing::TinyConfig(testing::TinyModelSpec{}).dump() + std::string(1, '\0') + "{{{")
                .status()
                .message()
                .find("NUL byte"),
            absl::string_view::npos);
  EXPECT_FALSE(ParseModelConfig("{not json").ok());
  EXPECT_FALSE(ParseModelConfig("[]").ok());
}

TEST(Tokenizer, ByteLevelRoundTripAndDeclaredTokenizer) {
  ByteTokenizer t;
  const std::string s = "def f(x):\n    return x\xc3\xa9";
  auto ids = t.Encode(s);
  EXPECT_EQ(ids.front(), 256);
  EXPECT_EQ(ids.size(), s.size() + 1);
  ids.push_back(257);
  EXPECT_EQ(t.Decode(ids), s);

  ModelConfig c;
  c.vocab_size = 258;
  c.tokenizer = "vericache-byte";
  EXPECT_TRUE(MakeTokenizer(c).ok());
  c.bos_token_id = 256;
  c.eos_token_ids = {257};
  EXPECT_TRUE(MakeTokenizer(c).ok());
  c.bos_token_id = 65;  // would be ignored: every prompt starts with 256
  EXPECT_NE(MakeTokenizer(c).status().message().find("bos_token_id 65"), absl::string_view::npos);
  c.bos_token_id = 256;
  c.eos_token_ids = {257, 10};
  EXPECT_NE(MakeTokenizer(c).status().message().find("eos_token_id 10"), absl::string_view::npos);
  c.eos_token_ids = {257};
  auto byte_level = MakeTokenizer(c);
  ASSERT_TRUE(byte_level.ok()) << byte_level.status();
  EXPECT_TRUE((*byte_level)->handles_text());
  EXPECT_TRUE((*byte_level)->IsEos(257));
  EXPECT_FALSE((*byte_level)->IsEos(10));
  // Another tokenizer, or none: token ids alone, with the config's BOS and EOS.
  for (const char* other : {"LlamaTokenizerFast", ""}) {
    c.tokenizer = other;
    c.bos_token_id = 1;
    c.eos_token_ids = {2, 9};
    auto t = MakeTokenizer(c);
    ASSERT_TRUE(t.ok()) << other << ": " << t.status();
    EXPECT_FALSE((*t)->handles_text()) << other;
    EXPECT_EQ((*t)->bos(), 1);
    EXPECT_TRUE((*t)->IsEos(2));
    EXPECT_TRUE((*t)->IsEos(9));
    EXPECT_FALSE((*t)->IsEos(3));
    EXPECT_FALSE((*t)->IsEos(-1));
    EXPECT_TRUE((*t)->Encode("abc").empty());
    EXPECT_EQ((*t)->Decode(std::vector<int32_t>{65, 66}), "");
  }
}

TEST(ModelLoad, GoodAndBadCheckpoints) {
  const std::string dir = testing::TempDir("load");
  testing::TinyModelSpec spec;
  testing::WriteTinyModel(dir, spec);
  ASSERT_TRUE(Model::Load(dir).ok());

  // A kernel thread count that is not one stops the load, named, before the kernels start.
  {
    const char* before = std::getenv("VC_THREADS");
    const std::string saved = before != nullptr ? before : "";
    setenv("VC_THREADS", "99999999", 1);
    auto bad = Model::Load(dir);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("VC_THREADS"), absl::string_view::npos) << bad.status();
    if (before != nullptr) {
      setenv("VC_THREADS", saved.c_str(), 1);
    } else {
      unsetenv("VC_THREADS");
    }
  }

  // A missing tensor.
  auto w = testing::TinyWeights(spec);
  w.erase("model.layers.1.mlp.up_proj.weight");
  testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(w));
  auto m = Model::Load(dir);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.layers.1.mlp.up_proj.weight"), absl::string_view::npos);

  // A tensor of the wrong shape.
  w = testing::TinyWeights(spec);
  w["model.norm.weight"].shape = {16, 2};
  testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(w));
  m = Model::Load(dir);
  EXPECT_NE(m.status().message().find("model.norm.weight"), absl::string_view::npos) << m.status();

  // A weight that is NaN, or infinite: every logit would be NaN.
  for (float bad : {std::nanf(""), INFINITY}) {
    w = testing::TinyWeights(spec);
    w["model.layers.1.self_attn.k_proj.weight"].values[5] = bad;
    testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(w));
    m = Model::Load(dir);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
    EXPECT_NE(m.status().message().find("k_proj.weight' holds a NaN or infinite value (element 5)"),
              absl::string_view::npos)
        << m.status();
  }

  // Finite weights whose products overflow: the forward pass refuses the NaN logits.
  {
    w = testing::TinyWeights(spec);
    for (float& x : w["model.layers.0.mlp.down_proj.weight"].values) x = 3e38f;
    testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(w));
    m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    PagedKvCache cache((*m)->kv_layout(16), 4);
    const SeqId seq = cache.NewSequence();
    const std::vector<int32_t> tokens = {1, 2, 3};
    SequenceChunk chunk{seq, tokens};
    std::vector<float> logits;
    const absl::Status st = (*m)->Forward({&chunk, 1}, cache, LogitsFor::kLastRows, &logits);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find("NaN or infinite logit"), absl::string_view::npos) << st;
  }

  // More layers in the checkpoint than the config names.
  {
    testing::TinyModelSpec more = spec;
    more.layers = spec.layers + 1;
    testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(testing::TinyWeights(more)));
    m = Model::Load(dir);
    EXPECT_NE(m.status().message().find("more layers than num_hidden_layers"), absl::string_view::npos) << m.status();
    // Any tensor of the extra layer gives it away, not only its first norm.
    auto weights = testing::TinyWeights(more);
    const std::string extra = absl::StrCat("model.layers.", spec.layers, ".");
    std::erase_if(weights, [&](const auto& w) {
      return w.first.rfind(extra, 0) == 0 && w.first != extra + "mlp.down_proj.weight";
    });
    testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(weights));
    m = Model::Load(dir);
    EXPECT_NE(m.status().message().find("it holds '" + extra + "mlp.down_proj.weight'"), absl::string_view::npos)
        << m.status();
  }

  // A truncated weights file.
  const std::string good = testing::SafetensorsBytes(testing::TinyWeights(spec));
  testing::WriteFile(dir + "/model.safetensors", good.substr(0, good.size() / 2));
  EXPECT_EQ(Model::Load(dir).status().code(), absl::StatusCode::kDataLoss);

  // A config that is not a regular file: a directory, or a FIFO (which would block a plain open).
  testing::WriteFile(dir + "/model.safetensors", good);
  std::filesystem::rename(dir + "/config.json", dir + "/config.json.good");
  std::filesystem::create_directory(dir + "/config.json");
  EXPECT_NE(Model::Load(dir).status().message().find("not a regular file"), absl::string_view::npos);
  std::filesystem::remove(dir + "/config.json");
  ASSERT_EQ(mkfifo((dir + "/config.json").c_str(), 0600), 0);
  EXPECT_NE(Model::Load(dir).status().message().find("not a regular file"), absl::string_view::npos);
  std::filesystem::remove(dir + "/config.json");
  std::filesystem::rename(dir + "/config.json.good", dir + "/config.json");
  ASSERT_TRUE(Model::Load(dir).ok());
  // The weights as a FIFO.
  std::filesystem::rename(dir + "/model.safetensors", dir + "/model.safetensors.good");
  ASSERT_EQ(mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  EXPECT_NE(Model::Load(dir).status().message().find("not a regular file"), absl::string_view::npos);
  std::filesystem::remove(dir + "/model.safetensors");
  std::filesystem::rename(dir + "/model.safetensors.good", dir + "/model.safetensors");
  ASSERT_TRUE(Model::Load(dir).ok());

  // No weights at all; no config at all.
  std::filesystem::remove(dir + "/model.safetensors");
  EXPECT_EQ(Model::Load(dir).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove(dir + "/config.json");
  EXPECT_EQ(Model::Load(dir).status().code(), absl::StatusCode::kNotFound);
}

// The checkpoint's fingerprint names a worker's blocks in the store, so it must not change from one
// version to the next: the shipped model's is pinned here (SHA-256 over config.json and the
// .safetensors files in name order, each as its name's length, name and bytes). Only regular files
// are read: a FIFO or a link to a device among the weights is refused, not waited on or read
// forever.
TEST(ModelFingerprint, StaysTheSameAndReadsRegularFilesOnly) {
  const auto shipped = ModelFingerprint(std::string(VC_SOURCE_DIR) + "/models/vc-code-4m");
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_EQ(absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(shipped->data()), shipped->size())),
            "83b0cebda87751341d250b1f30e158a372ce443a2960dfd8b9ae47ed6d1213d9");

  const std::string dir = testing::TempDir("fingerprint");
  testing::WriteTinyModel(dir, testing::TinyModelSpec{});
  const auto first = ModelFingerprint(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  // A file the weights do not load from is not part of the model.
  testing::WriteFile(dir + "/extra.safetensors", "anything");
  auto fp = ModelFingerprint(dir);
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(*fp, *first);
  std::filesystem::rename(dir + "/model.safetensors", dir + "/weights.bak");
  ASSERT_EQ(mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  fp = ModelFingerprint(dir);
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kInvalidArgument) << fp.status();
  EXPECT_NE(fp.status().message().find("model.safetensors: not a regular file"), absl::string_view::npos)
      << fp.status();
  std::filesystem::remove(dir + "/model.safetensors");
  std::filesystem::create_symlink("/dev/zero", dir + "/model.safetensors");
  fp = ModelFingerprint(dir);
  EXPECT_NE(fp.status().message().find("not a regular file"), absl::string_view::npos) << fp.status();
  std::filesystem::remove(dir + "/model.safetensors");
  std::filesystem::rename(dir + "/weights.bak", dir + "/model.safetensors");
  fp = ModelFingerprint(dir);
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(*fp, *first);
}

// A sharded checkpoint is identified by its index and the shards it names, whatever their names:
// the same shard files mapped differently load different weights, and must not share KV blocks.
TEST(ModelFingerprint, CoversTheIndexAndTheShardsItNames) {
  const std::string dir = testing::TempDir("fingerprint_sharded");
  testing::WriteFile(dir + "/config.json", testing::TinyConfig(testing::TinyModelSpec{}).dump());
  testing::WriteFile(dir + "/s1.bin", testing::SafetensorsBytes({{"a", RawTensor{DType::kF32, {1}, {7}}},
                                                                 {"b", RawTensor{DType::kF32, {1}, {8}}}}));
  testing::WriteFile(dir + "/s2.bin", testing::SafetensorsBytes({{"a", RawTensor{DType::kF32, {1}, {9}}},
                                                                 {"b", RawTensor{DType::kF32, {1}, {6}}}}));
  testing::WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.bin","b":"s2.bin"}})");
  EXPECT_EQ(*CheckpointFiles(dir), (std::vector<std::string>{"model.safetensors.index.json", "s1.bin", "s2.bin"}));
  const auto first = ModelFingerprint(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  testing::WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s2.bin","b":"s1.bin"}})");
  const auto swapped = ModelFingerprint(dir);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_NE(*swapped, *first);
  // A shard's bytes count too.
  testing::WriteFile(dir + "/s1.bin", testing::SafetensorsBytes({{"a", RawTensor{DType::kF32, {1}, {5}}},
                                                                 {"b", RawTensor{DType::kF32, {1}, {8}}}}));
  const auto changed = ModelFingerprint(dir);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(*changed, *swapped);
}

TEST(Files, ReadFileLimitedTakesOnlySmallRegularFiles) {
  const std::string dir = testing::TempDir("files");
  testing::WriteFile(dir + "/a", "12345");
  EXPECT_EQ(*ReadFileLimited(dir + "/a", 5, "test file"), "12345");
  auto big = ReadFileLimited(dir + "/a", 4, "test file");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("more than the 4"), absl::string_view::npos) << big.status();
  EXPECT_EQ(ReadFileLimited(dir + "/none", 5, "test file").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadFileLimited(dir, 5, "test file").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckJsonText(R"({"a":[[1]],"b":"[[[[["})", 3).ok());  // brackets in strings do not count
  EXPECT_FALSE(CheckJsonText(R"({"a":[[[1]]]})", 3).ok());
  // The parser would stop at a NUL and take the text before it for the whole.
  const absl::Status nul = CheckJsonText(std::string("{}\0{{{ not json", 14), 3);
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nul.message().find("NUL byte at offset 2"), absl::string_view::npos) << nul;
}

TEST(TextChecks, Addresses) {
  for (const char* ok : {"127.0.0.1:7070", "store-0.store:7070", "[::1]:8080", "unix:/tmp/s", "dns:///store:7070"}) {
    EXPECT_TRUE(CheckAddress("--store", ok, false).ok()) << ok;
  }
  for (const char* bad : {"", "bogus", "127.0.0.1", ":7070", "127.0.0.1:0", "[::1]"}) {
    const absl::Status st = CheckAddress("--store", bad, false);
    EXPECT_NE(st.message().find("give host:port"), absl::string_view::npos) << bad << ": " << st;
  }
  // gRPC would dial port 89999 - 65536 = 24463.
  EXPECT_NE(CheckAddress("--store", "127.0.0.1:89999", false).message().find("port past 65535"), absl::string_view::npos);
  // To listen: port 0 is any free port; a unix socket needs its path.
  EXPECT_TRUE(CheckAddress("listen address", "127.0.0.1:0", true).ok());
  EXPECT_TRUE(CheckAddress("listen address", "unix:/tmp/w.sock", true).ok());
  EXPECT_NE(CheckAddress("listen address", "unix:", true).message().find("names no socket path"), absl::string_view::npos);
  EXPECT_NE(CheckAddress("listen address", "0.0.0.0:70000", true).message().find("port past 65535"),
            absl::string_view::npos);
}

TEST(TextChecks, TokensAndUtf8) {
  EXPECT_TRUE(CheckBearerToken("store-secret-token", "t").ok());
  for (const char* bad : {"", "a b", "tok\x01en", "a\nb", "caf\xc3\xa9"}) EXPECT_FALSE(CheckBearerToken(bad, "t").ok()) << bad;
  EXPECT_TRUE(IsUtf8("def f():\n    return 'caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80'"));
  for (const char* bad : {"\xff", "\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "ab\xe2\x82"}) {
    EXPECT_FALSE(IsUtf8(bad)) << bad;
  }
}

}  // namespace
}  // namespace vc
