#include "worker/compression/registry.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "worker/compression/h2o_cache.h"
#include "worker/compression/quest_cache.h"
#include "worker/compression/snapkv.h"
#include "worker/compression/streaming_cache.h"
#include "worker/compression/token_list_cache.h"

namespace vc {
namespace {

// Parameter helpers: each returns kInvalidArgument naming the method and the key when the value is
// malformed or outside [lo, hi]; absent keys give the default.
absl::StatusOr<int64_t> SpecInt(const MethodSpec& m, const std::string& key, int64_t fallback, int64_t lo,
                                int64_t hi) {
  auto it = m.params.find(key);
  if (it == m.params.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(m.name, ": ", key, " must be an integer in [", lo, ", ", hi,
                                                   "], got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> SpecDouble(const MethodSpec& m, const std::string& key, double fallback, double lo,
                                  double hi) {
  auto it = m.params.find(key);
  if (it == m.params.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v) || !(v >= lo && v <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.name, ": ", key, " must be a number in [", lo, ", ", hi, "], got '", it->second, "'"));
  }
  return v;
}

absl::Status SpecKnownKeys(const MethodSpec& m, const std::vector<std::string>& known) {
  for (const auto& [k, v] : m.params) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(m.name, ": unknown parameter '", k, "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<MethodSpec>> ParseCompressorSpec(absl::string_view spec) {
  std::vector<MethodSpec> out;
  if (spec.empty()) return absl::InvalidArgumentError("empty compressor spec");
  // Checked first, since the messages below quote the spec: short, and one printable line.
  constexpr size_t kMaxSpecBytes = 256;
  if (spec.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressor spec of ", spec.size(), " bytes; at most ", kMaxSpecBytes));
  }
  for (char ch : spec) {
    if (ch < 0x20 || ch > 0x7e) {
      return absl::InvalidArgumentError("compressor spec holds a control or non-ASCII byte");
    }
  }
  for (absl::string_view part : absl::StrSplit(spec, '+')) {
    MethodSpec m;
    std::pair<absl::string_view, absl::string_view> name_params = absl::StrSplit(part, absl::MaxSplits(':', 1));
    m.name = std::string(absl::StripAsciiWhitespace(name_params.first));
    if (m.name.empty()) return absl::InvalidArgumentError(absl::StrCat("compressor spec '", spec, "': empty method"));
    if (!name_params.second.empty()) {
      for (absl::string_view kv : absl::StrSplit(name_params.second, ',')) {
        std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        const std::string key(absl::StripAsciiWhitespace(p.first));
        if (key.empty() || kv.find('=') == absl::string_view::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("compressor spec '", spec, "': expected key=value, got '", kv, "'"));
        }
        if (!m.params.emplace(key, std::string(absl::StripAsciiWhitespace(p.second))).second) {
          return absl::InvalidArgumentError(absl::StrCat("compressor spec '", spec, "': repeated key '", key, "'"));
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<KiviParams> ParseKiviParams(const MethodSpec& m, const KvLayout& layout) {
  VC_RETURN_IF_ERROR(SpecKnownKeys(m, {"bits", "group", "residual"}));
  KiviParams p;
  VC_ASSIGN_OR_RETURN(int64_t bits, SpecInt(m, "bits", 4, 2, 8));
  if (bits != 2 && bits != 4 && bits != 8) return absl::InvalidArgumentError("kivi: bits must be 2, 4 or 8");
  VC_ASSIGN_OR_RETURN(int64_t group, SpecInt(m, "group", 32, 8, 1024));
  VC_ASSIGN_OR_RETURN(int64_t residual, SpecInt(m, "residual", 32, 0, 1 << 20));
  if (group % 8 != 0) return absl::InvalidArgumentError("kivi: group must be a multiple of 8");
  const int vg = std::min<int>(static_cast<int>(group), layout.head_dim);
  if (vg % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kivi: head_dim ", layout.head_dim, " is not a multiple of 8 (values are quantized in groups of 8 or more channels)"));
  }
  if (layout.head_dim % vg != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kivi: head_dim ", layout.head_dim, " is not a multiple of the value group ", vg));
  }
  p.bits = static_cast<int>(bits);
  p.group = static_cast<int>(group);
  p.residual = static_cast<int>(residual);
  return p;
}


absl::StatusOr<SnapKvParams> ParseSnapKvParams(const MethodSpec& m) {
  VC_RETURN_IF_ERROR(SpecKnownKeys(m, {"capacity", "window", "kernel", "pooling"}));
  SnapKvParams p;
  VC_ASSIGN_OR_RETURN(p.capacity, SpecInt(m, "capacity", p.capacity, 1, int64_t{1} << 30));
  VC_ASSIGN_OR_RETURN(int64_t window, SpecInt(m, "window", p.window, 1, 1 << 16));
  VC_ASSIGN_OR_RETURN(int64_t kernel, SpecInt(m, "kernel", p.kernel, 1, 1023));
  if (kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat("snapkv: kernel must be odd, got ", kernel));
  }
  if (window > p.capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapkv: capacity ", p.capacity, " must be at least the window ", window));
  }
  auto it = m.params.find("pooling");
  if (it != m.params.end()) {
    if (it->second == "max") {
      p.pooling = SnapKvParams::Pooling::kMax;
    } else if (it->second == "avg") {
      p.pooling = SnapKvParams::Pooling::kAvg;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("snapkv: pooling must be max or avg, got '", it->second, "'"));
    }
  }
  p.window = static_cast<int>(window);
  p.kernel = static_cast<int>(kernel);
  return p;
}

absl::StatusOr<H2oParams> ParseH2oParams(const MethodSpec& m) {
  VC_RETURN_IF_ERROR(SpecKnownKeys(m, {"heavy", "recent", "heavy_ratio", "recent_ratio", "rollback"}));
  H2oParams p;
  for (const char* key : {"heavy", "recent"}) {
    if (m.params.count(key) && m.params.count(absl::StrCat(key, "_ratio"))) {
      return absl::InvalidArgumentError(absl::StrCat("h2o: give ", key, " or ", key, "_ratio, not both"));
    }
  }
  VC_ASSIGN_OR_RETURN(p.heavy, SpecInt(m, "heavy", -1, 0, int64_t{1} << 30));
  VC_ASSIGN_OR_RETURN(p.recent, SpecInt(m, "recent", -1, 1, int64_t{1} << 30));
  VC_ASSIGN_OR_RETURN(p.heavy_ratio, SpecDouble(m, "heavy_ratio", p.heavy_ratio, 0.0, 1.0));
  VC_ASSIGN_OR_RETURN(p.recent_ratio, SpecDouble(m, "recent_ratio", p.recent_ratio, 1e-6, 1.0));
  VC_ASSIGN_OR_RETURN(int64_t rollback, SpecInt(m, "rollback", p.rollback, 0, 4096));
  p.rollback = static_cast<int>(rollback);
  return p;
}

absl::StatusOr<QuestParams> ParseQuestParams(const MethodSpec& m, QuestParams defaults) {
  VC_RETURN_IF_ERROR(SpecKnownKeys(m, {"page", "budget"}));
  QuestParams p = defaults;
  VC_ASSIGN_OR_RETURN(int64_t page, SpecInt(m, "page", p.page, 1, 4096));
  VC_ASSIGN_OR_RETURN(p.budget, SpecInt(m, "budget", p.budget, 1, int64_t{1} << 30));
  if (p.budget < page) {
    return absl::InvalidArgumentError(
        absl::StrCat("quest: budget ", p.budget, " must hold at least one page of ", page, " positions"));
  }
  p.page = static_cast<int>(page);
  return p;
}

absl::StatusOr<std::unique_ptr<CompressedKvCache>> MakeCompressedKvCache(absl::string_view spec,
                                                                         const KvLayout& layout, int num_heads) {
  VC_ASSIGN_OR_RETURN(std::vector<MethodSpec> methods, ParseCompressorSpec(spec));
  std::vector<std::string> names;
  for (const auto& m : methods) names.push_back(m.name);
  const std::string joined = absl::StrJoin(names, "+");

  if (methods.size() == 1 && methods[0].name == "none") {
    VC_RETURN_IF_ERROR(SpecKnownKeys(methods[0], {}));
    return std::make_unique<TokenListCache>(layout, num_heads, KiviParams{}, nullptr);
  }
  if (methods.size() == 1 && methods[0].name == "kivi") {
    VC_ASSIGN_OR_RETURN(KiviParams p, ParseKiviParams(methods[0], layout));
    return std::make_unique<TokenListCache>(layout, num_heads, p, nullptr);
  }
  if (methods.size() == 1 && methods[0].name == "streaming") {
    const MethodSpec& m = methods[0];
    VC_RETURN_IF_ERROR(SpecKnownKeys(m, {"sinks", "window", "rollback"}));
    VC_ASSIGN_OR_RETURN(int64_t sinks, SpecInt(m, "sinks", 4, 0, 1 << 20));
    VC_ASSIGN_OR_RETURN(int64_t window, SpecInt(m, "window", 2000, 1, 1 << 24));
    VC_ASSIGN_OR_RETURN(int64_t rollback, SpecInt(m, "rollback", 32, 0, 4096));
    return std::make_unique<StreamingCache>(layout, static_cast<int>(sinks), static_cast<int>(window),
                                            static_cast<int>(rollback));
  }
  // Selection at build time, optionally followed by quantization.
  if ((methods.size() == 1 || (methods.size() == 2 && methods[1].name == "kivi")) && methods[0].name == "snapkv") {
    VC_ASSIGN_OR_RETURN(SnapKvParams snapkv, ParseSnapKvParams(methods[0]));
    auto sel = std::make_unique<SnapKvSelector>(snapkv);
    KiviParams p;
    if (methods.size() == 2) {
      VC_ASSIGN_OR_RETURN(p, ParseKiviParams(methods[1], layout));
    }
    return std::make_unique<TokenListCache>(layout, num_heads, p, std::move(sel));
  }
  // Quest's selection per query over KIVI's key groups (its pages).
  if (methods.size() == 2 && methods[0].name == "quest" && methods[1].name == "kivi") {
    VC_ASSIGN_OR_RETURN(KiviParams p, ParseKiviParams(methods[1], layout));
    VC_ASSIGN_OR_RETURN(QuestParams quest, ParseQuestParams(methods[0], QuestParams{p.group}));
    if (quest.page != p.group) {
      return absl::InvalidArgumentError(
          absl::StrCat("quest+kivi: pages are kivi's key groups of ", p.group, " positions; got page=", quest.page));
    }
    return std::make_unique<TokenListCache>(layout, num_heads, p, nullptr, quest.budget);
  }
  if (methods.size() == 1 && methods[0].name == "h2o") {
    VC_ASSIGN_OR_RETURN(H2oParams p, ParseH2oParams(methods[0]));
    return std::make_unique<H2oCache>(layout, num_heads, p);
  }
  if (methods.size() == 1 && methods[0].name == "quest") {
    VC_ASSIGN_OR_RETURN(QuestParams p, ParseQuestParams(methods[0]));
    return std::make_unique<QuestCache>(layout, p);
  }
  if (methods.size() == 1) {
    return absl::InvalidArgumentError(absl::StrCat("unknown compressor '", methods[0].name,
                                                   "' (known: none, kivi, streaming, snapkv, h2o, quest)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported composition '", joined,
                                                 "': compositions are a build-time selector or quest followed by kivi, "
                                                 "e.g. snapkv:capacity=1024+kivi:bits=4, quest:budget=4096+kivi:bits=4"));
}

}  // namespace vc
