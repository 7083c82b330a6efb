#include "worker/runtime/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/runtime/unicode.h"

namespace vc {
namespace {

using json = nlohmann::json;

// tokenizer.json files run to tens of megabytes (Gemma 3's is 33 MB).
constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{512} << 20;
constexpr uint64_t kMaxConfigJsonBytes = uint64_t{64} << 20;
// Pieces shorter than this are remembered within one Encode (words repeat).
constexpr size_t kMaxCachedPieceBytes = 256;

absl::Status Bad(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

// obj[key] when obj is an object holding a non-null value there; null otherwise.
const json* Field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::string> StrField(const json& obj, const char* key, absl::string_view where) {
  const json* v = Field(obj, key);
  if (v == nullptr) return Bad(absl::StrCat(where, ".", key), "missing");
  if (!v->is_string()) return Bad(absl::StrCat(where, ".", key), "not a string");
  return v->get<std::string>();
}

absl::StatusOr<bool> BoolField(const json& obj, const char* key, bool otherwise, absl::string_view where) {
  const json* v = Field(obj, key);
  if (v == nullptr) return otherwise;
  if (!v->is_boolean()) return Bad(absl::StrCat(where, ".", key), "not true or false");
  return v->get<bool>();
}

absl::StatusOr<std::string> TypeOf(const json& obj, absl::string_view where) {
  if (!obj.is_object()) return Bad(where, "not an object");
  return StrField(obj, "type", where);
}

absl::Status Unsupported(absl::string_view where, absl::string_view type, absl::string_view supported) {
  return Bad(absl::StrCat(where, ".type"), absl::StrCat("'", type, "' is not supported (supported: ", supported, ")"));
}

// The length of the UTF-8 character starting with byte `c` (text is valid UTF-8 here).
size_t CharLength(uint8_t c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// Decodes the character at s[*i] (valid UTF-8) and moves past it.
uint32_t NextCodePoint(absl::string_view s, size_t* i) {
  const uint8_t c = static_cast<uint8_t>(s[*i]);
  const size_t n = CharLength(c);
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[*i + k]) & 0x3F);
  *i += n;
  return cp;
}

// GPT-2's byte-level alphabet: each byte as a printable character (bytes_to_unicode).
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  absl::flat_hash_map<uint32_t, uint8_t> byte_of;  // code point -> byte
  ByteAlphabet() {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? b : 256 + extra++;
      AppendUtf8(cp, &of_byte[b]);
      byte_of[cp] = static_cast<uint8_t>(b);
    }
  }
  // The bytes a token's characters stand for; false when one is not in the alphabet.
  bool ToBytes(absl::string_view token, std::string* out) const {
    out->clear();
    for (size_t i = 0; i < token.size();) {
      auto it = byte_of.find(NextCodePoint(token, &i));
      if (it == byte_of.end()) return false;
      out->push_back(static_cast<char>(it->second));
    }
    return true;
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* const a = new ByteAlphabet();
  return *a;
}

// JavaScript's String.prototype.trim whitespace (that of \s), for added tokens' lstrip and rstrip.
bool IsJsSpace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// Text with spans: what the pre-tokenizers cut and the model encodes.
struct Pieces {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) into text, non-empty
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class Prepend { kAlways, kFirst, kNever };

struct NormalizerStep {
  enum Kind { kUnicode, kReplace, kPrepend } kind;
  NormalForm form = NormalForm::kNfc;
  std::string literal;                   // kReplace's pattern (when not a regex)
  std::unique_ptr<UnicodeRegex> regex;   // kReplace's pattern
  std::string content;                   // kReplace's replacement, kPrepend's prefix
};

struct PreTokenizerStep {
  enum Kind { kSplit, kMetaspace, kByteLevel } kind;
  std::string literal;                  // kSplit: a string pattern, or
  std::unique_ptr<UnicodeRegex> regex;  // kSplit: a regex (kByteLevel: GPT-2's, with use_regex)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::string replacement;  // kMetaspace
  Prepend prepend = Prepend::kAlways;
  bool split = true;              // kMetaspace
  bool add_prefix_space = false;  // kByteLevel
};

struct DecoderStep {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string pattern, content;  // kReplace; kMetaspace's replacement is `pattern`; kStrip's char is `content`
  bool strip_first_space = true;  // kMetaspace
  int start = 0, stop = 0;        // kStrip
};

struct TemplateItem {
  bool sequence = false;      // the text's ids
  std::vector<int32_t> ids;   // otherwise, these
};

struct BpeMerge {
  uint32_t rank;
  int32_t id;  // of the merged token
};

uint64_t PairKey(int32_t a, int32_t b) { return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b); }

}  // namespace

struct HfTokenizer::Impl {
  // The model: pieces (raw bytes for a byte-level tokenizer, text otherwise) -> id.
  absl::flat_hash_map<std::string, int32_t> vocab;
  absl::flat_hash_map<uint64_t, BpeMerge> merges;
  std::vector<std::string> token_text;  // id -> the token as tokenizer.json spells it
  std::vector<bool> special;            // id -> dropped by Decode
  bool byte_level = false;              // BPE runs over bytes (a ByteLevel pre-tokenizer)
  std::array<int32_t, 256> byte_symbol{};    // byte-level: each byte's own token
  std::array<int32_t, 256> fallback_byte{};  // byte fallback: <0xXX> tokens (-1: none)
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  int32_t unk = -1;

  // Added tokens: a byte trie over their contents.
  struct TrieNode {
    absl::flat_hash_map<uint8_t, int32_t> next;
    int32_t id = -1;
  };
  std::vector<TrieNode> trie{TrieNode{}};
  std::array<bool, 256> added_first{};  // bytes an added token can begin with
  absl::flat_hash_map<int32_t, std::pair<bool, bool>> added_strip;  // id -> lstrip, rstrip

  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  std::vector<TemplateItem> single_template;  // empty: the text's ids alone
  std::vector<DecoderStep> decoders;

  int32_t bos = -1;
  std::vector<int32_t> eos;
  int32_t id_limit = 0;

  // --- encoding
  void SplitAdded(absl::string_view text, std::vector<std::pair<absl::string_view, int32_t>>* out) const;
  absl::StatusOr<std::string> Normalize(std::string text) const;
  void PreTokenize(std::string text, bool first_section, Pieces* out) const;
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const;
  void Merge(std::vector<int32_t>* symbols) const;
  // --- decoding
  std::string DecodeBytes(absl::Span<const int32_t> ids) const;
};

namespace {

// Splits [begin, end) of `p.text` at the matches of `step`'s pattern, by its behavior.
void SplitSpan(const PreTokenizerStep& step, const std::string& text, size_t begin, size_t end,
               std::vector<std::pair<size_t, size_t>>* out) {
  struct Part {
    size_t b, e;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = begin;
  const auto on_match = [&](size_t mb, size_t me) {
    mb += begin;
    me += begin;
    if (prev < mb) parts.push_back({prev, mb, false});
    parts.push_back({mb, me, true});
    prev = me;
  };
  const absl::string_view s(text.data() + begin, end - begin);
  if (step.regex != nullptr) {
    step.regex->ForEachMatch(s, on_match);
  } else if (!step.literal.empty()) {
    for (size_t at = s.find(step.literal); at != absl::string_view::npos; at = s.find(step.literal, at)) {
      on_match(at, at + step.literal.size());
      at += step.literal.size();
    }
  }
  if (prev < end) parts.push_back({prev, end, false});
  if (step.invert) {
    for (Part& p : parts) p.match = !p.match;
  }
  std::vector<Part> kept;
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.match) kept.push_back(p);
      }
      break;
    case SplitBehavior::kIsolated:
      kept = parts;
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.match && !previous_match && !kept.empty()) {
          kept.back().e = p.e;
        } else {
          kept.push_back(p);
        }
        previous_match = p.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !kept.empty()) {
          kept.back().b = it->b;
        } else {
          kept.push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0 && parts[i].match == previous_match) {
          kept.back().e = parts[i].e;
        } else {
          kept.push_back(parts[i]);
        }
        previous_match = parts[i].match;
      }
      break;
    }
  }
  for (const Part& p : kept) {
    if (p.e > p.b) out->emplace_back(p.b, p.e);
  }
}

}  // namespace

void HfTokenizer::Impl::SplitAdded(absl::string_view text,
                                   std::vector<std::pair<absl::string_view, int32_t>>* out) const {
  size_t plain = 0;  // start of the text not yet given out
  for (size_t i = 0; i < text.size();) {
    if (!added_first[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = trie[node].next.find(static_cast<uint8_t>(text[j]));
      if (it == trie[node].next.end()) break;
      node = it->second;
      if (trie[node].id >= 0) {
        found = trie[node].id;
        found_end = j + 1;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    if (plain < i) out->emplace_back(text.substr(plain, i - plain), -1);
    out->emplace_back(text.substr(i, found_end - i), found);
    i = plain = found_end;
  }
  if (plain < text.size()) out->emplace_back(text.substr(plain), -1);
}

absl::StatusOr<std::string> HfTokenizer::Impl::Normalize(std::string text) const {
  for (const NormalizerStep& n : normalizers) {
    switch (n.kind) {
      case NormalizerStep::kUnicode: {
        VC_ASSIGN_OR_RETURN(text, NormalizeUnicode(text, n.form));
        break;
      }
      case NormalizerStep::kPrepend:
        text = n.content + text;
        break;
      case NormalizerStep::kReplace: {
        std::string out;
        size_t prev = 0;
        const auto on_match = [&](size_t b, size_t e) {
          out.append(text, prev, b - prev);
          out += n.content;
          prev = e;
        };
        if (n.regex != nullptr) {
          n.regex->ForEachMatch(text, on_match);
        } else if (!n.literal.empty()) {
          for (size_t at = text.find(n.literal); at != std::string::npos; at = text.find(n.literal, at)) {
            on_match(at, at + n.literal.size());
            at += n.literal.size();
          }
        }
        if (prev == 0) break;  // nothing replaced
        out.append(text, prev, std::string::npos);
        text = std::move(out);
        break;
      }
    }
  }
  return text;
}

void HfTokenizer::Impl::PreTokenize(std::string text, bool first_section, Pieces* out) const {
  out->text = std::move(text);
  out->spans.clear();
  if (!out->text.empty()) out->spans.emplace_back(0, out->text.size());
  std::vector<std::pair<size_t, size_t>> next;
  for (const PreTokenizerStep& step : pre_tokenizers) {
    next.clear();
    switch (step.kind) {
      case PreTokenizerStep::kSplit:
        for (const auto& [b, e] : out->spans) SplitSpan(step, out->text, b, e, &next);
        break;
      case PreTokenizerStep::kByteLevel:
        if (!step.add_prefix_space) {
          // Only the regex's split, if any: the bytes are mapped to symbols by EncodePiece.
          if (step.regex == nullptr) continue;
          for (const auto& [b, e] : out->spans) SplitSpan(step, out->text, b, e, &next);
          break;
        }
        [[fallthrough]];
      case PreTokenizerStep::kMetaspace: {
        // Both rewrite each piece (spaces as the replacement, a prefix added), then maybe split.
        std::string rewritten;
        std::vector<std::pair<size_t, size_t>> spans;
        for (size_t k = 0; k < out->spans.size(); ++k) {
          const absl::string_view s(out->text.data() + out->spans[k].first, out->spans[k].second - out->spans[k].first);
          const size_t b = rewritten.size();
          if (step.kind == PreTokenizerStep::kByteLevel) {
            if (step.add_prefix_space && s.front() != ' ') rewritten.push_back(' ');
            rewritten.append(s.data(), s.size());
          } else {
            // The prefix goes on every piece (always) or on the input's first (first).
            const bool prepend = step.prepend == Prepend::kAlways ||
                                 (step.prepend == Prepend::kFirst && first_section && k == 0 &&
                                  out->spans[k].first == 0);
            std::string piece;
            for (size_t i = 0; i < s.size(); ++i) {
              if (s[i] == ' ') {
                piece += step.replacement;
              } else {
                piece.push_back(s[i]);
              }
            }
            if (prepend && piece.compare(0, step.replacement.size(), step.replacement) != 0) rewritten += step.replacement;
            rewritten += piece;
          }
          spans.emplace_back(b, rewritten.size());
        }
        out->text = std::move(rewritten);
        if (step.regex != nullptr || (step.kind == PreTokenizerStep::kMetaspace && step.split)) {
          for (const auto& [b, e] : spans) SplitSpan(step, out->text, b, e, &next);
        } else {
          next = std::move(spans);
        }
        break;
      }
    }
    std::swap(out->spans, next);
  }
}

void HfTokenizer::Impl::Merge(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& id = *symbols;
  const int32_t n = static_cast<int32_t>(id.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // The pending merges, lowest rank first and, of equal ranks, leftmost first: the reference's order.
  struct Candidate {
    uint32_t rank;
    int32_t left, right;
    int32_t left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Candidate> heap;
  const auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    auto it = merges.find(PairKey(id[l], id[r]));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, l, r, id[l], id[r], it->second.id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate c = heap.back();
    heap.pop_back();
    // Stale when either side has merged since.
    if (id[c.left] != c.left_id || next[c.left] != c.right || id[c.right] != c.right_id) continue;
    id[c.left] = c.merged;
    id[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  int32_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) id[w++] = id[i];
  id.resize(w);
}

void HfTokenizer::Impl::EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    auto it = vocab.find(piece);
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  const auto push_unk = [&] {
    if (unk < 0) return;  // nothing to stand for it: the reference fails here
    if (fuse_unk && !symbols.empty() && symbols.back() == unk) return;
    symbols.push_back(unk);
  };
  if (byte_level) {
    for (char c : piece) {
      const int32_t s = byte_symbol[static_cast<uint8_t>(c)];
      if (s >= 0) {
        symbols.push_back(s);
      } else {
        push_unk();
      }
    }
  } else {
    for (size_t i = 0; i < piece.size();) {
      const size_t len = std::min(CharLength(static_cast<uint8_t>(piece[i])), piece.size() - i);
      const absl::string_view ch = piece.substr(i, len);
      i += len;
      auto it = vocab.find(ch);
      if (it != vocab.end()) {
        symbols.push_back(it->second);
        continue;
      }
      bool all = byte_fallback;
      for (size_t k = 0; all && k < ch.size(); ++k) all = fallback_byte[static_cast<uint8_t>(ch[k])] >= 0;
      if (all) {
        for (char c : ch) symbols.push_back(fallback_byte[static_cast<uint8_t>(c)]);
      } else {
        push_unk();
      }
    }
  }
  Merge(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

std::string HfTokenizer::Impl::DecodeBytes(absl::Span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(token_text.size()) || special[id]) continue;
    tokens.push_back(token_text[id]);
  }
  std::string scratch;
  for (const DecoderStep& d : decoders) {
    switch (d.kind) {
      case DecoderStep::kByteLevel: {
        std::string all;
        for (const std::string& t : tokens) {
          // A token outside the alphabet (an added one) stands for itself.
          all += Alphabet().ToBytes(t, &scratch) ? scratch : t;
        }
        tokens.assign(1, std::move(all));
        break;
      }
      case DecoderStep::kReplace:
      case DecoderStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string& t = tokens[i];
          const std::string& from = d.pattern;
          const std::string to = d.kind == DecoderStep::kReplace ? d.content : " ";
          if (!from.empty() && t.find(from) != std::string::npos) {
            std::string out;
            size_t prev = 0;
            for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, prev)) {
              out.append(t, prev, at - prev);
              out += to;
              prev = at + from.size();
            }
            out.append(t, prev, std::string::npos);
            t = std::move(out);
          }
          if (d.kind == DecoderStep::kMetaspace && d.strip_first_space && i == 0 && !t.empty() && t[0] == ' ') {
            t.erase(0, 1);
          }
        }
        break;
      case DecoderStep::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        bool in_bytes = false;
        for (std::string& t : tokens) {
          int byte = -1;
          if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>') {
            const auto hex = [](char c) {
              return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            };
            const int hi = hex(t[3]), lo = hex(t[4]);
            if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
          }
          if (byte >= 0) {
            bytes.push_back(static_cast<char>(byte));
            in_bytes = true;
            continue;
          }
          if (in_bytes) {
            out.push_back(std::move(bytes));
            bytes.clear();
            in_bytes = false;
          }
          out.push_back(std::move(t));
        }
        if (in_bytes) out.push_back(std::move(bytes));
        tokens = std::move(out);
        break;
      }
      case DecoderStep::kFuse:
        tokens.assign(1, absl::StrJoin(tokens, ""));
        break;
      case DecoderStep::kStrip:
        for (std::string& t : tokens) {
          const std::string& c = d.content;
          size_t b = 0, e = t.size();
          for (int k = 0; k < d.start && !c.empty() && b + c.size() <= e && t.compare(b, c.size(), c) == 0; ++k) {
            b += c.size();
          }
          for (int k = 0; k < d.stop && !c.empty() && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0;
               ++k) {
            e -= c.size();
          }
          t = t.substr(b, e - b);
        }
        break;
    }
  }
  return absl::StrJoin(tokens, "");
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

std::vector<int32_t> HfTokenizer::Encode(absl::string_view raw, bool add_special_tokens) const {
  const Impl& m = *impl_;
  const std::string valid = ToValidUtf8(raw);
  std::vector<std::pair<absl::string_view, int32_t>> sections;
  m.SplitAdded(valid, &sections);
  // Added tokens that strip spaces beside them (lstrip, rstrip) take them from their neighbours.
  if (!m.added_strip.empty()) {
    for (size_t i = 0; i < sections.size(); ++i) {
      auto it = sections[i].second >= 0 ? m.added_strip.find(sections[i].second) : m.added_strip.end();
      if (it == m.added_strip.end()) continue;
      if (it->second.first && i > 0 && sections[i - 1].second < 0) {
        absl::string_view& s = sections[i - 1].first;
        while (!s.empty()) {
          size_t k = s.size() - 1;
          while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
          size_t j = k;
          if (!IsJsSpace(NextCodePoint(s, &j))) break;
          s.remove_suffix(s.size() - k);
        }
      }
      if (it->second.second && i + 1 < sections.size() && sections[i + 1].second < 0) {
        absl::string_view& s = sections[i + 1].first;
        while (!s.empty()) {
          size_t j = 0;
          if (!IsJsSpace(NextCodePoint(s, &j))) break;
          s.remove_prefix(j);
        }
      }
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(valid.size() / 3 + 4);
  Pieces pieces;
  // Pieces encoded in this call: [start, length) in `cached_ids`.
  absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> cache;
  for (size_t si = 0; si < sections.size(); ++si) {
    const auto& [text, added] = sections[si];
    if (added >= 0) {
      ids.push_back(added);
      continue;
    }
    if (text.empty()) continue;
    absl::StatusOr<std::string> normalized = m.Normalize(std::string(text));
    if (!normalized.ok() || normalized->empty()) continue;  // valid UTF-8 normalizes
    m.PreTokenize(*std::move(normalized), si == 0, &pieces);
    for (const auto& [b, e] : pieces.spans) {
      const absl::string_view piece(pieces.text.data() + b, e - b);
      if (piece.size() >= kMaxCachedPieceBytes) {
        m.EncodePiece(piece, &ids);
        continue;
      }
      auto it = cache.find(piece);
      if (it != cache.end()) {
        // Copied through a temporary: the source is in `ids` itself.
        const size_t at = ids.size();
        ids.resize(at + it->second.second);
        std::copy_n(ids.begin() + it->second.first, it->second.second, ids.begin() + at);
        continue;
      }
      const size_t at = ids.size();
      m.EncodePiece(piece, &ids);
      cache.emplace(piece, std::make_pair(static_cast<uint32_t>(at), static_cast<uint32_t>(ids.size() - at)));
    }
  }
  if (!add_special_tokens || m.single_template.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + 4);
  for (const TemplateItem& t : m.single_template) {
    if (t.sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), t.ids.begin(), t.ids.end());
    }
  }
  return out;
}

std::string HfTokenizer::DecodeBytes(absl::Span<const int32_t> ids) const { return impl_->DecodeBytes(ids); }
std::string HfTokenizer::Decode(absl::Span<const int32_t> ids) const { return ToValidUtf8(impl_->DecodeBytes(ids)); }
int32_t HfTokenizer::bos() const { return impl_->bos; }
bool HfTokenizer::IsEos(int32_t id) const { return std::find(impl_->eos.begin(), impl_->eos.end(), id) != impl_->eos.end(); }
int32_t HfTokenizer::id_limit() const { return impl_->id_limit; }
std::string HfTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(impl_->token_text.size())) return "";
  return impl_->token_text[id];
}

// --- Parsing tokenizer.json ------------------------------------------------------------------------

namespace {

using Impl = HfTokenizer::Impl;

// A Replace or Split pattern: {"String": s} or {"Regex": r}.
absl::Status ParsePattern(const json& obj, absl::string_view where, std::string* literal,
                          std::unique_ptr<UnicodeRegex>* regex) {
  const json* p = Field(obj, "pattern");
  if (p == nullptr || !p->is_object()) return Bad(absl::StrCat(where, ".pattern"), "missing or not an object");
  if (const json* s = Field(*p, "String"); s != nullptr && s->is_string()) {
    *literal = s->get<std::string>();
    return absl::OkStatus();
  }
  if (const json* r = Field(*p, "Regex"); r != nullptr && r->is_string()) {
    absl::StatusOr<std::unique_ptr<UnicodeRegex>> re = UnicodeRegex::Compile(r->get<std::string>());
    if (!re.ok()) return Bad(absl::StrCat(where, ".pattern.Regex"), re.status().message());
    *regex = *std::move(re);
    return absl::OkStatus();
  }
  return Bad(absl::StrCat(where, ".pattern"), "holds neither a String nor a Regex");
}

absl::Status ParseNormalizer(const json& n, const std::string& where, Impl* m) {
  VC_ASSIGN_OR_RETURN(const std::string type, TypeOf(n, where));
  if (type == "Sequence") {
    const json* list = Field(n, "normalizers");
    if (list == nullptr || !list->is_array()) return Bad(absl::StrCat(where, ".normalizers"), "not a list");
    for (size_t i = 0; i < list->size(); ++i) {
      VC_RETURN_IF_ERROR(ParseNormalizer((*list)[i], absl::StrCat(where, ".normalizers[", i, "]"), m));
    }
    return absl::OkStatus();
  }
  NormalizerStep step;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = NormalizerStep::kUnicode;
    step.form = type == "NFC" ? NormalForm::kNfc : type == "NFD" ? NormalForm::kNfd
              : type == "NFKC" ? NormalForm::kNfkc : NormalForm::kNfkd;
  } else if (type == "Replace") {
    step.kind = NormalizerStep::kReplace;
    VC_RETURN_IF_ERROR(ParsePattern(n, where, &step.literal, &step.regex));
    VC_ASSIGN_OR_RETURN(step.content, StrField(n, "content", where));
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::kPrepend;
    VC_ASSIGN_OR_RETURN(step.content, StrField(n, "prepend", where));
  } else {
    return Unsupported(where, type, "NFC, NFD, NFKC, NFKD, Replace, Prepend, Sequence");
  }
  m->normalizers.push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<Prepend> ParsePrepend(const json& obj, const std::string& where) {
  VC_ASSIGN_OR_RETURN(const bool add_prefix_space, BoolField(obj, "add_prefix_space", true, where));
  const json* scheme = Field(obj, "prepend_scheme");
  if (scheme == nullptr) return add_prefix_space ? Prepend::kAlways : Prepend::kNever;
  const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
  if (s == "always") return Prepend::kAlways;
  if (s == "first") return Prepend::kFirst;
  if (s == "never") return Prepend::kNever;
  return Bad(absl::StrCat(where, ".prepend_scheme"), "not always, first or never");
}

absl::Status ParsePreTokenizer(const json& p, const std::string& where, Impl* m) {
  VC_ASSIGN_OR_RETURN(const std::string type, TypeOf(p, where));
  if (type == "Sequence") {
    const json* list = Field(p, "pretokenizers");
    if (list == nullptr || !list->is_array()) return Bad(absl::StrCat(where, ".pretokenizers"), "not a list");
    for (size_t i = 0; i < list->size(); ++i) {
      VC_RETURN_IF_ERROR(ParsePreTokenizer((*list)[i], absl::StrCat(where, ".pretokenizers[", i, "]"), m));
    }
    return absl::OkStatus();
  }
  if (m->byte_level) return Bad(where, "comes after a ByteLevel pre-tokenizer, which must be the last");
  PreTokenizerStep step;
  if (type == "Split") {
    step.kind = PreTokenizerStep::kSplit;
    VC_RETURN_IF_ERROR(ParsePattern(p, where, &step.literal, &step.regex));
    VC_ASSIGN_OR_RETURN(const std::string behavior, StrField(p, "behavior", where));
    static const auto* const kBehaviors = new absl::flat_hash_map<std::string, SplitBehavior>{
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    auto it = kBehaviors->find(behavior);
    if (it == kBehaviors->end()) return Bad(absl::StrCat(where, ".behavior"), absl::StrCat("'", behavior, "' is not known"));
    step.behavior = it->second;
    VC_ASSIGN_OR_RETURN(step.invert, BoolField(p, "invert", false, where));
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::kMetaspace;
    VC_ASSIGN_OR_RETURN(step.replacement, StrField(p, "replacement", where));
    if (step.replacement.empty()) return Bad(absl::StrCat(where, ".replacement"), "empty");
    VC_ASSIGN_OR_RETURN(step.prepend, ParsePrepend(p, where));
    VC_ASSIGN_OR_RETURN(step.split, BoolField(p, "split", true, where));
    step.literal = step.replacement;
    step.behavior = SplitBehavior::kMergedWithNext;
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::kByteLevel;
    VC_ASSIGN_OR_RETURN(step.add_prefix_space, BoolField(p, "add_prefix_space", true, where));
    VC_ASSIGN_OR_RETURN(const bool use_regex, BoolField(p, "use_regex", true, where));
    if (use_regex) {
      absl::StatusOr<std::unique_ptr<UnicodeRegex>> re =
          UnicodeRegex::Compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
      if (!re.ok()) return re.status();
      step.regex = *std::move(re);
    }
    m->byte_level = true;
  } else {
    return Unsupported(where, type, "Split, ByteLevel, Metaspace, Sequence");
  }
  m->pre_tokenizers.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const json& d, const std::string& where, Impl* m) {
  VC_ASSIGN_OR_RETURN(const std::string type, TypeOf(d, where));
  if (type == "Sequence") {
    const json* list = Field(d, "decoders");
    if (list == nullptr || !list->is_array()) return Bad(absl::StrCat(where, ".decoders"), "not a list");
    for (size_t i = 0; i < list->size(); ++i) {
      VC_RETURN_IF_ERROR(ParseDecoder((*list)[i], absl::StrCat(where, ".decoders[", i, "]"), m));
    }
    return absl::OkStatus();
  }
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderStep::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (type == "Replace") {
    step.kind = DecoderStep::kReplace;
    std::unique_ptr<UnicodeRegex> regex;
    VC_RETURN_IF_ERROR(ParsePattern(d, where, &step.pattern, &regex));
    if (regex != nullptr) return Bad(absl::StrCat(where, ".pattern"), "a Regex pattern in a decoder is not supported");
    VC_ASSIGN_OR_RETURN(step.content, StrField(d, "content", where));
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::kMetaspace;
    VC_ASSIGN_OR_RETURN(step.pattern, StrField(d, "replacement", where));
    VC_ASSIGN_OR_RETURN(const Prepend prepend, ParsePrepend(d, where));
    step.strip_first_space = prepend != Prepend::kNever;
  } else if (type == "Strip") {
    step.kind = DecoderStep::kStrip;
    VC_ASSIGN_OR_RETURN(step.content, StrField(d, "content", where));
    const json* start = Field(d, "start");
    const json* stop = Field(d, "stop");
    if (start == nullptr || !start->is_number_unsigned() || stop == nullptr || !stop->is_number_unsigned()) {
      return Bad(where, "start and stop must be counts");
    }
    step.start = static_cast<int>(std::min<uint64_t>(start->get<uint64_t>(), 1 << 20));
    step.stop = static_cast<int>(std::min<uint64_t>(stop->get<uint64_t>(), 1 << 20));
  } else {
    return Unsupported(where, type, "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
  }
  m->decoders.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const json& p, const std::string& where, Impl* m) {
  VC_ASSIGN_OR_RETURN(const std::string type, TypeOf(p, where));
  if (type == "Sequence") {
    const json* list = Field(p, "processors");
    if (list == nullptr || !list->is_array()) return Bad(absl::StrCat(where, ".processors"), "not a list");
    for (size_t i = 0; i < list->size(); ++i) {
      VC_RETURN_IF_ERROR(ParsePostProcessor((*list)[i], absl::StrCat(where, ".processors[", i, "]"), m));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // cls and sep are [token, id].
    const json* cls = Field(p, "cls");
    const json* sep = Field(p, "sep");
    const auto id_of = [](const json* pair) -> int64_t {
      return pair != nullptr && pair->is_array() && pair->size() == 2 && (*pair)[1].is_number_integer()
                 ? (*pair)[1].get<int64_t>() : -1;
    };
    if (id_of(cls) < 0 || id_of(sep) < 0) return Bad(where, "cls and sep must be [token, id]");
    m->single_template = {{false, {static_cast<int32_t>(id_of(cls))}}, {true, {}},
                          {false, {static_cast<int32_t>(id_of(sep))}}};
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return Unsupported(where, type, "TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence");
  }
  const json* single = Field(p, "single");
  if (single == nullptr || !single->is_array()) return Bad(absl::StrCat(where, ".single"), "not a list");
  const json* specials = Field(p, "special_tokens");
  std::vector<TemplateItem> items;
  for (size_t i = 0; i < single->size(); ++i) {
    const std::string at = absl::StrCat(where, ".single[", i, "]");
    const json& item = (*single)[i];
    if (const json* seq = Field(item, "Sequence"); seq != nullptr) {
      VC_ASSIGN_OR_RETURN(const std::string id, StrField(*seq, "id", at + ".Sequence"));
      if (id != "A") return Bad(at, "a single-text template may only hold sequence A");
      items.push_back({true, {}});
      continue;
    }
    const json* sp = Field(item, "SpecialToken");
    if (sp == nullptr) return Bad(at, "neither a Sequence nor a SpecialToken");
    VC_ASSIGN_OR_RETURN(const std::string name, StrField(*sp, "id", at + ".SpecialToken"));
    const json* entry = specials != nullptr ? Field(*specials, name.c_str()) : nullptr;
    const json* ids = entry != nullptr ? Field(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      return Bad(absl::StrCat(where, ".special_tokens"), absl::StrCat("has no ids for '", name, "'"));
    }
    TemplateItem t;
    for (const json& v : *ids) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= m->id_limit) {
        return Bad(absl::StrCat(where, ".special_tokens.", name), "holds an id outside the vocabulary");
      }
      t.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    items.push_back(std::move(t));
  }
  m->single_template = std::move(items);
  return absl::OkStatus();
}

absl::Status ParseModel(const json& model, Impl* m) {
  VC_ASSIGN_OR_RETURN(const std::string type, TypeOf(model, "model"));
  if (type != "BPE") return Unsupported("model", type, "BPE");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = Field(model, affix);
    if (v != nullptr && (!v->is_string() || !v->get<std::string>().empty())) {
      return Bad(absl::StrCat("model.", affix), "is not supported (only empty)");
    }
  }
  if (const json* dropout = Field(model, "dropout"); dropout != nullptr && dropout->is_number() && dropout->get<double>() > 0) {
    return Bad("model.dropout", "BPE dropout is not supported (it makes encoding random)");
  }
  VC_ASSIGN_OR_RETURN(m->byte_fallback, BoolField(model, "byte_fallback", false, "model"));
  VC_ASSIGN_OR_RETURN(m->ignore_merges, BoolField(model, "ignore_merges", false, "model"));
  VC_ASSIGN_OR_RETURN(m->fuse_unk, BoolField(model, "fuse_unk", false, "model"));
  const json* vocab = Field(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return Bad("model.vocab", "missing or not an object");
  // Byte-level vocabularies are held as the bytes their tokens stand for: BPE then runs on bytes.
  std::string bytes;
  int32_t limit = 0;
  std::vector<std::pair<int32_t, const std::string*>> by_id;
  by_id.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= (int64_t{1} << 30)) {
      return Bad(absl::StrCat("model.vocab[\"", it.key(), "\"]"), "not an id (0 to 2^30)");
    }
    const int32_t id = static_cast<int32_t>(it->get<int64_t>());
    by_id.emplace_back(id, &it.key());
    limit = std::max(limit, id + 1);
  }
  m->token_text.assign(limit, "");
  m->vocab.reserve(by_id.size());
  for (const auto& [id, text] : by_id) {
    m->token_text[id] = *text;
    const bool mapped = m->byte_level && Alphabet().ToBytes(*text, &bytes);
    if (!m->vocab.emplace(mapped ? bytes : *text, id).second) {
      return Bad("model.vocab", absl::StrCat("two tokens stand for the same text as '", *text, "'"));
    }
  }
  m->id_limit = limit;
  const auto lookup = [&](const std::string& token) -> int32_t {
    if (m->byte_level) {
      if (!Alphabet().ToBytes(token, &bytes)) return -1;
      auto it = m->vocab.find(bytes);
      return it == m->vocab.end() ? -1 : it->second;
    }
    auto it = m->vocab.find(token);
    return it == m->vocab.end() ? -1 : it->second;
  };
  m->byte_symbol.fill(-1);
  m->fallback_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (m->byte_level) {
      auto it = m->vocab.find(std::string(1, static_cast<char>(b)));
      if (it != m->vocab.end()) m->byte_symbol[b] = it->second;
    }
    static const char* const kHex = "0123456789ABCDEF";
    auto it = m->vocab.find(absl::StrCat("<0x", std::string(1, kHex[b >> 4]), std::string(1, kHex[b & 15]), ">"));
    if (it != m->vocab.end()) m->fallback_byte[b] = it->second;
  }
  if (const json* unk = Field(model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return Bad("model.unk_token", "not a string");
    m->unk = lookup(unk->get<std::string>());
    if (m->unk < 0) return Bad("model.unk_token", absl::StrCat("'", unk->get<std::string>(), "' is not in the vocabulary"));
  }
  const json* merges = Field(model, "merges");
  if (merges == nullptr || !merges->is_array()) return Bad("model.merges", "missing or not a list");
  m->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& e = (*merges)[i];
    std::string a, b;
    // "a b" (before tokenizers 0.20) or ["a", "b"].
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Bad(absl::StrCat("model.merges[", i, "]"), absl::StrCat("'", s, "' is not two tokens"));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return Bad(absl::StrCat("model.merges[", i, "]"), "neither \"a b\" nor [a, b]");
    }
    const int32_t ia = lookup(a), ib = lookup(b), merged = lookup(a + b);
    if (ia < 0 || ib < 0 || merged < 0) {
      return Bad(absl::StrCat("model.merges[", i, "]"),
                 absl::StrCat("'", ia < 0 ? a : ib < 0 ? b : a + b, "' is not in the vocabulary"));
    }
    // A repeated pair takes its last rank, as the reference's map does.
    m->merges.insert_or_assign(PairKey(ia, ib), BpeMerge{static_cast<uint32_t>(i), merged});
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const json& list, Impl* m) {
  if (!list.is_array()) return Bad("added_tokens", "not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    const json& t = list[i];
    VC_ASSIGN_OR_RETURN(const std::string content, StrField(t, "content", where));
    const json* idv = Field(t, "id");
    if (idv == nullptr || !idv->is_number_integer() || idv->get<int64_t>() < 0 || idv->get<int64_t>() >= (int64_t{1} << 30)) {
      return Bad(absl::StrCat(where, ".id"), "missing or not an id (0 to 2^30)");
    }
    if (content.empty()) return Bad(absl::StrCat(where, ".content"), "empty");
    const int32_t id = static_cast<int32_t>(idv->get<int64_t>());
    VC_ASSIGN_OR_RETURN(const bool special, BoolField(t, "special", false, where));
    VC_ASSIGN_OR_RETURN(const bool lstrip, BoolField(t, "lstrip", false, where));
    VC_ASSIGN_OR_RETURN(const bool rstrip, BoolField(t, "rstrip", false, where));
    if (id >= static_cast<int32_t>(m->token_text.size())) m->token_text.resize(id + 1);
    m->token_text[id] = content;
    if (m->special.size() < m->token_text.size()) m->special.resize(m->token_text.size(), false);
    m->special[id] = special;
    m->id_limit = std::max(m->id_limit, id + 1);
    if (lstrip || rstrip) m->added_strip[id] = {lstrip, rstrip};
    int32_t node = 0;
    for (char c : content) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto it = m->trie[node].next.find(b);
      if (it == m->trie[node].next.end()) {
        m->trie.emplace_back();
        it = m->trie[node].next.emplace(b, static_cast<int32_t>(m->trie.size() - 1)).first;
      }
      node = it->second;
    }
    m->trie[node].id = id;
    m->added_first[static_cast<uint8_t>(content[0])] = true;
  }
  m->special.resize(m->token_text.size(), false);
  return absl::OkStatus();
}

// tokenizer_config.json names tokens as a string or as {"content": string}.
std::string TokenName(const json& config, const char* key) {
  const json* v = Field(config, key);
  if (v == nullptr) return "";
  if (v->is_string()) return v->get<std::string>();
  if (const json* c = Field(*v, "content"); c != nullptr && c->is_string()) return c->get<std::string>();
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfTokenizer>> ParseHfTokenizer(absl::string_view tokenizer_json,
                                                              absl::string_view tokenizer_config_json, int32_t bos,
                                                              std::vector<int32_t> eos) {
  // Deep nesting would cost the parser a node per level; real files nest a few levels.
  if (absl::Status s = CheckJsonText(tokenizer_json, 64); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", s.message()));
  }
  const json root = json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("tokenizer.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
  auto m = std::make_unique<Impl>();
  // The pre-tokenizers first: they say whether the vocabulary is byte-level.
  if (const json* p = Field(root, "pre_tokenizer"); p != nullptr) VC_RETURN_IF_ERROR(ParsePreTokenizer(*p, "pre_tokenizer", m.get()));
  const json* model = Field(root, "model");
  if (model == nullptr) return Bad("model", "missing");
  VC_RETURN_IF_ERROR(ParseModel(*model, m.get()));
  m->special.assign(m->token_text.size(), false);
  if (const json* a = Field(root, "added_tokens"); a != nullptr) VC_RETURN_IF_ERROR(ParseAddedTokens(*a, m.get()));
  if (const json* n = Field(root, "normalizer"); n != nullptr) VC_RETURN_IF_ERROR(ParseNormalizer(*n, "normalizer", m.get()));
  if (const json* p = Field(root, "post_processor"); p != nullptr) {
    VC_RETURN_IF_ERROR(ParsePostProcessor(*p, "post_processor", m.get()));
  }
  if (const json* d = Field(root, "decoder"); d != nullptr) VC_RETURN_IF_ERROR(ParseDecoder(*d, "decoder", m.get()));

  json config = json::object();
  if (!tokenizer_config_json.empty()) {
    if (absl::Status s = CheckJsonText(tokenizer_config_json, 64); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", s.message()));
    }
    config = json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a valid JSON object");
    }
  }
  // The ids of tokenizer_config.json's names (added tokens or the vocabulary's).
  const auto id_of = [&](const std::string& name) -> int32_t {
    for (int32_t id = 0; id < static_cast<int32_t>(m->token_text.size()); ++id) {
      if (m->token_text[id] == name) return id;
    }
    return -1;
  };
  m->bos = bos;
  if (m->bos < 0) {
    if (const std::string name = TokenName(config, "bos_token"); !name.empty()) m->bos = id_of(name);
  }
  m->eos = std::move(eos);
  if (const std::string name = TokenName(config, "eos_token"); !name.empty()) {
    const int32_t id = id_of(name);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config.json: eos_token '", name, "' is not a token of tokenizer.json"));
    }
    if (std::find(m->eos.begin(), m->eos.end(), id) == m->eos.end()) m->eos.push_back(id);
  }
  return std::make_unique<HfTokenizer>(std::move(m));
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadHfTokenizer(const std::string& dir, int32_t bos,
                                                             std::vector<int32_t> eos) {
  VC_ASSIGN_OR_RETURN(const std::string tokenizer,
                      ReadFileLimited(dir + "/tokenizer.json", kMaxTokenizerJsonBytes, "tokenizer.json"));
  std::string config;
  if (absl::StatusOr<std::string> c =
          ReadFileLimited(dir + "/tokenizer_config.json", kMaxConfigJsonBytes, "tokenizer_config.json");
      c.ok()) {
    config = *std::move(c);
  } else if (!absl::IsNotFound(c.status())) {
    return c.status();
  }
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = ParseHfTokenizer(tokenizer, config, bos, std::move(eos));
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(dir, "/", t.status().message()));
  return t;
}

}  // namespace vc
