// Reading the small files that configure a process (model configs, token lists, prompts) without
// trusting them: only regular files (a FIFO or a device would block or never end), only up to a
// stated size, and JSON only up to a stated nesting depth (a parser builds one node per level, so
// a few megabytes of brackets would cost gigabytes). And what a directory's files take on disk.
#ifndef VC_COMMON_FILES_H_
#define VC_COMMON_FILES_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc {

// `path` opened for reading (a descriptor the caller closes) when it is a regular file, its size
// in *size: kNotFound when it does not exist, kInvalidArgument when it cannot be opened or is not a
// regular file (`what` names it in the message). A FIFO is refused, not waited on.
absl::StatusOr<int> OpenRegularFile(const std::string& path, absl::string_view what, uint64_t* size);

// The whole of `path`: kNotFound when it does not exist, kInvalidArgument when it is not a regular
// file or holds more than `max_bytes` (`what` names it in the message, e.g. "token file").
absl::StatusOr<std::string> ReadFileLimited(const std::string& path, uint64_t max_bytes, absl::string_view what);

// kInvalidArgument for text a JSON parser would misread or pay too much for: a NUL byte (which
// nlohmann's parser takes for the end of the input, so whatever follows would pass unread), or
// arrays and objects nested deeper than `max_depth` (only brackets outside strings count). The
// text need not be valid JSON otherwise (the parser says so afterwards).
absl::Status CheckJsonText(absl::string_view json, int max_depth);

// fn(path, bytes) for each regular file directly in `dir`, with the space allocated to it (st_blocks:
// a file preallocated past its size counts whole). A file deleted between the listing and the look
// is skipped. False when `dir` could not be listed to the end.
bool ForEachFileAllocation(const std::string& dir,
                           const std::function<void(const std::filesystem::path&, uint64_t)>& fn);

}  // namespace vc

#endif  // VC_COMMON_FILES_H_
