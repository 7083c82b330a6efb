// Small filesystems for tests of full disks: tmpfs mounts of a chosen size, in a mount namespace of
// the test process's own, so that nothing outside it sees them and they go when it exits. Needs
// root, or unprivileged user namespaces (then the process is root in a namespace of its own).
#ifndef VC_TESTS_TESTING_SMALL_FS_H_
#define VC_TESTS_TESTING_SMALL_FS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace vc::testing {

// Moves the process into mount namespace of its own. Call from main, before any thread starts.
// An error says why small filesystems cannot be made here.
absl::Status EnterPrivateMounts();

// A fresh directory named after `name` with a tmpfs of `bytes` mounted on it.
absl::StatusOr<std::string> SmallFilesystem(const std::string& name, uint64_t bytes);

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_SMALL_FS_H_
