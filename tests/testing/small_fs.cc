#include "tests/testing/small_fs.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/tiny_model.h"

namespace vc::testing {
namespace {

bool WriteSmallFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  return f.good();
}

}  // namespace

absl::Status EnterPrivateMounts() {
  if (geteuid() != 0) {
    // Root in a user namespace of its own, mapped to the user who ran it.
    const uid_t uid = geteuid();
    const gid_t gid = getegid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("not root, and no user namespace (", std::strerror(errno), ")"));
    }
    if (!WriteSmallFile("/proc/self/setgroups", "deny") || !WriteSmallFile("/proc/self/uid_map", absl::StrCat("0 ", uid, " 1")) ||
        !WriteSmallFile("/proc/self/gid_map", absl::StrCat("0 ", gid, " 1"))) {
      return absl::FailedPreconditionError("cannot map the user into its namespace");
    }
  } else if (unshare(CLONE_NEWNS) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("no mount namespace (", std::strerror(errno), ")"));
  }
  // Mounts made here stay here.
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot make mounts private (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SmallFilesystem(const std::string& name, uint64_t bytes) {
  const std::string dir = TempDir(name);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, absl::StrCat("size=", bytes, ",mode=0700").c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot mount a tmpfs on ", dir, " (", std::strerror(errno), ")"));
  }
  return dir;
}

}  // namespace vc::testing
