// The compressor registry: the one place that reads compressor specs. A spec names one method with
// its parameters, "name:key=value,key=value", or a composition joined by '+':
//   none                                   float32, every position (what the full KV holds)
//   kivi:bits=2|4|8,group=32,residual=32   KIVI quantization
//   streaming:sinks=4,window=2000,rollback=32
//   h2o:heavy=N,recent=M (or heavy_ratio, recent_ratio),rollback=R
//   snapkv:capacity=2048,window=32,kernel=5,pooling=max|avg
//   quest:page=16,budget=1024
//   snapkv:...+kivi:...                    selected at build time, then quantized
//   quest:budget=N+kivi:...                every position quantized, key groups chosen per query
// Each method's class takes its parameters typed (KiviParams, SnapKvParams, ...) and parses no
// text itself.
#ifndef VC_WORKER_COMPRESSION_REGISTRY_H_
#define VC_WORKER_COMPRESSION_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/compression/compressed_cache.h"
#include "worker/compression/h2o_cache.h"
#include "worker/compression/quest_cache.h"
#include "worker/compression/snapkv.h"
#include "worker/compression/token_list_cache.h"

namespace vc {

// One method of a spec: "name:key=value,key=value".
struct MethodSpec {
  std::string name;
  std::map<std::string, std::string> params;
};

// Splits a spec on '+' and ':' and ','. kInvalidArgument for an empty or over-long spec, a
// control or non-ASCII byte, empty parts, a missing '=', or a repeated key. Does not check names
// or values (MakeCompressedKvCache does).
absl::StatusOr<std::vector<MethodSpec>> ParseCompressorSpec(absl::string_view spec);

// Builds a cache for `spec` and a model of `layout` with `num_heads` query heads. kInvalidArgument
// naming the problem for an unknown method or parameter, a bad value, or an unsupported
// composition.
absl::StatusOr<std::unique_ptr<CompressedKvCache>> MakeCompressedKvCache(absl::string_view spec,
                                                                         const KvLayout& layout, int num_heads);

// Each method's parameters from its part of a spec, absent keys at their defaults;
// kInvalidArgument naming the method and key for an unknown key or a value out of range.
absl::StatusOr<KiviParams> ParseKiviParams(const MethodSpec& m, const KvLayout& layout);
absl::StatusOr<SnapKvParams> ParseSnapKvParams(const MethodSpec& m);
absl::StatusOr<H2oParams> ParseH2oParams(const MethodSpec& m);
// `defaults`: quest over KIVI takes its page from KIVI's group.
absl::StatusOr<QuestParams> ParseQuestParams(const MethodSpec& m, QuestParams defaults = {});

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_REGISTRY_H_
