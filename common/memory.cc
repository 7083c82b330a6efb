#include "common/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace vc {
namespace {

// The number in a cgroup limit file; 0 when it is absent or says "max".
uint64_t CgroupLimit(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  uint64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &v)) return 0;
  return v;
}

}  // namespace

uint64_t UsableMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (const uint64_t limit = CgroupLimit(path); limit > 0) bytes = std::min(bytes, limit);
  }
  return bytes;
}

absl::Status CheckFitsInMemory(uint64_t bytes, absl::string_view what) {
  const uint64_t usable = UsableMemoryBytes();
  if (bytes <= usable) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s (%.1f GiB) is more than the %.1f GiB of memory here", what,
                                                      bytes / 1073741824.0, usable / 1073741824.0));
}

}  // namespace vc
