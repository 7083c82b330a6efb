#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace vc {

absl::StatusOr<int> OpenRegularFile(const std::string& path, absl::string_view what, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(what, " ", path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a regular file"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadFileLimited(const std::string& path, uint64_t max_bytes, absl::string_view what) {
  uint64_t size = 0;
  absl::StatusOr<int> opened = OpenRegularFile(path, what, &size);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  if (size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": ", size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": read failed: ", std::strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {  // it grew while being read
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": more than the ", max_bytes, " bytes allowed"));
    }
  }
  ::close(fd);
  return out;
}

absl::Status CheckJsonText(absl::string_view json, int max_depth) {
  if (const size_t nul = json.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("JSON text has a NUL byte at offset ", nul));
  }
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat("JSON nests deeper than ", max_depth, " levels"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

bool ForEachFileAllocation(const std::string& dir,
                           const std::function<void(const std::filesystem::path&, uint64_t)>& fn) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (::stat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      fn(it->path(), static_cast<uint64_t>(st.st_blocks) * 512);
    }
  }
  return !ec;
}

}  // namespace vc
