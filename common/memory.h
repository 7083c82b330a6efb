// How much memory this process may use: the machine's physical memory, or less where a cgroup
// (a container's memory limit) says so. Used to refuse, with a clear error, memory budgets that
// could never be backed, before anything is allocated: allocating them would fail late (an
// exception, the kernel's OOM killer, or a shared-memory file filling /dev/shm).
#ifndef VC_COMMON_MEMORY_H_
#define VC_COMMON_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace vc {

// Physical memory, capped by the cgroup v2 or v1 memory limit when one is set.
uint64_t UsableMemoryBytes();

// kInvalidArgument naming `what` when `bytes` exceed UsableMemoryBytes(): options that ask for
// more memory than the machine (or its container) has.
absl::Status CheckFitsInMemory(uint64_t bytes, absl::string_view what);

}  // namespace vc

#endif  // VC_COMMON_MEMORY_H_
