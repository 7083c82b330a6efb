// libFuzzer target: a .safetensors file (worker/runtime/safetensors.h): its header's length and
// JSON, each tensor's dtype, shape and byte range. Every tensor of a file that opens is read.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/runtime/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("safetensors", 0);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const auto file = vc::SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (!file.ok()) return 0;
  for (const std::string& name : (*file)->names()) {
    const auto t = (*file)->Get(name);
    if (t.ok() && t->num_elements() > 0) (void)t->data;
  }
  return 0;
}
