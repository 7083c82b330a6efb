// Writes the seed inputs of the fuzz targets into DIR/<target>/ (tests/fuzz/corpus is its output):
// valid inputs of each kind, from which libFuzzer mutates. Run by hand when a format changes:
//   build/tests/fuzz/make_fuzz_seeds tests/fuzz/corpus
#include <array>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cachestore/block_format.h"
#include "tests/testing/blocks.h"
#include "tests/testing/tiny_model.h"

namespace {

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  vc::testing::WriteFile((dir / name).string(), bytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds DIR\n";
    return 2;
  }
  const std::filesystem::path out(argv[1]);
  // Blocks: float32 (the test blocks'), and bf16 of the same shape.
  Write(out / "block_format", "f32", vc::testing::RandomBlock(1, 7));
  vc::cachestore::BlockLayout bf16;
  bf16.num_layers = 2;
  bf16.num_kv_heads = 2;
  bf16.head_dim = 8;
  bf16.tokens = 16;
  bf16.encoding = vc::cachestore::BlockEncoding::kBFloat16;
  const std::string layer(bf16.layer_bytes(), '\x3f');
  std::array<uint8_t, 32> fingerprint{};
  fingerprint[0] = 9;
  auto block = vc::cachestore::EncodeBlock(fingerprint, bf16, {layer, layer});
  if (!block.ok()) {
    std::cerr << block.status() << "\n";
    return 1;
  }
  Write(out / "block_format", "bf16", *block);
  // Compressor specs.
  const std::vector<std::string> specs = {
      "none", "kivi:bits=2,group=16,residual=16", "kivi:bits=4,group=8,residual=8",
      "snapkv:capacity=48,window=16+kivi:bits=4,group=8,residual=8", "h2o:heavy=32,recent=16,rollback=8",
      "h2o:heavy_ratio=0.1,recent_ratio=0.1,rollback=32", "quest:page=16,budget=64"};
  for (size_t i = 0; i < specs.size(); ++i) Write(out / "compressor_spec", std::to_string(i), specs[i]);
  // A checkpoint: config.json and model.safetensors of the smallest test model.
  vc::testing::TinyModelSpec spec;
  spec.hidden = 16;
  spec.intermediate = 24;
  spec.layers = 1;
  spec.vocab = 32;
  Write(out / "model_config", "llama", vc::testing::TinyConfig(spec).dump(2));
  spec.architecture = "Qwen2ForCausalLM";
  spec.attention_bias = true;
  Write(out / "model_config", "qwen2", vc::testing::TinyConfig(spec).dump(2));
  Write(out / "safetensors", "tiny", vc::testing::SafetensorsBytes(vc::testing::TinyWeights(spec)));
  // A byte-level BPE tokenizer.json with a merge, an added special token and a template, then a NUL
  // and its tokenizer_config.json.
  Write(out / "hf_tokenizer", "byte_level_bpe",
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "<s>": 4},
  "merges": ["a b"], "byte_fallback": false},
 "added_tokens": [{"id": 4, "content": "<s>", "special": true}],
 "normalizer": null,
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [4], "tokens": ["<s>"]}}},
 "decoder": {"type": "ByteLevel"}})") +
            std::string(1, '\0') + R"({"bos_token": "<s>", "eos_token": "<s>"})");
  std::cout << "seeds written to " << out << "\n";
  return 0;
}
